// NetworkGate and the gated communicator (checkpoint.h, docs/CHECKPOINT.md).
#include <utility>

#include "cupcake/runtime/checkpoint.h"

namespace cupcake::runtime {

void NetworkGate::BeginTransfer() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (collectives_in_flight_ > 0) ++overlapping_;
  ++transfers_in_flight_;
  ++transfers_;
}

void NetworkGate::BeginTransferWhenIdle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return collectives_in_flight_ == 0 && collectives_waiting_ == 0; });
  ++transfers_in_flight_;
  ++idle_transfers_;
}

void NetworkGate::EndTransfer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --transfers_in_flight_;
  }
  idle_.notify_all();
}

void NetworkGate::EnterCollective() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (transfers_in_flight_ > 0) ++waited_;
  ++collectives_waiting_;
  idle_.wait(lock, [&] { return transfers_in_flight_ == 0; });
  --collectives_waiting_;
  ++collectives_in_flight_;
  ++collectives_;
}

void NetworkGate::LeaveCollective() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    --collectives_in_flight_;
  }
  idle_.notify_all();  // a transfer waiting for the network to be idle
}

int64_t NetworkGate::transfers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return transfers_;
}
int64_t NetworkGate::idle_transfers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_transfers_;
}
int64_t NetworkGate::collectives() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return collectives_;
}
int64_t NetworkGate::collectives_waited() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waited_;
}
int64_t NetworkGate::transfers_during_collectives() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return overlapping_;
}

namespace {

// Forwards every call to `inner_`; collectives inside the gate.
class GatedCommunicator final : public comm::Communicator {
 public:
  GatedCommunicator(std::shared_ptr<NetworkGate> gate, std::unique_ptr<comm::Communicator> inner)
      : gate_(std::move(gate)), inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& host() const override { return inner_->host(); }
  std::string library() const override { return inner_->library(); }
  comm::MemoryKind memory() const override { return inner_->memory(); }
  void* stream() const override { return inner_->stream(); }

  Status Barrier() override {
    return Gated([&] { return inner_->Barrier(); });
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    return Gated([&] { return inner_->Broadcast(buf, bytes, root); });
  }
  Status Allreduce(const void* send, void* recv, int64_t count, comm::DataType type, comm::ReduceOp op) override {
    return Gated([&] { return inner_->Allreduce(send, recv, count, type, op); });
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    return Gated([&] { return inner_->Allgather(send, recv, bytes_per_rank); });
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, comm::DataType type,
                       comm::ReduceOp op) override {
    return Gated([&] { return inner_->ReduceScatter(send, recv, count_per_rank, type, op); });
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    return Gated([&] { return inner_->Alltoall(send, recv, bytes_per_rank); });
  }
  Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                   std::span<const int64_t> recv_bytes) override {
    return Gated([&] { return inner_->Alltoallv(send, send_bytes, recv, recv_bytes); });
  }
  StatusOr<std::unique_ptr<comm::Communicator>> Split(int color, int key) override {
    gate_->EnterCollective();
    StatusOr<std::unique_ptr<comm::Communicator>> split = inner_->Split(color, key);
    gate_->LeaveCollective();
    if (!split.ok() || *split == nullptr) return split;
    return std::unique_ptr<comm::Communicator>(std::make_unique<GatedCommunicator>(gate_, std::move(split).value()));
  }
  Status Synchronize() override { return inner_->Synchronize(); }
  Status AsyncError() override { return inner_->AsyncError(); }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

 private:
  template <typename F>
  Status Gated(F&& call) {
    gate_->EnterCollective();
    Status s = call();
    gate_->LeaveCollective();
    return s;
  }

  std::shared_ptr<NetworkGate> gate_;
  std::unique_ptr<comm::Communicator> inner_;
};

}  // namespace

std::unique_ptr<comm::Communicator> GateCommunicator(std::shared_ptr<NetworkGate> gate,
                                                     std::unique_ptr<comm::Communicator> inner) {
  return std::make_unique<GatedCommunicator>(std::move(gate), std::move(inner));
}

}  // namespace cupcake::runtime

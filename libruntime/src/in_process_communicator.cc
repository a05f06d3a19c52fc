// InProcessGroup: ranks as threads sharing one State. Every collective is two phases around a
// generation barrier: each rank posts its buffer, all wait, each computes its own output from
// the posted ones (summing in rank order, so results are deterministic), all wait again (so no
// rank reuses its buffer while others still read). Abort wakes every waiter with the reason.
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "cupcake/kernels/compressor.h"
#include "cupcake/runtime/communicator.h"

namespace cupcake::runtime {

struct InProcessGroup::State {
  explicit State(int n) : size(n), sends(static_cast<size_t>(n)) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string reason;
  std::vector<const void*> sends;

  Status Wait(int rank) {
    std::unique_lock lock(mu);
    const uint64_t gen = generation;
    if (!aborted && ++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen || aborted; });
    }
    if (aborted)
      return UnavailableError("in-process group aborted: " + reason + " (rank " + std::to_string(rank) + ")");
    return Status::Ok();
  }
  void Abort(const std::string& why) {
    {
      std::lock_guard lock(mu);
      if (aborted) return;
      aborted = true;
      reason = why;
    }
    cv.notify_all();
  }
};

namespace {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup::State> state, int rank)
      : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  const std::string& host() const override { return host_; }

  Status Allreduce(const void* send, void* recv, int64_t count, ReduceType type) override {
    CUPCAKE_RETURN_IF_ERROR(Post(send));
    const int64_t bytes = count * (type == ReduceType::kFloat16 ? 2 : 4);
    std::memcpy(recv, state_->sends[0], static_cast<size_t>(bytes));
    for (int r = 1; r < size(); ++r) {
      const void* in = state_->sends[static_cast<size_t>(r)];
      if (type == ReduceType::kFloat16)
        kernels::SumFp16Payloads(static_cast<const std::byte*>(in), static_cast<std::byte*>(recv), count);
      else
        kernels::SumFp32Payloads(static_cast<const float*>(in), static_cast<float*>(recv), count);
    }
    return state_->Wait(rank_);
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(Post(send));
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<std::byte*>(recv) + r * bytes_per_rank, state_->sends[static_cast<size_t>(r)],
                  static_cast<size_t>(bytes_per_rank));
    return state_->Wait(rank_);
  }
  void Abort(const std::string& reason) override { state_->Abort(reason); }

 private:
  Status Post(const void* p) {
    state_->sends[static_cast<size_t>(rank_)] = p;
    return state_->Wait(rank_);
  }

  std::shared_ptr<InProcessGroup::State> state_;
  int rank_;
  std::string host_ = "localhost";
};

}  // namespace

InProcessGroup::InProcessGroup(int size) : state_(std::make_shared<State>(size)) {}

std::unique_ptr<Communicator> InProcessGroup::Rank(int rank) {
  return std::make_unique<InProcessCommunicator>(state_, rank);
}

}  // namespace cupcake::runtime

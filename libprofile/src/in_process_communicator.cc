// InProcessGroup: ranks as threads sharing one State. Every collective is two phases around a
// generation barrier: each rank posts its buffers, all wait, each computes its own output from
// the posted ones, all wait again (so no rank reuses its buffers while others still read).
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>

#include "cupcake/profile/communicator.h"

namespace cupcake::profile {

int64_t DataTypeBytes(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
  }
  return 0;
}

StatusOr<Communicator::Buffer> Communicator::Allocate(int64_t bytes) {
  if (bytes < 0) return InvalidArgumentError("Allocate: negative size " + std::to_string(bytes));
  return Buffer(new std::byte[static_cast<size_t>(bytes)], [](void* p) { delete[] static_cast<std::byte*>(p); });
}

Status Communicator::CopyIn(void* dst, const void* host_src, int64_t bytes) {
  std::memcpy(dst, host_src, static_cast<size_t>(bytes));
  return Status::Ok();
}

Status Communicator::CopyOut(void* host_dst, const void* src, int64_t bytes) {
  std::memcpy(host_dst, src, static_cast<size_t>(bytes));
  return Status::Ok();
}

struct InProcessGroup::State {
  explicit State(int n) : size(n), sends(static_cast<size_t>(n)), ints(static_cast<size_t>(n) * 2),
                          children(static_cast<size_t>(n)) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  std::vector<const void*> sends;
  std::vector<int> ints;                        // Split: color, key per rank
  std::vector<std::shared_ptr<State>> children; // Split: the new group's state, by leader rank

  void Wait() {
    std::unique_lock lock(mu);
    uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen; });
    }
  }
};

namespace {

using State = InProcessGroup::State;

template <typename T>
void Reduce(T* out, const T* in, int64_t count, ReduceOp op) {
  for (int64_t i = 0; i < count; ++i) out[i] = op == ReduceOp::kSum ? out[i] + in[i] : std::max(out[i], in[i]);
}

void ReduceInto(void* out, const void* in, int64_t count, DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32: Reduce(static_cast<float*>(out), static_cast<const float*>(in), count, op); break;
    case DataType::kFloat64: Reduce(static_cast<double*>(out), static_cast<const double*>(in), count, op); break;
    case DataType::kInt32: Reduce(static_cast<int*>(out), static_cast<const int*>(in), count, op); break;
  }
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup::State> state, int rank, std::vector<std::string> hosts)
      : state_(std::move(state)), rank_(rank), hosts_(std::move(hosts)) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  const std::string& host() const override { return hosts_[static_cast<size_t>(rank_)]; }
  std::string library() const override { return "in-process"; }

  Status Barrier() override {
    state_->Wait();
    return Status::Ok();
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    Post(buf);
    if (rank_ != root) std::memcpy(buf, state_->sends[static_cast<size_t>(root)], static_cast<size_t>(bytes));
    state_->Wait();
    return Status::Ok();
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    Post(send);
    const size_t bytes = static_cast<size_t>(count * DataTypeBytes(type));
    std::memcpy(recv, state_->sends[0], bytes);
    for (int r = 1; r < size(); ++r) ReduceInto(recv, state_->sends[static_cast<size_t>(r)], count, type, op);
    state_->Wait();
    return Status::Ok();
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    Post(send);
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<std::byte*>(recv) + r * bytes_per_rank, state_->sends[static_cast<size_t>(r)],
                  static_cast<size_t>(bytes_per_rank));
    state_->Wait();
    return Status::Ok();
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    Post(send);
    const int64_t block = count_per_rank * DataTypeBytes(type);
    auto at = [&](int r) { return static_cast<const std::byte*>(state_->sends[static_cast<size_t>(r)]) + rank_ * block; };
    std::memcpy(recv, at(0), static_cast<size_t>(block));
    for (int r = 1; r < size(); ++r) ReduceInto(recv, at(r), count_per_rank, type, op);
    state_->Wait();
    return Status::Ok();
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    Post(send);
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<std::byte*>(recv) + r * bytes_per_rank,
                  static_cast<const std::byte*>(state_->sends[static_cast<size_t>(r)]) + rank_ * bytes_per_rank,
                  static_cast<size_t>(bytes_per_rank));
    state_->Wait();
    return Status::Ok();
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    State& s = *state_;
    s.ints[2 * static_cast<size_t>(rank_)] = color;
    s.ints[2 * static_cast<size_t>(rank_) + 1] = key;
    s.Wait();
    std::vector<std::pair<int, int>> members;  // (key, rank) of my color
    for (int r = 0; r < size(); ++r)
      if (color >= 0 && s.ints[2 * static_cast<size_t>(r)] == color) members.emplace_back(s.ints[2 * static_cast<size_t>(r) + 1], r);
    std::sort(members.begin(), members.end());
    const bool leader = !members.empty() && std::min_element(members.begin(), members.end(), [](auto a, auto b) {
                                              return a.second < b.second;
                                            })->second == rank_;
    if (leader) s.children[static_cast<size_t>(rank_)] = std::make_shared<State>(static_cast<int>(members.size()));
    s.Wait();
    std::unique_ptr<Communicator> child;
    if (!members.empty()) {
      int leader_rank = size();
      for (auto [k, r] : members) leader_rank = std::min(leader_rank, r);
      std::vector<std::string> hosts;
      int new_rank = 0;
      for (size_t i = 0; i < members.size(); ++i) {
        hosts.push_back(hosts_[static_cast<size_t>(members[i].second)]);
        if (members[i].second == rank_) new_rank = static_cast<int>(i);
      }
      child = std::make_unique<InProcessCommunicator>(s.children[static_cast<size_t>(leader_rank)], new_rank, hosts);
    }
    s.Wait();
    if (leader) s.children[static_cast<size_t>(rank_)].reset();
    return child;
  }

 private:
  void Post(const void* p) {
    state_->sends[static_cast<size_t>(rank_)] = p;
    state_->Wait();
  }

  std::shared_ptr<InProcessGroup::State> state_;
  int rank_;
  std::vector<std::string> hosts_;
};

class WrongResultCommunicator final : public Communicator {
 public:
  WrongResultCommunicator(std::unique_ptr<Communicator> inner, pb::CommOp op) : inner_(std::move(inner)), op_(op) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& host() const override { return inner_->host(); }
  std::string library() const override { return inner_->library(); }
  Status Barrier() override { return inner_->Barrier(); }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    CUPCAKE_RETURN_IF_ERROR(inner_->Broadcast(buf, bytes, root));
    if (rank() != root) Corrupt(pb::BROADCAST, buf);
    return Status::Ok();
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(inner_->Allreduce(send, recv, count, type, op));
    if (type == DataType::kFloat32) Corrupt(pb::ALLREDUCE, recv);
    return Status::Ok();
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(inner_->Allgather(send, recv, bytes_per_rank));
    Corrupt(pb::ALLGATHER, recv);
    return Status::Ok();
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(inner_->ReduceScatter(send, recv, count_per_rank, type, op));
    Corrupt(pb::REDUCE_SCATTER, recv);
    return Status::Ok();
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(inner_->Alltoall(send, recv, bytes_per_rank));
    Corrupt(pb::ALLTOALL, recv);
    return Status::Ok();
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> child, inner_->Split(color, key));
    if (!child) return child;
    return std::unique_ptr<Communicator>(std::make_unique<WrongResultCommunicator>(std::move(child), op_));
  }
  StatusOr<Buffer> Allocate(int64_t bytes) override { return inner_->Allocate(bytes); }
  Status CopyIn(void* dst, const void* host_src, int64_t bytes) override { return inner_->CopyIn(dst, host_src, bytes); }
  Status CopyOut(void* host_dst, const void* src, int64_t bytes) override {
    return inner_->CopyOut(host_dst, src, bytes);
  }

 private:
  // Through CopyOut/CopyIn, so it works on any communicator's memory.
  void Corrupt(pb::CommOp op, void* recv) {
    if (op != op_) return;
    float first = 0;
    if (inner_->CopyOut(&first, recv, sizeof first).ok()) {
      first += 1.0f;
      (void)inner_->CopyIn(recv, &first, sizeof first);
    }
  }
  std::unique_ptr<Communicator> inner_;
  pb::CommOp op_;
};

}  // namespace

InProcessGroup::InProcessGroup(int size, std::vector<std::string> hosts)
    : state_(std::make_shared<State>(size)), hosts_(std::move(hosts)) {
  if (hosts_.empty()) hosts_.assign(static_cast<size_t>(size), "localhost");
}

std::unique_ptr<Communicator> InProcessGroup::Rank(int rank) {
  return std::make_unique<InProcessCommunicator>(state_, rank, hosts_);
}

std::unique_ptr<Communicator> MakeWrongResultCommunicator(std::unique_ptr<Communicator> inner, pb::CommOp op) {
  return std::make_unique<WrongResultCommunicator>(std::move(inner), op);
}

}  // namespace cupcake::profile

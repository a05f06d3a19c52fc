// InProcessGroup: ranks as threads sharing one State. Collectives run between generation
// barriers: each rank posts its buffers and all wait; then they compute from the posted ones
// (summing in rank order, so results are deterministic); a last wait keeps every rank from
// reusing its buffers while others still read them. Abort wakes every waiter with the reason.
// Allreduce is a reduce-scatter then an allgather over W chunks, so it also works in place
// (send == recv): in the first phase rank r writes only chunk r of its own output and reads
// chunk r of every input; in the second it copies chunk p from rank p's output into chunk p of
// its own, for p != r. No rank writes what another reads within a phase.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "cupcake/kernels/compressor.h"
#include "cupcake/runtime/communicator.h"

namespace cupcake::runtime {

struct InProcessGroup::State {
  explicit State(int n) : size(n), sends(static_cast<size_t>(n)), recvs(static_cast<size_t>(n)) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string reason;
  std::vector<const void*> sends;
  std::vector<void*> recvs;

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
    CUPCAKE_RETURN_IF_ERROR(Post(send, recv));
    const int64_t elem = type == ReduceType::kFloat16 ? 2 : 4;
    const int64_t w = size();
    // Phase 1 (reduce-scatter): chunk `rank_` of recv = the sum over ranks, in rank order, built
    // in blocks on the stack (the step path allocates nothing) and written once per block.
    const int64_t begin = count * rank_ / w, end = count * (rank_ + 1) / w;
    alignas(64) std::byte block[kBlockBytes];
    const int64_t per_block = kBlockBytes / elem;
    for (int64_t at = begin; at < end; at += per_block) {
      const int64_t n = std::min(per_block, end - at);
      std::memcpy(block, Bytes(state_->sends[0], at * elem), static_cast<size_t>(n * elem));
      for (int r = 1; r < size(); ++r) {
        const std::byte* in = Bytes(state_->sends[static_cast<size_t>(r)], at * elem);
        if (type == ReduceType::kFloat16)
          kernels::SumFp16Payloads(in, block, n);
        else
          kernels::SumFp32Payloads(reinterpret_cast<const float*>(in), reinterpret_cast<float*>(block), n);
      }
      std::memcpy(static_cast<std::byte*>(recv) + at * elem, block, static_cast<size_t>(n * elem));
    }
    CUPCAKE_RETURN_IF_ERROR(state_->Wait(rank_));
    // Phase 2 (allgather): the other ranks' chunks from their outputs.
    for (int r = 0; r < size(); ++r) {
      if (r == rank_) continue;
      const int64_t b = count * r / w, e = count * (r + 1) / w;
      std::memcpy(static_cast<std::byte*>(recv) + b * elem, Bytes(state_->recvs[static_cast<size_t>(r)], b * elem),
                  static_cast<size_t>((e - b) * elem));
    }
    return state_->Wait(rank_);
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(Post(send, recv));
    for (int r = 0; r < size(); ++r)
      std::memcpy(static_cast<std::byte*>(recv) + r * bytes_per_rank, state_->sends[static_cast<size_t>(r)],
                  static_cast<size_t>(bytes_per_rank));
    return state_->Wait(rank_);
  }
  void Abort(const std::string& reason) override { state_->Abort(reason); }

 private:
  static constexpr int64_t kBlockBytes = 4096;
  static const std::byte* Bytes(const void* p, int64_t offset) { return static_cast<const std::byte*>(p) + offset; }
  Status Post(const void* send, void* recv) {
    state_->sends[static_cast<size_t>(rank_)] = send;
    state_->recvs[static_cast<size_t>(rank_)] = recv;
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

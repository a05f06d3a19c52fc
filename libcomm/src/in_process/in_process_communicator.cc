// InProcessGroup: ranks as threads sharing one State. Every collective runs between generation
// barriers: each rank posts its buffers and all wait; then each computes its own output from
// the posted ones (reducing in rank order, so results are deterministic); a last wait keeps
// every rank from reusing its buffers while others still read them. Abort wakes every waiter
// with the reason.
//
// Allreduce is a reduce-scatter then an allgather over W chunks, so it also works in place
// (send == recv): in the first phase rank r writes only chunk r of its own output and reads
// chunk r of every input; in the second it copies chunk p from rank p's output into chunk p of
// its own, for p != r. No rank writes what another reads within a phase.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "../common.h"
#include "cupcake/comm/communicator.h"

namespace cupcake::comm {

struct InProcessGroup::State {
  explicit State(int n)
      : size(n),
        sends(static_cast<size_t>(n)),
        recvs(static_cast<size_t>(n)),
        counts(static_cast<size_t>(n)),
        ints(static_cast<size_t>(n) * 2),
        children(static_cast<size_t>(n)) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string reason;
  std::vector<const void*> sends;
  std::vector<void*> recvs;
  std::vector<const int64_t*> counts;  // Alltoallv: each rank's send_bytes
  std::vector<int> ints;  // Split: color, key per rank; Alltoallv: whether a rank's counts disagree
  std::vector<std::shared_ptr<State>> children;  // Split: the new groups' states, by leader rank

  Status Wait(int rank, const std::string& host) {
    std::unique_lock lock(mu);
    const uint64_t gen = generation;
    if (!aborted && ++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait(lock, [&] { return generation != gen || aborted; });
    }
    if (aborted) return UnavailableError("in-process group aborted: " + reason + internal::RankOnHost(rank, host));
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

using State = InProcessGroup::State;

const std::byte* At(const void* p, int64_t offset) { return static_cast<const std::byte*>(p) + offset; }
std::byte* At(void* p, int64_t offset) { return static_cast<std::byte*>(p) + offset; }
// memcpy without its null-pointer precondition: a rank may send or receive an empty block
// (Alltoallv, a zero-count collective) whose buffer is null.
void Copy(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, static_cast<size_t>(bytes));
}

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<State> state, int rank, std::vector<std::string> hosts)
      : state_(std::move(state)), rank_(rank), hosts_(std::move(hosts)) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  const std::string& host() const override { return hosts_[static_cast<size_t>(rank_)]; }
  std::string library() const override { return "in-process"; }

  Status Barrier() override { return Wait(); }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    CUPCAKE_RETURN_IF_ERROR(Post(buf, buf));
    if (rank_ != root) Copy(buf, state_->sends[static_cast<size_t>(root)], bytes);
    return Wait();
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(internal::CheckReduce("Allreduce", type, op, rank_, host()));
    CUPCAKE_RETURN_IF_ERROR(Post(send, recv));
    const int64_t elem = DataTypeBytes(type), w = size();
    // Phase 1 (reduce-scatter): chunk rank_ of recv = the reduction over ranks in rank order,
    // built in blocks on the stack (a runtime step allocates nothing), written once per block.
    const int64_t begin = count * rank_ / w, end = count * (rank_ + 1) / w;
    alignas(64) std::byte block[kBlockBytes];
    const int64_t per_block = kBlockBytes / elem;
    for (int64_t at = begin; at < end; at += per_block) {
      const int64_t n = std::min(per_block, end - at);
      Copy(block, At(state_->sends[0], at * elem), n * elem);
      for (int r = 1; r < w; ++r) ReduceInto(At(state_->sends[static_cast<size_t>(r)], at * elem), block, n, type, op);
      Copy(At(recv, at * elem), block, n * elem);
    }
    CUPCAKE_RETURN_IF_ERROR(Wait());
    // Phase 2 (allgather): the other ranks' chunks from their outputs.
    for (int r = 0; r < w; ++r) {
      if (r == rank_) continue;
      const int64_t b = count * r / w, e = count * (r + 1) / w;
      Copy(At(recv, b * elem), At(state_->recvs[static_cast<size_t>(r)], b * elem), (e - b) * elem);
    }
    return Wait();
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(Post(send, recv));
    for (int r = 0; r < size(); ++r)
      Copy(At(recv, r * bytes_per_rank), state_->sends[static_cast<size_t>(r)], bytes_per_rank);
    return Wait();
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(internal::CheckReduce("ReduceScatter", type, op, rank_, host()));
    CUPCAKE_RETURN_IF_ERROR(Post(send, recv));
    const int64_t block = count_per_rank * DataTypeBytes(type);
    Copy(recv, At(state_->sends[0], rank_ * block), block);
    for (int r = 1; r < size(); ++r)
      ReduceInto(At(state_->sends[static_cast<size_t>(r)], rank_ * block), recv, count_per_rank, type, op);
    return Wait();
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(Post(send, recv));
    for (int r = 0; r < size(); ++r)
      Copy(At(recv, r * bytes_per_rank), At(state_->sends[static_cast<size_t>(r)], rank_ * bytes_per_rank),
           bytes_per_rank);
    return Wait();
  }
  Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                   std::span<const int64_t> recv_bytes) override {
    CUPCAKE_RETURN_IF_ERROR(internal::CheckAlltoallv(send_bytes, recv_bytes, size(), rank_, host()));
    state_->counts[static_cast<size_t>(rank_)] = send_bytes.data();
    CUPCAKE_RETURN_IF_ERROR(Post(send, recv));
    // Every rank checks what the others send it and says whether it disagrees (ints[2 r]) before
    // anyone aborts: a rank that aborted would return and free its counts and buffers while the
    // others still read them. After the barrier the counts are no longer read.
    std::string disagreement;
    for (int r = 0; r < size() && disagreement.empty(); ++r) {
      const int64_t sent = state_->counts[static_cast<size_t>(r)][rank_];
      if (sent != recv_bytes[static_cast<size_t>(r)])
        disagreement = "Alltoallv: rank " + std::to_string(r) + " sends " + std::to_string(sent) + " bytes to rank " +
                       std::to_string(rank_) + ", which expects " + std::to_string(recv_bytes[static_cast<size_t>(r)]);
    }
    std::vector<int64_t> offsets(static_cast<size_t>(size()));  // where rank r's block for me starts
    for (int r = 0; r < size(); ++r)
      for (int j = 0; j < rank_; ++j) offsets[static_cast<size_t>(r)] += state_->counts[static_cast<size_t>(r)][j];
    state_->ints[2 * static_cast<size_t>(rank_)] = disagreement.empty() ? 0 : 1;
    CUPCAKE_RETURN_IF_ERROR(Wait());
    int first_disagreeing = -1;
    for (int r = 0; r < size() && first_disagreeing < 0; ++r)
      if (state_->ints[2 * static_cast<size_t>(r)] != 0) first_disagreeing = r;
    if (first_disagreeing >= 0) {
      // One rank names the disagreement; every rank returns the group's abort (buffers untouched).
      if (first_disagreeing == rank_) state_->Abort(disagreement);
      return Wait();
    }
    int64_t out = 0;
    for (int r = 0; r < size(); ++r) {
      const int64_t bytes = recv_bytes[static_cast<size_t>(r)];
      Copy(At(recv, out), At(state_->sends[static_cast<size_t>(r)], offsets[static_cast<size_t>(r)]), bytes);
      out += bytes;
    }
    return Wait();
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    State& s = *state_;
    s.ints[2 * static_cast<size_t>(rank_)] = color;
    s.ints[2 * static_cast<size_t>(rank_) + 1] = key;
    CUPCAKE_RETURN_IF_ERROR(Wait());
    std::vector<std::pair<int, int>> members;  // (key, rank) of my color
    int leader = size();  // the lowest rank of my color makes the new state
    for (int r = 0; r < size(); ++r) {
      if (color < 0 || s.ints[2 * static_cast<size_t>(r)] != color) continue;
      members.emplace_back(s.ints[2 * static_cast<size_t>(r) + 1], r);
      leader = std::min(leader, r);
    }
    std::sort(members.begin(), members.end());
    if (leader == rank_)
      s.children[static_cast<size_t>(rank_)] = std::make_shared<State>(static_cast<int>(members.size()));
    CUPCAKE_RETURN_IF_ERROR(Wait());
    std::unique_ptr<Communicator> child;
    if (!members.empty()) {
      std::vector<std::string> hosts;
      int new_rank = 0;
      for (size_t i = 0; i < members.size(); ++i) {
        hosts.push_back(hosts_[static_cast<size_t>(members[i].second)]);
        if (members[i].second == rank_) new_rank = static_cast<int>(i);
      }
      child = std::make_unique<InProcessCommunicator>(s.children[static_cast<size_t>(leader)], new_rank, hosts);
    }
    CUPCAKE_RETURN_IF_ERROR(Wait());
    if (leader == rank_) s.children[static_cast<size_t>(rank_)].reset();
    return child;
  }
  void Abort(const std::string& reason) override { state_->Abort(reason); }

 private:
  static constexpr int64_t kBlockBytes = 4096;
  Status Wait() { return state_->Wait(rank_, host()); }
  Status Post(const void* send, void* recv) {
    state_->sends[static_cast<size_t>(rank_)] = send;
    state_->recvs[static_cast<size_t>(rank_)] = recv;
    return Wait();
  }

  std::shared_ptr<State> state_;
  int rank_;
  std::vector<std::string> hosts_;
};

}  // namespace

InProcessGroup::InProcessGroup(int size, std::vector<std::string> hosts)
    : state_(std::make_shared<State>(size)), hosts_(std::move(hosts)) {
  if (hosts_.empty()) hosts_.assign(static_cast<size_t>(size), "localhost");
}

std::unique_ptr<Communicator> InProcessGroup::Rank(int rank) {
  return std::make_unique<InProcessCommunicator>(state_, rank, hosts_);
}

}  // namespace cupcake::comm

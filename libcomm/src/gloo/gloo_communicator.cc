// The gloo backend (gloo.h): one gloo context per communicator over the TCP transport, the ranks
// meeting through a KeyValueStore. gloo reports failures by throwing (gloo::Exception and
// its IoException, EnforceNotMet); every call into gloo is wrapped by Guard, which turns them
// into a Status naming the call, gloo's message, the rank and the host.
#include "gloo/gloo_communicator.h"

#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "common.h"

namespace cupcake::comm::internal {
namespace {

std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

// " (rank 1 of 2 on host-a)": the world of a set-up error.
std::string World(int rank, int size, const std::string& host) {
  return " (rank " + std::to_string(rank) + " of " + std::to_string(size) + " on " + host + ")";
}

// What a store failure carries through gloo's code, which knows only exceptions.
struct StoreFailure {
  Status status;
};

// gloo's store interface over ours: gloo calls it from connectFullMesh, on the calling thread.
class StoreAdapter final : public gloo::rendezvous::Store {
 public:
  StoreAdapter(KeyValueStore& store, std::chrono::milliseconds timeout) : store_(store), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    if (Status s = store_.Set(key, std::string(data.begin(), data.end())); !s.ok()) throw StoreFailure{s};
  }
  std::vector<char> get(const std::string& key) override {
    const std::string k[] = {key};
    if (Status s = store_.Wait(k, timeout_); !s.ok()) throw StoreFailure{s};
    StatusOr<std::string> v = store_.Get(key);
    if (!v.ok()) throw StoreFailure{v.status()};
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    if (Status s = store_.Wait(keys, timeout); !s.ok()) throw StoreFailure{s};
  }

 private:
  KeyValueStore& store_;
  std::chrono::milliseconds timeout_;
};

// A connected context of `size` ranks, meeting through `store` (already prefixed). A barrier
// ends it: connectFullMesh may return on one rank before its peers have connected, and a rank
// that then closed its context at once would fail their connecting.
StatusOr<std::shared_ptr<gloo::Context>> Connect(KeyValueStore& store, int rank, int size,
                                                 std::shared_ptr<gloo::transport::Device>& device,
                                                 std::chrono::milliseconds timeout, const std::string& host) {
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(timeout);
    StoreAdapter adapter(store, timeout);
    context->connectFullMesh(adapter, device);
    gloo::BarrierOptions barrier(context);
    barrier.setTimeout(timeout);
    gloo::barrier(barrier);
    return std::shared_ptr<gloo::Context>(std::move(context));
  } catch (const StoreFailure& f) {
    return Status(f.status.code(), "gloo communicator: rendezvous: " + f.status.message() + World(rank, size, host));
  } catch (const std::exception& e) {
    return UnavailableError(std::string("gloo communicator: connecting the ranks: ") + e.what() +
                            World(rank, size, host));
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<KeyValueStore> store, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context, std::string host, std::chrono::milliseconds timeout)
      : store_(std::move(store)),
        device_(std::move(device)),
        context_(std::move(context)),
        host_(std::move(host)),
        timeout_(timeout) {}
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  const std::string& host() const override { return host_; }
  std::string library() const override {
    return "gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." + std::to_string(GLOO_VERSION_MINOR) + "." +
           std::to_string(GLOO_VERSION_PATCH) + " (tcp)";
  }

  Status Barrier() override {
    return Guard("Barrier", [&] {
      gloo::BarrierOptions opts(context_);
      Prepare(opts);
      gloo::barrier(opts);
    });
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    CUPCAKE_RETURN_IF_ERROR(Count("Broadcast", bytes));
    if (root < 0 || root >= size())
      return InvalidArgumentError("Broadcast: root out of range; got " + std::to_string(root) + ", expected 0 <= root < " +
                                  std::to_string(size()) + RankOnHost(rank(), host_));
    if (bytes == 0) return Status::Ok();
    return Guard("Broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      Prepare(opts);
      opts.setRoot(root);
      opts.setOutput(static_cast<char*>(buf), static_cast<size_t>(bytes));
      gloo::broadcast(opts);
    });
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(Count("Allreduce", count));
    CUPCAKE_RETURN_IF_ERROR(CheckReduce("Allreduce", type, op, rank(), host_));
    return ChunkedAllreduce(send, recv, count, type, op);
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(Count("Allgather", bytes_per_rank));
    return RawAllgather(send, recv, bytes_per_rank, "Allgather");
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(Count("ReduceScatter", count_per_rank));
    CUPCAKE_RETURN_IF_ERROR(CheckReduce("ReduceScatter", type, op, rank(), host_));
    const int64_t block = count_per_rank * DataTypeBytes(type);
    chunks_.resize(static_cast<size_t>(block * size()));
    CUPCAKE_RETURN_IF_ERROR(RawAlltoall(send, chunks_.data(), block, "ReduceScatter"));
    ReduceBlocks(block, count_per_rank, type, op);
    if (block > 0) std::memcpy(recv, chunks_.data(), static_cast<size_t>(block));
    return Status::Ok();
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(Count("Alltoall", bytes_per_rank));
    return RawAlltoall(send, recv, bytes_per_rank, "Alltoall");
  }
  Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                   std::span<const int64_t> recv_bytes) override {
    CUPCAKE_RETURN_IF_ERROR(CheckAlltoallv(send_bytes, recv_bytes, size(), rank(), host_));
    const int64_t send_total = std::accumulate(send_bytes.begin(), send_bytes.end(), int64_t{0});
    const int64_t recv_total = std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0});
    CUPCAKE_RETURN_IF_ERROR(Count("Alltoallv", send_total));
    CUPCAKE_RETURN_IF_ERROR(Count("Alltoallv", recv_total));
    // gloo makes a transport buffer of each side; an empty side gets one of our own bytes.
    char unused = 0;
    return Guard("Alltoallv", [&] {
      gloo::AlltoallvOptions opts(context_);
      Prepare(opts);
      opts.setInput(send_total > 0 ? static_cast<char*>(const_cast<void*>(send)) : &unused,
                    std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
      opts.setOutput(recv_total > 0 ? static_cast<char*>(recv) : &unused,
                     std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
      gloo::alltoallv(opts);
    });
  }

  // 1. Every rank's (color, key) by an allgather.
  // 2. The members of my color ordered by (key, rank): my new rank is my place among them.
  // 3. They meet under the prefix "split<n>/<color>/" of this communicator's store, n counting
  //    this communicator's splits (the same on every rank: Split is collective).
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    const int32_t mine[2] = {color, key};
    std::vector<int32_t> all(static_cast<size_t>(2 * size()));
    CUPCAKE_RETURN_IF_ERROR(Allgather(mine, all.data(), sizeof mine));
    const std::string prefix = "split" + std::to_string(splits_++) + "/" + std::to_string(color) + "/";
    if (color < 0) return std::unique_ptr<Communicator>();
    std::vector<std::pair<int32_t, int>> members;  // (key, old rank)
    for (int r = 0; r < size(); ++r)
      if (all[static_cast<size_t>(2 * r)] == color) members.emplace_back(all[static_cast<size_t>(2 * r + 1)], r);
    std::sort(members.begin(), members.end());
    const int new_rank = static_cast<int>(
        std::find(members.begin(), members.end(), std::make_pair(static_cast<int32_t>(key), rank())) - members.begin());
    auto store = PrefixStore(store_, prefix);
    CUPCAKE_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> context,
                             Connect(*store, new_rank, static_cast<int>(members.size()), device_, timeout_, host_));
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(store, device_, std::move(context), host_, timeout_));
  }

  void Abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (aborted_.load()) return;
      abort_reason_ = reason;
      aborted_.store(true);
    }
    std::fprintf(stderr, "cupcake: aborting the gloo group: %s%s\n", reason.c_str(), RankOnHost(rank(), host_).c_str());
    try {
      context_->closeConnections();
    } catch (const std::exception&) {  // already closed by a failure: nothing more to close
    }
  }

 private:
  // Reduce-scatter by an alltoall, then allgather (as MpiCommunicator's ChunkedAllreduce):
  // the count split into size() chunks of ceil(count / size()) elements (the last padded),
  // chunk j reduced on rank j over the ranks' copies in rank order, then gathered back.
  Status ChunkedAllreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) {
    if (count == 0) return Status::Ok();
    const int64_t width = DataTypeBytes(type), p = size(), chunk = (count + p - 1) / p;
    const int64_t padded = chunk * p * width;
    padded_.assign(static_cast<size_t>(padded), std::byte{0});
    std::memcpy(padded_.data(), send, static_cast<size_t>(count * width));
    chunks_.resize(static_cast<size_t>(padded));
    CUPCAKE_RETURN_IF_ERROR(RawAlltoall(padded_.data(), chunks_.data(), chunk * width, "Allreduce"));
    ReduceBlocks(chunk * width, chunk, type, op);
    CUPCAKE_RETURN_IF_ERROR(RawAllgather(chunks_.data(), padded_.data(), chunk * width, "Allreduce"));
    std::memcpy(recv, padded_.data(), static_cast<size_t>(count * width));
    return Status::Ok();
  }
  // chunks_ holds size() blocks of `block` bytes (`count` elements); block 0 becomes their
  // reduction, in rank order.
  void ReduceBlocks(int64_t block, int64_t count, DataType type, ReduceOp op) {
    for (int64_t r = 1; r < size(); ++r) ReduceInto(chunks_.data() + r * block, chunks_.data(), count, type, op);
  }
  Status RawAlltoall(const void* send, void* recv, int64_t bytes_per_rank, const char* call) {
    if (bytes_per_rank == 0) return Status::Ok();
    const size_t total = static_cast<size_t>(bytes_per_rank * size());
    return Guard(call, [&] {
      gloo::AlltoallOptions opts(context_);
      Prepare(opts);
      opts.setInput(static_cast<char*>(const_cast<void*>(send)), total);
      opts.setOutput(static_cast<char*>(recv), total);
      gloo::alltoall(opts);
    });
  }
  Status RawAllgather(const void* send, void* recv, int64_t bytes_per_rank, const char* call) {
    if (bytes_per_rank == 0) return Status::Ok();
    return Guard(call, [&] {
      gloo::AllgatherOptions opts(context_);
      Prepare(opts);
      opts.setInput(static_cast<char*>(const_cast<void*>(send)), static_cast<size_t>(bytes_per_rank));
      opts.setOutput(static_cast<char*>(recv), static_cast<size_t>(bytes_per_rank * size()));
      gloo::allgather(opts);
    });
  }

  // A fresh tag per collective (the same sequence on every rank), so that a message left over
  // from a failed collective is never taken for one of the next; and the communicator's timeout.
  template <typename Options>
  void Prepare(Options& opts) {
    opts.setTag(next_tag_++);
    opts.setTimeout(timeout_);
  }

  // Runs `body` (calls into gloo), turning its exceptions into a Status; refuses after Abort.
  template <typename Body>
  Status Guard(const char* call, Body body) {
    if (aborted_.load()) return Aborted(call);
    try {
      body();
      return Status::Ok();
    } catch (const std::exception& e) {
      if (aborted_.load()) return Aborted(call);
      return UnavailableError(std::string(call) + ": gloo: " + e.what() + RankOnHost(rank(), host_));
    }
  }
  Status Aborted(const char* call) {
    std::lock_guard<std::mutex> lock(abort_mu_);
    return UnavailableError(std::string(call) + ": the group was aborted: " + abort_reason_ + RankOnHost(rank(), host_));
  }
  Status Count(std::string_view call, int64_t count) const {
    return CheckCount(call, count, INT64_MAX / 16, rank(), host_);
  }

  std::shared_ptr<KeyValueStore> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  std::string host_;
  std::chrono::milliseconds timeout_;
  uint32_t next_tag_ = 1;  // 0: Connect's barrier
  int splits_ = 0;
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
  std::vector<std::byte> chunks_, padded_;  // the reductions' buffers, kept between calls
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(std::shared_ptr<KeyValueStore> store, int rank, int size,
                                                             const GlooOptions& options) {
  // gloo's TCP transport writes without MSG_NOSIGNAL: a write to a peer that just died or gave
  // up raises SIGPIPE, whose default action ends this process before the write's error reaches
  // the collective. A dead peer must be an error the job sees (UNAVAILABLE), so a process that
  // left SIGPIPE at its default ignores it from here on (Python and most servers already do); a
  // handler the process installed is kept.
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  const std::string host = HostName();
  std::shared_ptr<gloo::transport::Device> device;
  try {
    gloo::transport::tcp::attr attr;
    if (!options.iface.empty())
      attr.iface = options.iface;
    else
      attr.hostname = options.hostname.empty() ? host : options.hostname;
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return UnavailableError("gloo communicator: no TCP device on " +
                            (options.iface.empty() ? "host '" + (options.hostname.empty() ? host : options.hostname)
                                                   : "interface '" + options.iface) +
                            "': " + e.what() + World(rank, size, host));
  }
  auto world = PrefixStore(std::move(store), "world/");
  CUPCAKE_ASSIGN_OR_RETURN(std::shared_ptr<gloo::Context> context,
                           Connect(*world, rank, size, device, options.timeout, host));
  return std::unique_ptr<Communicator>(
      std::make_unique<GlooCommunicator>(world, std::move(device), std::move(context), host, options.timeout));
}

}  // namespace cupcake::comm::internal

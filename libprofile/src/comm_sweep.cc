#include "cupcake/profile/comm_sweep.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "cupcake/profile/profile_run.h"
#include "cupcake/proto/names.h"

namespace cupcake::profile {
namespace {

using comm::Communicator;
using comm::DataType;
using comm::ReduceOp;

// The value rank `rank` puts at `index` of its send buffer: small integers, so that every
// expected result is exact: in float, and, for float16 sums, below 2048 (0 or 1 per rank, and
// ranks past 2047 add 0).
int Pattern(int rank, int64_t index, pb::DType dtype) {
  if (dtype == pb::FLOAT16) return rank < 2048 ? static_cast<int>((rank + index) % 2) : 0;
  return static_cast<int>(rank + 1 + index % 5);
}

// The bytes of a small non-negative integer as a float, or as a binary16 (exact below 2048).
void Encode(int v, pb::DType dtype, std::byte* out) {
  if (dtype != pb::FLOAT16) {
    const float f = static_cast<float>(v);
    std::memcpy(out, &f, 4);
    return;
  }
  uint16_t h = 0;
  if (v > 0) {
    const int e = 31 - __builtin_clz(static_cast<unsigned>(v));  // v = 1.m x 2^e
    h = static_cast<uint16_t>(((e + 15) << 10) | ((static_cast<unsigned>(v) << (10 - e)) & 0x3ff));
  }
  std::memcpy(out, &h, 2);
}

struct Planned {
  pb::Scope scope;
  pb::CommOp op;
  pb::DType dtype;  // of the reduction; DTYPE_UNSPECIFIED: float32
  int64_t size;  // stored size (bytes of each rank's send buffer)
  bool busy;  // measured beside a busy core (CommSweepOptions::busy)
  bool chained;  // measured on calls back to back (CommSweepOptions::chained)
};

// Calls per timed chain (CommSweepOptions::chained): the first ends where the time starts, so a
// chain times kChainCalls - 1 calls that each follow another.
constexpr int kChainCalls = 3;

// A thread that keeps one core busy with floating-point work until destroyed: what a CPU job's
// backward does beside a collective in flight (CommSweepOptions::busy). Both it and the calling
// (sweeping) thread are pinned to one CPU of the caller's affinity mask, the `slot`-th modulo
// their count (the rank, so ranks spread over the cores), so the collective always shares its
// core with the busy thread, as a job's communication thread shares a core with a backward.
// Unpinned, the scheduler sometimes put two ranks' busy threads on one core and their sweeping
// threads on the other, which measured idle-core times (docs/MODEL.md, "Busy cores"). Pinning
// is best effort (where the OS refuses it the threads run where the scheduler puts them); the
// caller's mask is restored at the end.
class BusyCore {
 public:
  explicit BusyCore(int slot) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (pthread_getaffinity_np(pthread_self(), sizeof mask, &mask) == 0 && CPU_COUNT(&mask) > 0) {
      saved_ = mask;
      int cpu = -1;
      for (int c = 0, seen = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &mask) && seen++ == slot % CPU_COUNT(&mask)) cpu = c;
      CPU_ZERO(&one_);
      CPU_SET(cpu, &one_);
      pinned_ = pthread_setaffinity_np(pthread_self(), sizeof one_, &one_) == 0;
    }
    thread_ = std::thread([this] { Spin(); });
    while (!spinning_.load()) std::this_thread::yield();  // the first point is measured beside it
  }
  BusyCore(const BusyCore&) = delete;
  BusyCore& operator=(const BusyCore&) = delete;
  ~BusyCore() {
    stop_.store(true, std::memory_order_relaxed);
    thread_.join();
    if (saved_) pthread_setaffinity_np(pthread_self(), sizeof *saved_, &*saved_);
  }
 private:
  void Spin() {
    if (pinned_) pthread_setaffinity_np(pthread_self(), sizeof one_, &one_);
    spinning_.store(true);
    std::vector<float> a(16384, 1.0f), b(16384, 0.5f);  // 128 KiB: in cache, as a kernel's tile
    while (!stop_.load(std::memory_order_relaxed)) {
      for (size_t i = 0; i < a.size(); ++i) a[i] = a[i] * 0.999f + b[i];
      result_ = a[0];
    }
  }

  std::optional<cpu_set_t> saved_;
  cpu_set_t one_{};
  bool pinned_ = false;
  std::atomic<bool> spinning_{false};
  std::atomic<bool> stop_{false};
  volatile float result_ = 0;  // keeps the loop from being optimized away
  std::thread thread_;  // started last, once the members above exist
};

// The stored size of `size` for `op` on `w` ranks, 0 when it rounds to nothing.
int64_t StoredSize(pb::CommOp op, int64_t size, int w) {
  if (op == pb::REDUCE_SCATTER || op == pb::ALLTOALL) return size / (4 * w) * (4 * w);
  return size / 4 * 4;
}

// One pass over a point: the collective on `data`, the barriers and the result exchange on
// `control` (the same ranks). Appends this rank's timed calls to `us`; returns the wrong
// iterations (wrong on any rank). A chained point's iteration is a chain of kChainCalls calls
// after one barrier, its time the chain's per call after the first one's end; its allreduces run
// out of place, so that no copy of the input separates them.
StatusOr<int> Measure(Communicator& control, Communicator& data, const Planned& p, int warmup, int iters,
                      Clock& clock, std::vector<double>& us) {
  const pb::CommOp op = p.op;
  const int w = data.size(), me = data.rank();
  const int64_t elem = p.dtype == pb::FLOAT16 ? 2 : 4;
  const int64_t n = p.size / elem;  // elements in the send buffer
  const int64_t block = op == pb::REDUCE_SCATTER || op == pb::ALLTOALL ? n / w : n;
  int64_t recv_n = n;
  if (op == pb::ALLGATHER) recv_n = n * w;
  if (op == pb::REDUCE_SCATTER) recv_n = block;
  auto expected = [&](int64_t i) -> int {
    auto sum = [&](int64_t at) {
      int s = 0;
      for (int r = 0; r < w; ++r) s += Pattern(r, at, p.dtype);
      return s;
    };
    switch (op) {
      case pb::ALLREDUCE: return sum(i);
      case pb::ALLGATHER: return Pattern(static_cast<int>(i / n), i % n, p.dtype);
      case pb::REDUCE_SCATTER: return sum(me * block + i);
      case pb::ALLTOALL: return Pattern(static_cast<int>(i / block), me * block + i % block, p.dtype);
      default: return Pattern(0, i, p.dtype);  // broadcast from rank 0
    }
  };
  // Host images of the buffers; the communicator's own buffers may be GPU memory.
  const int64_t got_n = op == pb::BROADCAST ? n : recv_n;
  std::vector<std::byte> pattern(static_cast<size_t>(n * elem)), want(static_cast<size_t>(got_n * elem)),
      got(want.size());
  const std::vector<std::byte> cleared(static_cast<size_t>(std::max(n, recv_n) * elem), std::byte{0xff});
  for (int64_t i = 0; i < n; ++i)
    Encode(Pattern(op == pb::BROADCAST ? 0 : me, i, p.dtype), p.dtype, &pattern[i * elem]);
  for (int64_t i = 0; i < got_n; ++i) Encode(expected(i), p.dtype, &want[i * elem]);
  CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer send, data.Allocate(n * elem));
  CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer recv, data.Allocate(recv_n * elem));
  CUPCAKE_RETURN_IF_ERROR(send.CopyFromHost(pattern.data(), n * elem));
  const DataType type = p.dtype == pb::FLOAT16 ? DataType::kFloat16 : DataType::kFloat32;
  std::vector<int> wrong(static_cast<size_t>(warmup + iters), 0);
  auto call = [&]() -> Status {
    switch (op) {
      case pb::ALLREDUCE:
        return data.Allreduce(p.chained ? send.data() : recv.data(), recv.data(), n, type, ReduceOp::kSum);
      case pb::ALLGATHER: return data.Allgather(send.data(), recv.data(), n * elem);
      case pb::REDUCE_SCATTER: return data.ReduceScatter(send.data(), recv.data(), block, type, ReduceOp::kSum);
      case pb::ALLTOALL: return data.Alltoall(send.data(), recv.data(), block * elem);
      default: return data.Broadcast(send.data(), n * elem, 0);
    }
  };
  for (int it = 0; it < warmup + iters; ++it) {
    // Spaced allreduces run in place, as the runtime runs them on flat gradient buffers.
    if (op == pb::ALLREDUCE && !p.chained)
      CUPCAKE_RETURN_IF_ERROR(recv.CopyFromHost(pattern.data(), n * elem));
    else
      CUPCAKE_RETURN_IF_ERROR(recv.CopyFromHost(cleared.data(), recv_n * elem));
    if (op == pb::BROADCAST && me != 0) CUPCAKE_RETURN_IF_ERROR(send.CopyFromHost(cleared.data(), n * elem));
    CUPCAKE_RETURN_IF_ERROR(control.Barrier());
    const int calls = p.chained ? kChainCalls : 1;
    double t0 = clock.NowUs();
    Status s;
    for (int c = 0; c < calls && s.ok(); ++c) {
      s = call();
      if (s.ok() && (c == 0 || c == calls - 1))
        s = data.Synchronize();  // device collectives are enqueued: the time is to completion
      if (c == 0 && calls > 1) t0 = clock.NowUs();
    }
    const double t1 = clock.NowUs();
    CUPCAKE_RETURN_IF_ERROR(s.WithPrefix(std::string(Name(op)) + " of " + std::to_string(p.size) + " bytes"));
    if (it >= warmup) us.push_back((t1 - t0) / (calls > 1 ? calls - 1 : 1));
    CUPCAKE_RETURN_IF_ERROR((op == pb::BROADCAST ? send : recv).CopyToHost(got.data(), got_n * elem));
    wrong[static_cast<size_t>(it)] = got == want ? 0 : 1;
  }
  std::vector<int> any(wrong.size());
  CUPCAKE_RETURN_IF_ERROR(control.Allreduce(wrong.data(), any.data(), static_cast<int64_t>(wrong.size()),
                                            DataType::kInt32, ReduceOp::kMax));
  int count = 0;
  for (int v : any) count += v;
  return count;
}

pb::Curve Key(const Planned& p) {
  pb::Curve c;
  c.set_kind(pb::COMM);
  c.set_comm_op(p.op);
  c.set_scope(p.scope);
  c.set_dtype(p.dtype);
  c.set_busy(p.busy);
  c.set_chained(p.chained);
  return c;
}

}  // namespace

Status AgreeOnConfiguration(Communicator& world, const std::vector<std::pair<std::string, std::string>>& flags) {
  std::string mine;
  for (const auto& [k, v] : flags) mine += k + "=" + v + "\n";
  int64_t max_len = 0;
  // Lengths as doubles (exact below 2^53) keep the interface small.
  double dlen = static_cast<double>(mine.size()), dmax = 0;
  CUPCAKE_RETURN_IF_ERROR(world.Allreduce(&dlen, &dmax, 1, DataType::kFloat64, ReduceOp::kMax));
  max_len = static_cast<int64_t>(dmax) + 1;
  std::vector<char> buf(static_cast<size_t>(max_len), 0), all(static_cast<size_t>(max_len * world.size()));
  std::memcpy(buf.data(), mine.data(), mine.size());
  CUPCAKE_RETURN_IF_ERROR(world.Allgather(buf.data(), all.data(), max_len));
  auto parse = [&](int r) {
    std::map<std::string, std::string> m;
    std::istringstream in(std::string(all.data() + r * max_len));
    for (std::string line; std::getline(in, line);) {
      auto eq = line.find('=');
      m[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return m;
  };
  const auto root = parse(0);
  std::string problems;
  for (int r = 1; r < world.size(); ++r) {
    for (const auto& [k, v] : parse(r)) {
      auto it = root.find(k);
      const std::string expected = it == root.end() ? "(unset)" : it->second;
      if (v != expected)
        problems += (problems.empty() ? "" : "\n") + k + ": ranks disagree; got " + (v.empty() ? "''" : v) +
                    " on rank " + std::to_string(r) + ", expected " + (expected.empty() ? "''" : expected) +
                    " as on rank 0";
    }
  }
  if (!problems.empty())
    return FailedPreconditionError(problems + "\n(every rank must be started with the same flags)");
  return Status::Ok();
}

namespace {

// The points to measure, the same on every rank: per scope (global, and intra and inter when
// `scopes` has them), op and size; allreduce also over float16.
std::vector<Planned> PlanPoints(const std::vector<std::pair<pb::Scope, int>>& scopes,
                                const std::vector<pb::CommOp>& ops, const std::vector<int64_t>& sizes, bool busy,
                                bool chained) {
  std::vector<Planned> plan;
  for (auto [scope, w] : scopes)
    for (pb::CommOp op : ops) {
      std::vector<int64_t> seen;
      for (int64_t s : sizes) {
        int64_t stored = StoredSize(op, s, w);
        if (stored == 0 || std::find(seen.begin(), seen.end(), stored) != seen.end()) continue;
        seen.push_back(stored);
        plan.push_back({scope, op, pb::DTYPE_UNSPECIFIED, stored, busy, chained});
        // The runtime's fp16 compressor sums halves: an allreduce of float16 is its own curve.
        if (op == pb::ALLREDUCE && stored % 2 == 0) plan.push_back({scope, op, pb::FLOAT16, stored, busy, chained});
      }
    }
  return plan;
}

// Rank 0: which planned points the sink already has (1) or not (0).
StatusOr<std::vector<char>> PresentInSink(const std::vector<Planned>& plan, ProfileSink& sink) {
  std::vector<char> present(plan.size(), 0);
  std::map<std::string, std::vector<int64_t>> sizes_of;
  for (size_t i = 0; i < plan.size(); ++i) {
    pb::Curve key = Key(plan[i]);
    auto it = sizes_of.find(CurveKey(key));
    if (it == sizes_of.end()) {
      CUPCAKE_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, sink.PointSizes(key));
      it = sizes_of.emplace(CurveKey(key), std::move(sizes)).first;
    }
    present[i] = std::binary_search(it->second.begin(), it->second.end(), plan[i].size) ? 1 : 0;
  }
  return present;
}

Status CheckSweepOptions(const CommSweepOptions& options, bool root, const ProfileSink* sink) {
  if (options.sizes.empty())
    return InvalidArgumentError("sizes: empty size range; got no sizes, expected at least one");
  for (int64_t s : options.sizes)
    if (s < 4 || s > (int64_t{1} << 30))
      return InvalidArgumentError("sizes: out of range; got " + std::to_string(s) + ", expected 4 <= bytes <= 2^30");
  if (options.warmup < 0 || options.iters < 1 || options.rounds < 1)
    return InvalidArgumentError("warmup, iters, rounds: out of range; got " + std::to_string(options.warmup) + ", " +
                                std::to_string(options.iters) + ", " + std::to_string(options.rounds) +
                                ", expected warmup >= 0, iters >= 1 and rounds >= 1");
  if (options.busy && options.chained)
    return InvalidArgumentError("busy, chained: both set; expected at most one (a sweep measures one condition)");
  if (root && sink == nullptr) return InvalidArgumentError("sink: rank 0 needs a sink");
  return Status::Ok();
}

// The communicators of each scope: intra (the ranks of each host) and inter (one rank per
// host), control and data split alike; null where this rank takes no part or there are none.
struct Scopes {
  std::unique_ptr<Communicator> intra, inter, intra_data, inter_data;
};

StatusOr<Scopes> SplitScopes(Communicator& world, Communicator& data, const Topology& topo, bool hierarchical) {
  Scopes s;
  if (!hierarchical) return s;
  const int host = topo.host_of_rank[static_cast<size_t>(world.rank())], leader = topo.local_rank == 0 ? 0 : -1;
  CUPCAKE_ASSIGN_OR_RETURN(s.intra, world.Split(host, world.rank()));
  CUPCAKE_ASSIGN_OR_RETURN(s.inter, world.Split(leader, world.rank()));
  if (&data != &world) {
    CUPCAKE_ASSIGN_OR_RETURN(s.intra_data, data.Split(host, world.rank()));
    CUPCAKE_ASSIGN_OR_RETURN(s.inter_data, data.Split(leader, world.rank()));
  }
  return s;
}

// After a point's last pass: its time (the slowest rank's median over all its timed calls; for
// intra, the slowest host), reported and, when no call was wrong, stored by rank 0, which
// sets `stored` to the sink's status. Collective over `world` (the returned Status is a
// collective's); `comm` is the point's scope, null on ranks outside it.
Status StorePoint(Communicator& world, Communicator* comm, const Planned& p, const CommSweepOptions& options,
                  std::vector<double>& us, int wrong, std::map<std::string, int>& curve_wrong, ProfileSink* sink,
                  SweepReport& report, Status& stored) {
  if (p.scope == pb::INTER && comm == nullptr) return Status::Ok();
  double median = Median(std::move(us)), slowest = 0;
  CUPCAKE_RETURN_IF_ERROR(comm->Allreduce(&median, &slowest, 1, DataType::kFloat64, ReduceOp::kMax));
  if (p.scope == pb::INTRA) {  // the slowest host, and every rank learns of wrong results
    double all = 0;
    CUPCAKE_RETURN_IF_ERROR(world.Allreduce(&slowest, &all, 1, DataType::kFloat64, ReduceOp::kMax));
    slowest = all;
    int any = 0;
    CUPCAKE_RETURN_IF_ERROR(world.Allreduce(&wrong, &any, 1, DataType::kInt32, ReduceOp::kMax));
    wrong = any;
  }
  pb::Curve key = Key(p);
  const std::string name = CurveKey(key);
  curve_wrong[name] += wrong;
  ++(wrong > 0 ? report.wrong : report.measured);
  report.points.push_back({name, p.size, slowest, wrong});
  if (world.rank() != 0) return Status::Ok();
  key.set_method("wall");
  key.set_warmup(options.warmup);
  key.set_iters(options.iters * options.rounds);
  key.set_wrong(curve_wrong[name]);
  if (wrong == 0) {
    stored = sink->AddPoint(key, p.size, slowest, options.force);
  } else {
    stored = sink->UpdateCurveMetadata(key);
    if (stored.code() == StatusCode::kNotFound) stored = Status::Ok();
  }
  return Status::Ok();
}

}  // namespace

StatusOr<SweepReport> SweepComm(Communicator& world, const CommSweepOptions& options, Clock& clock, ProfileSink* sink,
                                const ProgressFn& progress) {
  const bool root = world.rank() == 0;
  CUPCAKE_RETURN_IF_ERROR(CheckSweepOptions(options, root, sink));
  std::vector<pb::CommOp> ops = options.ops;
  if (ops.empty()) ops = {pb::ALLREDUCE, pb::ALLGATHER, pb::REDUCE_SCATTER, pb::ALLTOALL, pb::BROADCAST};

  CUPCAKE_ASSIGN_OR_RETURN(Topology topo, DiscoverTopology(world));
  const int nodes = static_cast<int>(topo.hosts.size());
  const bool hierarchical = nodes > 1 && topo.ranks_per_host > 0;
  Communicator& data = options.data != nullptr ? *options.data : world;
  if (data.size() != world.size() || data.rank() != world.rank())
    return InvalidArgumentError("data: not the world's ranks; got rank " + std::to_string(data.rank()) + " of " +
                                std::to_string(data.size()) + ", expected rank " + std::to_string(world.rank()) +
                                " of " + std::to_string(world.size()));
  CUPCAKE_ASSIGN_OR_RETURN(Scopes split, SplitScopes(world, data, topo, hierarchical));

  // 1. The plan, the same on every rank; rank 0 marks what the sink has and broadcasts it.
  std::vector<std::pair<pb::Scope, int>> scopes{{pb::GLOBAL, world.size()}};
  if (hierarchical) {
    scopes.emplace_back(pb::INTRA, topo.ranks_per_host);
    scopes.emplace_back(pb::INTER, nodes);
  }
  const std::vector<Planned> plan = PlanPoints(scopes, ops, options.sizes, options.busy, options.chained);
  std::vector<char> skip(plan.size(), 0);
  if (root && !options.force) {
    CUPCAKE_ASSIGN_OR_RETURN(skip, PresentInSink(plan, *sink));
  }
  CUPCAKE_RETURN_IF_ERROR(world.Broadcast(skip.data(), static_cast<int64_t>(skip.size()), 0));

  // 2. Measure, in `rounds` passes over the points; a point is stored after its last pass.
  std::optional<BusyCore> busy;
  if (options.busy) busy.emplace(world.rank());
  SweepReport report;
  std::map<std::string, int> curve_wrong;  // this run's wrong iterations per curve
  std::vector<std::vector<double>> us(plan.size());  // this rank's timed calls per point
  std::vector<int> wrong(plan.size(), 0);
  const int64_t steps = static_cast<int64_t>(plan.size()) * options.rounds;
  for (int round = 0; round < options.rounds; ++round) {
    const bool last = round == options.rounds - 1;
    for (size_t i = 0; i < plan.size(); ++i) {
      const Planned& p = plan[i];
      Communicator* comm =
          p.scope == pb::GLOBAL ? &world : p.scope == pb::INTRA ? split.intra.get() : split.inter.get();
      Communicator* comm_data = &data == &world         ? comm
                                : p.scope == pb::GLOBAL ? &data
                                : p.scope == pb::INTRA  ? split.intra_data.get()
                                                        : split.inter_data.get();
      Status stored;
      if (skip[i]) {
        if (last) ++report.skipped;
      } else if (p.scope != pb::INTER || comm != nullptr) {
        CUPCAKE_ASSIGN_OR_RETURN(int w, Measure(*comm, *comm_data, p, options.warmup, options.iters, clock, us[i]));
        wrong[i] += w;
      }
      if (last && !skip[i]) {
        CUPCAKE_RETURN_IF_ERROR(
            StorePoint(world, comm, p, options, us[i], wrong[i], curve_wrong, sink, report, stored));
        // Every rank learns whether rank 0 could store the point, so none waits in a
        // collective rank 0 will never join.
        CUPCAKE_RETURN_IF_ERROR(ShareRootStatus(world, stored));
      }
      if (root && progress)
        progress(static_cast<int64_t>(round) * static_cast<int64_t>(plan.size()) + static_cast<int64_t>(i) + 1,
                 steps);
    }
  }
  return report;
}

}  // namespace cupcake::profile

// zen_bytes: bytes per rank of ZenAllreduce beside the allgather scheme, over in-process ranks
// (threads of this process), for the index distributions of docs/ZEN.md. The wall times are
// threads on this machine's cores sharing memory, not a network measurement.
//
//   zen_bytes [--n=4194304] [--iters=3] [--overlap=0.9] [--pool=1.1] [--seed=1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cupcake/comm/zen.h"
#include "zen_indices.h"

namespace cupcake::comm {
namespace {

namespace zen = kernels::zen;

struct Options : bench::IndexSet {
  int iters = 3;
};

struct Row {
  std::vector<ZenStats> stats;
  std::vector<double> times_ms;
  int64_t union_size = 0;
  bool correct = true;
};

Row RunOne(const Options& o, int p, bool overlapping, int64_t k) {
  std::vector<std::vector<uint32_t>> idx(static_cast<size_t>(p));
  std::vector<std::vector<float>> val(static_cast<size_t>(p));
  std::vector<double> dense(static_cast<size_t>(o.n), 0);
  std::vector<bool> present(static_cast<size_t>(o.n), false);
  for (int r = 0; r < p; ++r) {
    idx[static_cast<size_t>(r)] = bench::RankIndices(o, overlapping, r, k);
    for (uint32_t i : idx[static_cast<size_t>(r)]) {
      const float v = static_cast<float>((i + 3 * r) % 64) - 32;  // integers: exact sums
      val[static_cast<size_t>(r)].push_back(v);
      dense[i] += v;
      present[i] = true;
    }
  }
  Row row;
  row.stats.resize(static_cast<size_t>(p));
  std::vector<zen::Sparse> results(static_cast<size_t>(p));
  InProcessGroup group(p);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      auto comm = group.Rank(r);
      for (int it = 0; it < o.iters; ++it) {
        (void)comm->Barrier();
        const auto start = std::chrono::steady_clock::now();
        auto out = ZenAllreduce(*comm, {idx[static_cast<size_t>(r)], val[static_cast<size_t>(r)]}, {.n = o.n},
                                &row.stats[static_cast<size_t>(r)]);
        (void)comm->Barrier();  // the call ends when the slowest rank has its result
        if (r == 0)
          row.times_ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        if (!out.ok()) {
          std::fprintf(stderr, "zen_bytes: rank %d: %s\n", r, out.status().ToString().c_str());
          std::exit(1);
        }
        results[static_cast<size_t>(r)] = std::move(out).value();
      }
    });
  for (auto& t : threads) t.join();
  for (int64_t i = 0; i < o.n; ++i) row.union_size += present[static_cast<size_t>(i)];
  for (const zen::Sparse& result : results) {
    row.correct = row.correct && static_cast<int64_t>(result.indices.size()) == row.union_size;
    for (size_t j = 0; row.correct && j < result.indices.size(); ++j) {
      row.correct = present[result.indices[j]] && result.values[j] == static_cast<float>(dense[result.indices[j]]);
    }
  }
  return row;
}

double Mean(const std::vector<ZenStats>& stats, int64_t (*field)(const ZenStats&)) {
  double sum = 0;
  for (const ZenStats& s : stats) sum += static_cast<double>(field(s));
  return sum / static_cast<double>(stats.size());
}

void PrintRow(const Options& o, int p, double density, bool overlapping) {
  const int64_t k = std::max<int64_t>(1, std::llround(density * static_cast<double>(o.n)));
  Row row = RunOne(o, p, overlapping, k);
  std::sort(row.times_ms.begin(), row.times_ms.end());
  const double counts = Mean(row.stats, [](const ZenStats& s) { return s.counts.sent; });
  const double pairs = Mean(row.stats, [](const ZenStats& s) { return s.pairs.sent; });
  const double sizes = Mean(row.stats, [](const ZenStats& s) { return s.sizes.sent; });
  const double parts = Mean(row.stats, [](const ZenStats& s) { return s.partitions.sent; });
  int64_t max_recv = 0, bitmaps = 0;
  for (const ZenStats& s : row.stats) max_recv = std::max(max_recv, s.Total().received);
  for (zen::Encoding e : row.stats[0].encodings) bitmaps += e == zen::Encoding::kBitmap;
  const double total = counts + pairs + sizes + parts;
  const double allgather = static_cast<double>(AllgatherSchemeBytes(k, p).sent);
  std::printf("%4d %8.4f %12s %9lld %10lld %9.0f %11.0f %9.0f %12.0f %12.0f %12lld %12.0f %7.2f %5lld %10.2f %6s\n", p,
              100 * density, overlapping ? "overlapping" : "uniform", static_cast<long long>(k),
              static_cast<long long>(row.union_size), counts, pairs, sizes, parts, total,
              static_cast<long long>(max_recv), allgather, total > 0 ? allgather / total : 0.0,
              static_cast<long long>(bitmaps), row.times_ms[row.times_ms.size() / 2], row.correct ? "OK" : "FAIL");
}

}  // namespace
}  // namespace cupcake::comm

int main(int argc, char** argv) {
  using namespace cupcake::comm;
  Options o;
  for (int a = 1; a < argc; ++a) {
    if (!cupcake::bench::ParseCommonFlag(argv[a], o, o.iters)) {
      std::fprintf(stderr, "zen_bytes: %s: unknown flag; expected --n, --iters, --overlap, --pool or --seed\n",
                   argv[a]);
      return 2;
    }
  }
  if (!cupcake::bench::CommonFlagsInRange(o, o.iters, cupcake::kernels::zen::kMaxElements)) {
    std::fprintf(
        stderr,
        "zen_bytes: flags: out of range; expected 1 <= n <= 2^31-1, iters >= 1, 0 <= overlap <= 1, pool >= overlap\n");
    return 2;
  }
  std::printf("# zen_bytes --n=%lld --iters=%d --overlap=%g --pool=%g --seed=%llu\n", static_cast<long long>(o.n),
              o.iters, o.overlap, o.pool, static_cast<unsigned long long>(o.seed));
  std::printf(
      "# k = round(density n) distinct indices per rank; uniform: uniform over n, independent per rank;\n"
      "# overlapping: round(overlap k) of them from a hot pool of round(pool k) uniform indices shared by all\n"
      "# ranks, the rest uniform over n. Values: integers, so the check against a dense sum is exact.\n"
      "# Bytes: mean per rank sent to other ranks (own blocks excluded); recv_max: largest total received.\n"
      "# allgather: (P-1) k 8 bytes sent per rank (ring allgather of k (index, value) pairs).\n"
      "# time: median of %d calls, in-process threads on this machine (not a network measurement).\n",
      o.iters);
  std::printf("%4s %8s %12s %9s %10s %9s %11s %9s %12s %12s %12s %12s %7s %5s %10s %6s\n", "P", "dens(%)", "indices",
              "k", "union", "counts(B)", "pairs(B)", "sizes(B)", "parts(B)", "zen_sent(B)", "recv_max(B)",
              "allgather(B)", "ag/zen", "bmaps", "time(ms)", "check");
  for (bool overlapping : {false, true}) {
    for (double density : {0.01, 0.001}) {
      for (int p : {2, 4, 8, 16, 32, 64}) PrintRow(o, p, density, overlapping);
    }
  }
  return 0;
}

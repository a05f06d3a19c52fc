// zen_work_bench: one owner's host work inside Zen's exchange, what the "encode zen" curve
// times (docs/MODEL.md, "The zen scheme"): its own k pairs split by owner, the merge-sum of the
// pairs the W ranks send owner 0, and owner 0's partition encoded; for independent ("uniform"),
// overlapping (bench/comm/zen_indices.h) and identical selections (every rank rank 0's uniform
// indices: union k), so that what the union changes in the merge shows (docs/ZEN.md, "Zen's
// phases"). One thread, no communication; a program to run by hand, never a timed test.
// Counters: union (owner 0's merged pairs), pairs (what it merged).
//
//   build/bench/comm/zen_work_bench [--benchmark_repetitions=3]
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "cupcake/kernels/zen.h"
#include "zen_indices.h"

namespace cupcake::bench {
namespace {

namespace zen = kernels::zen;

constexpr int64_t kN = int64_t{1} << 24;
constexpr uint32_t kSeed = 0x5eed;

constexpr const char* kModes[] = {"uniform", "overlapping", "identical"};

// mode: an index of kModes.
void BM_ZenOwnerWork(benchmark::State& st, int world, double density, int mode) {
  IndexSet o;
  o.n = kN;
  const auto k = static_cast<int64_t>(density * static_cast<double>(kN));
  std::vector<std::vector<uint32_t>> indices(static_cast<size_t>(world));
  const std::vector<float> values(static_cast<size_t>(k), 1.0f);
  std::vector<zen::Pair> received;  // what every rank sends owner 0, in rank order
  for (int r = 0; r < world; ++r) {
    indices[static_cast<size_t>(r)] = RankIndices(o, mode == 1, mode == 2 ? 0 : r, k);
    const zen::Partitioned split = zen::PartitionByOwner({indices[static_cast<size_t>(r)], values}, world, kSeed);
    received.insert(received.end(), split.pairs.begin(), split.pairs.begin() + split.counts[0]);
  }
  std::vector<std::byte> encoded;
  size_t merged = 0;
  for (auto _ : st) {
    const zen::Partitioned mine = zen::PartitionByOwner({indices[0], values}, world, kSeed);
    const zen::Sparse sum = zen::MergeSum(received);
    zen::EncodePartition(sum.view(), 0, kN, world, kSeed, encoded);
    merged = sum.indices.size();
    benchmark::DoNotOptimize(mine.pairs.data());
    benchmark::DoNotOptimize(encoded.data());
  }
  st.counters["union"] = static_cast<double>(merged);
  st.counters["pairs"] = static_cast<double>(received.size());
}

void Register() {
  for (int world : {4, 8})
    for (double density : {0.01, 0.001})
      for (int mode : {0, 1, 2}) {
        const std::string name = "zen_owner_work/W" + std::to_string(world) + "/" +
                                 (density == 0.01 ? "1%" : "0.1%") + "/" + kModes[mode];
        benchmark::RegisterBenchmark(name.c_str(), BM_ZenOwnerWork, world, density, mode)
            ->Unit(benchmark::kMillisecond);
      }
}

}  // namespace
}  // namespace cupcake::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  cupcake::bench::Register();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

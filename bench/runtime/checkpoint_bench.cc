// The checkpointer's per-step copy (docs/CHECKPOINT.md) on one rank: what a snapshot of a model's
// state costs the host, against the floors it is made of. Rows, each over `n` MiB of state split
// as the replay of a model is (2/3 kShared parameters and momentum, copied in the background;
// 1/3 the rank's own error feedback, captured at commit):
//   commit/<n>:   Checkpointer::Commit(step) then WaitForCopy(): the training thread's part and
//                 the background copy into the shared-memory slot, checksummed and fingerprinted;
//   memcpy/<n>:   one memcpy of the same bytes into memory written before (the copy's floor);
//   checksum/<n>: internal::Checksum over the same bytes (one hash pass).
// Bytes counted: the state's, per iteration; Google Benchmark prints them per second of real time
// (the copy runs on a thread of its own). One rank (an in-process communicator): no network.
// For a spread, repeat with --benchmark_repetitions. Never a timed test: run by hand.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "checkpoint_format.h"  // internal: the checksum (bench includes libruntime/src)
#include "cupcake/comm/communicator.h"
#include "cupcake/runtime/checkpoint.h"

namespace {

using namespace cupcake;  // NOLINT

constexpr int64_t kMiB = 1 << 20;

// `n` MiB of floats, every byte written (so no row pays page faults of its source).
std::vector<float> State(int64_t mib, float first) {
  std::vector<float> v(static_cast<size_t>(mib * kMiB / 4));
  for (size_t i = 0; i < v.size(); ++i) v[i] = first + static_cast<float>(i % 4099);
  return v;
}

void Commit(benchmark::State& state) {
  const int64_t mib = state.range(0);
  std::vector<float> shared = State(mib - mib / 3, 1.0f), own = State(mib / 3, -1.0f);
  comm::InProcessGroup group(1);
  std::unique_ptr<comm::Communicator> comm = group.Rank(0);
  runtime::CheckpointOptions options;
  options.name = "bench" + std::to_string(getpid());
  auto made = runtime::Checkpointer::Create(options, comm.get());
  if (!made.ok()) {
    state.SkipWithError(made.status().message().c_str());
    return;
  }
  runtime::Checkpointer& ckpt = **made;
  Status added = ckpt.AddFloats("params", shared, runtime::Capture::kInBackground, runtime::Scope::kShared);
  if (added.ok()) added = ckpt.AddFloats("error_feedback", own, runtime::Capture::kAtCommit);
  if (!added.ok()) {
    state.SkipWithError(added.message().c_str());
    return;
  }
  int64_t step = 0;
  // The first two commits fault in the segment's two slots; the rows time the steady state.
  for (; step < 2; ++step) (void)ckpt.Commit(step + 1);
  for (auto _ : state) {
    Status s = ckpt.Commit(++step);
    if (s.ok()) s = ckpt.WaitForCopy();
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>((shared.size() + own.size()) * 4));
  (void)runtime::Checkpointer::RemoveSegment(options.name, 0);
}

void Memcpy(benchmark::State& state) {
  const std::vector<float> from = State(state.range(0), 1.0f);
  std::vector<float> to = State(state.range(0), 0.0f);
  for (auto _ : state) {
    std::memcpy(to.data(), from.data(), from.size() * 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(from.size() * 4));
}

void Checksum(benchmark::State& state) {
  const std::vector<float> from = State(state.range(0), 1.0f);
  for (auto _ : state)
    benchmark::DoNotOptimize(
        runtime::internal::Checksum(reinterpret_cast<const std::byte*>(from.data()), from.size() * 4));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(from.size() * 4));
}

// 48 MiB: a model of 4 M parameters; 292 MiB: resnet50's replay (25.6 M parameters).
BENCHMARK(Commit)->Name("commit")->Arg(48)->Arg(292)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Memcpy)->Name("memcpy")->Arg(48)->Arg(292)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(Checksum)->Name("checksum")->Arg(48)->Arg(292)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

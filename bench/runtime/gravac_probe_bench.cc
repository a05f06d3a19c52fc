// GraVAC's gain probe (docs/ADAPTIVE.md) against the topk encode it runs beside, on the CPU:
// the controller's own cost per group and step. Rows: probe/<selection>/<n> (one Observe of a
// group with its error-feedback memory: g + e, the squares, two nth_element selections at
// ratios 0.1 and 0.01; randk: its indices) and topk/encode/<n> (the kernels' CPU encode at 0.01
// with residual memory, the work the probe adds to). Bytes counted: 4n per call (the group's
// float32 gradient); Google Benchmark prints GiB/s of CPU time. Same N(0, 1) gradient and
// memory for every row of a size, allocated and written before timing. For a spread, repeat
// with --benchmark_repetitions. Never a timed test: run by hand.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/clock.h"
#include "gravac.h"  // internal: the probe (bench includes libruntime/src)

namespace {

using namespace cupcake;  // NOLINT

std::vector<float> Normal(int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}

void Probe(benchmark::State& state, runtime::internal::Selection selection) {
  const int64_t n = state.range(0);
  const std::vector<float> g = Normal(n, 1), e = Normal(n, 2);
  SteadyClock clock;
  runtime::internal::GainProbe probe(selection, n, 42, &clock);
  probe.SetRatios(0.1, 0.01);
  uint64_t iteration = 0;
  for (auto _ : state) {
    if (Status s = probe.Observe(g, e.data(), 0, iteration++); !s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
  }
  double cost = 0;
  benchmark::DoNotOptimize(probe.Take(&cost));
  state.SetBytesProcessed(state.iterations() * 4 * n);
}

void TopkEncode(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> g = Normal(n, 1);
  kernels::CompressorConfig config;
  config.name = "topk";
  config.n = n;
  config.ratio = 0.01;
  auto c = kernels::MakeCompressor(config, kernels::Backend::kCpu).value();
  std::vector<float> memory(static_cast<size_t>(c->state_floats()));
  std::vector<std::byte> payload(static_cast<size_t>(c->payload_bytes()));
  for (auto _ : state) benchmark::DoNotOptimize(c->Encode(g, memory, 0, payload));
  state.SetBytesProcessed(state.iterations() * 4 * n);
}

BENCHMARK_CAPTURE(Probe, magnitude, runtime::internal::Selection::kMagnitude)
    ->RangeMultiplier(4)->Range(1 << 18, 1 << 24)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Probe, random, runtime::internal::Selection::kRandom)
    ->RangeMultiplier(4)->Range(1 << 18, 1 << 24)->Unit(benchmark::kMillisecond);
BENCHMARK(TopkEncode)->RangeMultiplier(4)->Range(1 << 18, 1 << 24)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();

// Encode and decode throughput per compressor on the CPU backend (and CUDA when a device is
// present), beside a memcpy of the same buffer in the same run.
//
// Throughput = 4n bytes (the uncompressed float32 group) per call: bytes_per_second, printed
// by Google Benchmark as GiB/s (2^30 bytes/s). memcpy copies the same 4n bytes.
// Setup: W = 4 ranks, ratio 0.01, each compressor's default memory; decode sums W payloads
// (allgather compressors) or reads one reduced buffer (allreduce ones).
// Sizes: n = 2^10 .. 2^26 elements, every 16x, plus 2^20 (the target's size).
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/catalogue.h"

namespace {

using namespace cupcake;           // NOLINT
using namespace cupcake::kernels;  // NOLINT

constexpr int kWorld = 4;

std::vector<float> Gradient(int64_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& x : g) x = d(rng);
  return g;
}

struct Setup {
  std::unique_ptr<Compressor> c;
  Buffer grad, state, payloads, out;
};

bool Prepare(benchmark::State& st, const std::string& name, Backend backend, Setup* s) {
  const int64_t n = st.range(0);
  CompressorConfig cfg;
  cfg.name = name;
  cfg.n = n;
  cfg.world_size = kWorld;
  cfg.ratio = 0.01;
  cfg.seed = 3;
  auto c = MakeCompressor(cfg, backend);
  if (!c.ok()) {
    st.SkipWithError(c.status().message().c_str());
    return false;
  }
  s->c = std::move(c).value();
  s->grad = std::move(Buffer::Allocate(backend, 4 * n)).value();
  s->state = std::move(Buffer::Allocate(backend, 4 * s->c->state_floats())).value();
  s->payloads = std::move(Buffer::Allocate(backend, s->c->decode_input_bytes())).value();
  s->out = std::move(Buffer::Allocate(backend, 4 * n)).value();
  auto g = Gradient(n);
  (void)s->grad.CopyFromHost(g.data(), 4 * n);
  (void)s->state.Zero();
  // W payloads: rank r encodes the gradient scaled by r + 1.
  std::vector<std::byte> all;
  std::vector<std::byte> one(static_cast<size_t>(s->c->payload_bytes()));
  Buffer pb = std::move(Buffer::Allocate(backend, s->c->payload_bytes())).value();
  const int ranks = s->c->layout().allreduce ? 1 : kWorld;
  for (int r = 0; r < ranks; ++r) {
    (void)s->c->Encode({s->grad.as<const float>(), static_cast<size_t>(n)},
                       {s->state.as<float>(), static_cast<size_t>(s->c->state_floats())}, r,
                       {pb.as<std::byte>(), one.size()});
    (void)Synchronize(backend);
    (void)pb.CopyToHost(one.data(), s->c->payload_bytes());
    all.insert(all.end(), one.begin(), one.end());
  }
  (void)s->payloads.CopyFromHost(all.data(), static_cast<int64_t>(all.size()));
  return true;
}

void BM_Encode(benchmark::State& st, std::string name, Backend backend) {
  Setup s;
  if (!Prepare(st, name, backend, &s)) return;
  const int64_t n = st.range(0);
  Buffer payload = std::move(Buffer::Allocate(backend, s.c->payload_bytes())).value();
  uint64_t it = 0;
  for (auto _ : st) {
    Status e = s.c->Encode({s.grad.as<const float>(), static_cast<size_t>(n)},
                           {s.state.as<float>(), static_cast<size_t>(s.c->state_floats())}, it++,
                           {payload.as<std::byte>(), static_cast<size_t>(s.c->payload_bytes())});
    if (!e.ok()) st.SkipWithError(e.message().c_str());
    (void)Synchronize(backend);
    benchmark::DoNotOptimize(payload.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 4 * n);
}

void BM_Decode(benchmark::State& st, std::string name, Backend backend) {
  Setup s;
  if (!Prepare(st, name, backend, &s)) return;
  const int64_t n = st.range(0);
  for (auto _ : st) {
    Status e = s.c->Decode({s.payloads.as<const std::byte>(), static_cast<size_t>(s.c->decode_input_bytes())},
                           {s.out.as<float>(), static_cast<size_t>(n)}, 0);
    if (!e.ok()) st.SkipWithError(e.message().c_str());
    (void)Synchronize(backend);
    benchmark::DoNotOptimize(s.out.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 4 * n);
}

void BM_Memcpy(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto g = Gradient(n);
  std::vector<float> dst(static_cast<size_t>(n));
  for (auto _ : st) {
    std::memcpy(dst.data(), g.data(), 4 * n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 4 * n);
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {int64_t{1} << 10, int64_t{1} << 14, int64_t{1} << 18, int64_t{1} << 20, int64_t{1} << 22,
                    int64_t{1} << 26})
    b->Arg(n);
  b->Unit(benchmark::kMicrosecond);
}

int Register() {
  benchmark::RegisterBenchmark("memcpy", BM_Memcpy)->Apply(Sizes);
  for (Backend backend : {Backend::kCpu, Backend::kCuda}) {
    if (!BackendAvailable(backend).ok()) continue;
    for (auto name : CompressorNames()) {
      const std::string tag = std::string(BackendName(backend)) + "/" + std::string(name);
      benchmark::RegisterBenchmark((tag + "/encode").c_str(), BM_Encode, std::string(name), backend)->Apply(Sizes);
      benchmark::RegisterBenchmark((tag + "/decode").c_str(), BM_Decode, std::string(name), backend)->Apply(Sizes);
    }
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace

BENCHMARK_MAIN();

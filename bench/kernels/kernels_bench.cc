// Encode and decode throughput per compressor on the CPU backend (and CUDA when a device is
// present), beside a memcpy of the same buffer in the same run.
//
// Bytes counted: 4n per call (the uncompressed float32 group, n elements), for every row,
// encode and decode alike; bytes_per_second, printed by Google Benchmark as GiB/s (2^30
// bytes per second of CPU time). memcpy copies 4n bytes between two buffers of the same
// size, allocated like the compressors' (64-byte aligned Buffer).
// Method: every buffer (gradient, state, payloads, output, memcpy source and destination) is
// allocated and written once before timing, so no page is first touched inside the timed
// loop, and one untimed call runs before it. Calls per row: fixed by size, enough to move
// 1 GiB of float32 and never fewer than 10 (2^20: 256 calls, 2^26: 10); for a spread, repeat
// with --benchmark_repetitions. The context lines name the CPU model (/proc/cpuinfo).
// Setup: W = 4 ranks, ratio 0.01, each compressor's default memory; decode sums W payloads
// (allgather compressors) or reads one reduced buffer (allreduce ones).
// Rows: memcpy (glibc: non-temporal stores at large sizes, which skip the read-for-ownership
// of the destination); copy-stores, the same copy by 16-byte loads and ordinary stores, which
// is what the kernels' stores cost; <backend>/<compressor>/{encode,decode} with the variant the library picks
// (label: the CPU variant, e.g. avx2); cpu-baseline/... forces the portable baseline of the
// elementwise compressors, for comparison in the same run.
// Sizes: n = 2^10, 2^14, 2^18, 2^20 (the target's size), 2^22, 2^24, 2^26 elements.
#include <benchmark/benchmark.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_loops.h"  // internal: the CPU variants (bench links the library's private headers)
#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/catalogue.h"

namespace {

using namespace cupcake;  // NOLINT
using namespace cupcake::kernels;  // NOLINT

constexpr int kWorld = 4;

// The same N(0, 1) gradient for every row of a size (generated once per size).
const std::vector<float>& Gradient(int64_t n) {
  static std::map<int64_t, std::vector<float>> cache;
  auto& g = cache[n];
  if (g.empty()) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 1.0f);
    g.resize(static_cast<size_t>(n));
    for (auto& x : g) x = d(rng);
  }
  return g;
}

// Which CPU implementation a row runs.
enum class Variant { kDefault, kBaseline };

// Allocated and written (every page touched) before any timing.
Buffer Touched(Backend backend, int64_t bytes) {
  Buffer b = std::move(Buffer::Allocate(backend, bytes)).value();
  (void)b.Zero();
  return b;
}

struct Setup {
  std::unique_ptr<Compressor> c;
  Buffer grad, state, payloads, out;
};

bool Prepare(benchmark::State& st, const std::string& name, Backend backend, Variant variant, Setup* s) {
  const int64_t n = st.range(0);
  CompressorConfig cfg;
  cfg.name = name;
  cfg.n = n;
  cfg.world_size = kWorld;
  cfg.ratio = 0.01;
  cfg.seed = 3;
  if (variant == Variant::kBaseline) {
    auto layout = ResolveLayout(cfg);
    if (!layout.ok()) {
      st.SkipWithError(layout.status().message().c_str());
      return false;
    }
    s->c = cpu::MakeCpuCompressor(*layout, cpu::Isa::kBaseline);
    st.SetLabel(cpu::IsaName(cpu::Isa::kBaseline));
  } else {
    auto c = MakeCompressor(cfg, backend);
    if (!c.ok()) {
      st.SkipWithError(c.status().message().c_str());
      return false;
    }
    s->c = std::move(c).value();
    if (backend == Backend::kCpu) st.SetLabel(cpu::IsaName(cpu::BestIsa()));
  }
  s->grad = Touched(backend, 4 * n);
  s->state = Touched(backend, 4 * s->c->state_floats());
  s->payloads = Touched(backend, s->c->decode_input_bytes());
  s->out = Touched(backend, 4 * n);
  const auto& g = Gradient(n);
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

void BM_Encode(benchmark::State& st, std::string name, Backend backend, Variant variant) {
  Setup s;
  if (!Prepare(st, name, backend, variant, &s)) return;
  const int64_t n = st.range(0);
  Buffer payload = Touched(backend, s.c->payload_bytes());
  uint64_t it = 0;
  auto encode = [&] {
    Status e = s.c->Encode({s.grad.as<const float>(), static_cast<size_t>(n)},
                           {s.state.as<float>(), static_cast<size_t>(s.c->state_floats())}, it++,
                           {payload.as<std::byte>(), static_cast<size_t>(s.c->payload_bytes())});
    if (!e.ok()) st.SkipWithError(e.message().c_str());
    (void)Synchronize(backend);
  };
  encode();  // untimed warm-up
  for (auto _ : st) {
    encode();
    benchmark::DoNotOptimize(payload.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 4 * n);
}

void BM_Decode(benchmark::State& st, std::string name, Backend backend, Variant variant) {
  Setup s;
  if (!Prepare(st, name, backend, variant, &s)) return;
  const int64_t n = st.range(0);
  auto decode = [&] {
    Status e = s.c->Decode({s.payloads.as<const std::byte>(), static_cast<size_t>(s.c->decode_input_bytes())},
                           {s.out.as<float>(), static_cast<size_t>(n)}, 0);
    if (!e.ok()) st.SkipWithError(e.message().c_str());
    (void)Synchronize(backend);
  };
  decode();  // untimed warm-up
  for (auto _ : st) {
    decode();
    benchmark::DoNotOptimize(s.out.data());
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 4 * n);
}

void BM_Memcpy(benchmark::State& st) {
  const int64_t n = st.range(0);
  Buffer src = Touched(Backend::kCpu, 4 * n), dst = Touched(Backend::kCpu, 4 * n);
  (void)src.CopyFromHost(Gradient(n).data(), 4 * n);
  std::memcpy(dst.data(), src.data(), static_cast<size_t>(4 * n));  // untimed warm-up
  for (auto _ : st) {
    std::memcpy(dst.data(), src.data(), static_cast<size_t>(4 * n));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 4 * n);
}

#if defined(__SSE2__)
// A copy by 16-byte loads and ordinary (cached) stores: the store traffic the kernels make.
void BM_CopyStores(benchmark::State& st) {
  const int64_t n = st.range(0);
  Buffer src = Touched(Backend::kCpu, 4 * n), dst = Touched(Backend::kCpu, 4 * n);
  (void)src.CopyFromHost(Gradient(n).data(), 4 * n);
  auto copy = [&] {
    const float* from = src.as<const float>();
    float* to = dst.as<float>();
    for (int64_t i = 0; i + 4 <= n; i += 4) _mm_store_ps(to + i, _mm_load_ps(from + i));
  };
  copy();  // untimed warm-up
  for (auto _ : st) {
    copy();
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * 4 * n);
}
#endif

// The CPU's model name, from /proc/cpuinfo ("unknown" where it has none).
std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos)
      return line.substr(line.find(':') + 2);
  return "unknown";
}

// Registers `name`/n for every size, each with a fixed number of calls: enough to move 1 GiB
// of float32 (2^28 elements), at least 10.
template <typename... Args>
void AddSizes(const std::string& name, Args&&... args) {
  for (int shift : {10, 14, 18, 20, 22, 24, 26}) {
    const int64_t n = int64_t{1} << shift;
    benchmark::RegisterBenchmark(name.c_str(), args...)
        ->Arg(n)
        ->Iterations(std::max<int64_t>(10, (int64_t{1} << 28) / n))
        ->Unit(benchmark::kMicrosecond);
  }
}

int Register() {
  benchmark::AddCustomContext("cpu_model", CpuModel());
  AddSizes("memcpy", BM_Memcpy);
#if defined(__SSE2__)
  AddSizes("copy-stores", BM_CopyStores);
#endif
  for (Backend backend : {Backend::kCpu, Backend::kCuda}) {
    if (!BackendAvailable(backend).ok()) continue;
    for (auto name : CompressorNames()) {
      const std::string tag = std::string(BackendName(backend)) + "/" + std::string(name);
      AddSizes(tag + "/encode", BM_Encode, std::string(name), backend, Variant::kDefault);
      AddSizes(tag + "/decode", BM_Decode, std::string(name), backend, Variant::kDefault);
    }
  }
  if (cpu::BestIsa() != cpu::Isa::kBaseline) {
    for (const char* name : {"fp16", "qsgd", "signsgd", "efsignsgd", "signum", "terngrad", "onebit"}) {
      const std::string tag = std::string("cpu-baseline/") + name;
      AddSizes(tag + "/encode", BM_Encode, std::string(name), Backend::kCpu, Variant::kBaseline);
      AddSizes(tag + "/decode", BM_Decode, std::string(name), Backend::kCpu, Variant::kBaseline);
    }
  }
  return 0;
}
const int kRegistered = Register();

}  // namespace

BENCHMARK_MAIN();

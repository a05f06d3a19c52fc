// gpu_kernels_bench: every compressor's CUDA encode and decode against a device-to-device copy,
// in bytes per second and as a share of the copy's bandwidth (docs/KERNELS.md, GPU section).
//
// Method: per size n, R sets of buffers (gradient N(0, 1), state, payload, W payloads to decode,
// output) with R large enough that R consecutive calls touch at least 3x the GPU's L2 cache, so
// that no call finds its inputs in L2 from the call before; calls rotate over the sets. Each
// call is timed alone with CUDA events on one stream (the launches of one call included, as a
// runtime step issues them): `warmup` untimed calls, then `iters` timed ones; median, p10 and
// p90 in us. The copy row is cudaMemcpyAsync of 4n bytes between rotating buffers, timed the
// same way; its bandwidth counts 8n bytes (read and written).
// Bytes counted per call (the least the algorithm moves; the table in docs/KERNELS.md):
//   encode: the gradient read once per pass that needs it, the memory read and written
//   (residual e: 8n, dgc u and v: 16n, signum's momentum: 8n), the payload written; the
//   compressors with a scale (qsgd, the sign family, onebit, terngrad) make two passes, since the
//   scale depends on every element before any residual can be written: the first reads x's
//   inputs, the second reads them again and writes; topk and dgc are reported against the copy
//   of their input (`x_copy`), not in bytes.
//   decode: the W payloads (allgather) or the one reduced payload read once, 4n written.
// Rows `gain_top` and `gain_rand` (op `probe`): GraVAC's gain probe on the device
// (cupcake/kernels/gain.h) over x = g + e, keeping 0.01 n and 0.001 n elements, against the copy.
// Usage: gpu_kernels_bench [--sizes N,N,...] [--world W] [--iters I] [--warmup K] [--only NAME]
//   NAME: a compressor, or gain (the probe rows)
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/gain.h"
#include "cupcake/proto/catalogue.h"

namespace {

using namespace cupcake;  // NOLINT
using namespace cupcake::kernels;  // NOLINT

[[noreturn]] void Die(const std::string& message, int code = 1) {
  std::fprintf(stderr, "gpu_kernels_bench: %s\n", message.c_str());
  std::exit(code);
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(std::string(what) + ": " + cudaGetErrorString(e));
}
void Check(const Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.message());
}

struct Options {
  std::vector<int64_t> sizes{int64_t{1} << 22, int64_t{1} << 24, int64_t{1} << 25};
  int world = 8;
  int iters = 30;
  int warmup = 3;
  std::string only;
};

int64_t ParseInt(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || x < lo || x > hi)
    Die(flag + ": out of range; got '" + v + "', expected an integer in [" + std::to_string(lo) + ", " +
            std::to_string(hi) + "]",
        2);
  return x;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Die(a + ": needs a value (usage: see the header of bench/kernels/gpu_kernels_bench.cc)", 2);
    const std::string v = argv[++i];
    if (a == "--sizes") {
      o.sizes.clear();
      size_t start = 0;
      while (start <= v.size()) {
        const size_t comma = std::min(v.find(',', start), v.size());
        o.sizes.push_back(ParseInt(a, v.substr(start, comma - start), 1, (int64_t{1} << 31) - 1));
        start = comma + 1;
      }
    } else if (a == "--world") {
      o.world = static_cast<int>(ParseInt(a, v, 1, 1024));
    } else if (a == "--iters") {
      o.iters = static_cast<int>(ParseInt(a, v, 1, 100000));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(ParseInt(a, v, 0, 1000));
    } else if (a == "--only") {
      o.only = v;
    } else {
      Die("unknown flag '" + a + "'; expected --sizes, --world, --iters, --warmup or --only", 2);
    }
  }
  return o;
}

struct Stats {
  double median_us, p10_us, p90_us;
};

Stats Summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  auto at = [&](double f) { return us[static_cast<size_t>(f * static_cast<double>(us.size() - 1) + 0.5)]; };
  return {at(0.5), at(0.1), at(0.9)};
}

// Times `call(set)` alone, `iters` times after `warmup`, rotating over `sets` buffer sets.
template <typename F>
Stats Time(cudaStream_t s, int sets, int warmup, int iters, F call) {
  cudaEvent_t a, b;
  Check(cudaEventCreate(&a), "cudaEventCreate");
  Check(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> us;
  for (int it = 0; it < warmup + iters; ++it) {
    Check(cudaEventRecord(a, s), "cudaEventRecord");
    call(it % sets, it);
    Check(cudaEventRecord(b, s), "cudaEventRecord");
    Check(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    Check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    if (it >= warmup) us.push_back(1e3 * ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Summarize(us);
}

void* DeviceAlloc(int64_t bytes) {
  void* p = nullptr;
  Check(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 16))), "cudaMalloc");
  return p;
}

bool TwoPass(CompressorKind k) {
  return k == CompressorKind::kQsgd || k == CompressorKind::kSignsgd || k == CompressorKind::kEfsignsgd ||
         k == CompressorKind::kSignum || k == CompressorKind::kOnebit || k == CompressorKind::kTerngrad;
}

// The encode's counted bytes (header).
int64_t EncodeBytes(const CompressorLayout& L) {
  const int64_t n = L.n;
  int64_t inputs = 4 * n;  // what x is made of, read per pass
  int64_t writes = L.payload_bytes;
  if (L.memory == MemoryKind::kResidual) {
    inputs += 4 * n;
    writes += 4 * n;
  } else if (L.memory == MemoryKind::kDgc) {
    inputs += 8 * n;
    writes += 8 * n;
  }
  // signum: the momentum read and written in the first pass, read again in the second.
  if (L.kind == CompressorKind::kSignum) return inputs + 12 * n + writes;
  return (TwoPass(L.kind) ? 2 : 1) * inputs + writes;
}

struct Row {
  std::string name, op;
  int64_t n;
  Stats st;
  double bytes;  // counted; 0 for x_copy rows
  double copy_us;
};

// How many sets of `set_bytes` each rotate so that consecutive calls touch at least 3x the L2
// (the method above), 2 to 16.
int RotatingSets(int64_t set_bytes, int64_t l2) {
  return static_cast<int>(std::clamp<int64_t>((3 * l2 + set_bytes - 1) / set_bytes, 2, 16));
}

// GraVAC's gain probe: rotating sets of g (the row's gradient) and e (g's reverse), as the
// compressors' rows rotate theirs.
void GainRows(const std::vector<float>& host, int64_t n, double copy_us, int64_t l2, const Options& o, cudaStream_t s,
              std::vector<Row>& rows) {
  auto made = cupcake::kernels::MakeDeviceGain();
  Check(made.status(), "MakeDeviceGain");
  const int sets = RotatingSets(8 * n, l2);
  std::vector<float*> g(static_cast<size_t>(sets)), e(static_cast<size_t>(sets));
  const std::vector<float> reversed(host.rbegin(), host.rend());
  for (int i = 0; i < sets; ++i) {
    g[static_cast<size_t>(i)] = static_cast<float*>(DeviceAlloc(4 * n));
    e[static_cast<size_t>(i)] = static_cast<float*>(DeviceAlloc(4 * n));
    Check(cudaMemcpy(g[static_cast<size_t>(i)], host.data(), static_cast<size_t>(4 * n), cudaMemcpyHostToDevice),
          "cudaMemcpy");
    Check(cudaMemcpy(e[static_cast<size_t>(i)], reversed.data(), static_cast<size_t>(4 * n), cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  const int64_t k_min = std::max<int64_t>(1, n / 100), k_c = std::max<int64_t>(1, n / 1000);
  for (const bool random : {false, true}) {
    const Stats st = Time(s, sets, o.warmup, o.iters, [&](int set, int it) {
      const float* gs = g[static_cast<size_t>(set)];
      const float* es = e[static_cast<size_t>(set)];
      Check(random ? (*made)->AddRandom(gs, es, n, k_min, k_c, 7, static_cast<uint64_t>(it), s)
                   : (*made)->AddLargest(gs, es, n, k_min, k_c, s),
            "DeviceGain");
    });
    rows.push_back({random ? "gain_rand" : "gain_top", "probe", n, st, 0.0, copy_us});
  }
  Check((*made)->Take(s).status(), "DeviceGain::Take");
  for (int i = 0; i < sets; ++i) {
    cudaFree(g[static_cast<size_t>(i)]);
    cudaFree(e[static_cast<size_t>(i)]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  int dev = 0;
  cudaDeviceProp prop{};
  Check(cudaGetDevice(&dev), "cudaGetDevice");
  Check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  int driver = 0;
  cudaDriverGetVersion(&driver);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  std::printf("# gpu_kernels_bench: %s\n", command.c_str());
  std::printf("# %s (sm_%d%d, %d SMs, L2 %d MiB), CUDA driver %d; W = %d, ratio 0.01, default memory\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize >> 20, driver, o.world);
  std::printf("# warmup %d, iters %d per row, each call timed alone (CUDA events); buffers rotate past L2\n", o.warmup,
              o.iters);
  cudaStream_t s;
  Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  const int64_t l2 = std::max(prop.l2CacheSize, 1 << 20);
  std::vector<Row> rows;
  for (const int64_t n : o.sizes) {
    // Host gradient, N(0, 1).
    std::vector<float> host(static_cast<size_t>(n));
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& x : host) x = normal(rng);
    // The copy.
    const int copy_sets = RotatingSets(8 * n, l2);
    std::vector<void*> src(static_cast<size_t>(copy_sets)), dst(static_cast<size_t>(copy_sets));
    for (int i = 0; i < copy_sets; ++i) {
      src[static_cast<size_t>(i)] = DeviceAlloc(4 * n);
      dst[static_cast<size_t>(i)] = DeviceAlloc(4 * n);
      Check(cudaMemcpy(src[static_cast<size_t>(i)], host.data(), static_cast<size_t>(4 * n), cudaMemcpyHostToDevice),
            "cudaMemcpy");
    }
    const Stats copy = Time(s, copy_sets, o.warmup, o.iters, [&](int set, int) {
      Check(cudaMemcpyAsync(dst[static_cast<size_t>(set)], src[static_cast<size_t>(set)], static_cast<size_t>(4 * n),
                            cudaMemcpyDeviceToDevice, s),
            "cudaMemcpyAsync");
    });
    rows.push_back({"copy", "d2d", n, copy, 8.0 * static_cast<double>(n), copy.median_us});
    for (int i = 0; i < copy_sets; ++i) {
      cudaFree(src[static_cast<size_t>(i)]);
      cudaFree(dst[static_cast<size_t>(i)]);
    }
    for (const std::string_view name_view : CompressorNames()) {
      const std::string name(name_view);
      if (!o.only.empty() && name != o.only) continue;
      CompressorConfig c;
      c.name = name;
      c.n = n;
      c.world_size = o.world;
      c.ratio = 0.01;
      c.seed = 7;
      auto made = MakeCompressor(c, Backend::kCuda);
      Check(made.status(), ("MakeCompressor " + name).c_str());
      Compressor& comp = **made;
      const CompressorLayout& L = comp.layout();
      const int64_t set_bytes = 4 * n + 4 * L.state_floats + L.payload_bytes + L.decode_input_bytes + 4 * n;
      const int sets = RotatingSets(set_bytes, l2);
      struct Set {
        float *grad, *state, *out;
        std::byte *payload, *in;
      };
      std::vector<Set> bufs;
      for (int i = 0; i < sets; ++i) {
        Set b{static_cast<float*>(DeviceAlloc(4 * n)), static_cast<float*>(DeviceAlloc(4 * L.state_floats)),
              static_cast<float*>(DeviceAlloc(4 * n)), static_cast<std::byte*>(DeviceAlloc(L.payload_bytes)),
              static_cast<std::byte*>(DeviceAlloc(L.decode_input_bytes))};
        Check(cudaMemcpy(b.grad, host.data(), static_cast<size_t>(4 * n), cudaMemcpyHostToDevice), "cudaMemcpy");
        Check(cudaMemset(b.state, 0, static_cast<size_t>(4 * L.state_floats)), "cudaMemset");
        bufs.push_back(b);
      }
      auto encode = [&](int set, int it) {
        const Set& b = bufs[static_cast<size_t>(set)];
        Check(comp.Encode({b.grad, static_cast<size_t>(n)}, {b.state, static_cast<size_t>(L.state_floats)},
                          static_cast<uint64_t>(it), {b.payload, static_cast<size_t>(L.payload_bytes)}, s),
              "Encode");
      };
      const Stats enc = Time(s, sets, o.warmup, o.iters, encode);
      // Decode input: each set's last payload, once (allreduce) or W times side by side.
      for (const Set& b : bufs)
        for (int64_t off = 0; off < L.decode_input_bytes; off += L.payload_bytes)
          Check(cudaMemcpy(b.in + off, b.payload, static_cast<size_t>(L.payload_bytes), cudaMemcpyDeviceToDevice),
                "cudaMemcpy");
      const int last_iter = o.warmup + o.iters - 1;  // randk decodes the indices of its encode
      const Stats dec = Time(s, sets, o.warmup, o.iters, [&](int set, int) {
        const Set& b = bufs[static_cast<size_t>(set)];
        Check(comp.Decode({b.in, static_cast<size_t>(L.decode_input_bytes)}, {b.out, static_cast<size_t>(n)},
                          static_cast<uint64_t>(last_iter), s),
              "Decode");
      });
      const bool sparse = L.kind == CompressorKind::kTopk || L.kind == CompressorKind::kDgc;
      rows.push_back({name, "encode", n, enc, sparse ? 0.0 : static_cast<double>(EncodeBytes(L)), copy.median_us});
      rows.push_back({name, "decode", n, dec, static_cast<double>(L.decode_input_bytes + 4 * n), copy.median_us});
      for (const Set& b : bufs) {
        cudaFree(b.grad);
        cudaFree(b.state);
        cudaFree(b.out);
        cudaFree(b.payload);
        cudaFree(b.in);
      }
    }
    if (o.only.empty() || o.only == "gain") GainRows(host, n, copy.median_us, l2, o, s, rows);
  }
  Check(cudaGetLastError(), "after the rows");
  std::printf("%-10s %-7s %10s %11s %11s %11s %14s %9s %11s %8s\n", "# name", "op", "n", "median_us", "p10_us",
              "p90_us", "bytes_counted", "GB/s", "of_copy_bw", "x_copy");
  for (const Row& r : rows) {
    const double copy_bw = 8.0 * static_cast<double>(r.n) / r.copy_us;  // bytes per us
    const double gbs = r.bytes > 0 ? r.bytes / r.st.median_us / 1e3 : 0.0;
    std::printf("%-10s %-7s %10" PRId64 " %11.1f %11.1f %11.1f %14.0f %9.0f %10.0f%% %8.2f\n", r.name.c_str(),
                r.op.c_str(), r.n, r.st.median_us, r.st.p10_us, r.st.p90_us, r.bytes, gbs,
                r.bytes > 0 ? 100.0 * (r.bytes / r.st.median_us) / copy_bw : 0.0, r.st.median_us / r.copy_us);
  }
  std::printf("# of_copy_bw = (bytes_counted / median) / (8n / copy median at the same n); x_copy = median / copy "
              "median\n");
  return 0;
}

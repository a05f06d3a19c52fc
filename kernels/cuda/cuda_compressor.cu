// CUDA implementation of every compressor and memory, step for step the CPU reference's
// (kernels/src/cpu/cpu_compressor.cc) with the same scalar code (kernels/src/common.h) and no
// FMA contraction (--fmad=false), so elementwise results match bit for bit. Reductions (norm,
// means) sum in double with a fixed grid, deterministic from run to run but in another order
// than the CPU: scales may differ in the last bits (test/kernels/cuda_matches_cpu_test.cc).
//
// Top-k (topk, dgc): radix selection, no sort:
//   1. four histogram passes over 8 bits of MagnitudeKey each, restricted to the keys that
//      share the digits chosen so far, find the k-th largest key T and how many entries equal
//      to T belong to the top k (need_eq); the pick between passes runs on the device;
//   2. per 4096-element tile, count (key > T, key == T) as one 64-bit pair; scan the tiles;
//   3. per tile, a block scan gives each entry its rank among the selected in index order
//      (ties: the lowest indices), and the selected entries are written in index order.
// dgc selects the same set with the same kernels (the CPU's sampled threshold only narrows
// its candidate scan; the result is identical by construction).
// Sparse decode: one scatter-add kernel per rank, in rank order (deterministic); out-of-range
// indices are skipped (the CPU reports them; checking here would need a host sync).
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <memory>

#include "../src/backends.h"
#include "../src/common.h"
#include "cupcake/proto/cuda.h"

namespace cupcake::kernels::cuda {
namespace {

using namespace cupcake::kernels::detail;  // NOLINT: the shared scalar helpers
using u8 = unsigned char;

constexpr int kThreads = 256;
constexpr int kReduceBlocks = 256;
constexpr int kItems = 16;
constexpr int kTile = kThreads * kItems;

unsigned Blocks(int64_t work) {
  int64_t b = (work + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > (1 << 20)) b = 1 << 20;  // grid-stride loops cover the rest
  return static_cast<unsigned>(b);
}

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

// ---- memory ----
__global__ void AddKernel(float* e, const float* g, int64_t n) { GRID_STRIDE(i, n) e[i] += g[i]; }
__global__ void DgcMemoryKernel(float* u, float* v, const float* g, int64_t n) {
  GRID_STRIDE(i, n) {
    const float ui = kDgcMomentum * u[i] + g[i];
    u[i] = ui;
    v[i] += ui;
  }
}
__global__ void SignumKernel(float* mom, const float* x, int64_t n) {
  GRID_STRIDE(i, n) {
    const float m = kSignumMomentum * mom[i] + (1.0f - kSignumMomentum) * x[i];
    mom[i] = IsFinite(m) ? m : 0.0f;
  }
}
__global__ void ZeroNonFiniteKernel(float* e, int64_t n) { GRID_STRIDE(i, n) e[i] = IsFinite(e[i]) ? e[i] : 0.0f; }

// ---- dense encodes ----
__global__ void Fp16EncodeKernel(const float* x, float* resid, int64_t n, int world, u8* payload) {
  const float wf = static_cast<float>(world);
  const float inv_w = 1.0f / wf;
  GRID_STRIDE(i, n) {
    const uint16_t h = FloatToHalf(x[i] * inv_w);
    payload[2 * i] = static_cast<u8>(h);
    payload[2 * i + 1] = static_cast<u8>(h >> 8);
    if (resid) {
      const float e = resid[i] - HalfToFloat(h) * wf;
      resid[i] = IsFinite(e) ? e : 0.0f;
    }
  }
}

// Reductions: Acc of four doubles, summed (or max-ed) over a fixed grid, then finished by one
// block in a fixed order.
struct Acc {
  double v[4];
};
enum class Red { kSumSquares, kSumAbs, kMaxAbs, kOnebit };

template <Red R>
__device__ Acc Element(float x) {
  Acc a{{0, 0, 0, 0}};
  const bool f = IsFinite(x);
  if (R == Red::kSumSquares) a.v[0] = f ? static_cast<double>(x) * x : 0.0;
  if (R == Red::kSumAbs || R == Red::kMaxAbs) a.v[0] = f ? static_cast<double>(Abs(x)) : 0.0;
  if (R == Red::kOnebit) {
    const bool neg = x < 0.0f;
    a.v[0] = f && !neg ? x : 0.0;
    a.v[1] = f && neg ? x : 0.0;
    a.v[2] = f && neg ? 1.0 : 0.0;
    a.v[3] = f ? 1.0 : 0.0;
  }
  return a;
}
template <Red R>
struct Combine {
  __device__ Acc operator()(const Acc& a, const Acc& b) const {
    Acc c;
    for (int j = 0; j < 4; ++j) c.v[j] = R == Red::kMaxAbs ? (a.v[j] > b.v[j] ? a.v[j] : b.v[j]) : a.v[j] + b.v[j];
    return c;
  }
};

template <Red R>
__global__ void ReduceKernel(const float* x, int64_t n, Acc* partials) {
  using BR = cub::BlockReduce<Acc, kThreads>;
  __shared__ typename BR::TempStorage tmp;
  Acc a{{0, 0, 0, 0}};
  GRID_STRIDE(i, n) a = Combine<R>()(a, Element<R>(x[i]));
  Acc total = BR(tmp).Reduce(a, Combine<R>());
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// Finishes the reduction and writes the scale(s) to scalars[] and to the payload metadata.
template <Red R>
__global__ void FinishKernel(const Acc* partials, int64_t n, float* scalars, u8* meta) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  Acc a{{0, 0, 0, 0}};
  for (int b = 0; b < kReduceBlocks; ++b) a = Combine<R>()(a, partials[b]);
  if (R == Red::kSumSquares) {
    const float norm = static_cast<float>(sqrt(a.v[0]));
    scalars[0] = norm;
    StoreF32(meta, norm);
  } else if (R == Red::kSumAbs) {
    const float s = static_cast<float>(a.v[0] / static_cast<double>(n));
    scalars[0] = s;
    StoreF32(meta, s);
  } else if (R == Red::kMaxAbs) {
    const float m = static_cast<float>(a.v[0]);
    scalars[0] = m;
    StoreF32(meta, m);
  } else {
    const double pos_count = a.v[3] - a.v[2];
    const float pos = pos_count > 0 ? static_cast<float>(a.v[0] / pos_count) : 0.0f;
    const float neg = a.v[2] > 0 ? static_cast<float>(a.v[1] / a.v[2]) : 0.0f;
    scalars[0] = pos;
    scalars[1] = neg;
    StoreF32(meta, pos);
    StoreF32(meta + 4, neg);
  }
}

__global__ void QsgdEncodeKernel(const float* x, float* resid, int64_t n, uint64_t key, const float* scalars,
                                 u8* payload) {
  const float norm = scalars[0];
  const float scale = norm > 0.0f ? kQsgdLevels / norm : 0.0f;
  const float unit = norm / kQsgdLevels;
  GRID_STRIDE(i, n) {
    const float r = QsgdQuantizeOne(x[i], scale, unit, key, static_cast<uint32_t>(i), payload + i);
    if (resid) resid[i] = r;
  }
}

// One thread per byte of sign bits. pos/neg from scalars: sign family (s, -s) or onebit.
// signum_resid: the residual of signum, whose bits come from the momentum x but whose
// residual is against the input held in resid.
__global__ void SignEncodeKernel(const float* x, float* resid, int64_t n, const float* scalars, bool two_means,
                                 bool signum_resid, u8* bits) {
  const float pos = scalars[0];
  const float neg = two_means ? scalars[1] : -scalars[0];
  const int64_t nb = (n + 7) / 8;
  GRID_STRIDE(b, nb) {
    uint32_t byte = 0;
    for (int j = 0; j < 8; ++j) {
      const int64_t i = 8 * b + j;
      if (i >= n) break;
      const float v = x[i];
      byte |= static_cast<uint32_t>(v < 0.0f) << j;
      if (resid) {
        if (signum_resid) {
          const float e = resid[i] - (v < 0.0f ? neg : pos);
          resid[i] = IsFinite(e) ? e : 0.0f;
        } else {
          const float e = v - (v < 0.0f ? neg : pos);
          resid[i] = IsFinite(v) ? e : 0.0f;
        }
      }
    }
    bits[b] = static_cast<u8>(byte);
  }
}

__global__ void TerngradEncodeKernel(const float* x, float* resid, int64_t n, uint64_t key, const float* scalars,
                                     u8* codes) {
  const float mx = scalars[0];
  const float inv = mx > 0.0f ? 1.0f / mx : 0.0f;
  const int64_t nb = (n + 3) / 4;
  GRID_STRIDE(b, nb) {
    uint32_t byte = 0;
    for (int j = 0; j < 4; ++j) {
      const int64_t i = 4 * b + j;
      if (i >= n) break;
      const float v = x[i];
      const uint32_t c = TerngradCode(v, inv, key, static_cast<uint32_t>(i));
      byte |= c << (2 * j);
      if (resid) {
        const float sent = c == 1u ? mx : (c == 2u ? -mx : 0.0f);
        resid[i] = c == 3u ? 0.0f : v - sent;
      }
    }
    codes[b] = static_cast<u8>(byte);
  }
}

// ---- dense decodes: one thread per element, ranks in order, the CPU's float operations ----
__global__ void Fp32DecodeKernel(const u8* p, int64_t n, int world, float* out) {
  const float wf = static_cast<float>(world);
  GRID_STRIDE(i, n) out[i] = LoadF32(p + 4 * i) / wf;
}
__global__ void Fp16DecodeKernel(const u8* p, int64_t n, float* out) {
  GRID_STRIDE(i, n) out[i] = HalfToFloat(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
}
__global__ void QsgdDecodeKernel(const u8* p, int64_t n, int world, int64_t payload_bytes, float* out) {
  const float wf = static_cast<float>(world);
  GRID_STRIDE(i, n) {
    float acc = 0.0f;
    for (int r = 0; r < world; ++r) {
      const u8* pr = p + r * payload_bytes;
      const float f = LoadF32(pr + n) / (kQsgdLevels * wf);
      const int8_t q = static_cast<int8_t>(pr[i]);
      const float v = q == -128 ? __int_as_float(0x7fc00000) : static_cast<float>(q) * f;
      acc = r == 0 ? v : acc + v;
    }
    out[i] = acc;
  }
}
__global__ void SignDecodeKernel(const u8* p, int64_t n, int world, int64_t payload_bytes, bool two_means, float* out) {
  const float wf = static_cast<float>(world);
  const int64_t nb = (n + 7) / 8;
  GRID_STRIDE(i, n) {
    float acc = 0.0f;
    for (int r = 0; r < world; ++r) {
      const u8* pr = p + r * payload_bytes;
      const float pos = LoadF32(pr + nb) / wf;
      const float neg = two_means ? LoadF32(pr + nb + 4) / wf : -pos;
      const float v = (pr[i / 8] >> (i % 8)) & 1u ? neg : pos;
      acc = r == 0 ? v : acc + v;
    }
    out[i] = acc;
  }
}
__global__ void TerngradDecodeKernel(const u8* p, int64_t n, int world, int64_t payload_bytes, float* out) {
  const float wf = static_cast<float>(world);
  const int64_t nb = (n + 3) / 4;
  GRID_STRIDE(i, n) {
    float acc = 0.0f;
    for (int r = 0; r < world; ++r) {
      const u8* pr = p + r * payload_bytes;
      const float s = LoadF32(pr + nb) / wf;
      const uint32_t c = (pr[i / 4] >> (2 * (i % 4))) & 3u;
      const float v = c == 0u ? 0.0f : c == 1u ? s : c == 2u ? -s : __int_as_float(0x7fc00000);
      acc = r == 0 ? v : acc + v;
    }
    out[i] = acc;
  }
}

// ---- sparse ----
struct Selection {
  uint32_t prefix;
  uint32_t mask;
  long long remaining;  // after the passes: need_eq
};

__global__ void InitSelectionKernel(Selection* sel, int64_t k, uint32_t* hist) {
  sel->prefix = 0;
  sel->mask = 0;
  sel->remaining = k;
  for (int d = 0; d < 256; ++d) hist[d] = 0;
}

__global__ void HistogramKernel(const float* x, int64_t n, const Selection* sel, int shift, uint32_t* hist) {
  __shared__ uint32_t sh[256];
  for (int d = threadIdx.x; d < 256; d += blockDim.x) sh[d] = 0;
  __syncthreads();
  const uint32_t prefix = sel->prefix, mask = sel->mask;
  GRID_STRIDE(i, n) {
    const uint32_t key = MagnitudeKey(x[i]);
    if ((key & mask) == prefix) atomicAdd(&sh[(key >> shift) & 255u], 1u);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < 256; d += blockDim.x)
    if (sh[d]) atomicAdd(&hist[d], sh[d]);
}

__global__ void PickDigitKernel(Selection* sel, int shift, uint32_t* hist) {
  long long above = 0;
  int d = 255;
  for (;; --d) {
    if (above + hist[d] >= sel->remaining || d == 0) break;
    above += hist[d];
  }
  sel->remaining -= above;
  sel->prefix |= static_cast<uint32_t>(d) << shift;
  sel->mask |= 255u << shift;
  for (int j = 0; j < 256; ++j) hist[j] = 0;
}

__device__ unsigned long long Flags(uint32_t key, uint32_t t) {
  return static_cast<unsigned long long>(key > t) | (static_cast<unsigned long long>(key == t) << 32);
}

__global__ void TileCountKernel(const float* x, int64_t n, const Selection* sel, unsigned long long* tiles) {
  using BR = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename BR::TempStorage tmp;
  const uint32_t t = sel->prefix;
  const int64_t base = blockIdx.x * int64_t{kTile};
  unsigned long long c = 0;
  for (int j = 0; j < kItems; ++j) {
    const int64_t i = base + j * kThreads + threadIdx.x;  // any order will do for a count
    if (i < n) c += Flags(MagnitudeKey(x[i]), t);
  }
  const unsigned long long total = BR(tmp).Sum(c);
  if (threadIdx.x == 0) tiles[blockIdx.x] = total;
}

// Exclusive scan of the tile counts by one block, in chunks. __launch_bounds__: without it the
// compiler may use more registers than a 1024-thread block can have (the launch then fails with
// cudaErrorLaunchOutOfResources, as it did on an H100).
__global__ void __launch_bounds__(1024) TileScanKernel(unsigned long long* tiles, int64_t num_tiles) {
  using BS = cub::BlockScan<unsigned long long, 1024>;
  __shared__ typename BS::TempStorage tmp;
  __shared__ unsigned long long carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < num_tiles; base += 1024) {
    const int64_t i = base + threadIdx.x;
    const unsigned long long v = i < num_tiles ? tiles[i] : 0ull;
    unsigned long long ex, total;
    BS(tmp).ExclusiveSum(v, ex, total);
    if (i < num_tiles) tiles[i] = carry + ex;
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
}

__global__ void TileSelectKernel(const float* x, int64_t n, int64_t k, const Selection* sel,
                                 const unsigned long long* tile_offsets, float* resid, float* u, float* v,
                                 u8* payload) {
  using BS = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ typename BS::TempStorage tmp;
  const uint32_t t = sel->prefix;
  const unsigned long long need_eq = static_cast<unsigned long long>(sel->remaining);
  const int64_t first = blockIdx.x * int64_t{kTile} + threadIdx.x * int64_t{kItems};  // blocked: index order
  unsigned long long mine = 0;
  for (int j = 0; j < kItems; ++j)
    if (first + j < n) mine += Flags(MagnitudeKey(x[first + j]), t);
  unsigned long long before;
  BS(tmp).ExclusiveSum(mine, before);
  unsigned long long run = tile_offsets[blockIdx.x] + before;
  u8* vals = payload;
  u8* idxs = payload + 4 * k;
  for (int j = 0; j < kItems; ++j) {
    const int64_t i = first + j;
    if (i >= n) break;
    const float xi = x[i];
    const uint32_t key = MagnitudeKey(xi);
    const unsigned long long gt_before = run & 0xffffffffull, eq_before = run >> 32;
    const bool take = key > t || (key == t && eq_before < need_eq);
    if (take) {
      const unsigned long long pos = gt_before + (eq_before < need_eq ? eq_before : need_eq);
      StoreF32(vals + 4 * pos, xi);
      const uint32_t ii = static_cast<uint32_t>(i);
      idxs[4 * pos] = static_cast<u8>(ii);
      idxs[4 * pos + 1] = static_cast<u8>(ii >> 8);
      idxs[4 * pos + 2] = static_cast<u8>(ii >> 16);
      idxs[4 * pos + 3] = static_cast<u8>(ii >> 24);
      if (resid) resid[i] = 0.0f;
      if (u) {
        u[i] = 0.0f;
        v[i] = 0.0f;
      }
    }
    run += Flags(key, t);
  }
}

__global__ void RandkEncodeKernel(const float* x, int64_t k, Feistel f, uint32_t n, float* resid, float* u, float* v,
                                  u8* payload) {
  GRID_STRIDE(j, k) {
    const uint32_t i = FeistelPermute(f, n, static_cast<uint32_t>(j));
    StoreF32(payload + 4 * j, x[i]);
    if (resid) resid[i] = 0.0f;
    if (u) {
      u[i] = 0.0f;
      v[i] = 0.0f;
    }
  }
}

__global__ void RandkDecodeKernel(const u8* p, int64_t k, Feistel f, uint32_t n, int world, float* out) {
  const float wf = static_cast<float>(world);
  GRID_STRIDE(j, k) out[FeistelPermute(f, n, static_cast<uint32_t>(j))] = LoadF32(p + 4 * j) / wf;
}

__global__ void ScatterAddKernel(const u8* pr, int64_t k, int64_t n, float* out) {
  GRID_STRIDE(j, k) {
    const u8* q = pr + 4 * k + 4 * j;
    const int32_t i = static_cast<int32_t>(q[0] | (q[1] << 8) | (q[2] << 16) | (static_cast<uint32_t>(q[3]) << 24));
    if (i >= 0 && i < n) atomicAdd(&out[i], LoadF32(pr + 4 * j));  // unique per rank: no contention
  }
}

__global__ void DivideKernel(float* out, int64_t n, int world) {
  const float wf = static_cast<float>(world);
  GRID_STRIDE(i, n) out[i] /= wf;
}

class CudaCompressor final : public Compressor {
 public:
  explicit CudaCompressor(const CompressorLayout& l) : Compressor(l, Backend::kCuda) {}
  ~CudaCompressor() override {
    if (workspace_) cudaFree(workspace_);
  }

  Status Init() {
    const auto& L = layout();
    num_tiles_ = (L.n + kTile - 1) / kTile;
    // Workspace: partials | scalars | selection | histogram | tile counts.
    off_scalars_ = sizeof(Acc) * kReduceBlocks;
    off_sel_ = off_scalars_ + 16;
    off_hist_ = off_sel_ + sizeof(Selection);
    off_tiles_ = (off_hist_ + 256 * 4 + 7) / 8 * 8;
    const size_t bytes = off_tiles_ + 8 * static_cast<size_t>(num_tiles_);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_, bytes));
    return Status::Ok();
  }

 private:
  template <typename T>
  T* Ws(size_t off) {
    return reinterpret_cast<T*>(static_cast<char*>(workspace_) + off);
  }

  template <Red R>
  void Reduce(const float* x, u8* meta, cudaStream_t s) {
    ReduceKernel<R><<<kReduceBlocks, kThreads, 0, s>>>(x, layout().n, Ws<Acc>(0));
    FinishKernel<R><<<1, 32, 0, s>>>(Ws<Acc>(0), layout().n, Ws<float>(off_scalars_), meta);
  }

  void TopK(const float* x, float* resid, float* u, float* v, u8* payload, cudaStream_t s) {
    const auto& L = layout();
    Selection* sel = Ws<Selection>(off_sel_);
    uint32_t* hist = Ws<uint32_t>(off_hist_);
    InitSelectionKernel<<<1, 1, 0, s>>>(sel, L.k, hist);
    for (int shift = 24; shift >= 0; shift -= 8) {
      HistogramKernel<<<Blocks(L.n), kThreads, 0, s>>>(x, L.n, sel, shift, hist);
      PickDigitKernel<<<1, 1, 0, s>>>(sel, shift, hist);
    }
    auto* tiles = Ws<unsigned long long>(off_tiles_);
    const unsigned grid = static_cast<unsigned>(num_tiles_);
    TileCountKernel<<<grid, kThreads, 0, s>>>(x, L.n, sel, tiles);
    TileScanKernel<<<1, 1024, 0, s>>>(tiles, num_tiles_);
    TileSelectKernel<<<grid, kThreads, 0, s>>>(x, L.n, L.k, sel, tiles, resid, u, v, payload);
  }

  Status EncodeImpl(const float* grad, float* state, uint64_t iteration, std::byte* payload_b, void* stream) override {
    const auto& L = layout();
    const int64_t n = L.n;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    u8* payload = reinterpret_cast<u8*>(payload_b);
    const unsigned grid = Blocks(n);
    const float* x = grad;
    float *resid = nullptr, *u = nullptr, *v = nullptr, *tail = state;
    if (L.memory == MemoryKind::kResidual) {
      resid = state;
      AddKernel<<<grid, kThreads, 0, s>>>(resid, grad, n);
      x = resid;
      tail = state + n;
    } else if (L.memory == MemoryKind::kDgc) {
      u = state;
      v = state + n;
      DgcMemoryKernel<<<grid, kThreads, 0, s>>>(u, v, grad, n);
      x = v;
      tail = state + 2 * n;
    }
    if (L.kind == CompressorKind::kSignum) {
      SignumKernel<<<grid, kThreads, 0, s>>>(tail, x, n);
      x = tail;
    }
    const uint64_t key = StreamKey(L.seed, iteration);
    float* scalars = Ws<float>(off_scalars_);
    switch (L.kind) {
      case CompressorKind::kFp32:
        CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(payload, x, 4 * n, cudaMemcpyDeviceToDevice, s));
        if (resid) CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(resid, 0, 4 * n, s));
        break;
      case CompressorKind::kFp16: Fp16EncodeKernel<<<grid, kThreads, 0, s>>>(x, resid, n, L.world_size, payload); break;
      case CompressorKind::kTopk:
      case CompressorKind::kDgc: TopK(x, resid, u, v, payload, s); break;
      case CompressorKind::kRandk: {
        const Feistel f = MakeFeistel(L.seed, iteration, static_cast<uint32_t>(n));
        RandkEncodeKernel<<<Blocks(L.k), kThreads, 0, s>>>(x, L.k, f, static_cast<uint32_t>(n), resid, u, v, payload);
        if (resid) ZeroNonFiniteKernel<<<grid, kThreads, 0, s>>>(resid, n);
        break;
      }
      case CompressorKind::kQsgd:
        Reduce<Red::kSumSquares>(x, payload + n, s);
        QsgdEncodeKernel<<<grid, kThreads, 0, s>>>(x, resid, n, key, scalars, payload);
        break;
      case CompressorKind::kSignsgd:
      case CompressorKind::kEfsignsgd:
      case CompressorKind::kSignum:
        Reduce<Red::kSumAbs>(x, payload + (n + 7) / 8, s);
        SignEncodeKernel<<<Blocks((n + 7) / 8), kThreads, 0, s>>>(x, resid, n, scalars, false,
                                                                  L.kind == CompressorKind::kSignum, payload);
        break;
      case CompressorKind::kOnebit:
        Reduce<Red::kOnebit>(x, payload + (n + 7) / 8, s);
        SignEncodeKernel<<<Blocks((n + 7) / 8), kThreads, 0, s>>>(x, resid, n, scalars, true, false, payload);
        break;
      case CompressorKind::kTerngrad:
        Reduce<Red::kMaxAbs>(x, payload + (n + 3) / 4, s);
        TerngradEncodeKernel<<<Blocks((n + 3) / 4), kThreads, 0, s>>>(x, resid, n, key, scalars, payload);
        break;
    }
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  Status DecodeImpl(const std::byte* payloads_b, float* out, uint64_t iteration, void* stream) override {
    const auto& L = layout();
    const int64_t n = L.n;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    const u8* p = reinterpret_cast<const u8*>(payloads_b);
    const unsigned grid = Blocks(n);
    switch (L.kind) {
      case CompressorKind::kFp32: Fp32DecodeKernel<<<grid, kThreads, 0, s>>>(p, n, L.world_size, out); break;
      case CompressorKind::kFp16: Fp16DecodeKernel<<<grid, kThreads, 0, s>>>(p, n, out); break;
      case CompressorKind::kRandk: {
        CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0, 4 * n, s));
        const Feistel f = MakeFeistel(L.seed, iteration, static_cast<uint32_t>(n));
        RandkDecodeKernel<<<Blocks(L.k), kThreads, 0, s>>>(p, L.k, f, static_cast<uint32_t>(n), L.world_size, out);
        break;
      }
      case CompressorKind::kTopk:
      case CompressorKind::kDgc:
        CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0, 4 * n, s));
        for (int r = 0; r < L.world_size; ++r)
          ScatterAddKernel<<<Blocks(L.k), kThreads, 0, s>>>(p + r * L.payload_bytes, L.k, n, out);
        if (L.world_size > 1) DivideKernel<<<grid, kThreads, 0, s>>>(out, n, L.world_size);
        break;
      case CompressorKind::kQsgd:
        QsgdDecodeKernel<<<grid, kThreads, 0, s>>>(p, n, L.world_size, L.payload_bytes, out);
        break;
      case CompressorKind::kSignsgd:
      case CompressorKind::kEfsignsgd:
      case CompressorKind::kSignum:
      case CompressorKind::kOnebit:
        SignDecodeKernel<<<grid, kThreads, 0, s>>>(p, n, L.world_size, L.payload_bytes,
                                                   L.kind == CompressorKind::kOnebit, out);
        break;
      case CompressorKind::kTerngrad:
        TerngradDecodeKernel<<<grid, kThreads, 0, s>>>(p, n, L.world_size, L.payload_bytes, out);
        break;
    }
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  void* workspace_ = nullptr;
  int64_t num_tiles_ = 0;
  size_t off_scalars_ = 0, off_sel_ = 0, off_hist_ = 0, off_tiles_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Compressor>> MakeCudaCompressor(const CompressorLayout& layout) {
  CUPCAKE_RETURN_IF_ERROR(DeviceAvailable());
  auto c = std::make_unique<CudaCompressor>(layout);
  CUPCAKE_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Compressor>(std::move(c));
}

}  // namespace cupcake::kernels::cuda

// CUDA implementation of every compressor and memory, step for step the CPU reference's
// (kernels/src/cpu/cpu_compressor.cc) with the same scalar code (kernels/src/common.h) and no
// FMA contraction (--fmad=false), so elementwise results match bit for bit. Reductions (norm,
// means) sum in double with a fixed grid, deterministic from run to run but in another order
// than the CPU: scales may differ in the last bits (test/kernels/cuda_matches_cpu_test.cc).
//
// Memory traffic (docs/KERNELS.md counts the bytes per kernel):
//   - Elementwise passes give each thread 4 consecutive elements, read and written 16 bytes at a
//     time when the pointers allow (a scalar path otherwise), so enough loads are in flight to
//     fill the memory system.
//   - Residual memory is fused: the passes read e and g and use x = e + g (the CPU's e += g, the
//     same float sum), and the last pass writes the new residual, so no pass only adds.
//     signum's momentum is updated in its reduction pass. Other memory combinations run the
//     memory as a pass of its own first, as the CPU does.
//   - Reductions run on a fixed grid; the last block to finish (a counter in the workspace)
//     sums the partials in a fixed order and writes the scale, so a reduction is one launch.
//   - Dense decodes compute each rank's scale (the division by W included) once, not once per
//     element: per block into shared memory (sign family, onebit), or by a kernel of its own into
//     the workspace (qsgd, terngrad), whichever measured faster for the kind.
//
// Top-k (topk, dgc): radix selection over MagnitudeKey in three digits (11, 12 and 8 bits), no
// sort:
//   1. pass A applies the memory (residual or dgc, writing it) and histograms the top 11 bits;
//      a one-block kernel picks the digit holding the k-th largest key;
//   2. pass B histograms the next 12 bits of the keys that share that digit; pick;
//   3. pass C, per 4096-element tile: the tile's count of keys above the 23-bit prefix and its
//      histogram of the last 8 bits among keys with the prefix (uint16 per bin); pick: the k-th
//      largest key T and need_eq, the entries equal to T that belong to the top k;
//   4. per tile, (key > T, key == T) counts from its histogram, an exclusive scan over the tiles,
//      then each tile's block scan ranks its selected entries in index order (ties: the lowest
//      indices) and writes them.
// Four full reads of x (pass A with the memory, B, C, the select) against six before.
// dgc selects the same set with the same kernels (the CPU's sampled threshold only narrows
// its candidate scan; the result is identical by construction).
// Sparse decode: by tiles of the output, each rank's run of ascending indices added in shared
// memory in rank order (SparseDecodeKernel, below); out-of-range indices are skipped (the CPU
// reports them; checking here would need a host sync).
#include <cuda_runtime.h>

#include <cub/block/block_load.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <memory>
#include <type_traits>

#include "../src/backends.h"
#include "../src/common.h"
#include "cupcake/internal/cuda_status.h"

namespace cupcake::kernels::cuda {
namespace {

using namespace cupcake::kernels::detail;  // NOLINT: the shared scalar helpers
using u8 = unsigned char;

constexpr int kThreads = 256;
constexpr int kVec = 4;  // elements per thread in the elementwise passes
constexpr int kReduceBlocks = 1024;
constexpr int kHistBlocks = 1024;
constexpr int kItems = 16;
constexpr int kTile = kThreads * kItems;
constexpr int kRankChunk = 256;  // ranks whose scales a decode block holds in shared memory at once
constexpr unsigned kFullMask = 0xffffffffu;

// Blocks for `work` items of one thread each, capped (grid-stride loops cover the rest).
unsigned Blocks(int64_t work) {
  int64_t b = (work + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > (1 << 20)) b = 1 << 20;
  return static_cast<unsigned>(b);
}
// Groups of kVec elements covering n; blocks for them, one group per thread.
__host__ __device__ int64_t VecGroups(int64_t n) { return (n + kVec - 1) / kVec; }
unsigned VecBlocks(int64_t n) { return Blocks(VecGroups(n)); }

#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); i += int64_t{gridDim.x} * blockDim.x)

// A grid-stride loop over groups of kVec elements whose trip count is the same for the 32 lanes
// of a warp (the grid's thread count is a multiple of 32), so the body may use warp votes and
// shuffles; `q` is this thread's group, valid when q * kVec < n.
#define WARP_UNIFORM_VEC_STRIDE(q, n)                                                          \
  for (int64_t q = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;                             \
       (q - static_cast<int64_t>(threadIdx.x % 32)) * kVec < (n); q += int64_t{gridDim.x} * blockDim.x)

__host__ __device__ bool Aligned(const void* p, int bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }
// A little-endian int32 at any alignment (payload indices).
__device__ __forceinline__ int32_t LoadI32(const unsigned char* q) {
  return static_cast<int32_t>(q[0] | (q[1] << 8) | (q[2] << 16) | (static_cast<uint32_t>(q[3]) << 24));
}

// ---- four elements at a time ----
struct F4 {
  float v[kVec];
};

// p[i .. i+3] (zeros past n): one 16-byte load when p + i is 16-byte aligned and in range.
__device__ __forceinline__ F4 Load4(const float* p, int64_t i, int64_t n) {
  F4 r;
  if (i + kVec <= n && (reinterpret_cast<uintptr_t>(p + i) & 15) == 0) {
    const float4 v = *reinterpret_cast<const float4*>(p + i);
    r.v[0] = v.x;
    r.v[1] = v.y;
    r.v[2] = v.z;
    r.v[3] = v.w;
  } else {
    for (int j = 0; j < kVec; ++j) r.v[j] = i + j < n ? p[i + j] : 0.0f;
  }
  return r;
}
__device__ __forceinline__ void Store4(float* p, int64_t i, int64_t n, const F4& r) {
  if (i + kVec <= n && (reinterpret_cast<uintptr_t>(p + i) & 15) == 0) {
    *reinterpret_cast<float4*>(p + i) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
  } else {
    for (int j = 0; j < kVec; ++j)
      if (i + j < n) p[i + j] = r.v[j];
  }
}
// `count` bytes (<= 8) at p: one store when aligned to their size, else byte by byte.
__device__ __forceinline__ void StoreBytes(u8* p, uint64_t bytes, int count) {
  if (count == 8 && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    *reinterpret_cast<uint64_t*>(p) = bytes;
  } else if (count == 4 && (reinterpret_cast<uintptr_t>(p) & 3) == 0) {
    *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(bytes);
  } else {
    for (int j = 0; j < count; ++j) p[j] = static_cast<u8>(bytes >> (8 * j));
  }
}

// Sources of x, the vector a pass compresses. Load(i, n) returns x[i .. i+3].
// Plain: x is an array (the gradient, or memory a previous pass updated).
struct Plain {
  const float* x;
  __device__ F4 Load(int64_t i, int64_t n) const { return Load4(x, i, n); }
};
// Residual memory, fused: x = e + g, the CPU's e += g. Passes that end the encode write the
// new residual over e themselves.
struct ResidualSum {
  const float* e;
  const float* g;
  __device__ F4 Load(int64_t i, int64_t n) const {
    F4 a = Load4(e, i, n);
    const F4 b = Load4(g, i, n);
    for (int j = 0; j < kVec; ++j) a.v[j] = a.v[j] + b.v[j];
    return a;
  }
};
// Residual memory applied and written: e += g, x = e (top-k's pass A, whose later passes read e).
struct ResidualUpdate {
  float* e;
  const float* g;
  __device__ F4 Load(int64_t i, int64_t n) const {
    const F4 x = ResidualSum{e, g}.Load(i, n);
    Store4(e, i, n, x);
    return x;
  }
};
// dgc memory applied and written: u = 0.9 u + g, v += u, x = v.
struct DgcUpdate {
  float* u;
  float* v;
  const float* g;
  __device__ F4 Load(int64_t i, int64_t n) const {
    F4 a = Load4(u, i, n), b = Load4(v, i, n);
    const F4 c = Load4(g, i, n);
    for (int j = 0; j < kVec; ++j) {
      a.v[j] = kDgcMomentum * a.v[j] + c.v[j];
      b.v[j] += a.v[j];
    }
    Store4(u, i, n, a);
    Store4(v, i, n, b);
    return b;
  }
};
// signum's momentum applied and written: m = 0.9 m + 0.1 x (0 when not finite), x = m.
struct SignumUpdate {
  float* mom;
  const float* x;
  __device__ F4 Load(int64_t i, int64_t n) const {
    F4 m = Load4(mom, i, n);
    const F4 in = Load4(x, i, n);
    for (int j = 0; j < kVec; ++j) {
      const float t = kSignumMomentum * m.v[j] + (1.0f - kSignumMomentum) * in.v[j];
      m.v[j] = IsFinite(t) ? t : 0.0f;
    }
    Store4(mom, i, n, m);
    return m;
  }
};

// ---- memory passes (the combinations that are not fused) ----
__global__ void AddKernel(float* e, const float* g, int64_t n) {
  GRID_STRIDE(q, VecGroups(n)) ResidualUpdate{e, g}.Load(q * kVec, n);
}
__global__ void DgcMemoryKernel(float* u, float* v, const float* g, int64_t n) {
  GRID_STRIDE(q, VecGroups(n)) DgcUpdate{u, v, g}.Load(q * kVec, n);
}

// ---- reductions: Acc of four doubles, summed (or max-ed) over a fixed grid ----
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

// Writes the scale(s) of the reduction `a` over n elements to scalars[] and the payload metadata.
template <Red R>
__device__ void Finish(const Acc& a, int64_t n, float* scalars, u8* meta) {
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

// One launch of kReduceBlocks blocks: each block reduces its grid-stride share and stores a
// partial; the last block to finish (counted in *done, which it resets) combines the partials
// in a fixed order (thread t: partials t, t + 256, ...; then the block reduction) and finishes.
template <Red R, class Src>
__global__ void __launch_bounds__(kThreads) ReduceKernel(Src src, int64_t n, Acc* partials, unsigned* done,
                                                         float* scalars, u8* meta) {
  using BR = cub::BlockReduce<Acc, kThreads>;
  __shared__ typename BR::TempStorage tmp;
  __shared__ bool last;
  Acc a{{0, 0, 0, 0}};
  GRID_STRIDE(q, VecGroups(n)) {
    const F4 x = src.Load(q * kVec, n);
    for (int j = 0; j < kVec; ++j)
      if (q * kVec + j < n) a = Combine<R>()(a, Element<R>(x.v[j]));
  }
  const Acc total = BR(tmp).Reduce(a, Combine<R>());
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = total;
    __threadfence();
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  Acc b{{0, 0, 0, 0}};
  for (int j = threadIdx.x; j < static_cast<int>(gridDim.x); j += kThreads) {
    Acc p;
    for (int c = 0; c < 4; ++c) p.v[c] = __ldcg(&partials[j].v[c]);  // other blocks' writes, not L1's copy
    b = Combine<R>()(b, p);
  }
  __syncthreads();  // tmp is reused
  const Acc all = BR(tmp).Reduce(b, Combine<R>());
  if (threadIdx.x == 0) {
    Finish<R>(all, n, scalars, meta);
    *done = 0;
  }
}

// ---- dense encodes: thread q encodes elements 4q .. 4q+3 ----
template <class Src>
__global__ void Fp32EncodeKernel(Src src, float* resid, int64_t n, u8* payload) {
  GRID_STRIDE(q, VecGroups(n)) {
    const int64_t i = q * kVec;
    const F4 x = src.Load(i, n);
    if (Aligned(payload, 4)) {
      Store4(reinterpret_cast<float*>(payload), i, n, x);
    } else {
      for (int j = 0; j < kVec; ++j)
        if (i + j < n) StoreF32(payload + 4 * (i + j), x.v[j]);
    }
    if (resid) Store4(resid, i, n, F4{{0.0f, 0.0f, 0.0f, 0.0f}});
  }
}

template <class Src>
__global__ void Fp16EncodeKernel(Src src, float* resid, int64_t n, int world, u8* payload) {
  const float wf = static_cast<float>(world);
  const float inv_w = 1.0f / wf;
  GRID_STRIDE(q, VecGroups(n)) {
    const int64_t i = q * kVec;
    const F4 x = src.Load(i, n);
    uint64_t halves = 0;
    F4 e;
    for (int j = 0; j < kVec; ++j) {
      const uint16_t h = FloatToHalf(x.v[j] * inv_w);
      halves |= static_cast<uint64_t>(h) << (16 * j);
      const float r = x.v[j] - HalfToFloat(h) * wf;
      e.v[j] = IsFinite(r) ? r : 0.0f;
    }
    const int count = static_cast<int>(n - i < kVec ? n - i : kVec);
    StoreBytes(payload + 2 * i, halves, 2 * count);
    if (resid) Store4(resid, i, n, e);
  }
}

template <class Src>
__global__ void QsgdEncodeKernel(Src src, float* resid, int64_t n, uint64_t key, const float* scalars, u8* payload) {
  const float norm = scalars[0];
  const float scale = norm > 0.0f ? kQsgdLevels / norm : 0.0f;
  const float unit = norm / kQsgdLevels;
  GRID_STRIDE(q, VecGroups(n)) {
    const int64_t i = q * kVec;
    const F4 x = src.Load(i, n);
    u8 bytes[kVec];
    F4 e;
    for (int j = 0; j < kVec; ++j)
      e.v[j] = QsgdQuantizeOne(x.v[j], scale, unit, key, static_cast<uint32_t>(i + j), &bytes[j]);
    const int count = static_cast<int>(n - i < kVec ? n - i : kVec);
    StoreBytes(payload + i, uint64_t{bytes[0]} | uint64_t{bytes[1]} << 8 | uint64_t{bytes[2]} << 16 |
                                uint64_t{bytes[3]} << 24,
               count);
    if (resid) Store4(resid, i, n, e);
  }
}

// Sign bits: thread q holds the 4 bits of elements 4q .. 4q+3 (bit j: element 4q+j negative);
// the even lane of each pair writes the byte of both. pos/neg from scalars: the sign family
// (s, -s) or onebit's two means. signum_resid: the residual of signum with residual memory,
// whose bits come from the momentum x but whose residual is against the input held in resid.
template <class Src>
__global__ void SignEncodeKernel(Src src, float* resid, int64_t n, const float* scalars, bool two_means,
                                 bool signum_resid, u8* bits) {
  const float pos = scalars[0];
  const float neg = two_means ? scalars[1] : -scalars[0];
  WARP_UNIFORM_VEC_STRIDE(q, n) {
    const int64_t i = q * kVec;
    const bool valid = i < n;
    uint32_t nibble = 0;
    if (valid) {
      const F4 x = src.Load(i, n);
      F4 e = signum_resid ? Load4(resid, i, n) : x;
      for (int j = 0; j < kVec; ++j) {
        const float v = x.v[j];
        nibble |= static_cast<uint32_t>(i + j < n && v < 0.0f) << j;
        const float r = e.v[j] - (v < 0.0f ? neg : pos);
        e.v[j] = signum_resid ? (IsFinite(r) ? r : 0.0f) : (IsFinite(v) ? r : 0.0f);
      }
      if (resid) Store4(resid, i, n, e);
    }
    const uint32_t odd = __shfl_down_sync(kFullMask, nibble, 1);
    if (valid && (q & 1) == 0) bits[q / 2] = static_cast<u8>(nibble | (odd << 4));
  }
}

// Two-bit codes: thread q writes the byte of elements 4q .. 4q+3.
template <class Src>
__global__ void TerngradEncodeKernel(Src src, float* resid, int64_t n, uint64_t key, const float* scalars,
                                     u8* codes) {
  const float mx = scalars[0];
  const float inv = mx > 0.0f ? 1.0f / mx : 0.0f;
  GRID_STRIDE(q, VecGroups(n)) {
    const int64_t i = q * kVec;
    const F4 x = src.Load(i, n);
    uint32_t byte = 0;
    F4 e;
    for (int j = 0; j < kVec; ++j) {
      const float v = x.v[j];
      const uint32_t c = i + j < n ? TerngradCode(v, inv, key, static_cast<uint32_t>(i + j)) : 0u;
      byte |= c << (2 * j);
      const float sent = c == 1u ? mx : (c == 2u ? -mx : 0.0f);
      e.v[j] = c == 3u ? 0.0f : v - sent;
    }
    codes[q] = static_cast<u8>(byte);
    if (resid) Store4(resid, i, n, e);
  }
}

// ---- dense decodes: ranks summed in order, the CPU's float operations; fp32, fp16, qsgd and
// terngrad write out[4q .. 4q+3] from thread q, the sign family 8 elements per thread ----
__global__ void Fp32DecodeKernel(const u8* p, int64_t n, int world, float* out) {
  const float wf = static_cast<float>(world);
  GRID_STRIDE(q, VecGroups(n)) {
    const int64_t i = q * kVec;
    F4 x;
    if (Aligned(p, 4)) {
      x = Load4(reinterpret_cast<const float*>(p), i, n);
    } else {
      for (int j = 0; j < kVec; ++j) x.v[j] = i + j < n ? LoadF32(p + 4 * (i + j)) : 0.0f;
    }
    for (int j = 0; j < kVec; ++j) x.v[j] = x.v[j] / wf;
    Store4(out, i, n, x);
  }
}

__global__ void Fp16DecodeKernel(const u8* p, int64_t n, float* out) {
  GRID_STRIDE(q, VecGroups(n)) {
    const int64_t i = q * kVec;
    uint64_t halves = 0;
    if (i + kVec <= n && Aligned(p + 2 * i, 8)) {
      halves = *reinterpret_cast<const uint64_t*>(p + 2 * i);
    } else {
      for (int j = 0; j < 2 * kVec; ++j)
        if (i + j / 2 < n) halves |= static_cast<uint64_t>(p[2 * i + j]) << (8 * j);
    }
    F4 x;
    for (int j = 0; j < kVec; ++j) x.v[j] = HalfToFloat(static_cast<uint16_t>(halves >> (16 * j)));
    Store4(out, i, n, x);
  }
}

enum class Dense { kQsgd, kSign, kOnebit, kTerngrad };

// The per-rank scale(s) of a dense payload at pr, divided as the CPU divides.
template <Dense D>
__device__ void RankScales(const u8* pr, int64_t n, float wf, float* a, float* b) {
  if (D == Dense::kQsgd) {
    *a = LoadF32(pr + n) / (kQsgdLevels * wf);
  } else if (D == Dense::kTerngrad) {
    *a = LoadF32(pr + (n + 3) / 4) / wf;
  } else {
    const int64_t nb = (n + 7) / 8;
    *a = LoadF32(pr + nb) / wf;
    *b = D == Dense::kOnebit ? LoadF32(pr + nb + 4) / wf : -*a;
  }
}

// Elements i .. i+3 of the rank whose qsgd or terngrad payload is at pr, from the rank's scale a.
template <Dense D>
__device__ void RankValues(const u8* pr, int64_t i, int64_t n, float a, F4* v) {
  if (D == Dense::kQsgd) {
    uint32_t w = 0;
    if (i + kVec <= n && Aligned(pr + i, 4)) {
      w = *reinterpret_cast<const uint32_t*>(pr + i);
    } else {
      for (int j = 0; j < kVec; ++j)
        if (i + j < n) w |= static_cast<uint32_t>(pr[i + j]) << (8 * j);
    }
    for (int j = 0; j < kVec; ++j) {
      const int8_t q = static_cast<int8_t>(w >> (8 * j));
      v->v[j] = q == -128 ? __int_as_float(0x7fc00000) : static_cast<float>(q) * a;
    }
  } else {  // terngrad: code 0, 1, 2, 3 is 0, a, -a, NaN
    // Three selects on the code's two bits, not a chain of compares: the codes differ from
    // element to element, so a branch per code would split every warp.
    const uint32_t byte = pr[i / 4];
    const float neg = -a, nan = __int_as_float(0x7fc00000);
    for (int j = 0; j < kVec; ++j) {
      const bool low = (byte >> (2 * j)) & 1u, high = (byte >> (2 * j)) & 2u;
      const float if_low = low ? a : 0.0f, if_high = low ? nan : neg;
      v->v[j] = high ? if_high : if_low;
    }
  }
}

// Sign bits (signsgd, efsignsgd, signum, onebit): each warp decodes 32 bytes of every rank's
// bits (256 elements), each lane 8 elements as two runs of 4 (one 16-byte store each) placed so
// that each of the warp's two stores covers 512 contiguous bytes: lane t takes elements 4t .. 4t+3
// and 128 + 4t .. 131 + 4t of the warp's run, the nibbles (t & 1) of bytes t / 2 and 16 + t / 2.
// (With a lane's 8 elements adjacent, each store would half-fill 32 sectors, doubling the L2
// write requests: docs/KERNELS.md.) The ranks' scales sit in shared memory per block, loaded
// kRankChunk ranks at a time. Loops are uniform
// per block (they hold __syncthreads). The ranks are summed in rank order, as on the CPU.
template <Dense D>
__global__ void __launch_bounds__(kThreads) SignDecodeKernel(const u8* p, int64_t n, int world, int64_t payload_bytes,
                                                             float* out) {
  __shared__ float sa[kRankChunk], sb[kRankChunk];
  const float wf = static_cast<float>(world);
  const int64_t nb = (n + 7) / 8;
  const int lane = threadIdx.x & 31;
  const int shift = 4 * (lane & 1);
  for (int64_t base = blockIdx.x * int64_t{kThreads}; base < nb; base += int64_t{gridDim.x} * kThreads) {
    const int64_t first = base + (threadIdx.x & ~31);  // the warp's first byte
    const int64_t b0 = first + lane / 2, b1 = b0 + 16;
    const int64_t e0 = 8 * first + 4 * lane, e1 = e0 + 128;  // this lane's two runs of 4 elements
    float acc[8];
    for (int r0 = 0; r0 < world; r0 += kRankChunk) {
      const int chunk = world - r0 < kRankChunk ? world - r0 : kRankChunk;
      __syncthreads();
      for (int c = threadIdx.x; c < chunk; c += kThreads)
        RankScales<D>(p + (r0 + c) * payload_bytes, n, wf, &sa[c], &sb[c]);
      __syncthreads();
      if (b0 >= nb) continue;
      for (int c = 0; c < chunk; ++c) {
        const u8* pr = p + (r0 + c) * payload_bytes;
        const uint32_t bits = ((pr[b0] >> shift) & 15u) | (b1 < nb ? ((pr[b1] >> shift) & 15u) << 4 : 0u);
        const float pos = sa[c], neg = sb[c];
        for (int e = 0; e < 8; ++e) {
          const float v = (bits >> e) & 1u ? neg : pos;
          acc[e] = r0 + c == 0 ? v : acc[e] + v;
        }
      }
    }
    if (e0 < n) Store4(out, e0, n, F4{{acc[0], acc[1], acc[2], acc[3]}});
    if (e1 < n) Store4(out, e1, n, F4{{acc[4], acc[5], acc[6], acc[7]}});
  }
}

// qsgd and terngrad: each rank's scales, divided as the CPU divides, into scales[2r] by a kernel
// of their own, which the decode's threads then load beside their data (no shared memory, no
// barrier). Measured on an H100 at W = 8 (docs/KERNELS.md): against scales in shared memory per
// block, faster for qsgd (275 to 197 us at 32 Mi elements) and terngrad (216 to 201 us), slower
// for the sign family (113 to 127 us), which keeps SignDecodeKernel.
template <Dense D>
__global__ void RankScalesKernel(const u8* p, int64_t n, int world, int64_t payload_bytes, float* scales) {
  const float wf = static_cast<float>(world);
  GRID_STRIDE(r, world) RankScales<D>(p + r * payload_bytes, n, wf, &scales[2 * r], &scales[2 * r + 1]);
}

template <Dense D>
__global__ void __launch_bounds__(kThreads) DenseDecodeGlobalKernel(const u8* p, int64_t n, int world,
                                                                    int64_t payload_bytes, const float* scales,
                                                                    float* out) {
  GRID_STRIDE(q, VecGroups(n)) {
    const int64_t i = q * kVec;
    F4 acc{{0.0f, 0.0f, 0.0f, 0.0f}};
    if (world > 0) RankValues<D>(p, i, n, scales[0], &acc);  // rank 0 taken as is, then the rest added
    for (int r = 1; r < world; ++r) {
      F4 v;
      RankValues<D>(p + r * payload_bytes, i, n, scales[2 * r], &v);
      for (int j = 0; j < kVec; ++j) acc.v[j] = acc.v[j] + v.v[j];
    }
    Store4(out, i, n, acc);
  }
}

// ---- sparse ----
// The radix selection's state: the digits chosen so far (prefix under mask) and how many of the
// top k are still to be found among the keys that share them (after the last pick: need_eq).
struct Selection {
  uint32_t prefix;
  uint32_t mask;
  long long remaining;
};

constexpr int kBinsA = 2048, kShiftA = 20;  // key bits 30..20
constexpr int kBinsB = 4096, kShiftB = 8;  // key bits 19..8
constexpr int kBinsC = 256;  // key bits 7..0
static_assert(kBinsC == kThreads, "pass C gives each thread one bin");

__global__ void InitSelectionKernel(Selection* sel, int64_t k, uint32_t* hist) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    sel->prefix = 0;
    sel->mask = 0;
    sel->remaining = k;
  }
  for (int d = threadIdx.x; d < kBinsA + kBinsB + kBinsC; d += blockDim.x) hist[d] = 0;
}

// Adds one to sh[digit] for every lane with `match`. A warp whose lanes all match with one digit
// (a run of equal values: zeros, a clipped range) adds once; otherwise each lane adds, and lanes
// on one address serialize in the shared-memory atomic unit, which on gradients (few lanes per
// bin) costs less than aggregating every warp (__match_any_sync).
__device__ __forceinline__ void WarpCount(uint32_t* sh, bool match, uint32_t digit) {
  const unsigned active = __ballot_sync(kFullMask, match);
  if (active == kFullMask && __all_sync(kFullMask, digit == __shfl_sync(kFullMask, digit, 0))) {
    if ((threadIdx.x % 32) == 0) atomicAdd(&sh[digit], 32u);
    return;
  }
  if (match) atomicAdd(&sh[digit], 1u);
}

// Passes A and B (and the gain probe's last 8 bits): a histogram of (key >> shift) & (bins - 1)
// over the keys under the selection's prefix, on a fixed grid of kHistBlocks (each block flushes
// its shared histogram once). kSel selections at once (sel[s], into hist + s * stride): one read
// of x serves them all.
template <int kBins, int kSel, class Src>
__global__ void __launch_bounds__(kThreads) HistogramKernel(Src src, int64_t n, const Selection* sel, int shift,
                                                            uint32_t* hist, int64_t stride) {
  __shared__ uint32_t sh[kSel * kBins];
  for (int d = threadIdx.x; d < kSel * kBins; d += kThreads) sh[d] = 0;
  __syncthreads();
  uint32_t prefix[kSel], mask[kSel];
  for (int c = 0; c < kSel; ++c) {
    prefix[c] = sel[c].prefix;
    mask[c] = sel[c].mask;
  }
  WARP_UNIFORM_VEC_STRIDE(q, n) {
    const int64_t i = q * kVec;
    F4 x{{0.0f, 0.0f, 0.0f, 0.0f}};
    if (i < n) x = src.Load(i, n);
    for (int j = 0; j < kVec; ++j) {
      const uint32_t key = MagnitudeKey(x.v[j]);
      for (int c = 0; c < kSel; ++c)
        WarpCount(sh + c * kBins, i + j < n && (key & mask[c]) == prefix[c], (key >> shift) & (kBins - 1));
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < kSel * kBins; d += kThreads)
    if (sh[d]) atomicAdd(&hist[(d / kBins) * stride + d % kBins], sh[d]);
}

// One block of 1024 threads per selection (block b: sel[b], hist + b * stride): the digit (of
// kBins, descending) holding the selection's remaining-th largest key; updates the selection.
// Thread t owns the bins t*P .. t*P+P-1 counted from the largest digit.
template <int kBins>
__global__ void __launch_bounds__(1024) PickDigitKernel(Selection* sel_base, int shift, const uint32_t* hist_base,
                                                        int64_t stride) {
  constexpr int P = kBins >= 1024 ? kBins / 1024 : 1;
  using BS = cub::BlockScan<unsigned long long, 1024>;
  __shared__ typename BS::TempStorage tmp;
  Selection* sel = sel_base + blockIdx.x;
  const uint32_t* hist = hist_base + blockIdx.x * stride;
  const long long remaining = sel->remaining;
  unsigned long long counts[P], mine = 0;
  for (int j = 0; j < P; ++j) {
    const int pos = threadIdx.x * P + j;
    counts[j] = pos < kBins ? hist[kBins - 1 - pos] : 0;
    mine += counts[j];
  }
  unsigned long long before;
  BS(tmp).ExclusiveSum(mine, before);
  for (int j = 0; j < P; ++j) {
    const int pos = threadIdx.x * P + j;
    if (pos >= kBins) break;
    const bool reaches = static_cast<long long>(before + counts[j]) >= remaining || pos == kBins - 1;
    if (reaches && static_cast<long long>(before) < remaining) {
      sel->remaining = remaining - static_cast<long long>(before);
      sel->prefix |= static_cast<uint32_t>(kBins - 1 - pos) << shift;
      sel->mask |= static_cast<uint32_t>(kBins - 1) << shift;
    }
    before += counts[j];
  }
}

// Pass C, one block per tile of kTile elements: keys above the 23-bit prefix (bits 30..8)
// counted into tile_above, and the keys with the prefix histogrammed by their last 8 bits, into
// the tile's tile_hist (uint16: a tile has at most 4096 entries) and the global hist.
template <class Src>
__global__ void __launch_bounds__(kThreads) TileHistogramKernel(Src src, int64_t n, const Selection* sel,
                                                                uint32_t* tile_above, uint16_t* tile_hist,
                                                                uint32_t* hist) {
  using BR = cub::BlockReduce<uint32_t, kThreads>;
  __shared__ typename BR::TempStorage tmp;
  __shared__ uint32_t sh[kBinsC];
  sh[threadIdx.x] = 0;  // kThreads == kBinsC
  __syncthreads();
  const uint32_t hi = sel->prefix >> 8;
  const int64_t base = blockIdx.x * int64_t{kTile};
  uint32_t above = 0;
  for (int j = 0; j < kItems / kVec; ++j) {
    const int64_t i = base + (j * kThreads + threadIdx.x) * kVec;  // any order will do for counts
    F4 x{{0.0f, 0.0f, 0.0f, 0.0f}};
    if (i < n) x = src.Load(i, n);
    for (int c = 0; c < kVec; ++c) {
      const uint32_t key = MagnitudeKey(x.v[c]);
      const bool in = i + c < n;
      above += in && (key >> 8) > hi;
      WarpCount(sh, in && (key >> 8) == hi, key & 255u);
    }
  }
  const uint32_t total = BR(tmp).Sum(above);
  __syncthreads();
  if (threadIdx.x == 0) tile_above[blockIdx.x] = total;
  const uint32_t h = sh[threadIdx.x];
  tile_hist[blockIdx.x * int64_t{kBinsC} + threadIdx.x] = static_cast<uint16_t>(h);
  if (h) atomicAdd(&hist[threadIdx.x], h);
}

__device__ unsigned long long Flags(uint32_t key, uint32_t t) {
  return static_cast<unsigned long long>(key > t) | (static_cast<unsigned long long>(key == t) << 32);
}

// One block per tile: (keys > T, keys == T) as one 64-bit pair, from the tile's pass C counts.
__global__ void __launch_bounds__(kThreads) TileCountKernel(const Selection* sel, const uint32_t* tile_above,
                                                            const uint16_t* tile_hist, unsigned long long* tiles) {
  using BR = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename BR::TempStorage tmp;
  const uint32_t d = sel->prefix & 255u;
  const unsigned long long h = tile_hist[blockIdx.x * int64_t{kBinsC} + threadIdx.x];
  const unsigned long long mine = threadIdx.x > d ? h : (threadIdx.x == d ? h << 32 : 0ull);
  const unsigned long long total = BR(tmp).Sum(mine);
  if (threadIdx.x == 0) tiles[blockIdx.x] = total + tile_above[blockIdx.x];
}

// Exclusive scan of the tile counts by one block: each thread scans kScanItems consecutive tiles,
// chunk after chunk of 1024 x kScanItems tiles (one chunk up to 2^25 elements). __launch_bounds__:
// without it the compiler may use more registers than a 1024-thread block can have (the launch
// then fails with cudaErrorLaunchOutOfResources, as it did on an H100).
constexpr int kScanItems = 8;
__global__ void __launch_bounds__(1024) TileScanKernel(unsigned long long* tiles, int64_t num_tiles) {
  using BS = cub::BlockScan<unsigned long long, 1024>;
  __shared__ typename BS::TempStorage tmp;
  unsigned long long carry = 0;  // the same in every thread: the chunk totals of the scan
  for (int64_t base = 0; base < num_tiles; base += 1024 * kScanItems) {
    const int64_t first = base + int64_t{threadIdx.x} * kScanItems;
    unsigned long long v[kScanItems], mine = 0;
    for (int j = 0; j < kScanItems; ++j) {
      v[j] = first + j < num_tiles ? tiles[first + j] : 0ull;
      mine += v[j];
    }
    unsigned long long ex, total;
    BS(tmp).ExclusiveSum(mine, ex, total);
    ex += carry;
    for (int j = 0; j < kScanItems; ++j) {
      if (first + j < num_tiles) tiles[first + j] = ex;
      ex += v[j];
    }
    carry += total;
    __syncthreads();  // tmp is reused
  }
}

// One block per tile: the tile is loaded coalesced and transposed so that thread t holds
// elements t*16 .. t*16+15 (index order); a block scan ranks the selected entries.
__global__ void __launch_bounds__(kThreads) TileSelectKernel(const float* x, int64_t n, int64_t k,
                                                             const Selection* sel,
                                                             const unsigned long long* tile_offsets, float* resid,
                                                             float* u, float* v, u8* payload) {
  using BL = cub::BlockLoad<float, kThreads, kItems, cub::BLOCK_LOAD_TRANSPOSE>;
  using BS = cub::BlockScan<unsigned long long, kThreads>;
  __shared__ union {
    typename BL::TempStorage load;
    typename BS::TempStorage scan;
  } tmp;
  const uint32_t t = sel->prefix;
  const unsigned long long need_eq = static_cast<unsigned long long>(sel->remaining);
  const int64_t tile = blockIdx.x * int64_t{kTile};
  const int valid = static_cast<int>(n - tile < kTile ? n - tile : kTile);
  float items[kItems];
  BL(tmp.load).Load(x + tile, items, valid, 0.0f);
  __syncthreads();
  const int first = threadIdx.x * kItems;
  unsigned long long mine = 0;
  for (int j = 0; j < kItems; ++j)
    if (first + j < valid) mine += Flags(MagnitudeKey(items[j]), t);
  unsigned long long before;
  BS(tmp.scan).ExclusiveSum(mine, before);
  unsigned long long run = tile_offsets[blockIdx.x] + before;
  u8* vals = payload;
  u8* idxs = payload + 4 * k;
  for (int j = 0; j < kItems; ++j) {
    if (first + j >= valid) break;
    const int64_t i = tile + first + j;
    const float xi = items[j];
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

// randk with residual memory, fused: payload[j] = (e + g)[idx_j] ...
__global__ void RandkGatherKernel(const float* x, const float* g, int64_t k, Feistel f, uint32_t n, u8* payload) {
  GRID_STRIDE(j, k) {
    const uint32_t i = FeistelPermute(f, n, static_cast<uint32_t>(j));
    StoreF32(payload + 4 * j, g ? x[i] + g[i] : x[i]);
  }
}
// ... then e = e + g where finite, else 0 (the CPU's sweep over the memory) ...
__global__ void ResidualFiniteKernel(float* e, const float* g, int64_t n) {
  GRID_STRIDE(q, VecGroups(n)) {
    F4 x = ResidualSum{e, g}.Load(q * kVec, n);
    for (int j = 0; j < kVec; ++j) x.v[j] = IsFinite(x.v[j]) ? x.v[j] : 0.0f;
    Store4(e, q * kVec, n, x);
  }
}
// ... and the sent entries' memory cleared.
__global__ void RandkClearKernel(int64_t k, Feistel f, uint32_t n, float* resid, float* u, float* v) {
  GRID_STRIDE(j, k) {
    const uint32_t i = FeistelPermute(f, n, static_cast<uint32_t>(j));
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
  const bool aligned = Aligned(pr, 4);
  GRID_STRIDE(j, k) {
    const u8* q = pr + 4 * k + 4 * j;
    const int32_t i = aligned ? *reinterpret_cast<const int32_t*>(q) : LoadI32(q);
    const float val = aligned ? *reinterpret_cast<const float*>(pr + 4 * j) : LoadF32(pr + 4 * j);
    if (i >= 0 && i < n) atomicAdd(&out[i], val);  // unique per rank: no contention
  }
}

__global__ void DivideKernel(float* out, int64_t n, int world) {
  const float wf = static_cast<float>(world);
  GRID_STRIDE(q, VecGroups(n)) {
    F4 x = Load4(out, q * kVec, n);
    for (int j = 0; j < kVec; ++j) x.v[j] = x.v[j] / wf;
    Store4(out, q * kVec, n, x);
  }
}


// ---- sparse decode by tiles ----
// out[i] = (0 + v_0(i) + v_1(i) + ...) / W over the ranks whose payload holds index i, in rank
// order (the CPU's float operations), 0 elsewhere; no divide for W = 1. Relies on the payload
// format's ascending indices (compressor.h): each rank's entries for a tile of kDecodeTile
// elements are then one contiguous run, found without a search:
//   1. TileStartsKernel, one thread per entry: entry e of rank r, in tile t_e (its predecessor in
//      t_p), starts the runs of tiles t_p + 1 .. t_e: starts[r][t] = e (and the last entry also
//      ends the tiles after it: k). Indices outside [0, n) are clamped to tiles -1 and T, and so
//      belong to no tile.
//   2. SparseDecodeKernel, one block per tile: the tile starts at zero in shared memory; rank by
//      rank (barriers between), the block adds the rank's run into it, one thread per entry
//      (a rank's indices are distinct, so no two threads of one rank meet); then the tile is
//      divided by W and written with 16-byte stores. (A run that starts out of bounds or out of
//      order is clamped; see the kernel.)
// One write of out and one read of the payloads, against a zero fill, W scatters of atomics and
// a divide pass before. A table beyond kMaxDecodeStarts entries (huge W x n) uses those kernels.
constexpr int kDecodeTile = 4096;  // floats: 16 KiB of shared memory per block
constexpr int64_t kMaxDecodeStarts = int64_t{1} << 24;

__device__ __forceinline__ int64_t DecodeTileOf(int32_t i, int64_t n, int64_t tiles) {
  if (i < 0) return -1;
  return i >= n ? tiles : i / kDecodeTile;
}

__global__ void TileStartsKernel(const u8* p, int64_t n, int64_t k, int world, int64_t payload_bytes,
                                 int64_t tiles, int32_t* starts) {
  const bool aligned = Aligned(p, 4) && payload_bytes % 4 == 0;
  GRID_STRIDE(g, k * world) {
    const int64_t r = g / k, e = g % k;
    const u8* idx = p + r * payload_bytes + 4 * k;
    auto at = [&](int64_t j) { return aligned ? reinterpret_cast<const int32_t*>(idx)[j] : LoadI32(idx + 4 * j); };
    const int64_t t_e = DecodeTileOf(at(e), n, tiles);
    const int64_t t_p = e == 0 ? -1 : DecodeTileOf(at(e - 1), n, tiles);
    int32_t* row = starts + r * (tiles + 1);
    for (int64_t t = t_p + 1; t <= t_e; ++t) row[t] = static_cast<int32_t>(e);
    if (e == k - 1)
      for (int64_t t = t_e + 1; t <= tiles; ++t) row[t] = static_cast<int32_t>(k);
  }
}

// Ranks are taken kRankChunk at a time, their runs' bounds read into shared memory first. When
// no run of the chunk is longer than the block (the usual case: about k / tiles entries), each
// thread loads its entry of kPrefetch ranks at once and the block then adds them rank by rank;
// else a rank's run is walked in steps of the block. Out-of-order payloads (which break the runs:
// wrong values) are clamped so that no read or write leaves its buffer.
constexpr int kPrefetch = 8;
__global__ void __launch_bounds__(kThreads) SparseDecodeKernel(const u8* p, int64_t n, int64_t k, int world,
                                                               int64_t payload_bytes, int64_t tiles,
                                                               const int32_t* starts, float* out) {
  __shared__ float tile[kDecodeTile];
  __shared__ int64_t lo_s[kRankChunk], hi_s[kRankChunk];
  const int64_t t = blockIdx.x;
  const int64_t a = t * kDecodeTile;
  for (int j = threadIdx.x; j < kDecodeTile; j += kThreads) tile[j] = 0.0f;
  auto add = [&](const u8* pr, int64_t e) {
    const int64_t i = LoadI32(pr + 4 * k + 4 * e);
    if (i >= a && i < a + kDecodeTile) tile[i - a] += LoadF32(pr + 4 * e);
  };
  for (int r0 = 0; r0 < world; r0 += kRankChunk) {
    const int chunk = world - r0 < kRankChunk ? world - r0 : kRankChunk;
    __syncthreads();
    bool long_run = false;
    if (threadIdx.x < chunk) {
      const int32_t* row = starts + (r0 + threadIdx.x) * (tiles + 1);
      const int64_t lo = min(max(int64_t{row[t]}, int64_t{0}), k);
      const int64_t hi = min(max(int64_t{row[t + 1]}, lo), k);
      lo_s[threadIdx.x] = lo;
      hi_s[threadIdx.x] = hi;
      long_run = hi - lo > kThreads;
    }
    if (!__syncthreads_or(long_run)) {
      for (int c0 = 0; c0 < chunk; c0 += kPrefetch) {
        int32_t idx[kPrefetch];
        float val[kPrefetch];
        for (int c = 0; c < kPrefetch; ++c) {
          const int64_t e = lo_s[c0 + c < chunk ? c0 + c : 0] + threadIdx.x;
          const bool in = c0 + c < chunk && e < hi_s[c0 + c];
          const u8* pr = p + (r0 + c0 + c) * payload_bytes;
          idx[c] = in ? LoadI32(pr + 4 * k + 4 * e) : -1;
          val[c] = in ? LoadF32(pr + 4 * e) : 0.0f;
        }
        for (int c = 0; c < kPrefetch && c0 + c < chunk; ++c) {
          if (idx[c] >= a && idx[c] < a + kDecodeTile) tile[idx[c] - a] += val[c];
          __syncthreads();  // rank r0 + c0 + c's adds before the next rank's
        }
      }
    } else {
      for (int c = 0; c < chunk; ++c) {
        const u8* pr = p + (r0 + c) * payload_bytes;
        for (int64_t e = lo_s[c] + threadIdx.x; e < hi_s[c]; e += kThreads) add(pr, e);
        __syncthreads();
      }
    }
  }
  __syncthreads();
  const float wf = static_cast<float>(world);
  for (int j = threadIdx.x * kVec; j < kDecodeTile && a + j < n; j += kThreads * kVec) {
    F4 v{{tile[j], tile[j + 1], tile[j + 2], tile[j + 3]}};
    if (world > 1)
      for (int c = 0; c < kVec; ++c) v.v[c] = v.v[c] / wf;
    Store4(out, a + j, n, v);
  }
}

class CudaCompressor final : public Compressor {
 public:
  explicit CudaCompressor(const CompressorLayout& l) : Compressor(l, Backend::kCuda) {}
  ~CudaCompressor() override {
    if (workspace_) cudaFree(workspace_);
  }

  Status Init() {
    const auto& L = layout();
    const bool sparse = L.kind == CompressorKind::kTopk || L.kind == CompressorKind::kDgc;
    num_tiles_ = sparse ? (L.n + kTile - 1) / kTile : 0;
    // Workspace: partials | scalars | reduce counter | selection | histograms (A, B, C) |
    // tile counts (8 B per tile) | tile_above (4 B) | tile_hist (512 B).
    off_scalars_ = sizeof(Acc) * kReduceBlocks;
    off_done_ = off_scalars_ + 16;
    off_sel_ = off_done_ + 16;
    off_hist_ = off_sel_ + sizeof(Selection);
    off_tiles_ = (off_hist_ + 4 * (kBinsA + kBinsB + kBinsC) + 7) / 8 * 8;
    off_above_ = off_tiles_ + 8 * static_cast<size_t>(num_tiles_);
    off_tile_hist_ = off_above_ + 4 * static_cast<size_t>(num_tiles_);
    off_rank_scales_ = off_tile_hist_ + 2 * kBinsC * static_cast<size_t>(num_tiles_);
    off_decode_starts_ = off_rank_scales_ + 8 * static_cast<size_t>(L.world_size);
    decode_tiles_ = (L.n + kDecodeTile - 1) / kDecodeTile;
    tiled_decode_ = sparse && L.world_size * (decode_tiles_ + 1) <= kMaxDecodeStarts;
    const size_t bytes =
        off_decode_starts_ + (tiled_decode_ ? 4 * static_cast<size_t>(L.world_size * (decode_tiles_ + 1)) : 0);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_, bytes));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemset(workspace_, 0, bytes));  // the reduce counter starts at 0
    return Status::Ok();
  }

 private:
  template <typename T>
  T* Ws(size_t off) {
    return reinterpret_cast<T*>(static_cast<char*>(workspace_) + off);
  }

  template <Dense D>
  void DenseDecodeGlobal(const u8* p, float* out, cudaStream_t s) {
    const auto& L = layout();
    float* scales = Ws<float>(off_rank_scales_);
    RankScalesKernel<D><<<Blocks(L.world_size), kThreads, 0, s>>>(p, L.n, L.world_size, L.payload_bytes, scales);
    DenseDecodeGlobalKernel<D><<<VecBlocks(L.n), kThreads, 0, s>>>(p, L.n, L.world_size, L.payload_bytes, scales, out);
  }

  template <Red R, class Src>
  void Reduce(Src src, u8* meta, cudaStream_t s) {
    ReduceKernel<R><<<kReduceBlocks, kThreads, 0, s>>>(src, layout().n, Ws<Acc>(0), Ws<unsigned>(off_done_),
                                                       Ws<float>(off_scalars_), meta);
  }

  // Pass A's source applies the memory; the later passes read x from where it left it.
  template <class SrcA>
  void TopK(SrcA first, const float* x, float* resid, float* u, float* v, u8* payload, cudaStream_t s) {
    const auto& L = layout();
    Selection* sel = Ws<Selection>(off_sel_);
    uint32_t* hist = Ws<uint32_t>(off_hist_);
    InitSelectionKernel<<<1, 1024, 0, s>>>(sel, L.k, hist);
    HistogramKernel<kBinsA, 1><<<kHistBlocks, kThreads, 0, s>>>(first, L.n, sel, kShiftA, hist, 0);
    PickDigitKernel<kBinsA><<<1, 1024, 0, s>>>(sel, kShiftA, hist, 0);
    HistogramKernel<kBinsB, 1><<<kHistBlocks, kThreads, 0, s>>>(Plain{x}, L.n, sel, kShiftB, hist + kBinsA, 0);
    PickDigitKernel<kBinsB><<<1, 1024, 0, s>>>(sel, kShiftB, hist + kBinsA, 0);
    const unsigned grid = static_cast<unsigned>(num_tiles_);
    auto* tiles = Ws<unsigned long long>(off_tiles_);
    auto* above = Ws<uint32_t>(off_above_);
    auto* tile_hist = Ws<uint16_t>(off_tile_hist_);
    uint32_t* hist_c = hist + kBinsA + kBinsB;
    TileHistogramKernel<<<grid, kThreads, 0, s>>>(Plain{x}, L.n, sel, above, tile_hist, hist_c);
    PickDigitKernel<kBinsC><<<1, 1024, 0, s>>>(sel, 0, hist_c, 0);
    TileCountKernel<<<grid, kThreads, 0, s>>>(sel, above, tile_hist, tiles);
    TileScanKernel<<<1, 1024, 0, s>>>(tiles, num_tiles_);
    TileSelectKernel<<<grid, kThreads, 0, s>>>(x, L.n, L.k, sel, tiles, resid, u, v, payload);
  }

  // The dense compressors after the memory: x from `src`; resid (when not null) receives the
  // residual, computed from x (or, for signum_resid, from the input resid holds).
  template <class Src>
  void Dense(Src src, float* resid, bool signum_resid, uint64_t key, u8* payload, cudaStream_t s) {
    const auto& L = layout();
    const int64_t n = L.n;
    const unsigned grid = VecBlocks(n);
    float* scalars = Ws<float>(off_scalars_);
    switch (L.kind) {
      case CompressorKind::kFp32: Fp32EncodeKernel<<<grid, kThreads, 0, s>>>(src, resid, n, payload); break;
      case CompressorKind::kFp16:
        Fp16EncodeKernel<<<grid, kThreads, 0, s>>>(src, resid, n, L.world_size, payload);
        break;
      case CompressorKind::kQsgd:
        Reduce<Red::kSumSquares>(src, payload + n, s);
        QsgdEncodeKernel<<<grid, kThreads, 0, s>>>(src, resid, n, key, scalars, payload);
        break;
      case CompressorKind::kSignsgd:
      case CompressorKind::kEfsignsgd:
        Reduce<Red::kSumAbs>(src, payload + (n + 7) / 8, s);
        SignEncodeKernel<<<grid, kThreads, 0, s>>>(src, resid, n, scalars, false, false, payload);
        break;
      case CompressorKind::kSignum:
        // The momentum is updated by the reduction's pass (src is SignumUpdate); the encode
        // reads it back.
        if constexpr (std::is_same_v<Src, SignumUpdate>) {
          Reduce<Red::kSumAbs>(src, payload + (n + 7) / 8, s);
          SignEncodeKernel<<<grid, kThreads, 0, s>>>(Plain{src.mom}, resid, n, scalars, false, signum_resid, payload);
        }
        break;
      case CompressorKind::kOnebit:
        Reduce<Red::kOnebit>(src, payload + (n + 7) / 8, s);
        SignEncodeKernel<<<grid, kThreads, 0, s>>>(src, resid, n, scalars, true, false, payload);
        break;
      case CompressorKind::kTerngrad:
        Reduce<Red::kMaxAbs>(src, payload + (n + 3) / 4, s);
        TerngradEncodeKernel<<<grid, kThreads, 0, s>>>(src, resid, n, key, scalars, payload);
        break;
      default: break;  // sparse kinds: EncodeImpl
    }
  }

  Status EncodeImpl(const float* grad, float* state, uint64_t iteration, std::byte* payload_b, void* stream) override {
    const auto& L = layout();
    const int64_t n = L.n;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    u8* payload = reinterpret_cast<u8*>(payload_b);
    const unsigned grid = VecBlocks(n);
    float *resid = nullptr, *u = nullptr, *v = nullptr, *tail = state;
    if (L.memory == MemoryKind::kResidual) {
      resid = state;
      tail = state + n;
    } else if (L.memory == MemoryKind::kDgc) {
      u = state;
      v = state + n;
      tail = state + 2 * n;
    }
    const uint64_t key = StreamKey(L.seed, iteration);
    switch (L.kind) {
      case CompressorKind::kTopk:
      case CompressorKind::kDgc:
        if (resid)
          TopK(ResidualUpdate{resid, grad}, resid, resid, u, v, payload, s);
        else if (u)
          TopK(DgcUpdate{u, v, grad}, v, resid, u, v, payload, s);
        else
          TopK(Plain{grad}, grad, resid, u, v, payload, s);
        break;
      case CompressorKind::kRandk: {
        const Feistel f = MakeFeistel(L.seed, iteration, static_cast<uint32_t>(n));
        const unsigned kgrid = Blocks(L.k);
        const auto un = static_cast<uint32_t>(n);
        if (u) DgcMemoryKernel<<<grid, kThreads, 0, s>>>(u, v, grad, n);
        RandkGatherKernel<<<kgrid, kThreads, 0, s>>>(resid ? resid : (u ? v : grad), resid ? grad : nullptr, L.k, f,
                                                     un, payload);
        if (resid) ResidualFiniteKernel<<<grid, kThreads, 0, s>>>(resid, grad, n);
        if (resid || u) RandkClearKernel<<<kgrid, kThreads, 0, s>>>(L.k, f, un, resid, u, v);
        break;
      }
      case CompressorKind::kFp32:
        if (!resid && !u) {
          CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(payload, grad, 4 * n, cudaMemcpyDeviceToDevice, s));
          break;
        }
        [[fallthrough]];
      default:
        if (L.kind == CompressorKind::kSignum) {
          // Signum's momentum sits after the memory; with residual or dgc memory, that memory
          // runs as a pass of its own first (x = e or v), then the momentum in the reduction.
          const float* x = grad;
          if (resid) {
            AddKernel<<<grid, kThreads, 0, s>>>(resid, grad, n);
            x = resid;
          } else if (u) {
            DgcMemoryKernel<<<grid, kThreads, 0, s>>>(u, v, grad, n);
            x = v;
          }
          Dense(SignumUpdate{tail, x}, resid, resid != nullptr, key, payload, s);
        } else if (resid) {
          Dense(ResidualSum{resid, grad}, resid, false, key, payload, s);
        } else if (u) {
          DgcMemoryKernel<<<grid, kThreads, 0, s>>>(u, v, grad, n);
          Dense(Plain{v}, nullptr, false, key, payload, s);
        } else {
          Dense(Plain{grad}, nullptr, false, key, payload, s);
        }
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
    const unsigned grid = VecBlocks(n);
    const int W = L.world_size;
    const unsigned sign_grid = Blocks((n + 7) / 8);
    switch (L.kind) {
      case CompressorKind::kFp32: Fp32DecodeKernel<<<grid, kThreads, 0, s>>>(p, n, W, out); break;
      case CompressorKind::kFp16: Fp16DecodeKernel<<<grid, kThreads, 0, s>>>(p, n, out); break;
      case CompressorKind::kRandk: {
        CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0, 4 * n, s));
        const Feistel f = MakeFeistel(L.seed, iteration, static_cast<uint32_t>(n));
        RandkDecodeKernel<<<Blocks(L.k), kThreads, 0, s>>>(p, L.k, f, static_cast<uint32_t>(n), W, out);
        break;
      }
      case CompressorKind::kTopk:
      case CompressorKind::kDgc:
        if (tiled_decode_) {
          int32_t* starts = Ws<int32_t>(off_decode_starts_);
          TileStartsKernel<<<Blocks(L.k * W), kThreads, 0, s>>>(p, n, L.k, W, L.payload_bytes, decode_tiles_, starts);
          SparseDecodeKernel<<<static_cast<unsigned>(decode_tiles_), kThreads, 0, s>>>(p, n, L.k, W, L.payload_bytes,
                                                                                      decode_tiles_, starts, out);
          break;
        }
        CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(out, 0, 4 * n, s));
        for (int r = 0; r < W; ++r)
          ScatterAddKernel<<<Blocks(L.k), kThreads, 0, s>>>(p + r * L.payload_bytes, L.k, n, out);
        if (W > 1) DivideKernel<<<grid, kThreads, 0, s>>>(out, n, W);
        break;
      case CompressorKind::kQsgd:
        DenseDecodeGlobal<Dense::kQsgd>(p, out, s);
        break;
      case CompressorKind::kSignsgd:
      case CompressorKind::kEfsignsgd:
      case CompressorKind::kSignum:
        SignDecodeKernel<Dense::kSign><<<sign_grid, kThreads, 0, s>>>(p, n, W, L.payload_bytes, out);
        break;
      case CompressorKind::kOnebit:
        SignDecodeKernel<Dense::kOnebit><<<sign_grid, kThreads, 0, s>>>(p, n, W, L.payload_bytes, out);
        break;
      case CompressorKind::kTerngrad:
        DenseDecodeGlobal<Dense::kTerngrad>(p, out, s);
        break;
    }
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  void* workspace_ = nullptr;
  int64_t num_tiles_ = 0;
  size_t off_rank_scales_ = 0;  // qsgd and terngrad decodes: 2 floats per rank
  size_t off_decode_starts_ = 0;  // topk and dgc decodes: int32 run starts, W x (tiles + 1)
  int64_t decode_tiles_ = 0;
  bool tiled_decode_ = false;
  size_t off_scalars_ = 0, off_done_ = 0, off_sel_ = 0, off_hist_ = 0, off_tiles_ = 0, off_above_ = 0,
         off_tile_hist_ = 0;
};

// ---- GraVAC's gain sums on the device (cupcake/kernels/gain.h) ----
// The totals the sum kernels' last blocks add to: a group at a time, in launch order.
struct GainAcc {
  double input, min, cand;
  unsigned long long skipped;
};

// The last block of a sum kernel: combines the per-block partials (as ReduceKernel does, in a
// fixed order) and returns the group's sums in every thread of that block; false elsewhere.
__device__ bool CombinePartials(const Acc& mine, Acc* partials, unsigned* done, Acc* all) {
  using BR = cub::BlockReduce<Acc, kThreads>;
  __shared__ typename BR::TempStorage tmp;
  __shared__ bool last;
  __shared__ Acc result;
  const Acc total = BR(tmp).Reduce(mine, Combine<Red::kSumSquares>());
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = total;
    __threadfence();
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  Acc b{{0, 0, 0, 0}};
  for (int j = threadIdx.x; j < static_cast<int>(gridDim.x); j += kThreads) {
    Acc p;
    for (int c = 0; c < 4; ++c) p.v[c] = __ldcg(&partials[j].v[c]);
    b = Combine<Red::kSumSquares>()(b, p);
  }
  __syncthreads();  // tmp is reused
  const Acc sum = BR(tmp).Reduce(b, Combine<Red::kSumSquares>());
  if (threadIdx.x == 0) {
    result = sum;
    *done = 0;
  }
  __syncthreads();
  *all = result;
  return true;
}

// Adds a group's sums to the totals, or counts it skipped when ||x||^2 is not finite.
__device__ void AddGroup(GainAcc* totals, double input, double min, double cand) {
  if (!isfinite(input)) {
    ++totals->skipped;
    return;
  }
  totals->input += input;
  totals->min += min;
  totals->cand += cand;
}

// Magnitude selection, after the two radix selections: v0 the float squares, v1 (v2) those whose
// key is above the k_min-th (k_c-th) largest key T; the selection's `remaining` keys equal to T
// add T's square each (equal keys, equal squares: which ones is immaterial).
template <class Src>
__global__ void __launch_bounds__(kThreads) LargestSumKernel(Src src, int64_t n, const Selection* sel, Acc* partials,
                                                             unsigned* done, GainAcc* totals) {
  const uint32_t t_min = sel[0].prefix, t_c = sel[1].prefix;
  Acc a{{0, 0, 0, 0}};
  GRID_STRIDE(q, VecGroups(n)) {
    const F4 x = src.Load(q * kVec, n);
    for (int j = 0; j < kVec; ++j) {
      if (q * kVec + j >= n) break;
      const float sq = __fmul_rn(x.v[j], x.v[j]);  // rounded to float, never fused into the sums
      const uint32_t key = MagnitudeKey(x.v[j]);
      a.v[0] += sq;
      if (key > t_min) a.v[1] += sq;
      if (key > t_c) a.v[2] += sq;
    }
  }
  Acc all;
  if (!CombinePartials(a, partials, done, &all) || threadIdx.x != 0) return;
  const float v_min = __uint_as_float(t_min), v_c = __uint_as_float(t_c);
  AddGroup(totals, all.v[0], all.v[1] + static_cast<double>(sel[0].remaining) * (v_min * v_min),
           all.v[2] + static_cast<double>(sel[1].remaining) * (v_c * v_c));
}

// Random selection: v0 the squares of x, v1 (v2) those of x at randk's first k_min (k_c)
// indices; squares in double, as the host probe's randk branch.
template <class Src>
__global__ void __launch_bounds__(kThreads) RandomSumKernel(Src src, int64_t n, int64_t k_min, int64_t k_c, Feistel f,
                                                            Acc* partials, unsigned* done, GainAcc* totals) {
  Acc a{{0, 0, 0, 0}};
  GRID_STRIDE(q, VecGroups(n)) {
    const F4 x = src.Load(q * kVec, n);
    for (int j = 0; j < kVec; ++j)
      if (q * kVec + j < n) a.v[0] += __dmul_rn(x.v[j], x.v[j]);  // not fused: the host's rounding
  }
  GRID_STRIDE(j, k_min) {
    const uint32_t i = FeistelPermute(f, static_cast<uint32_t>(n), static_cast<uint32_t>(j));
    const float v = src.Load(i, i + 1).v[0];
    const double sq = __dmul_rn(v, v);
    a.v[1] += sq;
    if (j < k_c) a.v[2] += sq;
  }
  Acc all;
  if (!CombinePartials(a, partials, done, &all) || threadIdx.x != 0) return;
  AddGroup(totals, all.v[0], all.v[1], all.v[2]);
}

class CudaDeviceGain final : public DeviceGain {
 public:
  ~CudaDeviceGain() override {
    if (workspace_) cudaFree(workspace_);
  }

  // Workspace: partials | reduce counter | two selections | their histograms | the totals.
  Status Init() {
    off_done_ = sizeof(Acc) * kReduceBlocks;
    off_sel_ = off_done_ + 16;
    off_hist_ = (off_sel_ + 2 * sizeof(Selection) + 15) / 16 * 16;
    off_totals_ = off_hist_ + 2 * 4 * (kBinsA + kBinsB + kBinsC);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&workspace_, off_totals_ + sizeof(GainAcc)));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemset(workspace_, 0, off_totals_ + sizeof(GainAcc)));
    return Status::Ok();
  }

  Status AddLargest(const float* g, const float* e, int64_t n, int64_t k_min, int64_t k_c, void* stream) override {
    CUPCAKE_RETURN_IF_ERROR(CheckKs(n, k_min, k_c));
    auto s = static_cast<cudaStream_t>(stream);
    if (e != nullptr)
      Largest(ResidualSum{e, g}, n, k_min, k_c, s);
    else
      Largest(Plain{g}, n, k_min, k_c, s);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  Status AddRandom(const float* g, const float* e, int64_t n, int64_t k_min, int64_t k_c, uint64_t seed,
                   uint64_t iteration, void* stream) override {
    CUPCAKE_RETURN_IF_ERROR(CheckKs(n, k_min, k_c));
    auto s = static_cast<cudaStream_t>(stream);
    const Feistel f = MakeFeistel(seed, iteration, static_cast<uint32_t>(n));
    if (e != nullptr)
      Random(ResidualSum{e, g}, n, k_min, k_c, f, s);
    else
      Random(Plain{g}, n, k_min, k_c, f, s);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Status::Ok();
  }

  StatusOr<GainTotals> Read(void* stream) override {
    GainAcc acc;
    auto s = static_cast<cudaStream_t>(stream);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&acc, Ws<GainAcc>(off_totals_), sizeof acc, cudaMemcpyDeviceToHost, s));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return GainTotals{acc.input, acc.min, acc.cand, static_cast<int64_t>(acc.skipped)};
  }

  StatusOr<GainTotals> Take(void* stream) override {
    CUPCAKE_ASSIGN_OR_RETURN(GainTotals totals, Read(stream));
    CUPCAKE_RETURN_IF_ERROR(Write(GainTotals{}, stream));
    return totals;
  }

  Status Write(const GainTotals& t, void* stream) override {
    // From a member, not the caller's stack: the copy may run after Write returns.
    written_ = GainAcc{t.input, t.min, t.cand, static_cast<unsigned long long>(t.skipped)};
    auto s = static_cast<cudaStream_t>(stream);
    CUPCAKE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(Ws<GainAcc>(off_totals_), &written_, sizeof written_, cudaMemcpyHostToDevice, s));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return Status::Ok();
  }

 private:
  template <typename T>
  T* Ws(size_t off) {
    return reinterpret_cast<T*>(static_cast<char*>(workspace_) + off);
  }

  static Status CheckKs(int64_t n, int64_t k_min, int64_t k_c) {
    if (n >= 1 && n <= int64_t{UINT32_MAX} && k_c >= 1 && k_c <= k_min && k_min <= n) return Status::Ok();
    return InvalidArgumentError("DeviceGain: k out of range; got n " + std::to_string(n) + ", k_min " +
                                std::to_string(k_min) + ", k_c " + std::to_string(k_c) +
                                ", expected 1 <= k_c <= k_min <= n < 2^32");
  }

  // The k_min-th and k_c-th largest keys by radix selection, both in each pass (the top-k
  // encode's passes A and B, then a third histogram for the last 8 bits), then the sums.
  template <class Src>
  void Largest(Src src, int64_t n, int64_t k_min, int64_t k_c, cudaStream_t s) {
    Selection* sel = Ws<Selection>(off_sel_);
    uint32_t* hist = Ws<uint32_t>(off_hist_);
    constexpr int64_t kStride = kBinsA + kBinsB + kBinsC;
    InitSelectionKernel<<<1, 1024, 0, s>>>(sel, k_min, hist);
    InitSelectionKernel<<<1, 1024, 0, s>>>(sel + 1, k_c, hist + kStride);
    HistogramKernel<kBinsA, 2><<<kHistBlocks, kThreads, 0, s>>>(src, n, sel, kShiftA, hist, kStride);
    PickDigitKernel<kBinsA><<<2, 1024, 0, s>>>(sel, kShiftA, hist, kStride);
    HistogramKernel<kBinsB, 2><<<kHistBlocks, kThreads, 0, s>>>(src, n, sel, kShiftB, hist + kBinsA, kStride);
    PickDigitKernel<kBinsB><<<2, 1024, 0, s>>>(sel, kShiftB, hist + kBinsA, kStride);
    HistogramKernel<kBinsC, 2><<<kHistBlocks, kThreads, 0, s>>>(src, n, sel, 0, hist + kBinsA + kBinsB, kStride);
    PickDigitKernel<kBinsC><<<2, 1024, 0, s>>>(sel, 0, hist + kBinsA + kBinsB, kStride);
    LargestSumKernel<<<kReduceBlocks, kThreads, 0, s>>>(src, n, sel, Ws<Acc>(0), Ws<unsigned>(off_done_),
                                                        Ws<GainAcc>(off_totals_));
  }

  template <class Src>
  void Random(Src src, int64_t n, int64_t k_min, int64_t k_c, const Feistel& f, cudaStream_t s) {
    RandomSumKernel<<<kReduceBlocks, kThreads, 0, s>>>(src, n, k_min, k_c, f, Ws<Acc>(0), Ws<unsigned>(off_done_),
                                                       Ws<GainAcc>(off_totals_));
  }

  void* workspace_ = nullptr;
  size_t off_done_ = 0, off_sel_ = 0, off_hist_ = 0, off_totals_ = 0;
  GainAcc written_{};
};

}  // namespace

StatusOr<std::unique_ptr<Compressor>> MakeCudaCompressor(const CompressorLayout& layout) {
  CUPCAKE_RETURN_IF_ERROR(DeviceAvailable());
  auto c = std::make_unique<CudaCompressor>(layout);
  CUPCAKE_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Compressor>(std::move(c));
}

StatusOr<std::unique_ptr<DeviceGain>> MakeCudaDeviceGain() {
  CUPCAKE_RETURN_IF_ERROR(DeviceAvailable());
  auto g = std::make_unique<CudaDeviceGain>();
  CUPCAKE_RETURN_IF_ERROR(g->Init());
  return std::unique_ptr<DeviceGain>(std::move(g));
}

}  // namespace cupcake::kernels::cuda

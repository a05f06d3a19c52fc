// AVX2 + F16C variants of the elementwise compressors' loops (see cpu_loops.h), for x86-64.
//
// Every function carries __attribute__((target("avx2,f16c"))) and is reached only through a
// compressor made with Isa::kAvx2, so the rest of the library stays baseline x86-64 code.
// No FMA: a fused multiply-add rounds once where the baseline rounds twice (the AVX-512
// target implies FMA, hence -ffp-contract=off in kernels/CMakeLists.txt). Each loop mirrors a baseline loop of
// cpu_compressor.cc element for element:
//   - reductions keep the baseline's lanes (16 float lanes per 4096-element block summed in
//     double in lane order; onebit's 8 lanes), so the sums round identically;
//   - comparisons are the ordered `x < 0` of the baseline (so -0 and NaN count as
//     non-negative), never the raw sign bit;
//   - the generator is detail::RandomBits computed for 8 indices at a time (vpmulld is the
//     same 32-bit wrapping multiply);
//   - F16C conversions round to nearest even like detail::FloatToHalf; NaN results are
//     patched to the baseline's canonical 0x7e00 | sign (F16C keeps the payload).
// Encodes fuse the memory update into the first pass (two passes over memory: reduce, then
// quantize), decodes keep 32 outputs in registers while summing the W payloads.
#include "cpu_loops.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "../common.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define CUPCAKE_X86 1
#else
#define CUPCAKE_X86 0
#endif

namespace cupcake::kernels::cpu {

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return "baseline";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

bool IsaSupported(Isa isa) {
  if (isa == Isa::kBaseline) return true;
#if CUPCAKE_X86
  __builtin_cpu_init();
  // F16C through cpuid: clang's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx2") && f16c;
  if (isa == Isa::kAvx2) return avx2;
  return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

Isa BestIsa() {
  if (IsaSupported(Isa::kAvx512)) return Isa::kAvx512;
  return IsaSupported(Isa::kAvx2) ? Isa::kAvx2 : Isa::kBaseline;
}

namespace avx2 {

#if CUPCAKE_X86

#define CUPCAKE_AVX2 __attribute__((target("avx2,f16c")))
#define CUPCAKE_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace {

using detail::Abs;
using detail::IsFinite;

constexpr int64_t kBlock = 4096;  // the baseline's reduction block (cpu_compressor.cc)

inline void StoreF(u8* p, float v) { std::memcpy(p, &v, 4); }
inline float LoadF(const u8* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// acc + v with acc as the first source operand: when both are NaN, x86 returns the first
// source's NaN, and the baseline's `out += v` keeps out's.
CUPCAKE_AVX2_INLINE __m256 AddTo(__m256 acc, __m256 v) { return _mm256_add_ps(acc, v); }
CUPCAKE_AVX2_INLINE float AddTo(float acc, float v) {
  return _mm_cvtss_f32(_mm_add_ss(_mm_set_ss(acc), _mm_set_ss(v)));
}

CUPCAKE_AVX2_INLINE __m256 AbsV(__m256 v) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}
// All ones where v is NaN or +-Inf (exponent all ones), like !detail::IsFinite.
CUPCAKE_AVX2_INLINE __m256i NonFinite(__m256 v) {
  const __m256i e = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), e), e);
}
CUPCAKE_AVX2_INLINE __m256 LessThanZero(__m256 v) { return _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ); }
CUPCAKE_AVX2_INLINE __m256 ZeroWhere(__m256i mask, __m256 v) { return _mm256_andnot_ps(_mm256_castsi256_ps(mask), v); }

// detail::Mix32 and detail::RandomBits on 8 lanes.
CUPCAKE_AVX2_INLINE __m256i Mix32(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return x;
}
// Uniform01(RandomBits(key, i + lane)) for lanes 0..7.
CUPCAKE_AVX2_INLINE __m256 Uniform8(uint64_t key, int64_t i) {
  const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))),
                                       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i lo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(key)));
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(key >> 32)));
  const __m256i bits = Mix32(_mm256_add_epi32(Mix32(_mm256_xor_si256(idx, lo)), hi));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(bits, 8)), _mm256_set1_ps(1.0f / 16777216.0f));
}

// ---- memory (first pass) ----
// x = g, or for residual memory x = e + g, stored back into e when kStore. (Without kStore
// the second pass recomputes e + g, the same rounding: one write stream less.)
template <bool kResid, bool kStore = true>
CUPCAKE_AVX2_INLINE __m256 Input8(const float* g, float* resid, int64_t i) {
  const __m256 gv = _mm256_loadu_ps(g + i);
  if (!kResid) return gv;
  const __m256 e = _mm256_add_ps(_mm256_loadu_ps(resid + i), gv);
  if (kStore) _mm256_storeu_ps(resid + i, e);
  return e;
}
template <bool kResid, bool kStore = true>
inline float Input1(const float* g, float* resid, int64_t i) {
  if (!kResid) return g[i];
  const float e = resid[i] + g[i];
  if (kStore) resid[i] = e;
  return e;
}

// The sign family's input after the memory and, for signum, the momentum update
// m = 0.9 m + 0.1 x (0 where not finite), stored back; returns what gets compressed.
template <bool kResid, bool kMom, bool kStore>
CUPCAKE_AVX2_INLINE __m256 SignInput8(const float* g, float* resid, float* mom, int64_t i) {
  const __m256 x = Input8<kResid, kStore>(g, resid, i);
  if (!kMom) return x;
  const float beta = detail::kSignumMomentum, one_minus = 1.0f - detail::kSignumMomentum;
  const __m256 m = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(mom + i)),
                                 _mm256_mul_ps(_mm256_set1_ps(one_minus), x));
  const __m256 kept = ZeroWhere(NonFinite(m), m);
  _mm256_storeu_ps(mom + i, kept);
  return kept;
}
template <bool kResid, bool kMom, bool kStore>
inline float SignInput1(const float* g, float* resid, float* mom, int64_t i) {
  const float x = Input1<kResid, kStore>(g, resid, i);
  if (!kMom) return x;
  const float beta = detail::kSignumMomentum, one_minus = 1.0f - detail::kSignumMomentum;
  const float m = beta * mom[i] + one_minus * x;
  mom[i] = IsFinite(m) ? m : 0.0f;
  return mom[i];
}

// Horizontal finish of a baseline BlockedSum block: s = tail, then + acc[0..15] in double.
CUPCAKE_AVX2_INLINE double FinishBlock(__m256 a0, __m256 a1, float tail) {
  alignas(32) float acc[16];
  _mm256_store_ps(acc, a0);
  _mm256_store_ps(acc + 8, a1);
  double s = tail;
  for (int j = 0; j < 16; ++j) s += acc[j];
  return s;
}

// BlockedSum(x, n, FiniteAbs) (kSquare: FiniteSquare) of the prepared input, fused with the
// memory update that prepares it; bits != null: also packs the signs of x (they do not depend
// on the scale), so the sign family without residual reads memory once.
// 16 elements of a BlockedSum block: prepare, pack their signs, add into the 16 lanes.
template <bool kResid, bool kMom, bool kSquare, bool kStore>
struct SumStep16 {
  const float* g;
  float* resid;
  float* mom;
  u8* bits;
  CUPCAKE_AVX2_INLINE void operator()(int64_t i, __m256& a0, __m256& a1) const {
    __m256 x0 = SignInput8<kResid, kMom, kStore>(g, resid, mom, i);
    __m256 x1 = SignInput8<kResid, kMom, kStore>(g, resid, mom, i + 8);
    if (bits) {
      const uint16_t w = static_cast<uint16_t>(static_cast<uint32_t>(_mm256_movemask_ps(LessThanZero(x0))) |
                                               (static_cast<uint32_t>(_mm256_movemask_ps(LessThanZero(x1))) << 8));
      std::memcpy(bits + i / 8, &w, 2);
    }
    x0 = ZeroWhere(NonFinite(x0), kSquare ? _mm256_mul_ps(x0, x0) : AbsV(x0));
    x1 = ZeroWhere(NonFinite(x1), kSquare ? _mm256_mul_ps(x1, x1) : AbsV(x1));
    a0 = _mm256_add_ps(a0, x0);
    a1 = _mm256_add_ps(a1, x1);
  }
};

// BlockedSum(x, n, FiniteAbs) (kSquare: FiniteSquare) of the prepared input, fused with the
// memory update that prepares it; bits != null: also packs the signs of x (they do not depend
// on the scale), so the sign family without residual reads memory once. (Running two blocks
// interleaved, to shorten the add chains, measured slower: their streams 16 KiB apart alias.)
template <bool kResid, bool kMom, bool kSquare, bool kStore>
CUPCAKE_AVX2 double FusedBlockedSum(const float* g, float* resid, float* mom, int64_t n, u8* bits) {
  const SumStep16<kResid, kMom, kSquare, kStore> step{g, resid, mom, bits};
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = b + kBlock < n ? b + kBlock : n;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t i = b;
    for (; i + 16 <= end; i += 16) step(i, a0, a1);
    float tail = 0.0f;
    const int64_t tail_start = i;  // a multiple of 16; the tail has < 16 elements
    uint32_t tail_bits = 0;
    for (; i < end; ++i) {
      const float v = SignInput1<kResid, kMom, kStore>(g, resid, mom, i);
      tail_bits |= static_cast<uint32_t>(v < 0.0f) << (i - tail_start);
      tail += IsFinite(v) ? (kSquare ? v * v : Abs(v)) : 0.0f;
    }
    if (bits)
      for (int64_t byte = tail_start / 8; 8 * byte < end; ++byte)
        bits[byte] = static_cast<u8>(tail_bits >> (8 * byte - tail_start));
    total += FinishBlock(a0, a1, tail);
  }
  return total;
}

// Second pass of the sign family and onebit: the residual (the signs are packed already).
// x = e + g (not stored by the first pass); m: signum's momentum, else null.
// Without m: e = x - (x < 0 ? neg : pos), 0 where x is not finite (baseline SignResidual).
// With m: e = x - (m < 0 ? neg : pos), 0 where e is not finite (baseline signum residual).
template <bool kMom>
CUPCAKE_AVX2 void SignResidual(const float* g, const float* m, float* resid, int64_t n, float pos, float neg) {
  const __m256 pv = _mm256_set1_ps(pos), nv = _mm256_set1_ps(neg);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(resid + i), _mm256_loadu_ps(g + i));
    if (!kMom) {
      const __m256 sent = _mm256_blendv_ps(pv, nv, LessThanZero(x));
      _mm256_storeu_ps(resid + i, ZeroWhere(NonFinite(x), _mm256_sub_ps(x, sent)));
    } else {
      const __m256 e = _mm256_sub_ps(x, _mm256_blendv_ps(pv, nv, LessThanZero(_mm256_loadu_ps(m + i))));
      _mm256_storeu_ps(resid + i, ZeroWhere(NonFinite(e), e));
    }
  }
  for (; i < n; ++i) {
    const float x = resid[i] + g[i];
    if (!kMom) {
      const float e = x - (x < 0.0f ? neg : pos);
      resid[i] = IsFinite(x) ? e : 0.0f;
    } else {
      const float e = x - (m[i] < 0.0f ? neg : pos);
      resid[i] = IsFinite(e) ? e : 0.0f;
    }
  }
}

template <bool kResid, bool kMom>
CUPCAKE_AVX2 void EncodeSignT(const float* g, float* resid, float* mom, int64_t n, u8* payload) {
  const double sum = FusedBlockedSum<kResid, kMom, false, false>(g, resid, mom, n, payload);
  const float scale = static_cast<float>(sum / static_cast<double>(n));
  if (kResid) SignResidual<kMom>(g, mom, resid, n, scale, -scale);
  StoreF(payload + (n + 7) / 8, scale);
}

// Morton spread: bit j of x moves to bit 2j.
inline uint64_t Spread32(uint64_t x) {
  x = (x | (x << 16)) & 0x0000ffff0000ffffull;
  x = (x | (x << 8)) & 0x00ff00ff00ff00ffull;
  x = (x | (x << 4)) & 0x0f0f0f0f0f0f0f0full;
  x = (x | (x << 2)) & 0x3333333333333333ull;
  x = (x | (x << 1)) & 0x5555555555555555ull;
  return x;
}

// ---- AVX-512 (F, BW, VL): the generator-bound quantize loops of qsgd and terngrad on 16
// lanes; everything else stays AVX2. Same operations as the 8-lane loops below, with mask
// registers for the selects. Each returns how many leading elements (a multiple of 32) it did.
// GCC 12's AVX-512 intrinsic headers trip -Wmaybe-uninitialized on their own
// _mm512_undefined_* placeholders (a known false positive); silenced for this section only.
#pragma GCC diagnostic push
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define CUPCAKE_AVX512 __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl")))
#define CUPCAKE_AVX512_INLINE __attribute__((target("avx2,f16c,avx512f,avx512bw,avx512vl"), always_inline)) inline

CUPCAKE_AVX512_INLINE __m512i Mix32x16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  return x;
}
CUPCAKE_AVX512_INLINE __m512 Uniform16(uint64_t key, int64_t i) {
  const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __m512i lo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(key)));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(key >> 32)));
  const __m512i bits = Mix32x16(_mm512_add_epi32(Mix32x16(_mm512_xor_si512(idx, lo)), hi));
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(bits, 8)), _mm512_set1_ps(1.0f / 16777216.0f));
}
CUPCAKE_AVX512_INLINE __mmask16 NonFinite16(__m512 v) {
  const __m512i e = _mm512_set1_epi32(0x7f800000);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), e), e);
}
CUPCAKE_AVX512_INLINE __m512 Abs16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
}

template <bool kResid>
CUPCAKE_AVX512 int64_t QsgdQuantize512(const float* x, float* resid, int64_t n, uint64_t key, float scale, float unit,
                                       u8* payload) {
  const __m512 scale_v = _mm512_set1_ps(scale), unit_v = _mm512_set1_ps(unit);
  const __m512 levels = _mm512_set1_ps(detail::kQsgdLevels), zero = _mm512_setzero_ps();
  const __m512i one = _mm512_set1_epi32(1), nan_q = _mm512_set1_epi32(-128), zero_i = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 2; ++k) {
      const int64_t j = i + 16 * k;
      const __m512 v = _mm512_loadu_ps(x + j);
      const __mmask16 bad = NonFinite16(v);
      const __m512 l =
          _mm512_min_ps(_mm512_maskz_mov_ps(static_cast<__mmask16>(~bad), _mm512_mul_ps(Abs16(v), scale_v)), levels);
      const __m512i fl = _mm512_cvttps_epi32(l);
      const __mmask16 up = _mm512_cmp_ps_mask(Uniform16(key, j), _mm512_sub_ps(l, _mm512_cvtepi32_ps(fl)), _CMP_LT_OQ);
      const __m512i lv = _mm512_min_epi32(_mm512_mask_add_epi32(fl, up, fl, one), _mm512_set1_epi32(127));
      const __mmask16 neg = _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
      const __m512i sq = _mm512_mask_sub_epi32(lv, neg, zero_i, lv);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(payload + j),
                       _mm512_cvtepi32_epi8(_mm512_mask_mov_epi32(sq, bad, nan_q)));
      if (kResid) {
        const __m512 sent = _mm512_mul_ps(_mm512_cvtepi32_ps(sq), unit_v);
        _mm512_storeu_ps(resid + j, _mm512_maskz_mov_ps(static_cast<__mmask16>(~bad), _mm512_sub_ps(v, sent)));
      }
    }
  }
  return i;
}

template <bool kResid>
CUPCAKE_AVX512 int64_t TerngradCodes512(const float* x, float* resid, int64_t n, uint64_t key, float inv, float mx,
                                        u8* payload) {
  const __m512 inv_v = _mm512_set1_ps(inv), mx_v = _mm512_set1_ps(mx), neg_mx_v = _mm512_set1_ps(-mx);
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint32_t lo = 0, hi = 0;  // bit 0 and bit 1 of the 32 codes
    for (int k = 0; k < 2; ++k) {
      const int64_t j = i + 16 * k;
      const __m512 v = _mm512_loadu_ps(x + j);
      const uint32_t bad = NonFinite16(v);
      const uint32_t take = _mm512_cmp_ps_mask(Uniform16(key, j), _mm512_mul_ps(Abs16(v), inv_v), _CMP_LT_OQ);
      const uint32_t neg = _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ);
      // code 1: take and not negative, 2: take and negative, 3: not finite.
      const uint32_t plus = take & ~neg & ~bad, minus = take & neg & ~bad;
      lo |= ((plus | bad) & 0xffffu) << (16 * k);
      hi |= ((minus | bad) & 0xffffu) << (16 * k);
      if (kResid) {
        const __m512 sent = _mm512_mask_mov_ps(_mm512_maskz_mov_ps(static_cast<__mmask16>(plus), mx_v),
                                               static_cast<__mmask16>(minus), neg_mx_v);
        _mm512_storeu_ps(resid + j, _mm512_maskz_mov_ps(static_cast<__mmask16>(~bad), _mm512_sub_ps(v, sent)));
      }
    }
    const uint64_t codes = Spread32(lo) | (Spread32(hi) << 1);
    std::memcpy(payload + i / 4, &codes, 8);
  }
  return i;
}
#pragma GCC diagnostic pop

template <bool kResid, bool kWide>
CUPCAKE_AVX2 void EncodeQsgdT(const float* g, float* resid, int64_t n, uint64_t key, u8* payload) {
  const float norm =
      static_cast<float>(std::sqrt(FusedBlockedSum<kResid, false, true, true>(g, resid, nullptr, n, nullptr)));
  const float scale = norm > 0.0f ? detail::kQsgdLevels / norm : 0.0f;
  const float unit = norm / detail::kQsgdLevels;
  const float* x = kResid ? resid : g;
  const __m256 scale_v = _mm256_set1_ps(scale), unit_v = _mm256_set1_ps(unit);
  const __m256 levels = _mm256_set1_ps(detail::kQsgdLevels);
  const __m256i max_q = _mm256_set1_epi32(127), nan_q = _mm256_set1_epi32(-128);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = kWide ? QsgdQuantize512<kResid>(x, resid, n, key, scale, unit, payload) : 0;
  for (; i + 32 <= n; i += 32) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const int64_t j = i + 8 * k;
      const __m256 v = _mm256_loadu_ps(x + j);
      const __m256i bad = NonFinite(v);
      // l = min(|v| scale, 127): minps returns the second operand for NaN, like `l < 127 ? l : 127`.
      const __m256 l = _mm256_min_ps(ZeroWhere(bad, _mm256_mul_ps(AbsV(v), scale_v)), levels);
      const __m256i fl = _mm256_cvttps_epi32(l);
      const __m256 up = _mm256_cmp_ps(Uniform8(key, j), _mm256_sub_ps(l, _mm256_cvtepi32_ps(fl)), _CMP_LT_OQ);
      const __m256i lv = _mm256_min_epi32(_mm256_sub_epi32(fl, _mm256_castps_si256(up)), max_q);
      const __m256i neg = _mm256_castps_si256(LessThanZero(v));
      const __m256i sq = _mm256_sub_epi32(_mm256_xor_si256(lv, neg), neg);  // -lv where negative
      q[k] = _mm256_blendv_epi8(sq, nan_q, bad);
      if (kResid) {
        const __m256 sent = _mm256_mul_ps(_mm256_cvtepi32_ps(sq), unit_v);
        _mm256_storeu_ps(resid + j, ZeroWhere(bad, _mm256_sub_ps(v, sent)));
      }
    }
    const __m256i b16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(payload + i), _mm256_permutevar8x32_epi32(b16, order));
  }
  for (; i < n; ++i) {  // the baseline loop body
    const float r = detail::QsgdQuantizeOne(x[i], scale, unit, key, static_cast<uint32_t>(i), payload + i);
    if (kResid) resid[i] = r;
  }
  StoreF(payload + n, norm);
}

template <bool kResid, bool kWide>
CUPCAKE_AVX2 void EncodeTerngradT(const float* g, float* resid, int64_t n, uint64_t key, u8* payload) {
  // 1. max |x| over the finite entries (max is exact, so the lane order does not matter).
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = Input8<kResid>(g, resid, i), x1 = Input8<kResid>(g, resid, i + 8);
    m0 = _mm256_max_ps(m0, ZeroWhere(NonFinite(x0), AbsV(x0)));
    m1 = _mm256_max_ps(m1, ZeroWhere(NonFinite(x1), AbsV(x1)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_max_ps(m0, m1));
  float mx = 0.0f;
  for (; i < n; ++i) {
    const float v = Input1<kResid>(g, resid, i);
    mx = mx > (IsFinite(v) ? Abs(v) : 0.0f) ? mx : (IsFinite(v) ? Abs(v) : 0.0f);
  }
  for (float l : lanes) mx = mx > l ? mx : l;
  const float inv = mx > 0.0f ? 1.0f / mx : 0.0f;
  // 2. codes: u < |x| / max ? (x < 0 ? 2 : 1) : 0; 3 where not finite.
  const float* x = kResid ? resid : g;
  const __m256 inv_v = _mm256_set1_ps(inv), mx_v = _mm256_set1_ps(mx), neg_mx_v = _mm256_set1_ps(-mx);
  const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2), three = _mm256_set1_epi32(3);
  i = kWide ? TerngradCodes512<kResid>(x, resid, n, key, inv, mx, payload) : 0;
  for (; i + 32 <= n; i += 32) {
    uint32_t lo = 0, hi = 0;  // bit 0 and bit 1 of the 32 codes
    for (int k = 0; k < 4; ++k) {
      const int64_t j = i + 8 * k;
      const __m256 v = _mm256_loadu_ps(x + j);
      const __m256i bad = NonFinite(v);
      const __m256i take =
          _mm256_castps_si256(_mm256_cmp_ps(Uniform8(key, j), _mm256_mul_ps(AbsV(v), inv_v), _CMP_LT_OQ));
      const __m256i neg = _mm256_castps_si256(LessThanZero(v));
      __m256i c = _mm256_and_si256(take, _mm256_blendv_epi8(one, two, neg));
      c = _mm256_blendv_epi8(c, three, bad);
      lo |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_slli_epi32(c, 31)))) << (8 * k);
      hi |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_slli_epi32(c, 30)))) << (8 * k);
      if (kResid) {
        __m256 sent = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, one)), mx_v);
        sent = _mm256_or_ps(sent, _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, two)), neg_mx_v));
        _mm256_storeu_ps(resid + j, ZeroWhere(bad, _mm256_sub_ps(v, sent)));
      }
    }
    const uint64_t codes = Spread32(lo) | (Spread32(hi) << 1);
    std::memcpy(payload + i / 4, &codes, 8);
  }
  for (int64_t b = i / 4; 4 * b < n; ++b) {
    uint32_t byte = 0;
    for (int64_t e = 4 * b; e < n && e < 4 * b + 4; ++e) {
      const uint32_t c = detail::TerngradCode(x[e], inv, key, static_cast<uint32_t>(e));
      byte |= c << (2 * (e - 4 * b));
      if (kResid) resid[e] = c == 3u ? 0.0f : x[e] - (c == 1u ? mx : (c == 2u ? -mx : 0.0f));
    }
    payload[b] = static_cast<u8>(byte);
  }
  StoreF(payload + (n + 3) / 4, mx);
}

template <bool kResid>
CUPCAKE_AVX2 void EncodeFp16T(const float* g, float* resid, int64_t n, int world_size, u8* payload) {
  const float wf = static_cast<float>(world_size);
  const float inv_w = 1.0f / wf;
  const __m256 inv_v = _mm256_set1_ps(inv_w), wf_v = _mm256_set1_ps(wf);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i sign_mask = _mm256_set1_epi32(static_cast<int>(0x80000000u)), qnan = _mm256_set1_epi32(0x7e00);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = Input8<kResid>(g, resid, i);
    const __m256 s = _mm256_mul_ps(x, inv_v);
    __m128i h = _mm256_cvtps_ph(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i bits = _mm256_castps_si256(s);
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(bits, abs_mask), inf);
    const __m256i nan_h = _mm256_or_si256(_mm256_srli_epi32(_mm256_and_si256(bits, sign_mask), 16), qnan);
    const __m128i nan_h16 = _mm_packus_epi32(_mm256_castsi256_si128(nan_h), _mm256_extracti128_si256(nan_h, 1));
    const __m128i is_nan16 = _mm_packs_epi32(_mm256_castsi256_si128(is_nan), _mm256_extracti128_si256(is_nan, 1));
    h = _mm_blendv_epi8(h, nan_h16, is_nan16);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(payload + 2 * i), h);
    if (kResid) {
      // sent = HalfToFloat(h) W; a NaN or Inf half makes e non-finite, stored as 0 either way.
      const __m256 e = _mm256_sub_ps(x, _mm256_mul_ps(_mm256_cvtph_ps(h), wf_v));
      _mm256_storeu_ps(resid + i, ZeroWhere(NonFinite(e), e));
    }
  }
  for (; i < n; ++i) {
    const float x = Input1<kResid>(g, resid, i);
    const uint16_t h = detail::FloatToHalf(x * inv_w);
    std::memcpy(payload + 2 * i, &h, 2);
    if (kResid) {
      const float e = x - detail::HalfToFloat(h) * wf;
      resid[i] = IsFinite(e) ? e : 0.0f;
    }
  }
}

}  // namespace

void EncodeFp16(const float* g, float* resid, int64_t n, int world_size, u8* payload) {
  if (resid)
    EncodeFp16T<true>(g, resid, n, world_size, payload);
  else
    EncodeFp16T<false>(g, resid, n, world_size, payload);
}

CUPCAKE_AVX2 void DecodeFp16(const u8* payload, float* out, int64_t n) {
  const __m256i em_mask = _mm256_set1_epi32(0x7fff), inf_h = _mm256_set1_epi32(0x7bff);
  const __m256i exp_ones = _mm256_set1_epi32(0x7f800000), sign_h = _mm256_set1_epi32(0x8000);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(payload + 2 * i));
    const __m256 f = _mm256_cvtph_ps(h);
    // Inf and NaN as detail::HalfToFloat writes them: the payload kept, never quieted.
    const __m256i h32 = _mm256_cvtepu16_epi32(h);
    const __m256i em = _mm256_and_si256(h32, em_mask);
    const __m256i special = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(em, 13), exp_ones),
                                            _mm256_slli_epi32(_mm256_and_si256(h32, sign_h), 16));
    const __m256i is_special = _mm256_cmpgt_epi32(em, inf_h);
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(f, _mm256_castsi256_ps(special), _mm256_castsi256_ps(is_special)));
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, payload + 2 * i, 2);
    out[i] = detail::HalfToFloat(h);
  }
}

void EncodeSign(const float* g, float* resid, float* mom, int64_t n, u8* payload) {
  if (resid && mom)
    EncodeSignT<true, true>(g, resid, mom, n, payload);
  else if (resid)
    EncodeSignT<true, false>(g, resid, mom, n, payload);
  else if (mom)
    EncodeSignT<false, true>(g, resid, mom, n, payload);
  else
    EncodeSignT<false, false>(g, resid, mom, n, payload);
}

namespace {
// onebit's first pass: the memory, then per 4096-element block 8 float lanes of the
// non-negative sum, the negative sum, the negative count and the finite count (baseline order:
// the scalar tail goes into the double totals before the lanes).
// 8 elements of an onebit block: signs, and the lanes of the non-negative sum, the negative
// sum, the negative count and the finite count.
template <bool kResid>
struct OnebitStep8 {
  const float* g;
  float* resid;
  u8* bits;
  CUPCAKE_AVX2_INLINE void operator()(int64_t i, __m256* acc) const {
    const __m256 v = Input8<kResid, false>(g, resid, i);
    const __m256 fin = _mm256_castsi256_ps(_mm256_xor_si256(NonFinite(v), _mm256_set1_epi32(-1)));
    const __m256 neg = LessThanZero(v);
    bits[i / 8] = static_cast<u8>(_mm256_movemask_ps(neg));
    const __m256 fneg = _mm256_and_ps(fin, neg), one = _mm256_set1_ps(1.0f);
    acc[0] = _mm256_add_ps(acc[0], _mm256_and_ps(_mm256_andnot_ps(neg, fin), v));
    acc[1] = _mm256_add_ps(acc[1], _mm256_and_ps(fneg, v));
    acc[2] = _mm256_add_ps(acc[2], _mm256_and_ps(fneg, one));
    acc[3] = _mm256_add_ps(acc[3], _mm256_and_ps(fin, one));
  }
};

CUPCAKE_AVX2_INLINE void OnebitFinish(const __m256* acc, double* sums) {
  alignas(32) float l[4][8];
  for (int k = 0; k < 4; ++k) _mm256_store_ps(l[k], acc[k]);
  for (int j = 0; j < 8; ++j)
    for (int k = 0; k < 4; ++k) sums[k] += l[k][j];
}

// onebit's first pass (the memory's e + g is recomputed by the second): per 4096-element
// block the 8 lanes of OnebitStep8, added to the double totals in lane order after the
// block's scalar tail (baseline order).
template <bool kResid>
CUPCAKE_AVX2 void OnebitSums(const float* g, float* resid, int64_t n, double* sums, u8* bits) {
  const OnebitStep8<kResid> step{g, resid, bits};
  for (int k = 0; k < 4; ++k) sums[k] = 0.0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = b + kBlock < n ? b + kBlock : n;
    __m256 acc[4];
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_setzero_ps();
    int64_t i = b;
    for (; i + 8 <= end; i += 8) step(i, acc);
    const int64_t tail_start = i;  // a multiple of 8; the tail has < 8 elements
    uint32_t tail_bits = 0;
    for (; i < end; ++i) {
      const float v = Input1<kResid, false>(g, resid, i);
      tail_bits |= static_cast<uint32_t>(v < 0.0f) << (i - tail_start);
      const bool f = IsFinite(v);
      sums[0] += f && v >= 0.0f ? v : 0.0f;
      sums[1] += f && v < 0.0f ? v : 0.0f;
      sums[2] += f && v < 0.0f ? 1.0 : 0.0;
      sums[3] += f ? 1.0 : 0.0;
    }
    if (tail_start < end) bits[tail_start / 8] = static_cast<u8>(tail_bits);
    OnebitFinish(acc, sums);
  }
}
}  // namespace

void EncodeOnebit(const float* g, float* resid, int64_t n, u8* payload) {
  double s[4];
  if (resid)
    OnebitSums<true>(g, resid, n, s, payload);
  else
    OnebitSums<false>(g, resid, n, s, payload);
  const double pos_count = s[3] - s[2];
  const float pos = pos_count > 0 ? static_cast<float>(s[0] / pos_count) : 0.0f;
  const float neg = s[2] > 0 ? static_cast<float>(s[1] / s[2]) : 0.0f;
  if (resid) SignResidual<false>(g, nullptr, resid, n, pos, neg);
  StoreF(payload + (n + 7) / 8, pos);
  StoreF(payload + (n + 7) / 8 + 4, neg);
}

// The decodes keep 32 outputs in registers while summing the payloads of up to kRankGroup
// ranks, in rank order: out = v_0 + v_1 + ..., as the baseline's `out = v_0; out += v_r`
// (beyond kRankGroup ranks, out is stored and the next group adds to it). Per-rank constants
// (scale / W) are computed once per group, with the baseline's expressions.
constexpr int kRankGroup = 8;

// Sums value8(rank, i) for ranks [r0, r1) into out[i, i + 32).
template <typename Value8>
CUPCAKE_AVX2_INLINE void Accumulate32(int r0, int r1, int64_t i, float* out, const Value8& value8) {
  __m256 acc[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 v = value8(r0, i + 8 * k, k);
    acc[k] = r0 == 0 ? v : AddTo(_mm256_loadu_ps(out + i + 8 * k), v);
  }
  for (int r = r0 + 1; r < r1; ++r)
    for (int k = 0; k < 4; ++k) acc[k] = AddTo(acc[k], value8(r, i + 8 * k, k));
  for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + i + 8 * k, acc[k]);
}

struct SignValue8 {
  const u8* p;
  int64_t payload_bytes;
  const __m256* table;  // per rank of the group: [pos, neg] repeated (vpermilps on the bit)
  int r0;
  CUPCAKE_AVX2_INLINE __m256 operator()(int r, int64_t i, int k) const {
    uint32_t w;
    std::memcpy(&w, p + r * payload_bytes + (i - 8 * k) / 8, 4);
    const __m256i idx =
        _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)),
                          _mm256_add_epi32(_mm256_set1_epi32(8 * k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
    // vpermilps reads the low two bits of each index; the table repeats [pos, neg], so bit 0 picks.
    return _mm256_permutevar_ps(table[r - r0], idx);
  }
};

CUPCAKE_AVX2 void DecodeSign(const u8* p, int64_t payload_bytes, int world_size, bool onebit, int64_t n, float* out) {
  const float wf = static_cast<float>(world_size);
  const int64_t nb = (n + 7) / 8;
  for (int r0 = 0; r0 < world_size; r0 += kRankGroup) {
    const int r1 = r0 + kRankGroup < world_size ? r0 + kRankGroup : world_size;
    float pos[kRankGroup], neg[kRankGroup];
    __m256 table[kRankGroup];
    for (int r = r0; r < r1; ++r) {
      const u8* meta = p + r * payload_bytes + nb;
      pos[r - r0] = LoadF(meta) / wf;
      neg[r - r0] = onebit ? LoadF(meta + 4) / wf : -pos[r - r0];
      table[r - r0] = _mm256_setr_ps(pos[r - r0], neg[r - r0], pos[r - r0], neg[r - r0], pos[r - r0], neg[r - r0],
                                     pos[r - r0], neg[r - r0]);
    }
    const SignValue8 value8{p, payload_bytes, table, r0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) Accumulate32(r0, r1, i, out, value8);
    for (; i < n; ++i)
      for (int r = r0; r < r1; ++r) {
        const float v = (p[r * payload_bytes + i / 8] >> (i % 8)) & 1u ? neg[r - r0] : pos[r - r0];
        out[i] = r == 0 ? v : AddTo(out[i], v);
      }
  }
}

struct QsgdValue8 {
  const u8* p;
  int64_t payload_bytes;
  const float* factor;
  int r0;
  CUPCAKE_AVX2_INLINE __m256 operator()(int r, int64_t i, int) const {
    const __m256i q =
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + r * payload_bytes + i)));
    return _mm256_blendv_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(factor[r - r0])),
                            _mm256_set1_ps(std::numeric_limits<float>::quiet_NaN()),
                            _mm256_castsi256_ps(_mm256_cmpeq_epi32(q, _mm256_set1_epi32(-128))));
  }
};

CUPCAKE_AVX2 void DecodeQsgd(const u8* p, int64_t payload_bytes, int world_size, int64_t n, float* out) {
  const float wf = static_cast<float>(world_size);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int r0 = 0; r0 < world_size; r0 += kRankGroup) {
    const int r1 = r0 + kRankGroup < world_size ? r0 + kRankGroup : world_size;
    float factor[kRankGroup];
    for (int r = r0; r < r1; ++r) factor[r - r0] = LoadF(p + r * payload_bytes + n) / (detail::kQsgdLevels * wf);
    const QsgdValue8 value8{p, payload_bytes, factor, r0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) Accumulate32(r0, r1, i, out, value8);
    for (; i < n; ++i)
      for (int r = r0; r < r1; ++r) {
        const int8_t q = static_cast<int8_t>(p[r * payload_bytes + i]);
        const float v = q == -128 ? nan : static_cast<float>(q) * factor[r - r0];
        out[i] = r == 0 ? v : AddTo(out[i], v);
      }
  }
}

struct TernaryValue8 {
  const u8* p;
  int64_t payload_bytes;
  const __m256* table;  // per rank: [0, s, -s, NaN] in both halves (vpermilps on the code)
  int r0;
  CUPCAKE_AVX2_INLINE __m256 operator()(int r, int64_t i, int) const {
    uint16_t w;
    std::memcpy(&w, p + r * payload_bytes + i / 4, 2);
    const __m256i codes = _mm256_srlv_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    return _mm256_permutevar_ps(table[r - r0], codes);  // low two bits of each lane = the code
  }
};

CUPCAKE_AVX2 void DecodeTerngrad(const u8* p, int64_t payload_bytes, int world_size, int64_t n, float* out) {
  const float wf = static_cast<float>(world_size);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t nb = (n + 3) / 4;
  for (int r0 = 0; r0 < world_size; r0 += kRankGroup) {
    const int r1 = r0 + kRankGroup < world_size ? r0 + kRankGroup : world_size;
    float value[kRankGroup][4];
    __m256 table[kRankGroup];
    for (int r = r0; r < r1; ++r) {
      const float s = LoadF(p + r * payload_bytes + nb) / wf;
      float* v = value[r - r0];
      v[0] = 0.0f;
      v[1] = s;
      v[2] = -s;
      v[3] = nan;
      table[r - r0] = _mm256_setr_ps(v[0], v[1], v[2], v[3], v[0], v[1], v[2], v[3]);
    }
    const TernaryValue8 value8{p, payload_bytes, table, r0};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) Accumulate32(r0, r1, i, out, value8);
    for (; i < n; ++i)
      for (int r = r0; r < r1; ++r) {
        const float v = value[r - r0][(p[r * payload_bytes + i / 4] >> (2 * (i % 4))) & 3u];
        out[i] = r == 0 ? v : AddTo(out[i], v);
      }
  }
}

void EncodeQsgd(const float* g, float* resid, int64_t n, uint64_t key, u8* payload, bool avx512) {
  if (avx512) {
    if (resid)
      EncodeQsgdT<true, true>(g, resid, n, key, payload);
    else
      EncodeQsgdT<false, true>(g, resid, n, key, payload);
  } else {
    if (resid)
      EncodeQsgdT<true, false>(g, resid, n, key, payload);
    else
      EncodeQsgdT<false, false>(g, resid, n, key, payload);
  }
}

void EncodeTerngrad(const float* g, float* resid, int64_t n, uint64_t key, u8* payload, bool avx512) {
  if (avx512) {
    if (resid)
      EncodeTerngradT<true, true>(g, resid, n, key, payload);
    else
      EncodeTerngradT<false, true>(g, resid, n, key, payload);
  } else {
    if (resid)
      EncodeTerngradT<true, false>(g, resid, n, key, payload);
    else
      EncodeTerngradT<false, false>(g, resid, n, key, payload);
  }
}

#else  // not x86: IsaSupported(kAvx2) is false, so these are never reached.

void EncodeFp16(const float*, float*, int64_t, int, u8*) { std::abort(); }
void DecodeFp16(const u8*, float*, int64_t) { std::abort(); }
void EncodeSign(const float*, float*, float*, int64_t, u8*) { std::abort(); }
void EncodeOnebit(const float*, float*, int64_t, u8*) { std::abort(); }
void DecodeSign(const u8*, int64_t, int, bool, int64_t, float*) { std::abort(); }
void EncodeQsgd(const float*, float*, int64_t, uint64_t, u8*, bool) { std::abort(); }
void DecodeQsgd(const u8*, int64_t, int, int64_t, float*) { std::abort(); }
void EncodeTerngrad(const float*, float*, int64_t, uint64_t, u8*, bool) { std::abort(); }
void DecodeTerngrad(const u8*, int64_t, int, int64_t, float*) { std::abort(); }

#endif  // CUPCAKE_X86

}  // namespace avx2
}  // namespace cupcake::kernels::cpu

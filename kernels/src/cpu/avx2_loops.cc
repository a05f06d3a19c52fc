// AVX2 + F16C variants of the elementwise compressors' loops (see cpu_loops.h), for x86-64.
//
// Every function carries __attribute__((target("avx2,f16c"))) and is reached only through a
// compressor made with Isa::kAvx2, so the rest of the library stays baseline x86-64 code.
// FMA is deliberately not enabled: a fused multiply-add rounds once where the baseline rounds
// twice. Each loop mirrors a baseline loop of cpu_compressor.cc element for element:
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
#include <immintrin.h>
#define CUPCAKE_X86 1
#else
#define CUPCAKE_X86 0
#endif

namespace cupcake::kernels::cpu {

const char* IsaName(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "baseline"; }

bool IsaSupported(Isa isa) {
  if (isa == Isa::kBaseline) return true;
#if CUPCAKE_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

Isa BestIsa() { return IsaSupported(Isa::kAvx2) ? Isa::kAvx2 : Isa::kBaseline; }

namespace avx2 {

#if CUPCAKE_X86

#define CUPCAKE_AVX2 __attribute__((target("avx2,f16c")))
#define CUPCAKE_AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) inline

namespace {

using detail::Abs;
using detail::IsFinite;

constexpr int64_t kBlock = 4096;  // the baseline's reduction block (cpu_compressor.cc)

inline void StoreF(u8* p, float v) { std::memcpy(p, &v, 4); }
inline float LoadF(const u8* p) { float v; std::memcpy(&v, p, 4); return v; }

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
// x = g, or for residual memory e = e + g stored back and x = e.
template <bool kResid>
CUPCAKE_AVX2_INLINE __m256 Input8(const float* g, float* resid, int64_t i) {
  const __m256 gv = _mm256_loadu_ps(g + i);
  if (!kResid) return gv;
  const __m256 e = _mm256_add_ps(_mm256_loadu_ps(resid + i), gv);
  _mm256_storeu_ps(resid + i, e);
  return e;
}
template <bool kResid>
inline float Input1(const float* g, float* resid, int64_t i) {
  if (!kResid) return g[i];
  resid[i] += g[i];
  return resid[i];
}

// The sign family's input after the memory and, for signum, the momentum update
// m = 0.9 m + 0.1 x (0 where not finite), stored back; returns what gets compressed.
template <bool kResid, bool kMom>
CUPCAKE_AVX2_INLINE __m256 SignInput8(const float* g, float* resid, float* mom, int64_t i) {
  const __m256 x = Input8<kResid>(g, resid, i);
  if (!kMom) return x;
  const float beta = detail::kSignumMomentum, one_minus = 1.0f - detail::kSignumMomentum;
  const __m256 m = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(beta), _mm256_loadu_ps(mom + i)),
                                 _mm256_mul_ps(_mm256_set1_ps(one_minus), x));
  const __m256 kept = ZeroWhere(NonFinite(m), m);
  _mm256_storeu_ps(mom + i, kept);
  return kept;
}
template <bool kResid, bool kMom>
inline float SignInput1(const float* g, float* resid, float* mom, int64_t i) {
  const float x = Input1<kResid>(g, resid, i);
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
// memory update that prepares it.
template <bool kResid, bool kMom, bool kSquare>
CUPCAKE_AVX2 double FusedBlockedSum(const float* g, float* resid, float* mom, int64_t n) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = b + kBlock < n ? b + kBlock : n;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = b;
    for (; i + 16 <= end; i += 16) {
      __m256 x0 = SignInput8<kResid, kMom>(g, resid, mom, i);
      __m256 x1 = SignInput8<kResid, kMom>(g, resid, mom, i + 8);
      x0 = ZeroWhere(NonFinite(x0), kSquare ? _mm256_mul_ps(x0, x0) : AbsV(x0));
      x1 = ZeroWhere(NonFinite(x1), kSquare ? _mm256_mul_ps(x1, x1) : AbsV(x1));
      a0 = _mm256_add_ps(a0, x0);
      a1 = _mm256_add_ps(a1, x1);
    }
    float tail = 0.0f;
    for (; i < end; ++i) {
      const float v = SignInput1<kResid, kMom>(g, resid, mom, i);
      tail += IsFinite(v) ? (kSquare ? v * v : Abs(v)) : 0.0f;
    }
    total += FinishBlock(a0, a1, tail);
  }
  return total;
}

// Bits of `x < 0` for 32 elements, element j at bit j.
CUPCAKE_AVX2_INLINE uint32_t Signs32(__m256 x0, __m256 x1, __m256 x2, __m256 x3) {
  return static_cast<uint32_t>(_mm256_movemask_ps(LessThanZero(x0))) |
         (static_cast<uint32_t>(_mm256_movemask_ps(LessThanZero(x1))) << 8) |
         (static_cast<uint32_t>(_mm256_movemask_ps(LessThanZero(x2))) << 16) |
         (static_cast<uint32_t>(_mm256_movemask_ps(LessThanZero(x3))) << 24);
}

// Bits of the scalar tail [start, n) (start a multiple of 8), baseline PackSigns layout.
inline void PackSignsTail(const float* x, int64_t start, int64_t n, u8* bits) {
  for (int64_t b = start / 8; 8 * b < n; ++b) {
    uint32_t byte = 0;
    for (int64_t i = 8 * b; i < n && i < 8 * b + 8; ++i) byte |= static_cast<uint32_t>(x[i] < 0.0f) << (i - 8 * b);
    bits[b] = static_cast<u8>(byte);
  }
}

// Second pass of the sign family: pack the signs of x; residual against +-scale.
// kMomResid: signum with residual memory, e = e - (m < 0 ? -scale : scale), 0 where e is not
// finite; otherwise (x is e itself) e = x - (x < 0 ? neg : pos), 0 where x is not finite.
template <int kResidKind>  // 0: none, 1: e = x - sent, 2: signum's e -= sent(m)
CUPCAKE_AVX2 void PackAndResidual(const float* x, float* resid, int64_t n, float pos, float neg, u8* bits) {
  const __m256 pv = _mm256_set1_ps(pos), nv = _mm256_set1_ps(neg);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + i + 8 * k);
    const uint32_t w = Signs32(v[0], v[1], v[2], v[3]);
    std::memcpy(bits + i / 8, &w, 4);
    if (kResidKind == 0) continue;
    for (int k = 0; k < 4; ++k) {
      const __m256 sent = _mm256_blendv_ps(pv, nv, LessThanZero(v[k]));
      if (kResidKind == 1) {
        _mm256_storeu_ps(resid + i + 8 * k, ZeroWhere(NonFinite(v[k]), _mm256_sub_ps(v[k], sent)));
      } else {
        const __m256 e = _mm256_sub_ps(_mm256_loadu_ps(resid + i + 8 * k), sent);
        _mm256_storeu_ps(resid + i + 8 * k, ZeroWhere(NonFinite(e), e));
      }
    }
  }
  PackSignsTail(x, i, n, bits);
  if (kResidKind == 0) return;
  for (; i < n; ++i) {
    const float v = x[i];
    if (kResidKind == 1) {
      const float e = v - (v < 0.0f ? neg : pos);
      resid[i] = IsFinite(v) ? e : 0.0f;
    } else {
      const float e = resid[i] - (v < 0.0f ? neg : pos);
      resid[i] = IsFinite(e) ? e : 0.0f;
    }
  }
}

template <bool kResid, bool kMom>
CUPCAKE_AVX2 void EncodeSignT(const float* g, float* resid, float* mom, int64_t n, u8* payload) {
  const double sum = FusedBlockedSum<kResid, kMom, false>(g, resid, mom, n);
  const float scale = static_cast<float>(sum / static_cast<double>(n));
  const float* x = kMom ? mom : kResid ? resid : g;
  PackAndResidual<kResid ? (kMom ? 2 : 1) : 0>(x, resid, n, scale, -scale, payload);
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

template <bool kResid>
CUPCAKE_AVX2 void EncodeQsgdT(const float* g, float* resid, int64_t n, uint64_t key, u8* payload) {
  const float norm = static_cast<float>(std::sqrt(FusedBlockedSum<kResid, false, true>(g, resid, nullptr, n)));
  const float scale = norm > 0.0f ? detail::kQsgdLevels / norm : 0.0f;
  const float unit = norm / detail::kQsgdLevels;
  const float* x = kResid ? resid : g;
  const __m256 scale_v = _mm256_set1_ps(scale), unit_v = _mm256_set1_ps(unit);
  const __m256 levels = _mm256_set1_ps(detail::kQsgdLevels);
  const __m256i max_q = _mm256_set1_epi32(127), nan_q = _mm256_set1_epi32(-128);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
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
    const float v = x[i];
    const bool finite = IsFinite(v);
    float l = finite ? Abs(v) * scale : 0.0f;
    l = l < detail::kQsgdLevels ? l : detail::kQsgdLevels;
    const int fl = static_cast<int>(l);
    const float u = detail::Uniform01(detail::RandomBits(key, static_cast<uint32_t>(i)));
    int qi = fl + (u < l - static_cast<float>(fl) ? 1 : 0);
    qi = qi < 127 ? qi : 127;
    const int sq = v < 0.0f ? -qi : qi;
    payload[i] = static_cast<u8>(static_cast<int8_t>(finite ? sq : -128));
    if (kResid) resid[i] = finite ? v - static_cast<float>(sq) * unit : 0.0f;
  }
  StoreF(payload + n, norm);
}

template <bool kResid>
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
  i = 0;
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
  auto code = [&](int64_t e) -> uint32_t {
    const float v = x[e];
    const float p = Abs(v) * inv;
    const float u = detail::Uniform01(detail::RandomBits(key, static_cast<uint32_t>(e)));
    const uint32_t c = u < p ? (v < 0.0f ? 2u : 1u) : 0u;
    return IsFinite(v) ? c : 3u;
  };
  for (int64_t b = i / 4; 4 * b < n; ++b) {
    uint32_t byte = 0;
    for (int64_t e = 4 * b; e < n && e < 4 * b + 4; ++e) {
      const uint32_t c = code(e);
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
  if (resid) EncodeFp16T<true>(g, resid, n, world_size, payload);
  else EncodeFp16T<false>(g, resid, n, world_size, payload);
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
  if (resid && mom) EncodeSignT<true, true>(g, resid, mom, n, payload);
  else if (resid) EncodeSignT<true, false>(g, resid, mom, n, payload);
  else if (mom) EncodeSignT<false, true>(g, resid, mom, n, payload);
  else EncodeSignT<false, false>(g, resid, mom, n, payload);
}

namespace {
// onebit's first pass: the memory, then per 4096-element block 8 float lanes of the
// non-negative sum, the negative sum, the negative count and the finite count (baseline order:
// the scalar tail goes into the double totals before the lanes).
template <bool kResid>
CUPCAKE_AVX2 void OnebitSums(const float* g, float* resid, int64_t n, double* sums) {
  double pos_sum = 0, neg_sum = 0, neg_count = 0, finite_count = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = b + kBlock < n ? b + kBlock : n;
    __m256 ps = _mm256_setzero_ps(), ns = ps, nc = ps, fc = ps;
    int64_t i = b;
    for (; i + 8 <= end; i += 8) {
      const __m256 v = Input8<kResid>(g, resid, i);
      const __m256 fin = _mm256_castsi256_ps(_mm256_xor_si256(NonFinite(v), _mm256_set1_epi32(-1)));
      const __m256 neg = LessThanZero(v);
      const __m256 fneg = _mm256_and_ps(fin, neg);
      ps = _mm256_add_ps(ps, _mm256_and_ps(_mm256_andnot_ps(neg, fin), v));
      ns = _mm256_add_ps(ns, _mm256_and_ps(fneg, v));
      nc = _mm256_add_ps(nc, _mm256_and_ps(fneg, one));
      fc = _mm256_add_ps(fc, _mm256_and_ps(fin, one));
    }
    for (; i < end; ++i) {
      const float v = Input1<kResid>(g, resid, i);
      const bool f = IsFinite(v);
      pos_sum += f && v >= 0.0f ? v : 0.0f;
      neg_sum += f && v < 0.0f ? v : 0.0f;
      neg_count += f && v < 0.0f ? 1.0 : 0.0;
      finite_count += f ? 1.0 : 0.0;
    }
    alignas(32) float l[4][8];
    _mm256_store_ps(l[0], ps);
    _mm256_store_ps(l[1], ns);
    _mm256_store_ps(l[2], nc);
    _mm256_store_ps(l[3], fc);
    for (int j = 0; j < 8; ++j) {
      pos_sum += l[0][j];
      neg_sum += l[1][j];
      neg_count += l[2][j];
      finite_count += l[3][j];
    }
  }
  sums[0] = pos_sum;
  sums[1] = neg_sum;
  sums[2] = neg_count;
  sums[3] = finite_count;
}
}  // namespace

void EncodeOnebit(const float* g, float* resid, int64_t n, u8* payload) {
  double s[4];
  if (resid) OnebitSums<true>(g, resid, n, s);
  else OnebitSums<false>(g, resid, n, s);
  const double pos_count = s[3] - s[2];
  const float pos = pos_count > 0 ? static_cast<float>(s[0] / pos_count) : 0.0f;
  const float neg = s[2] > 0 ? static_cast<float>(s[1] / s[2]) : 0.0f;
  if (resid) PackAndResidual<1>(resid, resid, n, pos, neg, payload);
  else PackAndResidual<0>(g, nullptr, n, pos, neg, payload);
  StoreF(payload + (n + 7) / 8, pos);
  StoreF(payload + (n + 7) / 8 + 4, neg);
}

// The decodes keep 32 outputs in registers while summing the W payloads in rank order,
// out = v_0 + v_1 + ..., as the baseline's `out = v_0; out += v_r`.
CUPCAKE_AVX2 void DecodeSign(const u8* p, int64_t payload_bytes, int world_size, bool onebit, int64_t n, float* out) {
  const float wf = static_cast<float>(world_size);
  const int64_t nb = (n + 7) / 8;
  auto pos_of = [&](int r) { return LoadF(p + r * payload_bytes + nb) / wf; };
  auto neg_of = [&](int r) { return onebit ? LoadF(p + r * payload_bytes + nb + 4) / wf : -pos_of(r); };
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int r = 0; r < world_size; ++r) {
      uint32_t w;
      std::memcpy(&w, p + r * payload_bytes + i / 8, 4);
      const __m256i wv = _mm256_set1_epi32(static_cast<int>(w));
      const __m256 pos = _mm256_set1_ps(pos_of(r)), neg = _mm256_set1_ps(neg_of(r));
      for (int k = 0; k < 4; ++k) {
        const __m256i m = _mm256_slli_epi32(bit, 8 * k);
        const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(wv, m), m);
        const __m256 v = _mm256_blendv_ps(pos, neg, _mm256_castsi256_ps(set));
        acc[k] = r == 0 ? v : AddTo(acc[k], v);
      }
    }
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + i + 8 * k, acc[k]);
  }
  for (; i < n; ++i)
    for (int r = 0; r < world_size; ++r) {
      const float v = (p[r * payload_bytes + i / 8] >> (i % 8)) & 1u ? neg_of(r) : pos_of(r);
      out[i] = r == 0 ? v : AddTo(out[i], v);
    }
}

CUPCAKE_AVX2 void DecodeQsgd(const u8* p, int64_t payload_bytes, int world_size, int64_t n, float* out) {
  const float wf = static_cast<float>(world_size);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto factor = [&](int r) { return LoadF(p + r * payload_bytes + n) / (detail::kQsgdLevels * wf); };
  const __m256 nan_v = _mm256_set1_ps(nan);
  const __m256i marker = _mm256_set1_epi32(-128);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int r = 0; r < world_size; ++r) {
      const u8* pr = p + r * payload_bytes + i;
      const __m256 f = _mm256_set1_ps(factor(r));
      for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(pr + 8 * k)));
        const __m256 v = _mm256_blendv_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), f), nan_v,
                                          _mm256_castsi256_ps(_mm256_cmpeq_epi32(q, marker)));
        acc[k] = r == 0 ? v : AddTo(acc[k], v);
      }
    }
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + i + 8 * k, acc[k]);
  }
  for (; i < n; ++i)
    for (int r = 0; r < world_size; ++r) {
      const int8_t q = static_cast<int8_t>(p[r * payload_bytes + i]);
      const float v = q == -128 ? nan : static_cast<float>(q) * factor(r);
      out[i] = r == 0 ? v : AddTo(out[i], v);
    }
}

CUPCAKE_AVX2 void DecodeTerngrad(const u8* p, int64_t payload_bytes, int world_size, int64_t n, float* out) {
  const float wf = static_cast<float>(world_size);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t nb = (n + 3) / 4;
  auto scale_of = [&](int r) { return LoadF(p + r * payload_bytes + nb) / wf; };
  const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256i one = _mm256_set1_epi32(1), two = _mm256_set1_epi32(2), three = _mm256_set1_epi32(3);
  const __m256 nan_v = _mm256_set1_ps(nan);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int r = 0; r < world_size; ++r) {
      uint64_t w;
      std::memcpy(&w, p + r * payload_bytes + i / 4, 8);
      const float s = scale_of(r);
      const __m256 pos = _mm256_set1_ps(s), neg = _mm256_set1_ps(-s);
      for (int k = 0; k < 4; ++k) {
        const __m256i wv = _mm256_set1_epi32(static_cast<int>((w >> (16 * k)) & 0xffffu));
        const __m256i c = _mm256_and_si256(_mm256_srlv_epi32(wv, shifts), three);
        __m256 v = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, one)), pos);
        v = _mm256_or_ps(v, _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, two)), neg));
        v = _mm256_or_ps(v, _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, three)), nan_v));
        acc[k] = r == 0 ? v : AddTo(acc[k], v);
      }
    }
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + i + 8 * k, acc[k]);
  }
  for (; i < n; ++i)
    for (int r = 0; r < world_size; ++r) {
      const float s = scale_of(r);
      const uint32_t c = (p[r * payload_bytes + i / 4] >> (2 * (i % 4))) & 3u;
      const float v = c == 0u ? 0.0f : c == 1u ? s : c == 2u ? -s : nan;
      out[i] = r == 0 ? v : AddTo(out[i], v);
    }
}

void EncodeQsgd(const float* g, float* resid, int64_t n, uint64_t key, u8* payload) {
  if (resid) EncodeQsgdT<true>(g, resid, n, key, payload);
  else EncodeQsgdT<false>(g, resid, n, key, payload);
}

void EncodeTerngrad(const float* g, float* resid, int64_t n, uint64_t key, u8* payload) {
  if (resid) EncodeTerngradT<true>(g, resid, n, key, payload);
  else EncodeTerngradT<false>(g, resid, n, key, payload);
}

#else  // not x86: IsaSupported(kAvx2) is false, so these are never reached.

void EncodeFp16(const float*, float*, int64_t, int, u8*) { std::abort(); }
void DecodeFp16(const u8*, float*, int64_t) { std::abort(); }
void EncodeSign(const float*, float*, float*, int64_t, u8*) { std::abort(); }
void EncodeOnebit(const float*, float*, int64_t, u8*) { std::abort(); }
void DecodeSign(const u8*, int64_t, int, bool, int64_t, float*) { std::abort(); }
void EncodeQsgd(const float*, float*, int64_t, uint64_t, u8*) { std::abort(); }
void DecodeQsgd(const u8*, int64_t, int, int64_t, float*) { std::abort(); }
void EncodeTerngrad(const float*, float*, int64_t, uint64_t, u8*) { std::abort(); }
void DecodeTerngrad(const u8*, int64_t, int, int64_t, float*) { std::abort(); }

#endif  // CUPCAKE_X86

}  // namespace avx2
}  // namespace cupcake::kernels::cpu

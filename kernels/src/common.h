// Scalar building blocks shared bit for bit by the CPU reference and the CUDA kernels:
// float bit access, half conversion, the counter-based random generator, the randk
// permutation and the top-k ordering key. Compiled by g++ and by nvcc (__host__ __device__).
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define CUPCAKE_HD __host__ __device__ __forceinline__
#else
#define CUPCAKE_HD inline
#endif

namespace cupcake::kernels::detail {

CUPCAKE_HD uint32_t FloatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

CUPCAKE_HD float BitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// True for finite values (not NaN, not +-Inf).
CUPCAKE_HD bool IsFinite(float x) { return (FloatBits(x) & 0x7f800000u) != 0x7f800000u; }
CUPCAKE_HD float Abs(float x) { return BitsFloat(FloatBits(x) & 0x7fffffffu); }

// Top-k ordering key: the bits of |x|. Larger magnitude = larger key; +Inf ranks above every
// finite value and NaN above +Inf, so non-finite entries are selected first (and so leave the
// error-feedback memory). Ties are broken by the lowest index by the callers.
CUPCAKE_HD uint32_t MagnitudeKey(float x) { return FloatBits(x) & 0x7fffffffu; }

// float -> binary16, round to nearest even; overflow to +-Inf, NaN -> 0x7e00 (sign kept).
// Branch-free form of F. Giesen's float_to_half_fast3_rtne, so the CPU loop vectorizes.
CUPCAKE_HD uint16_t FloatToHalf(float f) {
  const uint32_t u_all = FloatBits(f);
  const uint32_t sign = u_all & 0x80000000u;
  const uint32_t u = u_all ^ sign;
  // Results of the three paths, then a select.
  const uint32_t big = u > 0x7f800000u ? 0x7e00u : 0x7c00u;  // NaN : Inf/overflow
  const uint32_t denorm_magic = ((127 - 15) + (23 - 10) + 1) << 23;
  const uint32_t denorm = FloatBits(BitsFloat(u) + BitsFloat(denorm_magic)) - denorm_magic;
  const uint32_t mant_odd = (u >> 13) & 1u;
  const uint32_t normal = (u + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd) >> 13;
  uint32_t o = u >= ((127u + 16u) << 23) ? big : (u < (113u << 23) ? denorm : normal);
  return static_cast<uint16_t>(o | (sign >> 16));
}

// binary16 -> float (exact).
CUPCAKE_HD float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  // Normal and subnormal: shift into place and rescale by 2^112 (exact); Inf/NaN: set the
  // exponent to all ones.
  const float scaled = BitsFloat(em << 13) * BitsFloat(0x77800000u);  // * 2^112
  const uint32_t special = (em << 13) | 0x7f800000u;
  const uint32_t o = em >= 0x7c00u ? special : FloatBits(scaled);
  return BitsFloat(o | sign);
}

// ---- Counter-based random generator keyed by (seed, iteration, index). ----
// Stream key: splitmix64 of (seed, iteration). Per element: two rounds of a 32-bit
// multiply-xorshift mixer (C. Wellons' lowbias32) keyed by the two key halves; 32-bit so the
// CPU loop vectorizes. Not cryptographic; plenty for stochastic rounding and sampling.
CUPCAKE_HD uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
CUPCAKE_HD uint32_t Mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
// Zen's row hash (cupcake/kernels/zen.h: RowHash).
CUPCAKE_HD uint32_t ZenRowHash(uint32_t row, uint32_t seed) { return Mix32(row ^ (seed * 0x9e3779b9u)); }
CUPCAKE_HD uint64_t StreamKey(uint64_t seed, uint64_t iteration) {
  return Mix64(Mix64(seed + 0x9e3779b97f4a7c15ull) ^ (iteration * 0xd1b54a32d192ed03ull + 1));
}
CUPCAKE_HD uint32_t RandomBits(uint64_t key, uint32_t index) {
  return Mix32(Mix32(index ^ static_cast<uint32_t>(key)) + static_cast<uint32_t>(key >> 32));
}
// Uniform in [0, 1) with 24 random bits (exact in float).
CUPCAKE_HD float Uniform01(uint32_t bits) { return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f); }

// ---- randk: a keyed permutation of [0, n) by a 4-round Feistel network on 2h bits
// (2^(2h) >= n) with cycle walking; index j < k of the selection is Permute(j). ----
struct Feistel {
  uint32_t half_bits;
  uint32_t mask;
  uint32_t round_key[4];
};

CUPCAKE_HD Feistel MakeFeistel(uint64_t seed, uint64_t iteration, uint32_t n) {
  Feistel f{};
  uint32_t bits = 0;
  while (bits < 32 && (uint64_t{1} << bits) < n) ++bits;
  f.half_bits = bits < 2 ? 1 : (bits + 1) / 2;
  f.mask = (1u << f.half_bits) - 1u;
  const uint64_t key = StreamKey(seed ^ 0x72616e646bull /* "randk" */, iteration);
  for (uint32_t r = 0; r < 4; ++r) f.round_key[r] = static_cast<uint32_t>(Mix64(key + r));
  return f;
}

CUPCAKE_HD uint32_t FeistelOnce(const Feistel& f, uint32_t x) {
  uint32_t left = x >> f.half_bits, right = x & f.mask;
  for (int r = 0; r < 4; ++r) {
    const uint32_t next = left ^ (Mix32(right ^ f.round_key[r]) & f.mask);
    left = right;
    right = next;
  }
  return (left << f.half_bits) | right;
}

// Requires j < n. Walks the cycle until the value falls inside [0, n).
CUPCAKE_HD uint32_t FeistelPermute(const Feistel& f, uint32_t n, uint32_t j) {
  uint32_t x = FeistelOnce(f, j);
  while (x >= n) x = FeistelOnce(f, x);
  return x;
}

// ---- Byte-level little-endian loads and stores (payload metadata may be unaligned). ----
CUPCAKE_HD float LoadF32(const unsigned char* p) {
  return BitsFloat(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                   (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
}
CUPCAKE_HD void StoreF32(unsigned char* p, float x) {
  const uint32_t u = FloatBits(x);
  p[0] = static_cast<unsigned char>(u);
  p[1] = static_cast<unsigned char>(u >> 8);
  p[2] = static_cast<unsigned char>(u >> 16);
  p[3] = static_cast<unsigned char>(u >> 24);
}

constexpr float kDgcMomentum = 0.9f;
constexpr float kSignumMomentum = 0.9f;
constexpr float kQsgdLevels = 127.0f;

// terngrad, one element (every backend's loop calls this): the 2-bit code, 1 for +max, 2 for
// -max with probability |v| / max (inv = 1 / max), 0 otherwise, 3 for a non-finite element,
// drawn from the generator at (key, i).
CUPCAKE_HD uint32_t TerngradCode(float v, float inv, uint64_t key, uint32_t i) {
  const float p = Abs(v) * inv;
  const float u = Uniform01(RandomBits(key, i));
  const uint32_t c = u < p ? (v < 0.0f ? 2u : 1u) : 0u;
  return IsFinite(v) ? c : 3u;
}

// qsgd, one element (every backend's loop calls this, so their bits agree): the level
// sign(v) * (floor(|v| scale) + Bernoulli(fraction)), at most 127, with scale = 127 / norm,
// drawn from the generator at (key, i). Writes the payload byte (-128 marks a non-finite
// element) and returns the residual v - level * unit (0 for a non-finite element).
CUPCAKE_HD float QsgdQuantizeOne(float v, float scale, float unit, uint64_t key, uint32_t i, unsigned char* byte) {
  const bool finite = IsFinite(v);
  float l = finite ? Abs(v) * scale : 0.0f;
  l = l < kQsgdLevels ? l : kQsgdLevels;
  const int fl = static_cast<int>(l);
  const float u = Uniform01(RandomBits(key, i));
  int q = fl + (u < l - static_cast<float>(fl) ? 1 : 0);
  q = q < 127 ? q : 127;
  const int sq = v < 0.0f ? -q : q;
  *byte = static_cast<unsigned char>(static_cast<signed char>(finite ? sq : -128));
  return finite ? v - static_cast<float>(sq) * unit : 0.0f;
}

}  // namespace cupcake::kernels::detail

// The compressors restated from their definitions (kernels/README.md "Semantics" and the
// payload layouts in cupcake/kernels/compressor.h), one plain scalar loop each, slow and
// obvious, sharing no code with kernels/src: the independent reference the typed suite and the
// runtime's reference compare against. Finite inputs, first step (memory none; dgc's memory
// at step 0 is the gradient itself).
//
// The random generator is restated too (kernels/README.md "Randomness"): the stream key is
// splitmix64's finalizer applied as Mix64(Mix64(seed + golden) ^ (iteration * c + 1)), each
// element's bits two rounds of the lowbias32 mixer (C. Wellons) keyed by the key's halves,
// uniform = top 24 bits / 2^24; randk's indices are a 4-round Feistel permutation of the
// smallest even power of two >= n, with cycle walking, keyed from StreamKey(seed ^ "randk").
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

namespace cupcake::kernels::reference {

// ---- binary16 (IEEE 754: 1 sign, 5 exponent bits with bias 15, 10 fraction bits). ----
inline float HalfValue(uint16_t h) {
  const int e = (h >> 10) & 31, f = h & 1023;
  const float s = (h & 0x8000) ? -1.0f : 1.0f;
  if (e == 31) return f ? std::numeric_limits<float>::quiet_NaN() : s * std::numeric_limits<float>::infinity();
  if (e == 0) return s * std::ldexp(static_cast<float>(f), -24);
  return s * std::ldexp(static_cast<float>(1024 + f), e - 25);
}

// Round to nearest, ties to even; |x| >= 65520 (half-way above the largest half, 65504)
// becomes Inf.
inline uint16_t HalfOf(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isnan(x)) return sign | 0x7e00;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7c00;
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);                         // a = m 2^e, m in [0.5, 1)
  const int exponent = std::max(e - 1, -14);  // subnormals share the smallest normal's ulp
  const double q = std::nearbyint(a / std::ldexp(1.0, exponent - 10));  // ties to even
  // q counts ulps, in [0, 2048]; the bits are (exponent + 14) * 1024 + q (q = 2048 carries).
  return static_cast<uint16_t>(sign | ((exponent + 14) * 1024 + static_cast<int>(q)));
}

// ---- The generator. ----
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline uint32_t Lowbias32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
inline uint64_t Key(uint64_t seed, uint64_t iteration) {
  return Mix64(Mix64(seed + 0x9e3779b97f4a7c15ull) ^ (iteration * 0xd1b54a32d192ed03ull + 1));
}
inline float Uniform(uint64_t key, uint32_t index) {
  const uint32_t bits = Lowbias32(Lowbias32(index ^ static_cast<uint32_t>(key)) + static_cast<uint32_t>(key >> 32));
  return static_cast<float>(bits >> 8) / 16777216.0f;
}

// randk's j-th index at (seed, iteration) over [0, n).
inline uint32_t RandkIndex(uint64_t seed, uint64_t iteration, uint32_t n, uint32_t j) {
  uint32_t bits = 0;
  while (bits < 32 && (uint64_t{1} << bits) < n) ++bits;
  const uint32_t half = bits < 2 ? 1 : (bits + 1) / 2;
  const uint32_t mask = (1u << half) - 1u;
  const uint64_t key = Key(seed ^ 0x72616e646bull, iteration);  // "randk"
  auto once = [&](uint32_t x) {
    uint32_t left = x >> half, right = x & mask;
    for (uint64_t r = 0; r < 4; ++r) {
      const uint32_t next = left ^ (Lowbias32(right ^ static_cast<uint32_t>(Mix64(key + r))) & mask);
      left = right;
      right = next;
    }
    return (left << half) | right;
  };
  uint32_t x = once(j);
  while (x >= n) x = once(x);
  return x;
}

inline int64_t SelectedCount(int64_t n, double ratio) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(ratio * static_cast<double>(n))));
}

// ---- Payload bytes. ----
inline void Put(std::vector<std::byte>& p, const void* v, size_t bytes) {
  const auto* b = static_cast<const std::byte*>(v);
  p.insert(p.end(), b, b + bytes);
}
inline void PutF(std::vector<std::byte>& p, float v) { Put(p, &v, 4); }
inline float GetF(const std::byte* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}
inline int32_t GetI(const std::byte* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint16_t GetH(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Sign bits: bit j of byte b is element 8b + j, 1 = negative.
inline std::vector<std::byte> SignBits(const std::vector<float>& x) {
  std::vector<std::byte> bits((x.size() + 7) / 8, std::byte{0});
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] < 0.0f) bits[i / 8] |= std::byte(1u << (i % 8));
  return bits;
}
inline bool Negative(const std::byte* bits, size_t i) { return (std::to_integer<unsigned>(bits[i / 8]) >> (i % 8)) & 1u; }

inline double MeanAbs(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += std::fabs(static_cast<double>(v));
  return s / static_cast<double>(x.size());
}

// The payload one rank sends for gradient x (its first step).
inline std::vector<std::byte> Encode(const std::string& name, const std::vector<float>& x, int world, double ratio,
                                     uint64_t seed, uint64_t iteration) {
  const size_t n = x.size();
  std::vector<std::byte> p;
  if (name == "fp32") {
    for (float v : x) PutF(p, v);
  } else if (name == "fp16") {
    for (float v : x) {
      const uint16_t h = HalfOf(v / static_cast<float>(world));
      Put(p, &h, 2);
    }
  } else if (name == "topk" || name == "dgc") {
    // The k largest magnitudes, ties to the lowest index, sent in ascending index order.
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    order.resize(static_cast<size_t>(SelectedCount(static_cast<int64_t>(n), ratio)));
    std::sort(order.begin(), order.end());
    for (int32_t i : order) PutF(p, x[static_cast<size_t>(i)]);
    for (int32_t i : order) Put(p, &i, 4);
  } else if (name == "randk") {
    const int64_t k = SelectedCount(static_cast<int64_t>(n), ratio);
    for (int64_t j = 0; j < k; ++j)
      PutF(p, x[RandkIndex(seed, iteration, static_cast<uint32_t>(n), static_cast<uint32_t>(j))]);
  } else if (name == "qsgd") {
    double sq = 0;
    for (float v : x) sq += static_cast<double>(v) * v;
    const float norm = static_cast<float>(std::sqrt(sq));
    const uint64_t key = Key(seed, iteration);
    for (size_t i = 0; i < n; ++i) {
      // level = floor(|x| 127 / norm) + Bernoulli(the fraction), at most 127, with x's sign.
      const double l = norm > 0 ? std::min(127.0, std::fabs(x[i]) * 127.0 / norm) : 0.0;
      int q = static_cast<int>(std::floor(l));
      if (Uniform(key, static_cast<uint32_t>(i)) < l - q) ++q;
      q = std::min(q, 127);
      const auto level = static_cast<int8_t>(x[i] < 0 ? -q : q);
      Put(p, &level, 1);
    }
    PutF(p, norm);
  } else if (name == "signsgd" || name == "efsignsgd" || name == "signum") {
    std::vector<float> m = x;
    if (name == "signum")  // m = 0.9 m + 0.1 x from m = 0
      for (float& v : m) v = 0.1f * v;
    p = SignBits(m);
    PutF(p, static_cast<float>(MeanAbs(m)));
  } else if (name == "terngrad") {
    float max = 0;
    for (float v : x) max = std::max(max, std::fabs(v));
    const uint64_t key = Key(seed, iteration);
    p.assign((n + 3) / 4, std::byte{0});
    for (size_t i = 0; i < n; ++i) {
      // +-max with probability |x| / max (drawn as u < |x| (1 / max)), else 0.
      const bool sent = Uniform(key, static_cast<uint32_t>(i)) < std::fabs(x[i]) * (1.0f / max);
      const unsigned code = sent ? (x[i] < 0 ? 2u : 1u) : 0u;
      p[i / 4] |= std::byte(code << (2 * (i % 4)));
    }
    PutF(p, max);
  } else if (name == "onebit") {
    double pos = 0, neg = 0;
    int64_t npos = 0, nneg = 0;
    for (float v : x) {
      if (v < 0) {
        neg += v;
        ++nneg;
      } else {
        pos += v;
        ++npos;
      }
    }
    p = SignBits(x);
    PutF(p, npos ? static_cast<float>(pos / static_cast<double>(npos)) : 0.0f);
    PutF(p, nneg ? static_cast<float>(neg / static_cast<double>(nneg)) : 0.0f);
  }
  return p;
}

// The allreduce of fp32 and randk payloads: the elementwise float sum, in rank order.
inline std::vector<std::byte> SumFloats(const std::vector<std::vector<std::byte>>& payloads) {
  std::vector<float> acc(payloads[0].size() / 4, 0.0f);
  for (const auto& p : payloads)
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += GetF(p.data() + 4 * i);
  std::vector<std::byte> out(payloads[0].size());
  std::memcpy(out.data(), acc.data(), out.size());
  return out;
}

// fp16's allreduce: each partial sum rounded to a half, in rank order.
inline std::vector<std::byte> SumHalves(const std::vector<std::vector<std::byte>>& payloads) {
  std::vector<std::byte> out = payloads[0];
  for (size_t r = 1; r < payloads.size(); ++r)
    for (size_t i = 0; i < out.size() / 2; ++i) {
      const uint16_t s = HalfOf(HalfValue(GetH(out.data() + 2 * i)) + HalfValue(GetH(payloads[r].data() + 2 * i)));
      std::memcpy(out.data() + 2 * i, &s, 2);
    }
  return out;
}

// The average over the W ranks that `payloads` (one per rank) encode, in double.
inline std::vector<double> Average(const std::string& name, const std::vector<std::vector<std::byte>>& payloads,
                                   size_t n, double ratio, uint64_t seed, uint64_t iteration) {
  const double w = static_cast<double>(payloads.size());
  std::vector<double> out(n, 0.0);
  for (const auto& pv : payloads) {
    const std::byte* p = pv.data();
    if (name == "fp32") {
      for (size_t i = 0; i < n; ++i) out[i] += GetF(p + 4 * i) / w;
    } else if (name == "fp16") {
      for (size_t i = 0; i < n; ++i) out[i] += HalfValue(GetH(p + 2 * i));  // pre-scaled by 1 / W
    } else if (name == "topk" || name == "dgc") {
      const size_t k = static_cast<size_t>(SelectedCount(static_cast<int64_t>(n), ratio));
      for (size_t j = 0; j < k; ++j) out[static_cast<size_t>(GetI(p + 4 * (k + j)))] += GetF(p + 4 * j) / w;
    } else if (name == "randk") {
      const int64_t k = SelectedCount(static_cast<int64_t>(n), ratio);
      for (int64_t j = 0; j < k; ++j)
        out[RandkIndex(seed, iteration, static_cast<uint32_t>(n), static_cast<uint32_t>(j))] += GetF(p + 4 * j) / w;
    } else if (name == "qsgd") {
      const double norm = GetF(p + n);
      for (size_t i = 0; i < n; ++i) out[i] += norm * static_cast<int8_t>(std::to_integer<int>(p[i])) / (127.0 * w);
    } else if (name == "signsgd" || name == "efsignsgd" || name == "signum") {
      const double scale = GetF(p + (n + 7) / 8);
      for (size_t i = 0; i < n; ++i) out[i] += (Negative(p, i) ? -scale : scale) / w;
    } else if (name == "terngrad") {
      const double max = GetF(p + (n + 3) / 4);
      for (size_t i = 0; i < n; ++i) {
        const unsigned code = (std::to_integer<unsigned>(p[i / 4]) >> (2 * (i % 4))) & 3u;
        out[i] += (code == 1 ? max : code == 2 ? -max : 0.0) / w;
      }
    } else if (name == "onebit") {
      const double pos = GetF(p + (n + 7) / 8), neg = GetF(p + (n + 7) / 8 + 4);
      for (size_t i = 0; i < n; ++i) out[i] += (Negative(p, i) ? neg : pos) / w;
    }
  }
  return out;
}

}  // namespace cupcake::kernels::reference

// Every dispatched CPU variant (cpu_loops.h) writes the same bytes as the portable baseline:
// payloads, state and decoded output (up to the bits of a NaN that is the sum of two NaNs,
// see SameDecode), on random data with NaN, +-Inf, subnormals, signed
// zeros and huge values, at lengths that are not multiples of the vector width, and on random
// payload bytes for the decodes. Skipped where this machine lacks the variant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "cpu/cpu_loops.h"
#include "cupcake/kernels/compressor.h"

namespace cupcake::kernels::cpu {
namespace {

constexpr Isa kVariants[] = {Isa::kAvx2, Isa::kAvx512};
constexpr const char* kElementwise[] = {"fp16", "qsgd", "signsgd", "efsignsgd", "signum", "terngrad", "onebit"};

// Normal values with about 1 in 16 replaced by a special: NaN (both signs, with payloads),
// +-Inf, subnormals, +-0, huge (squares overflow), tiny normals.
std::vector<float> Nasty(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) {
    x = normal(rng);
    switch (bits(rng) % 32) {
      case 0: x = std::numeric_limits<float>::quiet_NaN(); break;
      case 1: x = detail::BitsFloat(0xff800001u | (bits(rng) & 0x3fffffu)); break;  // negative signalling NaN
      case 2: x = std::numeric_limits<float>::infinity(); break;
      case 3: x = -std::numeric_limits<float>::infinity(); break;
      case 4: x = detail::BitsFloat(bits(rng) & 0x807fffffu); break;  // subnormal or zero
      case 5: x = -0.0f; break;
      case 6: x = 0.0f; break;
      case 7: x *= 1e30f; break;
      case 8: x *= 1e-30f; break;
      default: break;
    }
  }
  return v;
}

std::vector<std::byte> RandomBytes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> b(static_cast<size_t>(n));
  for (auto& x : b) x = static_cast<std::byte>(rng() & 0xff);
  return b;
}

// Decoded sums: identical bytes, except that a NaN may be any NaN. When two NaNs meet in
// `out += v`, x86 returns the first source operand's, and which operand GCC puts first differs
// between the baseline's own vectorized loop and its scalar epilogue, so the sign and payload
// of such a NaN were never a defined result (NaN positions are: they must match).
bool SameDecode(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (detail::FloatBits(a[i]) != detail::FloatBits(b[i])) return false;
  }
  return true;
}
std::vector<float> CanonicalNans(std::vector<float> v) {
  for (auto& x : v) x = std::isnan(x) ? std::numeric_limits<float>::quiet_NaN() : x;
  return v;
}

template <typename T>
bool SameBytes(const std::vector<T>& a, const std::vector<T>& b) {
  // Empty vectors may hold null data(), which memcmp must not be given even for 0 bytes.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// First differing element, for the failure message.
template <typename T>
std::string FirstDifference(const std::vector<T>& a, const std::vector<T>& b) {
  const auto* pa = reinterpret_cast<const unsigned char*>(a.data());
  const auto* pb = reinterpret_cast<const unsigned char*>(b.data());
  for (size_t i = 0; i < a.size() * sizeof(T); ++i)
    if (pa[i] != pb[i]) {
      const size_t e = i / sizeof(T);
      char hex[64];
      if constexpr (sizeof(T) == 4) {
        uint32_t x, y;
        std::memcpy(&x, &a[e], 4);
        std::memcpy(&y, &b[e], 4);
        std::snprintf(hex, sizeof hex, ": 0x%08x vs 0x%08x", x, y);
      } else {
        std::snprintf(hex, sizeof hex, ": 0x%02x vs 0x%02x", pa[i], pb[i]);
      }
      return "byte " + std::to_string(i) + " (element " + std::to_string(e) + ")" + hex;
    }
  return "none";
}

class IsaVariants : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!IsaSupported(GetParam())) GTEST_SKIP() << IsaName(GetParam()) << " not supported by this build or machine";
  }
};

TEST_P(IsaVariants, EncodeAndDecodeMatchTheBaselineByteForByte) {
  const Isa isa = GetParam();
  for (const char* name : kElementwise) {
    for (const char* memory : {"none", "residual"}) {
      for (int64_t n : {1, 7, 9, 31, 33, 100, 4095, 4097, 12345, 40003}) {
        for (int w : {1, 3, 11}) {  // 11: more ranks than one decode group (8)
          SCOPED_TRACE(std::string(name) + " memory=" + memory + " n=" + std::to_string(n) + " W=" + std::to_string(w));
          CompressorConfig config;
          config.name = name;
          config.memory = memory;
          config.n = n;
          config.world_size = w;
          config.seed = 11;
          auto layout = ResolveLayout(config);
          ASSERT_TRUE(layout.ok()) << layout.status().ToString();
          auto base = MakeCpuCompressor(*layout, Isa::kBaseline);
          auto fast = MakeCpuCompressor(*layout, isa);
          // Finite random state (a real state is finite: non-finite entries are cleared).
          std::vector<float> base_state(static_cast<size_t>(layout->state_floats));
          {
            std::mt19937 rng(5);
            std::normal_distribution<float> d(0.0f, 0.5f);
            for (auto& s : base_state) s = d(rng);
          }
          std::vector<float> fast_state = base_state;
          std::vector<std::byte> all_base, all_fast;
          for (int r = 0; r < std::max(3, w); ++r) {  // steps: the state carries over
            const auto g = Nasty(n, static_cast<uint32_t>(100 * n + r));
            std::vector<std::byte> pb(static_cast<size_t>(layout->payload_bytes)), pf(pb.size());
            ASSERT_TRUE(base->Encode(g, base_state, r, pb).ok());
            ASSERT_TRUE(fast->Encode(g, fast_state, r, pf).ok());
            ASSERT_TRUE(SameBytes(pb, pf)) << "payload, step " << r << ": " << FirstDifference(pb, pf);
            ASSERT_TRUE(SameBytes(base_state, fast_state)) << "state, step " << r << ": "
                                                           << FirstDifference(base_state, fast_state);
            if (r < w) {
              all_base.insert(all_base.end(), pb.begin(), pb.end());
              all_fast.insert(all_fast.end(), pf.begin(), pf.end());
            }
          }
          if (layout->allreduce) all_base.resize(static_cast<size_t>(layout->decode_input_bytes));
          if (layout->allreduce) all_fast.resize(static_cast<size_t>(layout->decode_input_bytes));
          ASSERT_EQ(static_cast<int64_t>(all_base.size()), layout->decode_input_bytes);
          // Real payloads, then random bytes (random levels, codes, scales, NaN markers).
          const auto random_bytes = RandomBytes(layout->decode_input_bytes, static_cast<uint32_t>(n));
          const std::vector<std::byte>* real = &all_base;
          for (const std::vector<std::byte>* inp : {real, &random_bytes}) {
            const auto& in = *inp;
            std::vector<float> ob(static_cast<size_t>(n)), of(static_cast<size_t>(n), 1.0f);
            ASSERT_TRUE(base->Decode(in, ob, 0).ok());
            ASSERT_TRUE(fast->Decode(in, of, 0).ok());
            ASSERT_TRUE(SameDecode(ob, of)) << (inp == &all_base ? "decode of real payloads: " : "decode of random bytes: ")
                                           << FirstDifference(CanonicalNans(ob), CanonicalNans(of));
          }
        }
      }
    }
  }
}

// The half conversion against detail::FloatToHalf on every 97th float bit pattern (normals,
// subnormals, overflow, ties, NaN payloads of both signs), and the decode on every half.
TEST_P(IsaVariants, Fp16ConversionsMatchTheScalarOnesExhaustively) {
  if (GetParam() != Isa::kAvx2) GTEST_SKIP() << "the fp16 loops are the same in every variant";
  constexpr int64_t kChunk = 1 << 20;
  std::vector<float> x(kChunk);
  std::vector<unsigned char> half(2 * kChunk);
  uint64_t u = 0;
  while (u <= 0xffffffffull) {
    int64_t m = 0;
    for (; m < kChunk - 3 && u <= 0xffffffffull; ++m, u += 97) x[m] = detail::BitsFloat(static_cast<uint32_t>(u));
    x[m++] = 65520.0f;  // ties and the overflow boundary, unaligned in the chunk
    x[m++] = 2.9802322e-8f;
    x[m++] = detail::BitsFloat(0x7f800001u);
    avx2::EncodeFp16(x.data(), nullptr, m, 1, half.data());
    for (int64_t i = 0; i < m; ++i) {
      uint16_t h;
      std::memcpy(&h, half.data() + 2 * i, 2);
      ASSERT_EQ(h, detail::FloatToHalf(x[i] * 1.0f)) << std::hex << detail::FloatBits(x[i]);
    }
  }
  std::vector<unsigned char> all(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    all[2 * h] = static_cast<unsigned char>(h);
    all[2 * h + 1] = static_cast<unsigned char>(h >> 8);
  }
  std::vector<float> out(65536);
  avx2::DecodeFp16(all.data(), out.data(), 65536);
  for (uint32_t h = 0; h < 65536; ++h)
    ASSERT_EQ(detail::FloatBits(out[h]), detail::FloatBits(detail::HalfToFloat(static_cast<uint16_t>(h)))) << h;
}

INSTANTIATE_TEST_SUITE_P(Cpu, IsaVariants, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Isa>& p) { return std::string(IsaName(p.param)); });

}  // namespace
}  // namespace cupcake::kernels::cpu

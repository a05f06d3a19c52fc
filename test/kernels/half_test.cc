// The scalar helpers shared by the CPU and CUDA code: half conversion against the compiler's
// _Float16 (round to nearest even), the fp16 payload sum, the random generator's uniformity.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common.h"
#include "cupcake/kernels/compressor.h"

namespace cupcake::kernels::detail {
namespace {

uint16_t Reference(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

TEST(Half, FloatToHalfRoundsToNearestEvenLikeTheCompiler) {
  // Every 97th float bit pattern (covers normals, subnormals, overflow, ties), plus specials.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 97) {
    const float f = BitsFloat(static_cast<uint32_t>(u));
    if (std::isnan(f)) {
      ASSERT_EQ(FloatToHalf(f) & 0x7c00u, 0x7c00u);
      ASSERT_NE(FloatToHalf(f) & 0x03ffu, 0u);
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), Reference(f)) << std::hex << u;
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65520.0f, 65519.99f, 5.9604645e-8f, 2.9802322e-8f, 1.0f + 1.0f / 2048})
    EXPECT_EQ(FloatToHalf(f), Reference(f)) << f;
}

TEST(Half, HalfToFloatIsExactForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 x;
    const uint16_t h16 = static_cast<uint16_t>(h);
    std::memcpy(&x, &h16, 2);
    const float want = static_cast<float>(x);
    const float got = HalfToFloat(h16);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(FloatBits(got), FloatBits(want)) << h;
      ASSERT_EQ(FloatToHalf(got), h16);
    }
  }
}

TEST(Half, SumFp16PayloadsIsTheCorrectlyRoundedHalfSum) {
  for (uint32_t a = 0; a < 65536; a += 37) {
    for (uint32_t b = 0; b < 65536; b += 101) {
      const uint16_t x = static_cast<uint16_t>(a), y = static_cast<uint16_t>(b);
      const double exact = double(HalfToFloat(x)) + double(HalfToFloat(y));
      if (std::isnan(exact) || std::isinf(exact)) continue;
      uint16_t io = y;
      SumFp16Payloads(reinterpret_cast<const std::byte*>(&x), reinterpret_cast<std::byte*>(&io), 1);
      // Reference: the double sum is exact; _Float16 from double rounds once.
      const _Float16 h = static_cast<_Float16>(exact);
      uint16_t want;
      std::memcpy(&want, &h, 2);
      ASSERT_EQ(io, want) << a << " + " << b;
    }
  }
}

TEST(Random, UniformIsInRangeAndBalanced) {
  const uint64_t key = StreamKey(42, 7);
  double sum = 0;
  const int n = 1 << 20;
  int buckets[16] = {};
  for (int i = 0; i < n; ++i) {
    const float u = Uniform01(RandomBits(key, static_cast<uint32_t>(i)));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    ++buckets[static_cast<int>(u * 16)];
  }
  EXPECT_NEAR(sum / n, 0.5, 0.002);  // sd of the mean: 0.29 / 1024
  for (int b : buckets) EXPECT_NEAR(b, n / 16, 5 * 250);  // sd ~ 250
  EXPECT_NE(RandomBits(StreamKey(42, 8), 0), RandomBits(key, 0));
}

TEST(Random, RandkIndicesArePermutations) {
  for (uint32_t n : {1u, 2u, 3u, 17u, 1000u, 4097u}) {
    std::vector<bool> seen(n, false);
    for (uint32_t j = 0; j < n; ++j) {
      const uint32_t i = RandkIndex(5, 9, n, j);
      ASSERT_LT(i, n);
      ASSERT_FALSE(seen[i]) << "n=" << n << " j=" << j;
      seen[i] = true;
    }
  }
}

}  // namespace
}  // namespace cupcake::kernels::detail

// The typed compressor suite: every property runs on the CPU reference and, when a GPU is
// present, on the CUDA kernels (skipped with the reason otherwise; gpu_test.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <string>

#include "cupcake/proto/catalogue.h"
#include "gpu_test.h"
#include "harness.h"
#include "scalar_reference.h"

namespace cupcake::kernels::testing {
namespace {

namespace ref = ::cupcake::kernels::reference;

// A backend's payload against the scalar definition's: bit for bit where the definition fixes
// every bit; the reductions (qsgd's norm, the sign family's mean magnitude, onebit's two means)
// within 1e-5 relative, since they may be summed in another order; qsgd's levels off by at
// most one, and only where the rounding threshold sits between the two norms (<= 1 in 1000).
void ExpectMatchesDefinition(const std::string& name, int64_t n, const std::vector<std::byte>& got,
                             const std::vector<std::byte>& want) {
  ASSERT_EQ(got.size(), want.size());
  size_t exact = got.size();
  std::vector<size_t> reductions;
  if (name == "qsgd") {
    exact = 0;
    reductions = {static_cast<size_t>(n)};
    int64_t off_by_one = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int d = std::abs(static_cast<int8_t>(got[i]) - static_cast<int8_t>(want[i]));
      ASSERT_LE(d, 1) << "level " << i;
      off_by_one += d;
    }
    EXPECT_LE(off_by_one, std::max<int64_t>(1, n / 1000));
  } else if (name == "signsgd" || name == "efsignsgd" || name == "signum") {
    exact = static_cast<size_t>((n + 7) / 8);
    reductions = {exact};
  } else if (name == "onebit") {
    exact = static_cast<size_t>((n + 7) / 8);
    reductions = {exact, exact + 4};
  }
  for (size_t i = 0; i < exact; ++i) ASSERT_EQ(got[i], want[i]) << "payload byte " << i << " of " << got.size();
  for (size_t at : reductions) {
    const float g = ref::GetF(got.data() + at), w = ref::GetF(want.data() + at);
    EXPECT_NEAR(g, w, 1e-5 * std::fabs(w)) << "f32 at byte " << at;
  }
}

template <typename B>
class CompressorSuite : public ::testing::Test {
 protected:
  static constexpr Backend kBackend = B::kBackend;
  void SetUp() override { CUPCAKE_GPU_OR_SKIP(BackendAvailable(kBackend)); }
  Runner Make(const std::string& name, int64_t n, int world, double ratio = 0.01, const std::string& memory = "",
              uint64_t seed = 7) {
    CompressorConfig c;
    c.name = name;
    c.memory = memory;
    c.n = n;
    c.world_size = world;
    c.ratio = ratio;
    c.seed = seed;
    return Runner(c, kBackend);
  }
};

TYPED_TEST_SUITE(CompressorSuite, Backends, BackendNames);

// The payload layouts compressor.h documents, restated byte by byte (not the catalogue's own
// PayloadBytes): k = max(1, floor(ratio n)) for the selecting compressors.
int64_t DocumentedPayloadBytes(std::string_view name, int64_t n, double ratio) {
  const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::floor(ratio * static_cast<double>(n))));
  const int64_t bits = (n + 7) / 8, codes = (n + 3) / 4;
  if (name == "fp32") return 4 * n;
  if (name == "fp16") return 2 * n;
  if (name == "topk" || name == "dgc") return 4 * k + 4 * k;  // values, then int32 indices
  if (name == "randk") return 4 * k;
  if (name == "qsgd") return n + 4;  // int8 levels, f32 norm
  if (name == "signsgd" || name == "efsignsgd" || name == "signum") return bits + 4;  // bits, f32 scale
  if (name == "terngrad") return codes + 4;  // 2-bit codes, f32 max
  if (name == "onebit") return bits + 8;  // bits, two f32 means
  ADD_FAILURE() << "no documented layout for " << name;
  return -1;
}

// Real payloads have exactly the documented size (and the catalogue's), for awkward n and
// several W.
TYPED_TEST(CompressorSuite, PayloadSizeMatchesCatalogue) {
  for (auto name : CompressorNames()) {
    for (int64_t n : {1, 3, 7, 8, 9, 100, 1001}) {
      for (int w : {1, 3}) {
        SCOPED_TRACE(std::string(name) + " n=" + std::to_string(n) + " W=" + std::to_string(w));
        Runner r = this->Make(std::string(name), n, w, 0.3);
        const CompressorInfo& info = *FindCompressor(name);
        const int64_t documented = DocumentedPayloadBytes(name, n, 0.3);
        EXPECT_EQ(PayloadBytes(info, n, 0.3), documented);
        EXPECT_EQ(r.compressor().payload_bytes(), documented);
        auto p = r.Encode(RandomVector(n, 1), 0);
        EXPECT_EQ(static_cast<int64_t>(p.size()), documented);
        std::vector<std::byte> in = p;
        if (info.collective == pb::ALLGATHER)
          for (int i = 1; i < w; ++i) in.insert(in.end(), p.begin(), p.end());
        auto out = r.Decode(in, 0);
        for (float v : out) EXPECT_TRUE(std::isfinite(v));
      }
    }
  }
}

// Every compressor against the plain restatement of its definition (scalar_reference.h), for
// awkward n and both ratios: each of W ranks' payloads (ExpectMatchesDefinition), and the
// decode of what they sent (allreduce sums by the reference's own loops) against the
// reference's average of the same payloads.
TYPED_TEST(CompressorSuite, MatchesTheScalarDefinition) {
  const int w = 3;
  const uint64_t seed = 41, iteration = 3;
  for (auto name_view : CompressorNames()) {
    const std::string name(name_view);
    const bool sparse = name == "topk" || name == "randk" || name == "dgc";
    const std::string memory = name == "dgc" ? "dgc" : "none";  // dgc's memory at step 0 is g
    for (int64_t n : {1, 9, 1000, 4099}) {
      for (double ratio : {0.01, 0.3}) {
        if (!sparse && ratio != 0.01) continue;
        SCOPED_TRACE(name + " n=" + std::to_string(n) + " ratio=" + std::to_string(ratio));
        std::vector<std::vector<std::byte>> sent;
        for (int r = 0; r < w; ++r) {
          const std::vector<float> g = RandomVector(n, static_cast<uint32_t>(10 + r));
          // Each rank on its own compressor at iteration 0: the memory's state is the zero one.
          Runner run = this->Make(name, n, w, ratio, memory, seed);
          sent.push_back(run.Encode(g, iteration));
          ExpectMatchesDefinition(name, n, sent.back(), ref::Encode(name, g, w, ratio, seed, iteration));
        }
        const pb::CommOp collective = FindCompressor(name)->collective;
        const std::vector<std::byte> in = collective == pb::ALLGATHER ? Concat(sent)
                                          : name == "fp16"             ? ref::SumHalves(sent)
                                                                       : ref::SumFloats(sent);
        Runner run = this->Make(name, n, w, ratio, memory, seed);
        const std::vector<float> out = run.Decode(in, iteration);
        const std::vector<double> avg = ref::Average(name, sent, static_cast<size_t>(n), ratio, seed, iteration);
        for (int64_t i = 0; i < n; ++i) {
          if (name == "fp16") {  // the reduced halves, exactly
            ASSERT_EQ(out[i], ref::HalfValue(ref::GetH(in.data() + 2 * i))) << i;
          } else {
            ASSERT_NEAR(out[i], avg[i], 1e-5 * (1.0 + std::fabs(avg[i]))) << i;
          }
        }
      }
    }
  }
}

TYPED_TEST(CompressorSuite, Fp32DecodeAveragesTheReducedSum) {
  const int64_t n = 1000;
  const int w = 3;
  std::vector<float> sum(n, 0.0f);
  std::vector<std::vector<float>> g;
  for (int r = 0; r < w; ++r) g.push_back(RandomVector(n, 10 + r));
  Runner run = this->Make("fp32", n, w);
  std::vector<std::byte> reduced;
  for (int r = 0; r < w; ++r) {
    auto p = run.Encode(g[r], 0);
    std::vector<float> f(n);
    std::memcpy(f.data(), p.data(), 4 * n);
    EXPECT_EQ(f, g[r]);  // fp32 sends the gradient as is
    SumFp32Payloads(g[r].data(), sum.data(), n);
  }
  reduced.resize(4 * n);
  std::memcpy(reduced.data(), sum.data(), 4 * n);
  auto out = run.Decode(reduced, 0);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], sum[i] / 3.0f);
}

// fp16: scaled by 1/W before the cast, summed in half by SumFp16Payloads, decoded to float.
// Bound: each of the W casts and W-1 half additions rounds by at most 2^-11 relative to a
// value no larger than sum |g_r| / W, so |out - mean| <= 2W * 2^-11 * sum_r |g_r| / W + 2^-24.
TYPED_TEST(CompressorSuite, Fp16ErrorBound) {
  const int64_t n = 4096;
  const int w = 4;
  Runner run = this->Make("fp16", n, w);
  std::vector<std::vector<float>> g;
  for (int r = 0; r < w; ++r) g.push_back(RandomVector(n, 20 + r, 100.0f));
  std::vector<std::byte> reduced;
  for (int r = 0; r < w; ++r) {
    auto p = run.Encode(g[r], 0);
    if (r == 0) reduced = p;
    else SumFp16Payloads(p.data(), reduced.data(), n);
  }
  auto out = run.Decode(reduced, 0);
  for (int64_t i = 0; i < n; ++i) {
    double mean = 0, abs_sum = 0;
    for (int r = 0; r < w; ++r) {
      mean += g[r][i] / static_cast<double>(w);
      abs_sum += std::fabs(g[r][i]);
    }
    const double bound = 2.0 * w * std::ldexp(1.0, -11) * abs_sum / w + std::ldexp(1.0, -24);
    ASSERT_LE(std::fabs(out[i] - mean), bound) << "i=" << i;
  }
}

// Oracle: sort by (|x| desc, index asc), take k; the payload lists them in index order.
std::vector<int32_t> TopkOracle(const std::vector<float>& x, int64_t k) {
  std::vector<int32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TYPED_TEST(CompressorSuite, TopkAndDgcReturnExactlyTheKLargestMagnitudes) {
  for (std::string name : {"topk", "dgc"}) {
    for (int64_t n : {1, 10, 1000, 20000, 100003}) {
      for (double ratio : {0.001, 0.01, 0.3, 1.0}) {
        SCOPED_TRACE(name + " n=" + std::to_string(n) + " ratio=" + std::to_string(ratio));
        // Values on a coarse grid so many magnitudes tie (ties go to the lowest index).
        auto x = RandomVector(n, static_cast<uint32_t>(n));
        for (auto& v : x) v = std::round(v * 8.0f) / 8.0f;
        Runner run = this->Make(name, n, 1, ratio, "none");
        const int64_t k = SelectedCount(n, ratio);
        auto p = run.Encode(x, 0);
        auto want = TopkOracle(x, k);
        for (int64_t j = 0; j < k; ++j) {
          ASSERT_EQ(LoadI(p, 4 * k + 4 * j), want[j]) << "j=" << j;
          ASSERT_EQ(LoadF(p, 4 * j), x[want[j]]);
        }
      }
    }
  }
}

TYPED_TEST(CompressorSuite, SparseDecodeAddsValuesAtEqualIndices) {
  const int64_t n = 10;
  const int w = 3;
  Runner run = this->Make("topk", n, w, 0.2);  // k = 2
  auto payload = [](std::initializer_list<float> v, std::initializer_list<int32_t> i) {
    std::vector<std::byte> p(16);
    std::memcpy(p.data(), std::data(v), 8);
    std::memcpy(p.data() + 8, std::data(i), 8);
    return p;
  };
  auto all = Concat({payload({1.0f, 2.0f}, {3, 7}), payload({4.0f, 8.0f}, {3, 5}), payload({16.0f, 32.0f}, {0, 3})});
  auto out = run.Decode(all, 0);
  std::vector<float> want(n, 0.0f);
  want[3] = (1.0f + 4.0f + 32.0f) / 3.0f;
  want[7] = 2.0f / 3.0f;
  want[5] = 8.0f / 3.0f;
  want[0] = 16.0f / 3.0f;
  EXPECT_EQ(out, want);
}

TYPED_TEST(CompressorSuite, RandkRanksShareDistinctIndices) {
  const int64_t n = 5000;
  const int w = 2;
  const int64_t k = SelectedCount(n, 0.05);
  Runner a = this->Make("randk", n, w, 0.05, "none", 99);
  Runner b = this->Make("randk", n, w, 0.05, "none", 99);
  auto ga = RandomVector(n, 1), gb = RandomVector(n, 2);
  auto pa = a.Encode(ga, 5), pb = b.Encode(gb, 5);
  std::set<uint32_t> idx;
  for (int64_t j = 0; j < k; ++j) {
    const uint32_t i = ref::RandkIndex(99, 5, n, static_cast<uint32_t>(j));
    ASSERT_LT(i, n);
    idx.insert(i);
    EXPECT_EQ(LoadF(pa, 4 * j), ga[i]);
    EXPECT_EQ(LoadF(pb, 4 * j), gb[i]);
  }
  EXPECT_EQ(static_cast<int64_t>(idx.size()), k);  // distinct
  auto out = a.Decode(ref::SumFloats({pa, pb}), 5);
  for (int64_t i = 0; i < n; ++i) {
    const float want = idx.count(static_cast<uint32_t>(i)) ? (ga[i] + gb[i]) / 2.0f : 0.0f;
    ASSERT_EQ(out[i], want) << i;
  }
  // Another iteration picks another set.
  int same = 0;
  for (int64_t j = 0; j < k; ++j) same += idx.count(ref::RandkIndex(99, 6, n, static_cast<uint32_t>(j)));
  EXPECT_LT(same, k / 2);
}

// The exposed RandkIndex (what tools and the runtime's tests may call) is the keyed Feistel
// permutation of the definition, at small, odd and large n.
TEST(RandkIndex, IsTheKeyedFeistelPermutation) {
  for (uint32_t n : {1u, 2u, 3u, 5u, 1000u, 5000u, 65537u, 2147483647u}) {
    for (uint64_t seed : {0ull, 99ull, 0xffffffffffffffffull}) {
      for (uint64_t it : {0ull, 5ull, 1ull << 40}) {
        for (uint32_t j = 0; j < std::min(n, 64u); ++j)
          ASSERT_EQ(RandkIndex(seed, it, n, j), ref::RandkIndex(seed, it, n, j)) << n << " " << seed << " " << it << " " << j;
      }
    }
  }
}

// The reference's binary16 rounding itself, on hand-checked values: ties to even, subnormals,
// overflow to Inf.
TEST(ScalarReference, HalfRoundsToNearestEven) {
  EXPECT_EQ(ref::HalfOf(1.0f), 0x3c00);
  EXPECT_EQ(ref::HalfOf(-2.0f), 0xc000);
  EXPECT_EQ(ref::HalfOf(65504.0f), 0x7bff);
  EXPECT_EQ(ref::HalfOf(65519.0f), 0x7bff);
  EXPECT_EQ(ref::HalfOf(65520.0f), 0x7c00);
  EXPECT_EQ(ref::HalfOf(1.0f + 1.0f / 2048), 0x3c00);      // a tie: to the even 1.0
  EXPECT_EQ(ref::HalfOf(1.0f + 3.0f / 2048), 0x3c02);      // a tie: to the even 1 + 2/1024
  EXPECT_EQ(ref::HalfOf(std::ldexp(1.0f, -24)), 0x0001);   // the smallest subnormal
  EXPECT_EQ(ref::HalfOf(std::ldexp(1.0f, -25)), 0x0000);   // a tie with 0: to even
  EXPECT_EQ(ref::HalfOf(std::ldexp(1023.0f, -24)), 0x03ff);
  EXPECT_EQ(ref::HalfOf(std::ldexp(2047.0f, -25)), 0x0400);  // rounds up into the normals
  for (uint32_t h = 0; h < 0x7c00; ++h) ASSERT_EQ(ref::HalfOf(ref::HalfValue(static_cast<uint16_t>(h))), h);
}

TYPED_TEST(CompressorSuite, SignFamilyBitsAndScale) {
  const int64_t n = 1003;
  auto x = RandomVector(n, 3);
  for (std::string name : {"signsgd", "efsignsgd", "onebit"}) {
    SCOPED_TRACE(name);
    Runner run = this->Make(name, n, 1, 0.01, "none");
    auto p = run.Encode(x, 0);
    const int64_t nb = (n + 7) / 8;
    double abs_sum = 0, pos_sum = 0, neg_sum = 0;
    int64_t pos = 0, neg = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool bit = (static_cast<unsigned>(p[i / 8]) >> (i % 8)) & 1u;
      ASSERT_EQ(bit, x[i] < 0.0f) << i;
      abs_sum += std::fabs(x[i]);
      (x[i] < 0 ? neg_sum : pos_sum) += x[i];
      ++(x[i] < 0 ? neg : pos);
    }
    auto out = run.Decode(p, 0);
    if (name == "onebit") {
      EXPECT_NEAR(LoadF(p, nb), pos_sum / pos, 1e-6);
      EXPECT_NEAR(LoadF(p, nb + 4), neg_sum / neg, 1e-6);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] < 0 ? LoadF(p, nb + 4) : LoadF(p, nb));
    } else {
      const float s = LoadF(p, nb);
      EXPECT_NEAR(s, abs_sum / n, 1e-6);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], x[i] < 0 ? -s : s);
    }
  }
}

TYPED_TEST(CompressorSuite, SignDecodeAveragesRanks) {
  const int64_t n = 77;
  const int w = 3;
  Runner run = this->Make("signsgd", n, w);
  std::vector<std::vector<std::byte>> ps;
  std::vector<std::vector<float>> g;
  for (int r = 0; r < w; ++r) {
    g.push_back(RandomVector(n, 40 + r));
    ps.push_back(run.Encode(g[r], 0));
  }
  auto out = run.Decode(Concat(ps), 0);
  const int64_t nb = (n + 7) / 8;
  for (int64_t i = 0; i < n; ++i) {
    float want = 0.0f;
    for (int r = 0; r < w; ++r) {
      const float s = LoadF(ps[r], nb) / 3.0f;
      want += g[r][i] < 0 ? -s : s;
    }
    ASSERT_EQ(out[i], want) << i;
  }
}

TYPED_TEST(CompressorSuite, SignumSendsTheSignOfTheMomentum) {
  const int64_t n = 64;
  Runner run = this->Make("signum", n, 1);
  auto g1 = RandomVector(n, 5), g2 = RandomVector(n, 6);
  run.Encode(g1, 0);
  auto p = run.Encode(g2, 1);
  double abs_sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float m = 0.9f * (0.9f * 0.0f + 0.1f * g1[i]) + 0.1f * g2[i];
    abs_sum += std::fabs(m);
    const bool bit = (static_cast<unsigned>(p[i / 8]) >> (i % 8)) & 1u;
    ASSERT_EQ(bit, m < 0.0f) << i;
  }
  EXPECT_NEAR(LoadF(p, n / 8), abs_sum / n, 1e-6);
}

// Unbiasedness: mean of T decodes (fresh iteration each) approaches x. Each decode of element
// i has standard deviation <= unit / 2 (unit = norm/127 for qsgd, max for terngrad), so the
// mean's is <= unit / (2 sqrt(T)); tolerance 5 of those (fixed seed: deterministic).
TYPED_TEST(CompressorSuite, QsgdAndTerngradAreUnbiased) {
  const int64_t n = 64;
  const int kT = 4000;
  auto x = RandomVector(n, 8);
  double norm = 0, mx = 0;
  for (float v : x) {
    norm += double(v) * v;
    mx = std::max(mx, double(std::fabs(v)));
  }
  norm = std::sqrt(norm);
  for (std::string name : {"qsgd", "terngrad"}) {
    SCOPED_TRACE(name);
    Runner run = this->Make(name, n, 1, 0.01, "none", 1234);
    std::vector<double> mean(n, 0.0);
    for (int t = 0; t < kT; ++t) {
      auto out = run.Decode(run.Encode(x, t), t);
      for (int64_t i = 0; i < n; ++i) mean[i] += out[i] / double(kT);
    }
    const double unit = name == "qsgd" ? norm / 127.0 : mx;
    const double tol = 5.0 * unit / (2.0 * std::sqrt(double(kT)));
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(mean[i], x[i], tol) << i;
  }
}

// Error feedback: sent + new residual == input + old residual (sent = the W = 1 decode).
// Exact for the sparse compressors; within 2 ulp of the larger term for the others.
TYPED_TEST(CompressorSuite, ErrorFeedbackKeepsWhatWasNotSent) {
  const int64_t n = 2001;
  for (std::string name : {"fp32", "fp16", "topk", "randk", "dgc", "qsgd", "efsignsgd", "terngrad", "onebit"}) {
    SCOPED_TRACE(name);
    Runner run = this->Make(name, n, 1, 0.05, "residual");
    auto e_old = RandomVector(n, 9, 0.1f);
    run.SetState(e_old);
    auto g = RandomVector(n, 10);
    auto sent = run.Decode(run.Encode(g, 3), 3);
    auto e_new = run.State();
    const bool exact = name == "topk" || name == "randk" || name == "dgc" || name == "fp32";
    for (int64_t i = 0; i < n; ++i) {
      const float input = g[i] + e_old[i];
      if (exact) {
        ASSERT_EQ(sent[i] + e_new[i], input) << i;
      } else {
        const float tol = 2.0f * std::numeric_limits<float>::epsilon() * std::max(std::fabs(input), std::fabs(sent[i]));
        ASSERT_NEAR(sent[i] + e_new[i], input, tol) << i;
      }
    }
  }
}

TYPED_TEST(CompressorSuite, DgcMemoryAccumulatesMomentumAndClearsWhatWasSent) {
  const int64_t n = 500;
  Runner run = this->Make("topk", n, 1, 0.1, "dgc");
  auto g1 = RandomVector(n, 11), g2 = RandomVector(n, 12);
  auto p1 = run.Encode(g1, 0);
  auto s1 = run.State();
  std::vector<float> u(n), v(n);
  for (int64_t i = 0; i < n; ++i) u[i] = v[i] = g1[i];
  const int64_t k = 50;
  for (int64_t j = 0; j < k; ++j) {
    const int32_t i = LoadI(p1, 4 * k + 4 * j);
    EXPECT_EQ(LoadF(p1, 4 * j), v[i]);
    u[i] = v[i] = 0.0f;
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(s1[i], u[i]);
    ASSERT_EQ(s1[n + i], v[i]);
  }
  auto p2 = run.Encode(g2, 1);
  for (int64_t i = 0; i < n; ++i) {
    u[i] = 0.9f * u[i] + g2[i];
    v[i] += u[i];
  }
  EXPECT_EQ(LoadI(p2, 4 * k), TopkOracle(v, k)[0]);
}

// NaN and Inf stay where they are: every other decoded element is finite and, for the
// elementwise compressors, equal to the decode of the input with those entries set to 0;
// the memory stays finite.
TYPED_TEST(CompressorSuite, NonFiniteInputsDoNotSpread) {
  const int64_t n = 257;
  auto clean = RandomVector(n, 13);
  auto dirty = clean;
  const float inf = std::numeric_limits<float>::infinity();
  dirty[5] = std::numeric_limits<float>::quiet_NaN();
  dirty[100] = -inf;
  dirty[256] = inf;
  auto zeroed = clean;
  zeroed[5] = zeroed[100] = zeroed[256] = 0.0f;
  for (auto name : CompressorNames()) {
    SCOPED_TRACE(std::string(name));
    const std::string memory = name == "signum" || name == "fp32" ? "none" : "residual";
    Runner run = this->Make(std::string(name), n, 1, 0.05, memory);
    Runner ref = this->Make(std::string(name), n, 1, 0.05, memory);
    auto out = run.Decode(run.Encode(dirty, 0), 0);
    auto want = ref.Decode(ref.Encode(zeroed, 0), 0);
    for (int64_t i = 0; i < n; ++i) {
      if (i == 5 || i == 100 || i == 256) continue;
      ASSERT_TRUE(std::isfinite(out[i])) << i;
      const bool elementwise = name == "fp16" || name == "qsgd" || name == "signsgd" || name == "efsignsgd" ||
                               name == "terngrad" || name == "fp32" || name == "randk";
      if (elementwise) {
        ASSERT_EQ(out[i], want[i]) << i;
      }
    }
    for (float e : run.State()) ASSERT_TRUE(std::isfinite(e));
  }
}

}  // namespace
}  // namespace cupcake::kernels::testing

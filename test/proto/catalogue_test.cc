#include "cupcake/proto/catalogue.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace cupcake {
namespace {

// kernels/README.md, written out independently of the catalogue's formulas.
int64_t DesignPayload(std::string_view name, int64_t n, double rho) {
  int64_t k = std::max<int64_t>(1, static_cast<int64_t>(std::floor(rho * static_cast<double>(n) + 1e-9)));
  if (name == "fp32") return 4 * n;
  if (name == "fp16") return 2 * n;
  if (name == "topk" || name == "dgc") return 8 * k;
  if (name == "randk") return 4 * k;
  if (name == "qsgd") return n + 4;
  if (name == "signsgd" || name == "efsignsgd" || name == "signum") return (n + 7) / 8 + 4;
  if (name == "terngrad") return (n + 3) / 4 + 4;
  if (name == "onebit") return (n + 7) / 8 + 8;
  ADD_FAILURE() << "no catalogue row written out for " << name;
  return -1;
}

TEST(Catalogue, PayloadOfEveryCompressorMatchesTheDesignTable) {
  ASSERT_EQ(Compressors().size(), 11u);
  for (const CompressorInfo& c : Compressors()) {
    for (int64_t n : {1, 2, 7, 8, 9, 99, 100, 101, 1000, 1023, 25557032}) {
      for (double rho : {0.01, 0.001, 0.5}) {
        EXPECT_EQ(PayloadBytes(c, n, rho), DesignPayload(c.name, n, rho)) << c.name << " n=" << n << " rho=" << rho;
      }
    }
  }
  EXPECT_EQ(PayloadBytes(*FindCompressor("terngrad"), 5, 0.01), 2 + 4);
  EXPECT_EQ(PayloadBytes(*FindCompressor("onebit"), 9, 0.01), 2 + 8);
  EXPECT_EQ(PayloadBytes(*FindCompressor("topk"), 1000, 0.01), 80);
}

TEST(Catalogue, CollectivesAndMemoriesFollowTheDesign) {
  const std::map<std::string_view, pb::CommOp> collective{
      {"fp32", pb::ALLREDUCE},   {"fp16", pb::ALLREDUCE},     {"randk", pb::ALLREDUCE},   {"topk", pb::ALLGATHER},
      {"dgc", pb::ALLGATHER},    {"qsgd", pb::ALLGATHER},     {"signsgd", pb::ALLGATHER}, {"efsignsgd", pb::ALLGATHER},
      {"signum", pb::ALLGATHER}, {"terngrad", pb::ALLGATHER}, {"onebit", pb::ALLGATHER}};
  for (const CompressorInfo& c : Compressors()) {
    ASSERT_TRUE(collective.count(c.name)) << c.name;
    EXPECT_EQ(c.collective, collective.at(c.name)) << c.name;
    EXPECT_EQ(c.uses_ratio, c.name == "topk" || c.name == "randk" || c.name == "dgc") << c.name;
  }
  EXPECT_EQ(FindCompressor("dgc")->default_memory, "dgc");
  EXPECT_EQ(Compressors()[0].name, "fp32");
  EXPECT_EQ(CompressorNames().size(), Compressors().size());
  EXPECT_EQ(FindCompressor("nope"), nullptr);
}

TEST(Catalogue, SelectedCountAndRatioChecks) {
  EXPECT_EQ(SelectedCount(100, 0.29), 29);  // not 28 from binary rounding
  EXPECT_EQ(SelectedCount(10, 0.01), 1);
  EXPECT_EQ(SelectedCount(5, 1.0), 5);
  EXPECT_TRUE(ValidateRatio("--ratio", 1.0).ok());
  EXPECT_EQ(ValidateRatio("--ratio", 0).message(), "--ratio: ratio out of range; got 0, expected 0 < ratio <= 1");
  EXPECT_EQ(UnknownCompressorError("--compressor", "topkk").message(),
            "--compressor: unknown compressor 'topkk' (did you mean 'topk'?); expected one of fp32, fp16, topk, "
            "randk, dgc, qsgd, signsgd, efsignsgd, signum, terngrad, onebit");
}

// Zen's steps (docs/MODEL.md, "The zen scheme"), each size worked out by hand.
TEST(Catalogue, ZenStepBytesByHand) {
  const SchemeInfo* zen = FindScheme("zen");
  ASSERT_NE(zen, nullptr);
  ASSERT_EQ(zen->step_count, 4);
  EXPECT_TRUE(zen->zen);
  EXPECT_EQ(PayloadStep(*zen), 1);
  const CompressorInfo& topk = *FindCompressor("topk");
  auto bytes = [&](int64_t n, double ratio, int world, double zen_union = 0) {
    std::vector<int64_t> out;
    for (int i = 0; i < zen->step_count; ++i)
      out.push_back(StepBytes(*zen, zen->steps[i], topk, n, ratio, {world, 1}, zen_union));
    return out;
  };
  // n 1000, k 10, W 4: counts 8 x 4; pairs 8 x 10; sizes 8; the union
  // 1000 (1 - 0.99^4) = 39.404, an owner's round(9.851) = 10 entries over 250 rows: row list
  // 8 + 40 + 40 = 88, bitmap 8 + 32 + 40 = 80 -> 80.
  EXPECT_EQ(bytes(1000, 0.01, 4), (std::vector<int64_t>{32, 80, 8, 80}));
  // n 1000, k 1, W 2: union 1000 (1 - 0.999^2) = 1.999, round(0.9995) = 1 entry over 500 rows:
  // row list 8 + 4 + 4 = 16, bitmap 8 + 63 + 4 = 75 -> 16.
  EXPECT_EQ(bytes(1000, 0.001, 2), (std::vector<int64_t>{16, 8, 8, 16}));
  // n 100000, k 1000, W 8: union 100000 (1 - 0.99^8) = 7725.53, round(965.69) = 966 entries
  // over 12500 rows: row list 8 + 3864 + 3864 = 7736, bitmap 8 + 1563 + 3864 = 5435 -> 5435.
  EXPECT_EQ(bytes(100000, 0.01, 8), (std::vector<int64_t>{64, 8000, 8, 5435}));
  // One rank: the union is its k = 10 entries over 1000 rows: 8 + 40 + 40 = 88.
  EXPECT_EQ(bytes(1000, 0.01, 1), (std::vector<int64_t>{8, 80, 8, 88}));
  // A measured union share of the W k = 40 pairs: 0.5 -> U = 20, an owner's 5 entries over 250
  // rows: row list 8 + 20 + 20 = 48, bitmap 8 + 32 + 20 = 60 -> 48. 1 -> U = 40, 10 entries: 80
  // as the bitmap above. 0.05 -> U = 2, clamped to k = 10, round(2.5) = 3 entries: row list
  // 8 + 12 + 12 = 32. Only the partitions change.
  EXPECT_EQ(bytes(1000, 0.01, 4, 0.5), (std::vector<int64_t>{32, 80, 8, 48}));
  EXPECT_EQ(bytes(1000, 0.01, 4, 1.0), (std::vector<int64_t>{32, 80, 8, 80}));
  EXPECT_EQ(bytes(1000, 0.01, 4, 0.05), (std::vector<int64_t>{32, 80, 8, 32}));
  // n 100, k 30, W 8, share 0.9: U = 216, clamped to n = 100: 13 entries over 13 rows: row list
  // 8 + 52 + 52 = 112, bitmap 8 + 2 + 52 = 62 -> 62.
  EXPECT_EQ(bytes(100, 0.3, 8, 0.9), (std::vector<int64_t>{64, 240, 8, 62}));
  EXPECT_EQ(zen->steps[0].op, pb::ALLTOALL);
  EXPECT_EQ(zen->steps[1].op, pb::ALLTOALL);
  EXPECT_EQ(zen->steps[2].op, pb::ALLGATHER);
  EXPECT_EQ(zen->steps[3].op, pb::ALLGATHER);
}

TEST(Catalogue, ZenNeedsSparsePairs) {
  const SchemeInfo& zen = *FindScheme("zen");
  EXPECT_EQ(SchemeCodecProblem(zen, *FindCompressor("topk")), "");
  EXPECT_EQ(SchemeCodecProblem(zen, *FindCompressor("dgc")), "");
  EXPECT_EQ(SchemeCodecProblem(zen, *FindCompressor("efsignsgd")),
            "zen needs a compressor whose payload is sparse pairs; got efsignsgd, expected topk or dgc");
  EXPECT_EQ(SchemeCodecProblem(*FindScheme("flat"), *FindCompressor("efsignsgd")), "");
  EXPECT_EQ(SchemeNames(),
            "flat_fp32, flat_fp16, flat, hier_fp32, hier_fp16, hier, zen, zen_sparse, powersgd, powersgd_batched");
}

// PowerSGD's two allreduces, sized from the tensors' shapes (the hook's rules), hand-worked:
// rank 2; [16, 12]: r 2, 28 x 2 x 2 = 112 < 192, compressed: P 32, Q 24; [8, 3, 3]: 8 x 9,
// 17 x 4 = 68 < 72: P 16, Q 18; [5]: a vector (5 x 1, 6 x 1 x 2 >= 5): 5 floats with P;
// [10, 7] without a recorded shape: a vector of 70. Batched: 192 + 72 + 5 + 70 = 339 floats,
// side 19 (18^2 = 324 < 339), P = Q = 19 x 2.
TEST(Catalogue, PowerSgdSizesFollowTheShapes) {
  pb::Model m;
  for (auto [numel, shape] : {std::pair<int, std::vector<int64_t>>{192, {16, 12}}, {72, {8, 3, 3}}, {5, {5}},
                              {70, {}}}) {
    pb::Tensor* t = m.add_tensors();
    t->set_numel(numel);
    for (int64_t d : shape) t->add_shape(d);
  }
  const LowRankSizes per_tensor = PowerSgdGroupSizes(m, 0, 3, 2, false);
  EXPECT_EQ(per_tensor.first_floats, 32 + 16 + 5 + 70);
  EXPECT_EQ(per_tensor.second_floats, 24 + 18);
  const LowRankSizes batched = PowerSgdGroupSizes(m, 0, 3, 2, true);
  EXPECT_EQ(batched.first_floats, 38);
  EXPECT_EQ(batched.second_floats, 38);
  EXPECT_EQ(PowerSgdSide(289), 17);
  EXPECT_EQ(PowerSgdSide(290), 18);
  EXPECT_EQ(PowerSgdSide(1), 1);
  const SchemeInfo& s = *FindScheme("powersgd");
  const CompressorInfo& fp32 = *FindCompressor("fp32");
  EXPECT_EQ(CodecCompressor(s, fp32).name, "powersgd");
  EXPECT_EQ(StepBytes(s, s.steps[0], fp32, 339, 0, {2, 1}, 0, &per_tensor), 4 * 123);
  EXPECT_EQ(StepBytes(s, s.steps[1], fp32, 339, 0, {2, 1}, 0, &per_tensor), 4 * 42);
  EXPECT_EQ(s.steps[0].op, pb::ALLREDUCE);
  EXPECT_EQ(s.steps[1].op, pb::ALLREDUCE);
  EXPECT_TRUE(FindScheme("powersgd_batched")->batched);
  EXPECT_FALSE(s.batched);
}

// zen_sparse: Zen's steps on the group's expected non-zeros, whatever the plan's compressor.
// Tensors of 1000 (density 0.25: 250 non-zeros), 7 (density 0.01: round(0.07) = 0, clamped to
// 1) and 10 (no density: dense, 10) elements.
TEST(Catalogue, ZenSparseSizesByTheRecordedDensity) {
  pb::Model m;
  for (auto [numel, density] : {std::pair{1000, 0.25}, std::pair{7, 0.01}, std::pair{10, -1.0}}) {
    pb::Tensor* t = m.add_tensors();
    t->set_numel(numel);
    if (density > 0) t->set_density(density);
  }
  EXPECT_EQ(ExpectedNonzeros(m.tensors(0)), 250);
  EXPECT_EQ(ExpectedNonzeros(m.tensors(1)), 1);
  EXPECT_EQ(ExpectedNonzeros(m.tensors(2)), 10);
  EXPECT_TRUE(HasSparseGradients(m));
  const SchemeInfo& s = *FindScheme("zen_sparse");
  const CompressorInfo& fp32 = *FindCompressor("fp32");
  EXPECT_EQ(SchemeCodecProblem(s, fp32), "");
  EXPECT_EQ(SchemeCodecProblem(s, *FindCompressor("efsignsgd")), "");
  EXPECT_EQ(CodecCompressor(s, fp32).name, "nonzero");
  EXPECT_DOUBLE_EQ(SchemeRatio(s, 0.5, m, 0, 2), 261.0 / 1017.0);
  EXPECT_DOUBLE_EQ(SchemeRatio(*FindScheme("zen"), 0.5, m, 0, 2), 0.5);
  // Pairs: 8 x 261; partitions at W = 4: U = 1017 (1 - (1 - 261/1017)^4) = 706.5, an owner's
  // 177 over 255 rows: row list 8 + 708 + 708, bitmap 8 + 32 + 708 = 748.
  const double ratio = SchemeRatio(s, 0, m, 0, 2);
  EXPECT_EQ(StepBytes(s, s.steps[1], fp32, 1017, ratio, {4, 1}, 0), 8 * 261);
  EXPECT_EQ(StepBytes(s, s.steps[3], fp32, 1017, ratio, {4, 1}, 0), 748);
  m.mutable_tensors(0)->set_density(0.5);
  m.mutable_tensors(1)->clear_density();
  EXPECT_TRUE(HasSparseGradients(m));
  m.mutable_tensors(0)->set_density(0.51);  // its pairs would outweigh the dense group
  EXPECT_FALSE(HasSparseGradients(m));
}

}  // namespace
}  // namespace cupcake

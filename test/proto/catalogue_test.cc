#include "cupcake/proto/catalogue.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

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
      {"fp32", pb::ALLREDUCE}, {"fp16", pb::ALLREDUCE},    {"randk", pb::ALLREDUCE},  {"topk", pb::ALLGATHER},
      {"dgc", pb::ALLGATHER},  {"qsgd", pb::ALLGATHER},    {"signsgd", pb::ALLGATHER}, {"efsignsgd", pb::ALLGATHER},
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

}  // namespace
}  // namespace cupcake

// CUDA output against the CPU reference, on the same inputs (skipped without a GPU, saying why;
// failed instead with CUPCAKE_REQUIRE_GPU=1: gpu_test.h).
// Bit-exact: fp32, fp16, topk, randk, dgc (payloads and decodes; same selection rule, same
// float operations, no FMA contraction). Within a bound: the compressors with a reduction
// (qsgd's norm, the sign family's means, terngrad's max is exact): the scale may differ in the
// last bits because the GPU sums in another order, so scales agree within 1e-5 relative, and
// stochastic levels may differ by one where the rounding threshold sits between the two
// scales: at most 0.1% of the elements.
#include <cmath>
#include <string>

#include "cupcake/proto/catalogue.h"
#include "gpu_test.h"
#include "harness.h"

namespace cupcake::kernels::testing {
namespace {

class CudaMatchesCpu : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { CUPCAKE_GPU_OR_SKIP(BackendAvailable(Backend::kCuda)); }
};

TEST_P(CudaMatchesCpu, OnTheSameInputs) {
  const std::string name = GetParam();
  const bool exact = name == "fp32" || name == "fp16" || name == "topk" || name == "randk" || name == "dgc";
  for (int64_t n : {1, 9, 1000, 65537, 1 << 20}) {
    SCOPED_TRACE(name + " n=" + std::to_string(n));
    CompressorConfig c;
    c.name = name;
    c.n = n;
    c.world_size = 3;
    c.ratio = 0.01;
    c.seed = 17;
    if (name == "signum" || name == "fp32") c.memory = "none";
    Runner cpu(c, Backend::kCpu), gpu(c, Backend::kCuda);
    std::vector<std::vector<std::byte>> pc, pg;
    std::vector<float> state_c, state_g;
    for (int r = 0; r < 3; ++r) {
      auto g = RandomVector(n, 100 + r);
      // Two steps so the memory takes part.
      cpu.Encode(g, 0);
      gpu.Encode(g, 0);
      pc.push_back(cpu.Encode(g, 1));
      pg.push_back(gpu.Encode(g, 1));
    }
    const CompressorInfo& info = *FindCompressor(name);
    std::vector<std::byte> in_c = info.collective == pb::ALLGATHER ? Concat(pc) : pc[0];
    std::vector<std::byte> in_g = info.collective == pb::ALLGATHER ? Concat(pg) : pg[0];
    auto out_c = cpu.Decode(in_c, 1);
    auto out_g = gpu.Decode(in_c, 1);  // decode the same bytes on both
    if (exact) {
      ASSERT_EQ(pc, pg);
      ASSERT_EQ(out_c, out_g);
      ASSERT_EQ(cpu.State(), gpu.State());
      continue;
    }
    // Decoding the same payload bytes is exact for every compressor.
    ASSERT_EQ(out_c, out_g);
    // Encodings agree up to the scale's last bits and rare one-level differences.
    const int64_t meta = info.payload == PayloadFormula::kInt8Norm ? n
                         : info.payload == PayloadFormula::kTernaryScale ? (n + 3) / 4
                                                                          : (n + 7) / 8;
    for (int r = 0; r < 3; ++r) {
      const float sc = LoadF(pc[r], meta), sg = LoadF(pg[r], meta);
      EXPECT_NEAR(sg, sc, 1e-5 * std::fabs(sc)) << "rank " << r;
      int64_t differing = 0;
      for (int64_t i = 0; i < meta; ++i) differing += pc[r][i] != pg[r][i];
      EXPECT_LE(differing, std::max<int64_t>(1, meta / 1000)) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCompressors, CudaMatchesCpu,
                         ::testing::Values("fp32", "fp16", "topk", "randk", "dgc", "qsgd", "signsgd", "efsignsgd",
                                           "signum", "terngrad", "onebit"));

}  // namespace
}  // namespace cupcake::kernels::testing

// The backend suite over NCCL: every case on a one-rank NCCL group on this machine's GPU (the
// GPU machine has one). Without a GPU or NCCL the test skips saying why (gpu_test.h); with
// CUPCAKE_REQUIRE_GPU=1 that is a failure.
#include "cases.h"
#include "cupcake/comm/nccl.h"
#include "gpu_test.h"

namespace cupcake::comm::testing {
namespace {

class NcclSuite : public ::testing::TestWithParam<int> {};

TEST_P(NcclSuite, PassesTheBackendCase) {
  auto nccl = MakeNcclCommunicator(nullptr);
  if (!nccl.ok()) CUPCAKE_GPU_OR_SKIP(nccl.status());
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  EXPECT_EQ((*nccl)->memory(), MemoryKind::kDevice);
  EXPECT_NE((*nccl)->stream(), nullptr);
  Cases()[static_cast<size_t>(GetParam())].run(**nccl);
}

INSTANTIATE_TEST_SUITE_P(OneGpu, NcclSuite, ::testing::Range(0, static_cast<int>(Cases().size())),
                         [](const auto& param_info) { return Cases()[static_cast<size_t>(param_info.param)].name; });

}  // namespace
}  // namespace cupcake::comm::testing

// NCCL as the comm sweep's data communicator, one rank on this machine's first GPU (NCCL takes
// one GPU per rank, and the GPU machine has one). Without a GPU or NCCL, the refusal is checked
// and the measurement skipped.
#include <gtest/gtest.h>

#include "cupcake/comm/nccl.h"
#include "cupcake/profile/comm_sweep.h"
#include "gpu_test.h"

namespace cupcake::profile {
namespace {

using comm::InProcessGroup;
using comm::MakeNcclCommunicator;

TEST(Nccl, SweepsEveryCollectiveOnOneGpuOrSaysWhyNot) {
  InProcessGroup group(1, {"gpu-host"});
  auto world = group.Rank(0);
  auto nccl = MakeNcclCommunicator(world.get(), 0);
  if (!nccl.ok()) {
    EXPECT_EQ(nccl.status().code(), StatusCode::kFailedPrecondition);
    const std::string m = nccl.status().message();
    EXPECT_TRUE(m.starts_with("NCCL communicator: no CUDA device found") ||
                m.starts_with("NCCL communicator: this build has no NCCL")) << m;
    EXPECT_TRUE(m.ends_with("(rank 0 on gpu-host)") || m.find("this build has no NCCL") != std::string::npos) << m;
    CUPCAKE_GPU_OR_SKIP(nccl.status());  // skips only for an absent GPU or NCCL (gpu_test.h)
  }
  EXPECT_EQ((*nccl)->library().rfind("NCCL ", 0), 0u) << (*nccl)->library();
  MemorySink sink;
  FakeClock clock(3.0);
  CommSweepOptions o;
  o.sizes = {4, 1 << 10, 1 << 20};
  o.warmup = 1;
  o.iters = 3;
  o.data = nccl->get();
  auto report = SweepComm(*world, o, clock, &sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->wrong, 0);
  // Five collectives and the float16 allreduce (every size here is even), at three sizes each.
  EXPECT_EQ(report->measured, 18);
}

TEST(Nccl, RefusesADeviceThisHostDoesNotHave) {
  InProcessGroup group(1, {"gpu-host"});
  auto world = group.Rank(0);
  auto nccl = MakeNcclCommunicator(world.get(), 4096);
  ASSERT_FALSE(nccl.ok());
  EXPECT_EQ(nccl.status().code(), StatusCode::kFailedPrecondition);
  const std::string m = nccl.status().message();
  EXPECT_TRUE(m.starts_with("NCCL communicator: no CUDA device") ||
              m.starts_with("NCCL communicator: this build has no NCCL")) << m;
}

}  // namespace
}  // namespace cupcake::profile

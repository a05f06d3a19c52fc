// gpu_test.h's verdicts: which probe messages mean an absent GPU (skip, with the reason),
// which a failure of present hardware (fail), and CUPCAKE_REQUIRE_GPU turning skips into
// failures. The messages are the shapes cupcake::internal::CudaDeviceCount
// (proto/internal/cupcake/internal/cuda_status.h) and the factories produce.
#include <gtest/gtest.h>

#include <string>

#include "cupcake/kernels/compressor.h"
#include "gpu_test.h"

namespace cupcake::gpu_test {
namespace {

const Status kNoDevice = FailedPreconditionError(
    "backend cuda: no CUDA device found; got 'cudaErrorNoDevice: no CUDA-capable device is detected' from "
    "cudaGetDeviceCount, expected >= 1 device");
const Status kNoDriver = FailedPreconditionError(
    "backend cuda: no CUDA device found; got 'cudaErrorInsufficientDriver: CUDA driver version is insufficient for "
    "CUDA runtime version' from cudaGetDeviceCount, expected >= 1 device");

TEST(GpuProbe, NoDeviceSkipsSayingSo) {
  const Verdict v = Classify(kNoDevice, false, false);
  EXPECT_EQ(v.kind, Verdict::kSkip);
  EXPECT_EQ(v.reason.rfind("no CUDA device: cudaGetDeviceCount found no GPU (", 0), 0u) << v.reason;
  EXPECT_EQ(Classify(FailedPreconditionError("no CUDA device found; got 0 devices from cudaGetDeviceCount"), false,
                     false)
                .reason,
            "no CUDA device: cudaGetDeviceCount counted 0 devices");
}

// A driver is loaded but the runtime sees no device: hidden (CUDA_VISIBLE_DEVICES="") or lost.
// A GPU machine must go red then, not skip.
TEST(GpuProbe, NoDeviceWithADriverLoadedFails) {
  EXPECT_EQ(Classify(kNoDevice, false, true).kind, Verdict::kFail);
  EXPECT_EQ(Classify(FailedPreconditionError("no CUDA device found; got 0 devices from cudaGetDeviceCount"), false,
                     true)
                .kind,
            Verdict::kFail);
}

TEST(GpuProbe, InsufficientDriverWithoutADriverIsNoGpu) {
  const Verdict v = Classify(kNoDriver, false, false);
  EXPECT_EQ(v.kind, Verdict::kSkip);
  EXPECT_EQ(v.reason.rfind("no CUDA device: no GPU driver installed (", 0), 0u) << v.reason;
}

TEST(GpuProbe, InsufficientDriverWithADriverLoadedFails) {
  const Verdict v = Classify(kNoDriver, false, true);  // a driver older than the runtime
  EXPECT_EQ(v.kind, Verdict::kFail);
  EXPECT_EQ(v.reason.rfind("the GPU is present but failing: ", 0), 0u) << v.reason;
}

TEST(GpuProbe, OtherErrorsAreFailuresOfPresentHardware) {
  for (const char* m : {"backend cuda: no CUDA device found; got 'cudaErrorUnknown: unknown error' from "
                        "cudaGetDeviceCount, expected >= 1 device",
                        "cuda: cudaSetDevice(0): cudaErrorDevicesUnavailable: CUDA-capable device(s) is/are busy",
                        "cupti: cuptiSubscribe: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"}) {
    SCOPED_TRACE(m);
    EXPECT_EQ(Classify(InternalError(m), false, true).kind, Verdict::kFail);
    EXPECT_EQ(Classify(InternalError(m), false, false).kind, Verdict::kFail);
  }
}

TEST(GpuProbe, AbsentSupportInTheBuildSkips) {
  EXPECT_EQ(Classify(FailedPreconditionError("this build has no CUPTI; build with ..."), false, true).reason,
            "no CUPTI: this build has no CUPTI; build with ...");
  EXPECT_EQ(Classify(FailedPreconditionError("backend cuda: not available; got a build without CUDA, expected ..."),
                     false, false)
                .kind,
            Verdict::kSkip);
  EXPECT_EQ(Classify(FailedPreconditionError("rank 0 on h: this build has no NCCL"), false, false).kind,
            Verdict::kSkip);
}

TEST(GpuProbe, RequireGpuTurnsEverySkipIntoAFailure) {
  const Verdict v = Classify(kNoDevice, true, false);
  EXPECT_EQ(v.kind, Verdict::kFail);
  EXPECT_EQ(v.reason.rfind("CUPCAKE_REQUIRE_GPU is set, but no CUDA device: ", 0), 0u) << v.reason;
  EXPECT_EQ(Classify(kNoDriver, true, false).kind, Verdict::kFail);
  EXPECT_EQ(Classify(Status::Ok(), true, false).kind, Verdict::kRun);
}

// This machine's own probe is either a GPU that works or one that is absent, never a broken one.
TEST(GpuProbe, ThisMachinesGpuWorksOrIsAbsent) {
  const Verdict v = Classify(kernels::BackendAvailable(kernels::Backend::kCuda), false, NvidiaDriverLoaded());
  EXPECT_NE(v.kind, Verdict::kFail) << v.reason;
}

}  // namespace
}  // namespace cupcake::gpu_test

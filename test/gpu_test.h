// When a GPU test runs, skips or fails, for every GPU fixture of the suite (one place).
//
// A test probes its device (kernels::BackendAvailable, profile::OpenCudaKernelDevice, ...) and
// hands the probe's Status to CUPCAKE_GPU_OR_SKIP. It skips only when the hardware or the
// build's support is absent, with the reason ("no CUDA device: ..."):
//   - cudaGetDeviceCount said cudaErrorNoDevice, or counted 0 devices, and no NVIDIA driver is
//     loaded (no /proc/driver/nvidia/version); with a driver loaded that is a hidden or lost
//     device (CUDA_VISIBLE_DEVICES, a device that fell off the bus) and fails;
//   - it said cudaErrorInsufficientDriver and no NVIDIA driver is loaded: the toolkit's runtime
//     without a driver reports "CUDA driver version is insufficient", which here means "no GPU
//     driver";
//   - the build has no CUDA, NCCL or CUPTI.
// Any other error is a failure of present hardware (a driver older than the runtime, a device
// that refuses to start, CUPTI that cannot subscribe) and fails the test. With
// CUPCAKE_REQUIRE_GPU=1 in the environment (bench/gpu/run.sh sets it) every skip is a failure,
// so a GPU run cannot come out green without having run the GPU cases.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cupcake/proto/status.h"

namespace cupcake::gpu_test {

inline constexpr const char* kRequireGpuVariable = "CUPCAKE_REQUIRE_GPU";

// True when CUPCAKE_REQUIRE_GPU is set to anything but "" or "0".
inline bool RequireGpu() {
  const char* v = std::getenv(kRequireGpuVariable);
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

inline bool Contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Why `probe_message` means that the GPU (or the build's support for it) is absent, or "" when
// it names a failure of present hardware. `driver_loaded`: whether an NVIDIA kernel driver is
// loaded on this machine.
inline std::string AbsenceReason(const std::string& probe_message, bool driver_loaded) {
  if (Contains(probe_message, "cudaErrorNoDevice") && !driver_loaded)
    return "no CUDA device: cudaGetDeviceCount found no GPU (" + probe_message + ")";
  if (Contains(probe_message, "got 0 devices") && !driver_loaded)
    return "no CUDA device: cudaGetDeviceCount counted 0 devices";
  if (Contains(probe_message, "cudaErrorInsufficientDriver") && !driver_loaded)
    return "no CUDA device: no GPU driver installed (no /proc/driver/nvidia/version; the CUDA runtime reports "
           "this as cudaErrorInsufficientDriver, 'CUDA driver version is insufficient')";
  if (Contains(probe_message, "this build has no CUDA") || Contains(probe_message, "a build without CUDA"))
    return "no CUDA device: this build has no CUDA (" + probe_message + ")";
  if (Contains(probe_message, "this build has no NCCL")) return "no NCCL: " + probe_message;
  if (Contains(probe_message, "this build has no CUPTI")) return "no CUPTI: " + probe_message;
  return "";
}

inline bool NvidiaDriverLoaded() {
  std::error_code ec;
  return std::filesystem::exists("/proc/driver/nvidia/version", ec);
}

struct Verdict {
  enum Kind { kRun, kSkip, kFail } kind = kRun;
  std::string reason;
};

// What a GPU test does with its probe's status.
inline Verdict Classify(const Status& probe, bool require_gpu, bool driver_loaded) {
  if (probe.ok()) return {Verdict::kRun, ""};
  const std::string absent = AbsenceReason(probe.message(), driver_loaded);
  if (absent.empty()) return {Verdict::kFail, "the GPU is present but failing: " + probe.ToString()};
  if (require_gpu) return {Verdict::kFail, std::string(kRequireGpuVariable) + " is set, but " + absent};
  return {Verdict::kSkip, absent};
}

inline Verdict ClassifyHere(const Status& probe) { return Classify(probe, RequireGpu(), NvidiaDriverLoaded()); }

}  // namespace cupcake::gpu_test

// In a test body or SetUp: runs on when `probe` (a Status) is ok, else skips with the reason
// or fails (see above).
#define CUPCAKE_GPU_OR_SKIP(probe)                                                                      \
  do {                                                                                                  \
    const ::cupcake::gpu_test::Verdict cupcake_gpu_verdict_ = ::cupcake::gpu_test::ClassifyHere(probe); \
    if (cupcake_gpu_verdict_.kind == ::cupcake::gpu_test::Verdict::kFail) FAIL() << cupcake_gpu_verdict_.reason; \
    if (cupcake_gpu_verdict_.kind == ::cupcake::gpu_test::Verdict::kSkip) GTEST_SKIP() << cupcake_gpu_verdict_.reason; \
  } while (0)

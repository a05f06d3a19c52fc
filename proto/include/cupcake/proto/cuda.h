// CUDA runtime errors as Status, one macro for this vendor API shared by the
// libraries' CUDA code (kernels, profiler backends, runtime). Header-only: include it only from
// sources built with CUDA (they link CUDA::cudart).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cupcake/proto/status.h"

namespace cupcake {

// InternalError "cuda: <call>: <error name>: <message>".
inline Status CudaStatus(cudaError_t e, const char* call) {
  return InternalError(std::string("cuda: ") + call + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// The number of CUDA devices (>= 1), or FailedPrecondition "no CUDA device found; got
// '<error name>: <message>' from cudaGetDeviceCount, expected >= 1 device" (or "got 0 devices");
// the runtime's sticky error is cleared, so later calls are not poisoned by this one.
inline StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return count;
  (void)cudaGetLastError();
  const std::string got =
      e == cudaSuccess ? "0 devices" : std::string("'") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + "'";
  return FailedPreconditionError("no CUDA device found; got " + got + " from cudaGetDeviceCount, expected >= 1 device");
}

}  // namespace cupcake

#define CUPCAKE_CUDA_RETURN_IF_ERROR(call)                                              \
  do {                                                                                  \
    if (const cudaError_t cupcake_cuda_err_ = (call); cupcake_cuda_err_ != cudaSuccess) \
      return ::cupcake::CudaStatus(cupcake_cuda_err_, #call);                           \
  } while (0)

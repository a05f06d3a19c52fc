// CUDA runtime errors as Status: the one macro for this vendor API, shared by every library's
// CUDA code (kernels, comm, profile, runtime). Private to the build: the target
// cupcake_cuda_status (proto/CMakeLists.txt) carries this folder and CUDA::cudart, libraries
// link it privately, and nothing here is installed, so no installed header pulls CUDA in.
//
//   CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, n));                // "cuda: <call>: <name>: <message>"
//   CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(d), rank, host);     // ... " (rank 3 on host-a)"
//
// The macro takes its context as arguments (a rank and a host where the caller has them); it
// never reads names from the caller's scope.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cupcake/proto/status.h"

namespace cupcake::internal {

// InternalError "cuda: <call>: <error name>: <message>".
inline Status CudaError(cudaError_t e, const char* call) {
  return InternalError(std::string("cuda: ") + call + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// The same, followed by " (rank <rank> on <host>)", the tail of every rank's error.
inline Status CudaError(cudaError_t e, const char* call, int rank, const std::string& host) {
  return InternalError(CudaError(e, call).message() + " (rank " + std::to_string(rank) + " on " + host + ")");
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

}  // namespace cupcake::internal

// Returns the CudaError of `call` when it fails. Optional trailing arguments: `rank, host`.
#define CUPCAKE_CUDA_RETURN_IF_ERROR(call, ...)                                                   \
  do {                                                                                            \
    if (const cudaError_t cupcake_cuda_err_ = (call); cupcake_cuda_err_ != cudaSuccess)           \
      return ::cupcake::internal::CudaError(cupcake_cuda_err_, #call __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

// CUDA runtime errors -> Status for the runtime (one macro per vendor API, carrying
// the call, the vendor's message and the rank and host): `rank_` and `host_` must be in scope.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cupcake/proto/cuda.h"
#include "cupcake/proto/status.h"

namespace cupcake::runtime::internal {

inline std::string RankOnHost(int rank, const std::string& host) {
  return " (rank " + std::to_string(rank) + " on " + host + ")";
}

inline Status CudaError(cudaError_t e, const char* call, int rank, const std::string& host) {
  return InternalError(CudaStatus(e, call).message() + RankOnHost(rank, host));
}

// FailedPrecondition naming `call` when the machine has no usable CUDA device.
inline Status CheckCudaDevice(const std::string& call, int rank, const std::string& host) {
  const StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) return Status::Ok();
  return FailedPreconditionError(call + ": " + count.status().message() + RankOnHost(rank, host));
}

}  // namespace cupcake::runtime::internal

#define CUPCAKE_RT_CUDA_RETURN_IF_ERROR(call)                                                    \
  do {                                                                                           \
    cudaError_t cupcake_rt_cuda_err_ = (call);                                                   \
    if (cupcake_rt_cuda_err_ != cudaSuccess)                                                     \
      return ::cupcake::runtime::internal::CudaError(cupcake_rt_cuda_err_, #call, rank_, host_); \
  } while (0)

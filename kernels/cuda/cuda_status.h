// CUDA runtime error -> Status, the one macro for this vendor API (STYLE.md).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "cupcake/proto/status.h"

#define CUPCAKE_CUDA_RETURN_IF_ERROR(call)                                                         \
  do {                                                                                             \
    cudaError_t cupcake_cuda_err_ = (call);                                                        \
    if (cupcake_cuda_err_ != cudaSuccess) {                                                        \
      return ::cupcake::InternalError(std::string("cuda: ") + #call + ": " +                       \
                                      cudaGetErrorName(cupcake_cuda_err_) + ": " +                 \
                                      cudaGetErrorString(cupcake_cuda_err_));                      \
    }                                                                                              \
  } while (0)

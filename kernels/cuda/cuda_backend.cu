// CUDA device memory and availability for the factory (backends.h). Every CUDA runtime call
// goes through CUPCAKE_CUDA_RETURN_IF_ERROR, which turns its error into a Status naming the
// call and the runtime's message.
#include <cuda_runtime.h>

#include <string>

#include "../src/backends.h"
#include "cupcake/internal/cuda_status.h"

namespace cupcake::kernels::cuda {

Status DeviceAvailable() { return ::cupcake::internal::CudaDeviceCount().status().WithPrefix("backend cuda"); }

Status Malloc(void** ptr, int64_t size_bytes) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(ptr, static_cast<size_t>(size_bytes)));
  return Status::Ok();
}

void Free(void* ptr) { (void)cudaFree(ptr); }

// Buffer's copies and fill are complete when they return, for every stream: cudaMemcpy from
// pageable memory may return before the DMA has landed, and cudaMemset returns before the
// device has run it, while work on a non-blocking stream (the runtime's, NCCL's) is not
// ordered after the legacy stream. So each is enqueued on the legacy stream and waited for.
Status CopyToDevice(void* dst, const void* src, int64_t size_bytes) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(size_bytes), cudaMemcpyHostToDevice, cudaStreamLegacy));
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return Status::Ok();
}

Status CopyToHost(void* dst, const void* src, int64_t size_bytes) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, static_cast<size_t>(size_bytes), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status Memset(void* ptr, int64_t size_bytes) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(ptr, 0, static_cast<size_t>(size_bytes), cudaStreamLegacy));
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cudaStreamLegacy));
  return Status::Ok();
}

Status Synchronize(void* stream) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

}  // namespace cupcake::kernels::cuda

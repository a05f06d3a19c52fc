// CUDA device memory and availability for the factory (backends.h). Every CUDA runtime call
// goes through CUPCAKE_CUDA_RETURN_IF_ERROR, which turns its error into a Status naming the
// call and the runtime's message.
#include <cuda_runtime.h>

#include <string>

#include "../src/backends.h"
#include "cupcake/proto/cuda.h"

namespace cupcake::kernels::cuda {

Status DeviceAvailable() { return CudaDeviceCount().status().WithPrefix("backend cuda"); }

Status Malloc(void** ptr, int64_t size_bytes) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(ptr, static_cast<size_t>(size_bytes)));
  return Status::Ok();
}

void Free(void* ptr) { (void)cudaFree(ptr); }

Status CopyToDevice(void* dst, const void* src, int64_t size_bytes) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, static_cast<size_t>(size_bytes), cudaMemcpyHostToDevice));
  return Status::Ok();
}

Status CopyToHost(void* dst, const void* src, int64_t size_bytes) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, static_cast<size_t>(size_bytes), cudaMemcpyDeviceToHost));
  return Status::Ok();
}

Status Memset(void* ptr, int64_t size_bytes) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemset(ptr, 0, static_cast<size_t>(size_bytes)));
  return Status::Ok();
}

Status Synchronize(void* stream) {
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  return Status::Ok();
}

}  // namespace cupcake::kernels::cuda

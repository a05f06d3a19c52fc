// Internal: the per-backend entry points the factory (factory.cc) dispatches to.
#pragma once

#include <memory>

#include "cupcake/kernels/compressor.h"

namespace cupcake::kernels {

std::unique_ptr<Compressor> MakeCpuCompressor(const CompressorLayout& layout);

namespace cuda {
// Defined in kernels/cuda/ only when the build has CUDA (CUPCAKE_HAVE_CUDA).
Status DeviceAvailable();
StatusOr<std::unique_ptr<Compressor>> MakeCudaCompressor(const CompressorLayout& layout);
Status Malloc(void** ptr, int64_t size_bytes);
void Free(void* ptr);
Status CopyToDevice(void* dst, const void* src, int64_t size_bytes);
Status CopyToHost(void* dst, const void* src, int64_t size_bytes);
Status Memset(void* ptr, int64_t size_bytes);
Status Synchronize(void* stream);
}  // namespace cuda

}  // namespace cupcake::kernels

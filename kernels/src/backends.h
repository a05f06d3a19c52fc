// Internal: the per-backend entry points the factory (factory.cc) dispatches to.
#pragma once

#include <memory>
#include <span>

#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/fusion.h"
#include "cupcake/kernels/gain.h"
#include "cupcake/kernels/powersgd.h"
#include "cupcake/kernels/zen.h"

namespace cupcake::kernels {

std::unique_ptr<Compressor> MakeCpuCompressor(const CompressorLayout& layout);

// The total numel of `segments`, or InvalidArgument naming every bad segment (fusion.cc).
StatusOr<int64_t> CheckFusionSegments(std::span<const FusionSegment> segments, const float* fusion);
// Segments already checked; `numel` their total.
std::unique_ptr<FusionTable> MakeCpuFusionTable(std::span<const FusionSegment> segments, float* fusion, int64_t numel);

namespace powersgd {
std::unique_ptr<Codec> MakeCpuCodec(const Layout& layout);  // cpu/powersgd_cpu.cc
}  // namespace powersgd

namespace cuda {
// Defined in kernels/cuda/ only when the build has CUDA (CUPCAKE_HAVE_CUDA).
Status DeviceAvailable();
StatusOr<std::unique_ptr<Compressor>> MakeCudaCompressor(const CompressorLayout& layout);
StatusOr<std::unique_ptr<FusionTable>> MakeCudaFusionTable(std::span<const FusionSegment> segments, float* fusion,
                                                           int64_t numel);
Status Malloc(void** ptr, int64_t size_bytes);
void Free(void* ptr);
Status CopyToDevice(void* dst, const void* src, int64_t size_bytes);
Status CopyToHost(void* dst, const void* src, int64_t size_bytes);
Status Memset(void* ptr, int64_t size_bytes);
Status Synchronize(void* stream);
StatusOr<std::unique_ptr<zen::DeviceSteps>> MakeZenDeviceSteps();  // kernels/cuda/cuda_zen.cu
StatusOr<std::unique_ptr<powersgd::Codec>> MakePowerSgdCodec(const powersgd::Layout& layout);  // cuda_powersgd.cu
StatusOr<std::unique_ptr<DeviceGain>> MakeCudaDeviceGain();  // cuda_compressor.cu
}  // namespace cuda

}  // namespace cupcake::kernels

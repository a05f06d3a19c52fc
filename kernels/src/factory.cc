// The one file that picks implementations by build configuration (`#if
// CUPCAKE_HAVE_*` lives only here). Everything else is backend-agnostic or backend-specific.
#include <cstdlib>
#include <cstring>
#include <utility>

#include "backends.h"
#include "cupcake/kernels/buffer.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/cupti.h"
#include "cupcake/kernels/fusion.h"
#include "cupcake/kernels/gain.h"
#include "cupcake/kernels/powersgd.h"

#ifndef CUPCAKE_HAVE_CUDA
#error "CUPCAKE_HAVE_CUDA must be defined (0 or 1) by kernels/CMakeLists.txt"
#endif
#ifndef CUPCAKE_HAVE_CUPTI
#error "CUPCAKE_HAVE_CUPTI must be defined (0 or 1) by kernels/CMakeLists.txt"
#endif
#if CUPCAKE_HAVE_CUPTI
#include "../cupti/cupti_activity_source.h"
#endif

namespace cupcake::kernels {

namespace {
#if !CUPCAKE_HAVE_CUDA
Status NoCuda() {
  return FailedPreconditionError(
      "backend cuda: not available; got a build without CUDA, expected one configured with "
      "CUPCAKE_WITH_CUDA=ON or AUTO and the toolkit found");
}
#endif
}  // namespace

Status BackendAvailable(Backend backend) {
  if (backend == Backend::kCpu) return Status::Ok();
#if CUPCAKE_HAVE_CUDA
  return cuda::DeviceAvailable();
#else
  return NoCuda();
#endif
}

StatusOr<std::unique_ptr<Compressor>> MakeCompressor(const CompressorConfig& config, Backend backend) {
  CUPCAKE_ASSIGN_OR_RETURN(CompressorLayout layout, ResolveLayout(config));
  if (backend == Backend::kCpu) return MakeCpuCompressor(layout);
#if CUPCAKE_HAVE_CUDA
  return cuda::MakeCudaCompressor(layout);
#else
  return NoCuda();
#endif
}

StatusOr<std::unique_ptr<zen::DeviceSteps>> zen::DeviceSteps::Create() {
#if CUPCAKE_HAVE_CUDA
  return cuda::MakeZenDeviceSteps();
#else
  return NoCuda();
#endif
}

StatusOr<std::unique_ptr<powersgd::Codec>> powersgd::MakeCodec(const Config& config, Backend backend) {
  CUPCAKE_ASSIGN_OR_RETURN(Layout layout, ResolveLayout(config));
  if (backend == Backend::kCpu) return MakeCpuCodec(layout);
#if CUPCAKE_HAVE_CUDA
  return cuda::MakePowerSgdCodec(layout);
#else
  return NoCuda();
#endif
}

StatusOr<std::unique_ptr<DeviceGain>> MakeDeviceGain() {
#if CUPCAKE_HAVE_CUDA
  return cuda::MakeCudaDeviceGain();
#else
  return NoCuda();
#endif
}

StatusOr<std::unique_ptr<FusionTable>> MakeFusionTable(Backend backend, std::span<const FusionSegment> segments,
                                                       float* fusion) {
  CUPCAKE_ASSIGN_OR_RETURN(int64_t numel, CheckFusionSegments(segments, fusion));
  if (backend == Backend::kCpu) return MakeCpuFusionTable(segments, fusion, numel);
#if CUPCAKE_HAVE_CUDA
  return cuda::MakeCudaFusionTable(segments, fusion, numel);
#else
  return NoCuda();
#endif
}

StatusOr<Buffer> Buffer::Allocate(Backend backend, int64_t size_bytes) {
  if (size_bytes < 0) {
    return InvalidArgumentError("buffer: size out of range; got " + std::to_string(size_bytes) +
                                " bytes, expected >= 0");
  }
  Buffer b;
  b.backend_ = backend;
  b.size_bytes_ = size_bytes;
  if (size_bytes == 0) return b;
  if (backend == Backend::kCpu) {
    // 64-byte aligned so vector loads start on a cache line.
    b.data_ = std::aligned_alloc(64, static_cast<size_t>((size_bytes + 63) / 64 * 64));
    if (b.data_ == nullptr) {
      return InternalError("buffer: host allocation failed; got " + std::to_string(size_bytes) + " bytes");
    }
    return b;
  }
#if CUPCAKE_HAVE_CUDA
  CUPCAKE_RETURN_IF_ERROR(cuda::DeviceAvailable());
  CUPCAKE_RETURN_IF_ERROR(cuda::Malloc(&b.data_, size_bytes));
  return b;
#else
  return NoCuda();
#endif
}

Buffer::Buffer(Buffer&& other) noexcept
    : backend_(other.backend_),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Buffer dead(std::move(*this));
    backend_ = other.backend_;
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

Buffer::~Buffer() {
  if (data_ == nullptr) return;
  if (backend_ == Backend::kCpu) {
    std::free(data_);
    return;
  }
#if CUPCAKE_HAVE_CUDA
  cuda::Free(data_);
#endif
}

namespace {
Status CheckCopySize(int64_t size_bytes, int64_t capacity) {
  if (size_bytes < 0 || size_bytes > capacity) {
    return InvalidArgumentError("buffer: copy size out of range; got " + std::to_string(size_bytes) +
                                " bytes, expected 0 <= size <= " + std::to_string(capacity));
  }
  return Status::Ok();
}
}  // namespace

Status Buffer::CopyFromHost(const void* src, int64_t size_bytes) {
  CUPCAKE_RETURN_IF_ERROR(CheckCopySize(size_bytes, size_bytes_));
  if (size_bytes == 0) return Status::Ok();
  if (backend_ == Backend::kCpu) {
    std::memcpy(data_, src, static_cast<size_t>(size_bytes));
    return Status::Ok();
  }
#if CUPCAKE_HAVE_CUDA
  return cuda::CopyToDevice(data_, src, size_bytes);
#else
  return NoCuda();
#endif
}

Status Buffer::CopyToHost(void* dst, int64_t size_bytes) const {
  CUPCAKE_RETURN_IF_ERROR(CheckCopySize(size_bytes, size_bytes_));
  if (size_bytes == 0) return Status::Ok();
  if (backend_ == Backend::kCpu) {
    std::memcpy(dst, data_, static_cast<size_t>(size_bytes));
    return Status::Ok();
  }
#if CUPCAKE_HAVE_CUDA
  return cuda::CopyToHost(dst, data_, size_bytes);
#else
  return NoCuda();
#endif
}

Status Buffer::Zero() {
  if (size_bytes_ == 0) return Status::Ok();
  if (backend_ == Backend::kCpu) {
    std::memset(data_, 0, static_cast<size_t>(size_bytes_));
    return Status::Ok();
  }
#if CUPCAKE_HAVE_CUDA
  return cuda::Memset(data_, size_bytes_);
#else
  return NoCuda();
#endif
}

Status Synchronize(Backend backend, void* stream) {
  if (backend == Backend::kCpu) return Status::Ok();
#if CUPCAKE_HAVE_CUDA
  return cuda::Synchronize(stream);
#else
  (void)stream;
  return NoCuda();
#endif
}

bool BuiltWithCupti() { return CUPCAKE_HAVE_CUPTI != 0; }

StatusOr<std::unique_ptr<ActivitySource>> OpenCuptiActivitySource(CuptiMarks marks) {
#if CUPCAKE_HAVE_CUPTI
  return cupti::MakeCuptiActivitySource(marks);
#else
  (void)marks;
  return FailedPreconditionError(
      "this build has no CUPTI; build with the CUDA toolkit's CUPTI (extras/CUPTI) and -DCUPCAKE_WITH_CUPTI=ON");
#endif
}

}  // namespace cupcake::kernels

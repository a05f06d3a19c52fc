#include "cuda_kernel_device.h"

#include <cuda_runtime.h>

#include <string>

#include "cupcake/internal/cuda_status.h"

namespace cupcake::profile::internal {
namespace {

// Owns a stream, two timing events and (after the first EvictCaches) a scratch buffer on the
// device `ordinal`, current at creation.
class CudaKernelDevice final : public KernelDevice {
 public:
  CudaKernelDevice(int ordinal, std::string description) : ordinal_(ordinal), description_(std::move(description)) {}
  ~CudaKernelDevice() override {
    if (scratch_ != nullptr) (void)cudaFree(scratch_);
    if (stop_ != nullptr) (void)cudaEventDestroy(stop_);
    if (start_ != nullptr) (void)cudaEventDestroy(start_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  Status Init() {
    // A blocking stream: kernels::Buffer's synchronous setup calls (cudaMemset, cudaMemcpy) run on
    // the legacy default stream, and the sweep's launches must be ordered after them.
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_));
    return Status::Ok();
  }

  bool cuda() const override { return true; }
  std::string Describe() const override { return description_; }
  void* stream() override { return stream_; }

  Status BeginTimed() override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream_));
    return Status::Ok();
  }

  StatusOr<double> EndTimed() override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, stream_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_));
    float ms = 0;
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    return static_cast<double>(ms) * 1000.0;
  }

  Status Synchronize() override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

  // Writing twice the L2's size leaves none of the lines the previous launches cached (the L2
  // keeps at most its size of them; the write replaces them with scratch lines). A memset on
  // stream_, so it is ordered before the next launch there.
  Status EvictCaches() override {
    if (scratch_ == nullptr) {
      int l2_bytes = 0;
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, ordinal_));
      if (l2_bytes <= 0)
        return FailedPreconditionError("CUDA device " + std::to_string(ordinal_) + ": no L2 cache size to evict; got " +
                                       std::to_string(l2_bytes) + " bytes");
      const size_t bytes = 2 * static_cast<size_t>(l2_bytes);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(scratch_, 0, scratch_bytes_, stream_));
    return Status::Ok();
  }

  StatusOr<void*> AllocatePinned(int64_t size_bytes) override {
    void* p = nullptr;
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, static_cast<size_t>(size_bytes)));
    return p;
  }

  void FreePinned(void* ptr) override {
    if (ptr != nullptr) (void)cudaFreeHost(ptr);
  }

  Status CopyAsync(void* dst, const void* src, int64_t size_bytes) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(size_bytes), cudaMemcpyDefault, stream_));
    return Status::Ok();
  }

 private:
  int ordinal_;
  std::string description_;
  void* scratch_ = nullptr;  // EvictCaches' buffer, twice the L2
  size_t scratch_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace

StatusOr<std::unique_ptr<KernelDevice>> MakeCudaKernelDevice(int ordinal) {
  CUPCAKE_ASSIGN_OR_RETURN(const int count, ::cupcake::internal::CudaDeviceCount());
  if (ordinal < 0 || ordinal >= count)
    return InvalidArgumentError("CUDA device: out of range; got " + std::to_string(ordinal) +
                                ", expected 0 <= device < " + std::to_string(count));
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  int driver = 0, runtime = 0;
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&driver));
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
  std::string description = std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
                            ", " + std::to_string(prop.totalGlobalMem >> 20) + " MiB), driver " +
                            std::to_string(driver) + ", runtime " + std::to_string(runtime);
  auto device = std::make_unique<CudaKernelDevice>(ordinal, std::move(description));
  CUPCAKE_RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<KernelDevice>(std::move(device));
}

}  // namespace cupcake::profile::internal

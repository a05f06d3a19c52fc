#include "cuda_kernel_device.h"

#include <cuda_runtime.h>

#include <string>

#include "cupcake/internal/cuda_status.h"

namespace cupcake::profile::internal {
namespace {

// Owns a stream and two timing events on the device current at creation.
class CudaKernelDevice final : public KernelDevice {
 public:
  explicit CudaKernelDevice(std::string description) : description_(std::move(description)) {}
  ~CudaKernelDevice() override {
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
  std::string description_;
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
  auto device = std::make_unique<CudaKernelDevice>(std::move(description));
  CUPCAKE_RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<KernelDevice>(std::move(device));
}

}  // namespace cupcake::profile::internal

// DeviceStreams on the CUDA runtime API (host code; no kernels here: the compressors' kernels
// live in cupcake::kernels).
#include <cuda_runtime.h>

#include <vector>

#include "cuda/cuda_status.h"
#include "device_streams.h"

namespace cupcake::runtime::internal {
namespace {

class CudaDeviceStreams final : public DeviceStreams {
 public:
  CudaDeviceStreams(int rank, std::string host) : rank_(rank), host_(std::move(host)) {}
  ~CudaDeviceStreams() override {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  Status Init(int events) {
    CUPCAKE_RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    events_.reserve(static_cast<size_t>(events));
    for (int i = 0; i < events; ++i) {
      cudaEvent_t e = nullptr;
      CUPCAKE_RT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    return Status::Ok();
  }

  void* compute() const override { return stream_; }
  Status Record(int event, void* stream) override {
    CUPCAKE_RT_CUDA_RETURN_IF_ERROR(cudaEventRecord(events_[static_cast<size_t>(event)], Stream(stream)));
    return Status::Ok();
  }
  Status StreamWait(void* stream, int event) override {
    CUPCAKE_RT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(Stream(stream), events_[static_cast<size_t>(event)], 0));
    return Status::Ok();
  }
  StatusOr<bool> Done(int event) override {
    const cudaError_t e = cudaEventQuery(events_[static_cast<size_t>(event)]);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return CudaError(e, "cudaEventQuery", rank_, host_);
  }
  Status CheckDeviceMemory(const void* p) const override {
    cudaPointerAttributes a{};
    CUPCAKE_RT_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&a, p));
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return Status::Ok();
    return InvalidArgumentError(std::string("not device memory; got ") +
                                (a.type == cudaMemoryTypeHost ? "pinned host memory" : "unregistered host memory") +
                                ", expected memory from cudaMalloc (rank " + std::to_string(rank_) + " on " + host_ +
                                ")");
  }

 private:
  static cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }

  int rank_;
  std::string host_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceStreams>> MakeCudaDeviceStreams(int events, int rank, const std::string& host,
                                                               const std::string& call) {
  CUPCAKE_RETURN_IF_ERROR(CheckCudaDevice(call, rank, host));
  auto streams = std::make_unique<CudaDeviceStreams>(rank, host);
  CUPCAKE_RETURN_IF_ERROR(streams->Init(events));
  return std::unique_ptr<DeviceStreams>(std::move(streams));
}

}  // namespace cupcake::runtime::internal

// DeviceStreams on the CUDA runtime API (host code; no kernels here: the compressors' kernels
// live in cupcake::kernels).
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cupcake/internal/cuda_status.h"
#include "device_streams.h"

namespace cupcake::runtime::internal {
namespace {

// FailedPrecondition naming `call` when the machine has no usable CUDA device.
Status CheckCudaDevice(const std::string& call, int rank, const std::string& host) {
  const StatusOr<int> count = ::cupcake::internal::CudaDeviceCount();
  if (count.ok()) return Status::Ok();
  return FailedPreconditionError(call + ": " + count.status().message() + " (rank " + std::to_string(rank) + " on " +
                                 host + ")");
}

class CudaDeviceStreams final : public DeviceStreams {
 public:
  CudaDeviceStreams(int rank, std::string host) : rank_(rank), host_(std::move(host)) {}
  ~CudaDeviceStreams() override {
    if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
    for (cudaGraphExec_t g : graphs_)
      if (g != nullptr) (void)cudaGraphExecDestroy(g);
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    for (void* p : pinned_) (void)cudaFreeHost(p);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  Status Init(int events, int graphs) {
    graphs_.assign(static_cast<size_t>(graphs), nullptr);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), rank_, host_);
    events_.reserve(static_cast<size_t>(events));
    for (int i = 0; i < events; ++i) {
      cudaEvent_t e = nullptr;
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), rank_, host_);
      events_.push_back(e);
    }
    return Status::Ok();
  }

  void* compute() const override { return stream_; }
  Status Record(int event, void* stream) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventRecord(Event(event), Stream(stream)), rank_, host_);
    return Status::Ok();
  }
  Status StreamWait(void* stream, int event) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(Stream(stream), Event(event), 0), rank_, host_);
    return Status::Ok();
  }
  Status Copy(void* dst, const void* src, int64_t bytes, void* stream) override {
    if (bytes > 0) {
      CUPCAKE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, Stream(stream)), rank_, host_);
    }
    return Status::Ok();
  }
  Status Zero(void* dst, int64_t bytes, void* stream) override {
    if (bytes > 0)
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), Stream(stream)), rank_, host_);
    return Status::Ok();
  }
  Status Wait(int event) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(Event(event)), rank_, host_);
    return Status::Ok();
  }
  StatusOr<void*> PinnedHost(int64_t bytes) override {
    void* p = nullptr;
    CUPCAKE_CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1)), cudaHostAllocDefault), rank_, host_);
    pinned_.push_back(p);
    return p;
  }
  StatusOr<bool> Done(int event) override {
    const cudaError_t e = cudaEventQuery(Event(event));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return ::cupcake::internal::CudaError(e, "cudaEventQuery", rank_, host_);
  }
  Status Enqueue(int graph, int wait, int record, StreamWork enqueue) override {
    if (graph < 0) {
      if (wait >= 0) CUPCAKE_RETURN_IF_ERROR(StreamWait(stream_, wait));
      CUPCAKE_RETURN_IF_ERROR(enqueue(stream_));
      if (record >= 0) CUPCAKE_RETURN_IF_ERROR(Record(record, stream_));
      return Status::Ok();
    }
    cudaGraphExec_t& exec = graphs_[static_cast<size_t>(graph)];
    if (exec == nullptr) CUPCAKE_RETURN_IF_ERROR(Capture(wait, record, enqueue, &exec));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec, stream_), rank_, host_);
    return Status::Ok();
  }
  Status CheckDeviceMemory(const void* p) const override {
    cudaPointerAttributes a{};
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&a, p), rank_, host_);
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) return Status::Ok();
    return InvalidArgumentError(std::string("not device memory; got ") +
                                (a.type == cudaMemoryTypeHost ? "pinned host memory" : "unregistered host memory") +
                                ", expected memory from cudaMalloc (rank " + std::to_string(rank_) + " on " + host_ +
                                ")");
  }

 private:
  static cudaStream_t Stream(void* s) { return static_cast<cudaStream_t>(s); }
  cudaEvent_t Event(int i) const { return events_[static_cast<size_t>(i)]; }
  std::vector<void*> pinned_;

  // Captures the wait, the work and the record on the compute stream (thread-local capture: other
  // threads' CUDA calls are not affected) and instantiates the graph. The events become external
  // wait and record nodes, which act as cudaStreamWaitEvent and cudaEventRecord do each launch.
  // The capture is always ended, so a failure leaves the stream usable.
  Status Capture(int wait, int record, StreamWork enqueue, cudaGraphExec_t* exec) {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), rank_, host_);
    cudaError_t e = cudaSuccess;
    const char* call = "cudaStreamWaitEvent (external, in capture)";
    if (wait >= 0) e = cudaStreamWaitEvent(stream_, Event(wait), cudaEventWaitExternal);
    Status work = e == cudaSuccess ? enqueue(stream_) : Status::Ok();
    if (e == cudaSuccess && work.ok() && record >= 0) {
      e = cudaEventRecordWithFlags(Event(record), stream_, cudaEventRecordExternal);
      call = "cudaEventRecordWithFlags (external, in capture)";
    }
    cudaGraph_t g = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &g);
    if (e == cudaSuccess && work.ok() && end == cudaSuccess) {
      e = cudaGraphInstantiate(exec, g, 0);
      call = "cudaGraphInstantiate";
      if (e != cudaSuccess) *exec = nullptr;
    }
    if (g != nullptr) (void)cudaGraphDestroy(g);
    if (!work.ok()) return work;
    if (e != cudaSuccess) return ::cupcake::internal::CudaError(e, call, rank_, host_);
    if (end != cudaSuccess) return ::cupcake::internal::CudaError(end, "cudaStreamEndCapture", rank_, host_);
    return Status::Ok();
  }

  int rank_;
  std::string host_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::vector<cudaGraphExec_t> graphs_;  // null until captured
};

}  // namespace

StatusOr<std::unique_ptr<DeviceStreams>> MakeCudaDeviceStreams(int events, int graphs, int rank,
                                                               const std::string& host, const std::string& call) {
  CUPCAKE_RETURN_IF_ERROR(CheckCudaDevice(call, rank, host));
  auto streams = std::make_unique<CudaDeviceStreams>(rank, host);
  CUPCAKE_RETURN_IF_ERROR(streams->Init(events, graphs));
  return std::unique_ptr<DeviceStreams>(std::move(streams));
}

}  // namespace cupcake::runtime::internal

#include "nccl/nccl_communicator.h"

#include <nccl.h>

#include <string>

#include "cupcake/proto/cuda.h"

namespace cupcake::profile::internal {
namespace {

Status NcclError(ncclResult_t r, const char* call, ncclComm_t comm) {
  std::string last = ncclGetLastError(comm);
  return InternalError(std::string(call) + ": " + ncclGetErrorString(r) + (last.empty() ? "" : " (" + last + ")"));
}
#define CUPCAKE_NCCL_RETURN_IF_ERROR(call, comm)                                   \
  do {                                                                             \
    if (const ncclResult_t r_ = (call); r_ != ncclSuccess) return NcclError(r_, #call, comm); \
  } while (0)

ncclDataType_t NcclType(DataType type) {
  switch (type) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt32: return ncclInt32;
  }
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

std::string NcclLibrary() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL";
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int device, std::string host)
      : comm_(comm), stream_(stream), device_(device), host_(std::move(host)) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host() const override { return host_; }
  std::string library() const override { return NcclLibrary(); }

  // NCCL has no barrier: an allreduce of one int, which no rank leaves before all have joined.
  Status Barrier() override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (scratch_ == nullptr) CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, sizeof(int)));
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), comm_);
    return Wait();
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclBroadcast(buf, buf, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_), comm_);
    return Wait();
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclAllReduce(send, recv, static_cast<size_t>(count), NcclType(type), NcclOp(op), comm_, stream_),
                 comm_);
    return Wait();
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, static_cast<size_t>(bytes_per_rank), ncclUint8, comm_, stream_), comm_);
    return Wait();
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclReduceScatter(send, recv, static_cast<size_t>(count_per_rank), NcclType(type), NcclOp(op), comm_,
                                   stream_),
                 comm_);
    return Wait();
  }
  // As nccl-tests' alltoall: one grouped send and receive per peer.
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const size_t b = static_cast<size_t>(bytes_per_rank);
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclGroupStart(), comm_);
    for (int peer = 0; peer < size_; ++peer) {
      ncclResult_t r = ncclSend(static_cast<const char*>(send) + peer * b, b, ncclUint8, peer, comm_, stream_);
      if (r == ncclSuccess) r = ncclRecv(static_cast<char*>(recv) + peer * b, b, ncclUint8, peer, comm_, stream_);
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return NcclError(r, "ncclSend/ncclRecv", comm_);
      }
    }
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclGroupEnd(), comm_);
    return Wait();
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    ncclComm_t child = nullptr;
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr), comm_);
    if (child == nullptr) return std::unique_ptr<Communicator>();
    cudaStream_t stream = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      ncclCommDestroy(child);
      return CudaStatus(e, "cudaStreamCreateWithFlags");
    }
    return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(child, stream, device_, host_));
  }

  StatusOr<Buffer> Allocate(int64_t bytes) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1)));
    return Buffer(p, [](void* q) { cudaFree(q); });
  }
  // On the collectives' stream, waited for: a plain cudaMemcpy from pageable memory may return
  // before its data reaches the device, and the non-blocking stream would not wait for it (the
  // sweep's check caught reduce_scatter results overwritten by the clearing copy on an H100).
  Status CopyIn(void* dst, const void* host_src, int64_t bytes) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, host_src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }
  Status CopyOut(void* host_dst, const void* src, int64_t bytes) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

 private:
  // The call's result is in place when the stream is done; an asynchronous NCCL error (a peer
  // lost) is reported rather than waited on forever where NCCL detects it.
  Status Wait() {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    ncclResult_t async = ncclSuccess;
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &async), comm_);
    if (async != ncclSuccess) return NcclError(async, "ncclCommGetAsyncError", comm_);
    return Status::Ok();
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  std::string host_;
  int rank_ = 0;
  int size_ = 0;
  void* scratch_ = nullptr;
};

// This rank's device check, as a message ("" when fine).
std::string CheckDevice(const Communicator& bootstrap, int device) {
  const std::string where = "rank " + std::to_string(bootstrap.rank()) + " on " + bootstrap.host() + ": ";
  auto count = CudaDeviceCount();
  if (!count.ok()) return where + count.status().message() + " (NCCL needs one GPU per rank)";
  if (device < 0 || device >= *count)
    return where + "no CUDA device " + std::to_string(device) + "; this host has " + std::to_string(*count) +
           " (NCCL needs one GPU per rank: run at most " + std::to_string(*count) + " ranks per host)";
  return "";
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap, int device) {
  // 1. Every rank checks its device, and all learn of the first rank that cannot take part.
  const std::string problem = CheckDevice(bootstrap, device);
  int failed = problem.empty() ? 0 : 1, any = 0;
  CUPCAKE_RETURN_IF_ERROR(bootstrap.Allreduce(&failed, &any, 1, DataType::kInt32, ReduceOp::kMax));
  if (any) {
    if (!problem.empty()) return FailedPreconditionError(problem);
    return FailedPreconditionError("another rank has no usable CUDA device (see its message)");
  }
  // 2. Rank 0's unique id to all, then one communicator per rank.
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) CUPCAKE_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id), nullptr);
  CUPCAKE_RETURN_IF_ERROR(bootstrap.Broadcast(&id, sizeof id, 0));
  cudaStream_t stream = nullptr;
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()); r != ncclSuccess) {
    cudaStreamDestroy(stream);
    return NcclError(r, "ncclCommInitRank", nullptr)
        .WithPrefix("rank " + std::to_string(bootstrap.rank()) + " on " + bootstrap.host());
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(comm, stream, device, bootstrap.host()));
}

}  // namespace cupcake::profile::internal

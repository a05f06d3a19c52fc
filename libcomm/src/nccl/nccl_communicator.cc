// NcclCommunicator: the collectives on GPU memory. Each is enqueued on the communicator's own
// non-blocking stream and returns (MemoryKind::kDevice); Synchronize() waits for the stream and
// reports NCCL's asynchronous errors. A runtime Session orders the collectives after its
// encodes with CUDA events; the profiler synchronizes after each call it times.
//
// Bootstrap (a collective over a host communicator): 1. every rank checks its CUDA device and
// all learn, through a max-allreduce of one flag, whether any rank cannot take part (so no rank
// is left waiting in ncclCommInitRank); 2. rank 0 makes the ncclUniqueId and broadcasts it;
// 3. every rank joins with ncclCommInitRank.
#include "nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "../common.h"
#include "cupcake/internal/cuda_status.h"

namespace cupcake::comm::internal {
namespace {

Status NcclError(ncclResult_t r, const char* call, ncclComm_t comm, int rank, const std::string& host) {
  const char* last = ncclGetLastError(comm);
  return UnavailableError(std::string("nccl: ") + call + ": " + ncclGetErrorString(r) +
                          (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()) +
                          RankOnHost(rank, host));
}

// One macro per vendor API, taking what it needs as arguments (CUDA's:
// CUPCAKE_CUDA_RETURN_IF_ERROR(call, rank, host), cupcake/internal/cuda_status.h).
#define CUPCAKE_NCCL_RETURN_IF_ERROR(call, nccl_comm, rank, host)                                  \
  do {                                                                                             \
    if (const ncclResult_t cupcake_nccl_rc_ = (call); cupcake_nccl_rc_ != ncclSuccess)             \
      return ::cupcake::comm::internal::NcclError(cupcake_nccl_rc_, #call, nccl_comm, rank, host); \
  } while (0)

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

std::string NcclLibrary() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "NCCL";
  // NCCL_VERSION_CODE since 2.9: major * 10000 + minor * 100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

ncclDataType_t NcclType(DataType type) {
  switch (type) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt8: return ncclInt8;
    case DataType::kUint8: return ncclUint8;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

class NcclCommunicator final : public Communicator {
 public:
  // Owns `comm` and `stream`.
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int device, std::string host)
      : comm_(comm), stream_(stream), device_(device), host_(std::move(host)) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
  }
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (!aborted_.load()) {
      (void)cudaStreamSynchronize(stream_);
      (void)ncclCommDestroy(comm_);
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    (void)cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host() const override { return host_; }
  std::string library() const override { return NcclLibrary(); }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  void* stream() const override { return stream_; }

  // NCCL has no barrier: an allreduce of one int, which no rank leaves before all have joined.
  Status Barrier() override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), rank_, host_);
    if (scratch_ == nullptr) CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch_, sizeof(int)), rank_, host_);
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), comm_, rank_,
                                 host_);
    return Synchronize();
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), rank_, host_);
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclBroadcast(buf, buf, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_),
                                 comm_, rank_, host_);
    return Status::Ok();
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(CheckReduce("Allreduce", type, op, rank_, host_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), rank_, host_);
    CUPCAKE_NCCL_RETURN_IF_ERROR(
        ncclAllReduce(send, recv, static_cast<size_t>(count), NcclType(type), NcclOp(op), comm_, stream_), comm_, rank_,
        host_);
    return Status::Ok();
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), rank_, host_);
    CUPCAKE_NCCL_RETURN_IF_ERROR(
        ncclAllGather(send, recv, static_cast<size_t>(bytes_per_rank), ncclUint8, comm_, stream_), comm_, rank_, host_);
    return Status::Ok();
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(CheckReduce("ReduceScatter", type, op, rank_, host_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), rank_, host_);
    CUPCAKE_NCCL_RETURN_IF_ERROR(
        ncclReduceScatter(send, recv, static_cast<size_t>(count_per_rank), NcclType(type), NcclOp(op), comm_, stream_),
        comm_, rank_, host_);
    return Status::Ok();
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    std::vector<int64_t> bytes(static_cast<size_t>(size_), bytes_per_rank);
    return Alltoallv(send, bytes, recv, bytes);
  }
  // As nccl-tests' alltoall: one grouped send and receive per peer.
  Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                   std::span<const int64_t> recv_bytes) override {
    CUPCAKE_RETURN_IF_ERROR(CheckAlltoallv(send_bytes, recv_bytes, size_, rank_, host_));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), rank_, host_);
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclGroupStart(), comm_, rank_, host_);
    int64_t s_at = 0, r_at = 0;
    ncclResult_t r = ncclSuccess;
    for (int peer = 0; peer < size_ && r == ncclSuccess; ++peer) {
      const size_t s = static_cast<size_t>(send_bytes[static_cast<size_t>(peer)]);
      const size_t n = static_cast<size_t>(recv_bytes[static_cast<size_t>(peer)]);
      r = ncclSend(static_cast<const char*>(send) + s_at, s, ncclUint8, peer, comm_, stream_);
      if (r == ncclSuccess) r = ncclRecv(static_cast<char*>(recv) + r_at, n, ncclUint8, peer, comm_, stream_);
      s_at += static_cast<int64_t>(s);
      r_at += static_cast<int64_t>(n);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (r != ncclSuccess) return NcclError(r, "ncclSend/ncclRecv", comm_, rank_, host_);
    if (end != ncclSuccess) return NcclError(end, "ncclGroupEnd", comm_, rank_, host_);
    return Status::Ok();
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), rank_, host_);
    ncclComm_t child = nullptr;
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, nullptr),
                                 comm_, rank_, host_);
    if (child == nullptr) return std::unique_ptr<Communicator>();
    cudaStream_t stream = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
      ncclCommDestroy(child);
      return ::cupcake::internal::CudaError(e, "cudaStreamCreateWithFlags", rank_, host_);
    }
    return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(child, stream, device_, host_));
  }
  // The results are in place when the stream is done; an asynchronous NCCL error (a peer lost)
  // is reported rather than waited on forever where NCCL detects it.
  Status Synchronize() override {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), rank_, host_);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), rank_, host_);
    ncclResult_t async = ncclSuccess;
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &async), comm_, rank_, host_);
    if (async != ncclSuccess) return NcclError(async, "ncclCommGetAsyncError", comm_, rank_, host_);
    return Status::Ok();
  }
  Status AsyncError() override {
    ncclResult_t async = ncclSuccess;
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(comm_, &async), comm_, rank_, host_);
    if (async != ncclSuccess && async != ncclInProgress)
      return NcclError(async, "ncclCommGetAsyncError", comm_, rank_, host_);
    return Status::Ok();
  }
  void Abort(const std::string& reason) override {
    if (aborted_.exchange(true)) return;
    std::fprintf(stderr, "cupcake: aborting the NCCL communicator: %s%s\n", reason.c_str(),
                 RankOnHost(rank_, host_).c_str());
    (void)ncclCommAbort(comm_);
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  int device_;
  std::string host_;
  int rank_ = 0;
  int size_ = 0;
  void* scratch_ = nullptr;
  std::atomic<bool> aborted_{false};
};

// This rank's device: `device` (-1: the current one) must exist. "" when fine.
std::string CheckDevice(int& device, int rank, const std::string& host) {
  auto count = ::cupcake::internal::CudaDeviceCount();
  if (!count.ok()) return "NCCL communicator: " + count.status().message() + RankOnHost(rank, host);
  if (device < 0 && cudaGetDevice(&device) != cudaSuccess) device = 0;
  if (device >= *count)
    return "NCCL communicator: no CUDA device " + std::to_string(device) + "; this host has " + std::to_string(*count) +
           " (one GPU per rank: run at most " + std::to_string(*count) + " ranks per host)" + RankOnHost(rank, host);
  return "";
}

}  // namespace

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap, int device) {
  const int rank = bootstrap != nullptr ? bootstrap->rank() : 0;
  const int size = bootstrap != nullptr ? bootstrap->size() : 1;
  const std::string host = bootstrap != nullptr ? bootstrap->host() : HostName();
  // 1. Devices: every rank learns whether any rank cannot take part.
  const std::string problem = CheckDevice(device, rank, host);
  int32_t failed = problem.empty() ? 0 : 1, any = failed;
  if (bootstrap != nullptr)
    CUPCAKE_RETURN_IF_ERROR(bootstrap->Allreduce(&failed, &any, 1, DataType::kInt32, ReduceOp::kMax)
                                .WithPrefix("NCCL communicator: bootstrap"));
  if (!problem.empty()) return FailedPreconditionError(problem);
  if (any != 0)
    return FailedPreconditionError("NCCL communicator: another rank has no usable CUDA device (see its message)" +
                                   RankOnHost(rank, host));
  // 2. Rank 0's unique id to all. A rank 0 that fails to make one sends zeros, and says why.
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), rank, host);
  ncclUniqueId id{};
  Status made;
  if (rank == 0)
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
      made = NcclError(r, "ncclGetUniqueId", nullptr, rank, host);
  if (bootstrap != nullptr) CUPCAKE_RETURN_IF_ERROR(bootstrap->Broadcast(&id, sizeof id, 0));
  CUPCAKE_RETURN_IF_ERROR(made);
  // 3. Join.
  cudaStream_t stream = nullptr;
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank, host);
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, size, id, rank); r != ncclSuccess) {
    cudaStreamDestroy(stream);
    return NcclError(r, "ncclCommInitRank", nullptr, rank, host);
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(comm, stream, device, host));
}

// ncclCommSplit with one color is NCCL's MPI_Comm_dup: a communicator of our own over the
// job's ranks, so our collectives never interleave with the job's on its communicator.
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicatorFromHandle(const void* nccl_comm) {
  int rank = 0;
  const std::string host = HostName();
  const std::string call = "NCCL communicator from the job's";
  if (nccl_comm == nullptr)
    return InvalidArgumentError(call + ": nccl_comm: null; expected a pointer to the job's ncclComm_t");
  int device = -1;
  if (std::string problem = CheckDevice(device, rank, host); !problem.empty())
    return FailedPreconditionError(call + ": " + problem.substr(problem.find(": ") + 2));
  ncclComm_t job = *static_cast<const ncclComm_t*>(nccl_comm);
  if (job == nullptr)
    return InvalidArgumentError(call + ": nccl_comm: points to a null ncclComm_t; expected the job's");
  CUPCAKE_NCCL_RETURN_IF_ERROR(ncclCommUserRank(job, &rank), job, rank, host);
  cudaStream_t stream = nullptr;
  CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), rank, host);
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommSplit(job, /*color=*/0, /*key=*/rank, &comm, nullptr); r != ncclSuccess) {
    (void)cudaStreamDestroy(stream);
    return NcclError(r, "ncclCommSplit", job, rank, host);
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(comm, stream, device, host));
}

}  // namespace cupcake::comm::internal

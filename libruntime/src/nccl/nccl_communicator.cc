// NcclCommunicator: the runtime's collectives on GPU memory. Each collective is enqueued on the
// communicator's own stream and returns (MemoryKind::kDevice); the Session orders it after the
// encode with CUDA events and waits on events. The ncclUniqueId travels over a host
// communicator (the bootstrap: MPI in a job, in-process in tests): rank 0 makes it and every
// rank gathers it with one allgather, which is MPI_Bcast's job done with the Communicator
// interface the runtime already has. Every rank also sends whether it found a device, so that a
// rank without one makes every rank fail with the same message instead of leaving them in
// ncclCommInitRank.
#include "nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_status.h"

namespace cupcake::runtime::internal {
namespace {

Status NcclError(ncclResult_t r, const char* call, ncclComm_t comm, int rank, const std::string& host) {
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  return UnavailableError(std::string("nccl: ") + call + ": " + ncclGetErrorString(r) +
                          (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()) + " (rank " +
                          std::to_string(rank) + " on " + host + ")");
}

// The one macro for NCCL calls (STYLE.md): `comm_`, `rank_` and `host_` must be in scope.
#define CUPCAKE_NCCL_RETURN_IF_ERROR(call)                                                           \
  do {                                                                                               \
    ncclResult_t cupcake_nccl_rc_ = (call);                                                          \
    if (cupcake_nccl_rc_ != ncclSuccess) return NcclError(cupcake_nccl_rc_, #call, comm_, rank_, host_); \
  } while (0)

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int size, std::string host)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), host_(std::move(host)) {}
  ~NcclCommunicator() override {
    if (!aborted_.load()) {
      (void)cudaStreamSynchronize(stream_);
      (void)ncclCommDestroy(comm_);
    }
    (void)cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host() const override { return host_; }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  void* stream() const override { return stream_; }

  // fp16 sums with ncclFloat16: NCCL adds halves with __hadd (sm_53+), one correctly rounded
  // (nearest even) addition at a time, as kernels::SumFp16Payloads does; the order of the
  // additions is NCCL's (ring or tree), not rank order, so with 3 or more ranks a sum may
  // differ from the CPU reference's in the last bit. With 1 or 2 ranks it is the same.
  Status Allreduce(const void* send, void* recv, int64_t count, ReduceType type) override {
    CUPCAKE_NCCL_RETURN_IF_ERROR(ncclAllReduce(send, recv, static_cast<size_t>(count),
                                               type == ReduceType::kFloat16 ? ncclFloat16 : ncclFloat32, ncclSum,
                                               comm_, stream_));
    return Status::Ok();
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_NCCL_RETURN_IF_ERROR(
        ncclAllGather(send, recv, static_cast<size_t>(bytes_per_rank), ncclUint8, comm_, stream_));
    return Status::Ok();
  }
  void Abort(const std::string& reason) override {
    if (aborted_.exchange(true)) return;
    std::fprintf(stderr, "cupcake runtime: aborting the NCCL communicator: %s (rank %d on %s)\n", reason.c_str(),
                 rank_, host_.c_str());
    (void)ncclCommAbort(comm_);
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_;
  int size_;
  std::string host_;
  std::atomic<bool> aborted_{false};
};

// What each rank contributes to the bootstrap allgather.
struct Hello {
  ncclUniqueId id;  // rank 0's is used
  int32_t has_device;
  int32_t ok;       // rank 0: the id was made
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap) {
  const int rank_ = bootstrap != nullptr ? bootstrap->rank() : 0;
  const int size = bootstrap != nullptr ? bootstrap->size() : 1;
  const std::string host_ = bootstrap != nullptr ? bootstrap->host() : HostName();
  ncclComm_t comm_ = nullptr;
  const std::string call = "NCCL communicator";
  const Status device = CheckCudaDevice(call, rank_, host_);
  Hello mine{};
  mine.has_device = device.ok() ? 1 : 0;
  std::string id_error;
  if (rank_ == 0 && device.ok()) {
    ncclResult_t r = ncclGetUniqueId(&mine.id);
    mine.ok = r == ncclSuccess ? 1 : 0;
    if (r != ncclSuccess) id_error = NcclError(r, "ncclGetUniqueId", nullptr, rank_, host_).message();
  }
  std::vector<Hello> all(static_cast<size_t>(size));
  if (bootstrap != nullptr) {
    CUPCAKE_RETURN_IF_ERROR(bootstrap->Allgather(&mine, all.data(), sizeof(Hello)).WithPrefix(call + ": bootstrap"));
  } else {
    all[0] = mine;
  }
  if (!device.ok()) return device;
  for (int r = 0; r < size; ++r)
    if (!all[static_cast<size_t>(r)].has_device)
      return FailedPreconditionError(call + ": rank " + std::to_string(r) +
                                     " has no CUDA device; expected one per rank (rank " + std::to_string(rank_) +
                                     " on " + host_ + ")");
  if (!all[0].ok)
    return UnavailableError(rank_ == 0 ? id_error
                                       : call + ": rank 0 could not make the NCCL id (rank " + std::to_string(rank_) +
                                             " on " + host_ + ")");
  int dev = 0;
  CUPCAKE_RT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  cudaStream_t stream = nullptr;
  CUPCAKE_RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (ncclResult_t r = ncclCommInitRank(&comm_, size, all[0].id, rank_); r != ncclSuccess) {
    (void)cudaStreamDestroy(stream);
    return NcclError(r, "ncclCommInitRank", nullptr, rank_, host_);
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(comm_, stream, rank_, size, host_));
}

// ncclCommSplit with one color is NCCL's MPI_Comm_dup: a communicator of our own over the
// job's ranks, so our collectives never interleave with the job's on its communicator.
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicatorFromHandle(const void* nccl_comm) {
  int rank_ = 0;
  const std::string host_ = HostName();
  const std::string call = "NCCL communicator from the job's";
  if (nccl_comm == nullptr)
    return InvalidArgumentError(call + ": nccl_comm: null; expected a pointer to the job's ncclComm_t");
  CUPCAKE_RETURN_IF_ERROR(CheckCudaDevice(call, rank_, host_));
  ncclComm_t job = *static_cast<const ncclComm_t*>(nccl_comm);
  if (job == nullptr) return InvalidArgumentError(call + ": nccl_comm: points to a null ncclComm_t; expected the job's");
  int size = 0;
  if (ncclResult_t r = ncclCommUserRank(job, &rank_); r != ncclSuccess)
    return NcclError(r, "ncclCommUserRank", job, rank_, host_);
  if (ncclResult_t r = ncclCommCount(job, &size); r != ncclSuccess) return NcclError(r, "ncclCommCount", job, rank_, host_);
  cudaStream_t stream = nullptr;
  CUPCAKE_RT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclComm_t comm_ = nullptr;
  if (ncclResult_t r = ncclCommSplit(job, /*color=*/0, /*key=*/rank_, &comm_, nullptr); r != ncclSuccess) {
    (void)cudaStreamDestroy(stream);
    return NcclError(r, "ncclCommSplit", job, rank_, host_);
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(comm_, stream, rank_, size, host_));
}

}  // namespace cupcake::runtime::internal

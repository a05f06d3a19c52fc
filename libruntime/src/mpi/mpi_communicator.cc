#include "mpi/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <string>

#include "cupcake/kernels/compressor.h"

namespace cupcake::runtime::internal {
namespace {

// The one place MPI error codes become a Status: the call, MPI's message, rank and host.
Status MpiError(const char* call, int code, int rank, const std::string& host) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return UnavailableError(std::string(call) + ": " +
                          (len > 0 ? std::string(text, static_cast<size_t>(len)) : "error " + std::to_string(code)) +
                          " (rank " + std::to_string(rank) + " on " + host + ")");
}

#define CUPCAKE_MPI_RETURN_IF_ERROR(call)                                                     \
  do {                                                                                        \
    int cupcake_mpi_rc_ = (call);                                                             \
    if (cupcake_mpi_rc_ != MPI_SUCCESS) return MpiError(#call, cupcake_mpi_rc_, rank_, host_); \
  } while (0)

std::string ProcessorName() {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS) return "?";
  return std::string(name, static_cast<size_t>(len));
}

// MPI has no half type: fp16 payloads travel as MPI_UINT16_T and are summed by this op.
void SumFp16(void* in, void* inout, int* len, MPI_Datatype*) {
  kernels::SumFp16Payloads(static_cast<const std::byte*>(in), static_cast<std::byte*>(inout), *len);
}

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (a duplicate) and `fp16_sum`.
  MpiCommunicator(MPI_Comm comm, MPI_Op fp16_sum, std::string host)
      : comm_(comm), fp16_sum_(fp16_sum), host_(std::move(host)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    MPI_Op_free(&fp16_sum_);
    MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host() const override { return host_; }

  Status Allreduce(const void* send, void* recv, int64_t count, ReduceType type) override {
    CUPCAKE_RETURN_IF_ERROR(CheckCount(count));
    if (send == recv) send = MPI_IN_PLACE;
    if (type == ReduceType::kFloat16) {
      CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Allreduce(send, recv, static_cast<int>(count), MPI_UINT16_T, fp16_sum_, comm_));
    } else {
      CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Allreduce(send, recv, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_));
    }
    return Status::Ok();
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(CheckCount(bytes_per_rank));
    const int n = static_cast<int>(bytes_per_rank);
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_));
    return Status::Ok();
  }
  void Abort(const std::string& reason) override {
    std::fprintf(stderr, "cupcake runtime: aborting the MPI job: %s (rank %d on %s)\n", reason.c_str(), rank_,
                 host_.c_str());
    MPI_Abort(comm_, 1);
  }

 private:
  Status CheckCount(int64_t count) const {
    if (count < 0 || count > INT_MAX)
      return InvalidArgumentError("MPI count out of range; got " + std::to_string(count) + ", expected <= " +
                                  std::to_string(INT_MAX) + " (rank " + std::to_string(rank_) + " on " + host_ + ")");
    return Status::Ok();
  }

  MPI_Comm comm_;
  MPI_Op fp16_sum_;
  std::string host_;
  int rank_ = 0;
  int size_ = 1;
};

class MpiProcessImpl final : public MpiProcess {
 public:
  ~MpiProcessImpl() override { MPI_Finalize(); }
  StatusOr<std::unique_ptr<Communicator>> World() override { return MakeMpiCommunicator(nullptr); }
};

}  // namespace

StatusOr<std::unique_ptr<MpiProcess>> MakeMpiProcess(int* argc, char*** argv) {
  const int rank_ = -1;
  const std::string host_ = "?";
  int provided = 0;
  CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return std::unique_ptr<MpiProcess>(std::make_unique<MpiProcessImpl>());
}

bool MpiInitialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(const void* mpi_comm) {
  int rank_ = -1;
  std::string host_ = "?";
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    return FailedPreconditionError("MPI communicator: MPI is not initialized; expected MPI_Init_thread (or InitMpi) first");
  host_ = ProcessorName();
  MPI_Comm parent = mpi_comm == nullptr ? MPI_COMM_WORLD : *static_cast<const MPI_Comm*>(mpi_comm);
  MPI_Comm_rank(parent, &rank_);
  int provided = 0;
  CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Query_thread(&provided));
  if (provided < MPI_THREAD_SERIALIZED)
    return FailedPreconditionError("MPI communicator: thread support too low; got level " + std::to_string(provided) +
                                   ", expected MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (the session's "
                                   "communication thread makes the collectives; use MPI_Init_thread)");
  MPI_Comm comm = MPI_COMM_NULL;
  CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Comm_dup(parent, &comm));
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Op op = MPI_OP_NULL;
  if (int rc = MPI_Op_create(&SumFp16, /*commute=*/1, &op); rc != MPI_SUCCESS) {
    MPI_Comm_free(&comm);
    return MpiError("MPI_Op_create", rc, rank_, host_);
  }
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(comm, op, host_));
}

}  // namespace cupcake::runtime::internal

#include "mpi/mpi_communicator.h"

#include <mpi.h>

#include <climits>
#include <string>

namespace cupcake::profile::internal {
namespace {

// The one place MPI error codes become a Status: the call, MPI's message, rank and host.
Status MpiError(const char* call, int code, int rank, const std::string& host) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return UnavailableError(std::string(call) + ": " + (len > 0 ? std::string(text, static_cast<size_t>(len)) : "error " + std::to_string(code)) +
                          " (rank " + std::to_string(rank) + " on " + host + ")");
}

#define CUPCAKE_MPI_RETURN_IF_ERROR(call)                                          \
  do {                                                                             \
    int cupcake_mpi_rc_ = (call);                                                  \
    if (cupcake_mpi_rc_ != MPI_SUCCESS) return MpiError(#call, cupcake_mpi_rc_, rank_, host_); \
  } while (0)

MPI_Datatype Type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt32: return MPI_INT;
  }
  return MPI_BYTE;
}

MPI_Op Op(ReduceOp op) { return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX; }

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned, std::string host) : comm_(comm), owned_(owned), host_(std::move(host)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& host() const override { return host_; }
  std::string library() const override {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    std::string s(v, static_cast<size_t>(len));
    if (auto cut = s.find_first_of(",\n"); cut != std::string::npos) s.resize(cut);
    return s;
  }

  Status Barrier() override {
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Barrier(comm_));
    return Status::Ok();
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    CUPCAKE_RETURN_IF_ERROR(CheckCount(bytes));
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Bcast(buf, static_cast<int>(bytes), MPI_BYTE, root, comm_));
    return Status::Ok();
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(CheckCount(count));
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Allreduce(send, recv, static_cast<int>(count), Type(type), Op(op), comm_));
    return Status::Ok();
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(CheckCount(bytes_per_rank));
    const int n = static_cast<int>(bytes_per_rank);
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_));
    return Status::Ok();
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    CUPCAKE_RETURN_IF_ERROR(CheckCount(count_per_rank));
    CUPCAKE_MPI_RETURN_IF_ERROR(
        MPI_Reduce_scatter_block(send, recv, static_cast<int>(count_per_rank), Type(type), Op(op), comm_));
    return Status::Ok();
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    CUPCAKE_RETURN_IF_ERROR(CheckCount(bytes_per_rank));
    const int n = static_cast<int>(bytes_per_rank);
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Alltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_));
    return Status::Ok();
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    MPI_Comm out = MPI_COMM_NULL;
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out));
    if (out == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
    MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(out, true, host_));
  }

 private:
  Status CheckCount(int64_t count) const {
    if (count < 0 || count > INT_MAX)
      return InvalidArgumentError("MPI count out of range; got " + std::to_string(count) + ", expected <= " +
                                  std::to_string(INT_MAX) + " (rank " + std::to_string(rank_) + " on " + host_ + ")");
    return Status::Ok();
  }

  MPI_Comm comm_;
  bool owned_;
  std::string host_;
  int rank_ = 0;
  int size_ = 1;
};

class MpiProcessImpl final : public MpiProcess {
 public:
  explicit MpiProcessImpl(std::string host) : host_(std::move(host)) {}
  ~MpiProcessImpl() override { MPI_Finalize(); }
  std::unique_ptr<Communicator> World() override {
    return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false, host_);
  }

 private:
  std::string host_;
};

}  // namespace

StatusOr<std::unique_ptr<MpiProcess>> MakeMpiProcess(int* argc, char*** argv) {
  int provided = 0;
  const int rank_ = -1;
  const std::string host_ = "?";
  CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  return std::unique_ptr<MpiProcess>(std::make_unique<MpiProcessImpl>(std::string(name, static_cast<size_t>(len))));
}

}  // namespace cupcake::profile::internal

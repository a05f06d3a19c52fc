// MpiCommunicator: the collectives on host memory over an MPI communicator of our own (a
// duplicate of the job's, or a Split of one), each started non-blocking and completed by Wait
// (MpiWait in mpi.h). MPI has no half types: float16 and bfloat16
// travel as MPI_UINT16_T and are reduced by user-defined operations that apply ReduceInto,
// the reduction every host backend shares.
//
// Allreduce for 2 ranks, and from kChunkedMinBytes up, is ours: a reduce-scatter by
// MPI_Ialltoall (chunk j to rank j, which reduces the copies in rank order), then
// MPI_Iallgather of the reduced chunks, so each link carries 2 (p - 1) / p of the bytes each way
// at once. Open MPI's non-blocking allreduce (libnbc) reduces to rank 0 and broadcasts back for
// fewer than 4 ranks and whenever the call is in place (the runtime's fp32 groups): every byte
// crosses the root's link twice, one direction at a time. The exchanges go through MPI's
// collectives rather than a ring of point-to-point messages, whose large transfers are less
// steady; below kChunkedMinBytes with more than 2 ranks, MPI's tree (2 log2 p steps) beats two
// all-to-all exchanges. Measurements behind these choices: docs/EVALUATION.md.
#include "mpi/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../common.h"

namespace cupcake::comm::internal {
namespace {

// The one place MPI error codes become a Status: the call, MPI's message, rank and host.
Status MpiError(const char* call, int code, int rank, const std::string& host) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return UnavailableError(std::string(call) + ": " +
                          (len > 0 ? std::string(text, static_cast<size_t>(len)) : "error " + std::to_string(code)) +
                          RankOnHost(rank, host));
}

#define CUPCAKE_MPI_RETURN_IF_ERROR(call, rank, host)                                 \
  do {                                                                                \
    if (const int cupcake_mpi_rc_ = (call); cupcake_mpi_rc_ != MPI_SUCCESS)           \
      return ::cupcake::comm::internal::MpiError(#call, cupcake_mpi_rc_, rank, host); \
  } while (0)

std::string ProcessorName() {
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  if (MPI_Get_processor_name(name, &len) != MPI_SUCCESS) return "?";
  return std::string(name, static_cast<size_t>(len));
}

void SumFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(in, inout, *len, DataType::kFloat16, ReduceOp::kSum);
}
void SumBFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(in, inout, *len, DataType::kBFloat16, ReduceOp::kSum);
}
void MaxBFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  ReduceInto(in, inout, *len, DataType::kBFloat16, ReduceOp::kMax);
}

MPI_Datatype Type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat16: return MPI_UINT16_T;
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUint8: return MPI_UINT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
  }
  return MPI_BYTE;
}

class MpiCommunicator final : public Communicator {
 public:
  // Owns `comm` and the user-defined operations.
  MpiCommunicator(MPI_Comm comm, std::string host, const MpiWait& wait)
      : comm_(comm), host_(std::move(host)), wait_(wait) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Op_create(&SumFloat16, /*commute=*/1, &sum_f16_);
    MPI_Op_create(&SumBFloat16, 1, &sum_bf16_);
    MPI_Op_create(&MaxBFloat16, 1, &max_bf16_);
  }
  ~MpiCommunicator() override {
    for (MPI_Op* op : {&sum_f16_, &sum_bf16_, &max_bf16_}) MPI_Op_free(op);
    MPI_Comm_free(&comm_);
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
    if (wait_.startup_us > 0) {
      char note[96];
      std::snprintf(note, sizeof note, " (emulated start-up %g us per collective)", wait_.startup_us);
      s += note;
    }
    return s;
  }

  Status Barrier() override {
    MPI_Request req;
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Ibarrier(comm_, &req), rank_, host_);
    return Wait(req);
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    StartUp();
    CUPCAKE_RETURN_IF_ERROR(Count("Broadcast", bytes));
    MPI_Request req;
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Ibcast(buf, static_cast<int>(bytes), MPI_BYTE, root, comm_, &req), rank_, host_);
    return Wait(req);
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    StartUp();
    CUPCAKE_RETURN_IF_ERROR(Count("Allreduce", count));
    CUPCAKE_RETURN_IF_ERROR(CheckReduce("Allreduce", type, op, rank_, host_));
    if (size_ == 2 || (size_ > 2 && count * DataTypeBytes(type) >= kChunkedMinBytes))
      return ChunkedAllreduce(send, recv, count, type, op);
    if (send == recv) send = MPI_IN_PLACE;
    MPI_Request req;
    CUPCAKE_MPI_RETURN_IF_ERROR(
        MPI_Iallreduce(send, recv, static_cast<int>(count), Type(type), Op(type, op), comm_, &req), rank_, host_);
    return Wait(req);
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    StartUp();
    CUPCAKE_RETURN_IF_ERROR(Count("Allgather", bytes_per_rank));
    const int n = static_cast<int>(bytes_per_rank);
    MPI_Request req;
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Iallgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req), rank_, host_);
    return Wait(req);
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    StartUp();
    CUPCAKE_RETURN_IF_ERROR(Count("ReduceScatter", count_per_rank));
    CUPCAKE_RETURN_IF_ERROR(CheckReduce("ReduceScatter", type, op, rank_, host_));
    MPI_Request req;
    CUPCAKE_MPI_RETURN_IF_ERROR(
        MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count_per_rank), Type(type), Op(type, op), comm_, &req),
        rank_, host_);
    return Wait(req);
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    StartUp();
    CUPCAKE_RETURN_IF_ERROR(Count("Alltoall", bytes_per_rank));
    const int n = static_cast<int>(bytes_per_rank);
    MPI_Request req;
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Ialltoall(send, n, MPI_BYTE, recv, n, MPI_BYTE, comm_, &req), rank_, host_);
    return Wait(req);
  }
  Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                   std::span<const int64_t> recv_bytes) override {
    StartUp();
    CUPCAKE_RETURN_IF_ERROR(CheckAlltoallv(send_bytes, recv_bytes, size_, rank_, host_));
    std::vector<int> sc(static_cast<size_t>(size_)), sd(sc.size()), rc(sc.size()), rd(sc.size());
    int64_t s_at = 0, r_at = 0;
    for (size_t j = 0; j < sc.size(); ++j) {
      CUPCAKE_RETURN_IF_ERROR(Count("Alltoallv", s_at + send_bytes[j]));
      CUPCAKE_RETURN_IF_ERROR(Count("Alltoallv", r_at + recv_bytes[j]));
      sc[j] = static_cast<int>(send_bytes[j]);
      sd[j] = static_cast<int>(s_at);
      rc[j] = static_cast<int>(recv_bytes[j]);
      rd[j] = static_cast<int>(r_at);
      s_at += send_bytes[j];
      r_at += recv_bytes[j];
    }
    MPI_Request req;
    CUPCAKE_MPI_RETURN_IF_ERROR(
        MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_, &req), rank_,
        host_);
    return Wait(req);
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    MPI_Comm out = MPI_COMM_NULL;
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &out), rank_, host_);
    if (out == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(out, host_, wait_));
  }
  void Abort(const std::string& reason) override {
    std::fprintf(stderr, "cupcake: aborting the MPI job: %s%s\n", reason.c_str(), RankOnHost(rank_, host_).c_str());
    MPI_Abort(comm_, 1);
  }

 private:
  static constexpr int64_t kChunkedMinBytes = 64 << 10;

  // Reduce-scatter by an alltoall, then allgather: the count split into size_ chunks of
  // ceil(count / size_) elements (the last ones padded), chunk j sent to rank j
  // (MPI_Ialltoall), which reduces the size_ copies of its chunk in rank order, and the
  // reduced chunks gathered back (MPI_Iallgather). Every chunk is reduced on one rank, in one
  // order, so all ranks end with the same bits; each rank sends and receives
  // 2 (p - 1) / p of the bytes, as in a ring.
  Status ChunkedAllreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) {
    const int64_t width = DataTypeBytes(type), p = size_, chunk = (count + p - 1) / p;
    const int64_t padded = chunk * p * width;
    const bool exact = count % p == 0;  // no padding: send from and gather into the caller's buffers
    const std::byte* in = static_cast<const std::byte*>(send);
    if (!exact) {
      padded_.assign(static_cast<size_t>(padded), std::byte{0});
      std::memcpy(padded_.data(), send, static_cast<size_t>(count * width));
      in = padded_.data();
    }
    chunks_.resize(static_cast<size_t>(padded));
    const MPI_Datatype t = Type(type);
    const int c = static_cast<int>(chunk);
    MPI_Request req;
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Ialltoall(in, c, t, chunks_.data(), c, t, comm_, &req), rank_, host_);
    CUPCAKE_RETURN_IF_ERROR(Wait(req));
    for (int64_t r = 1; r < p; ++r) ReduceInto(chunks_.data() + r * chunk * width, chunks_.data(), chunk, type, op);
    std::byte* out = exact ? static_cast<std::byte*>(recv) : padded_.data();
    CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Iallgather(chunks_.data(), c, t, out, c, t, comm_, &req), rank_, host_);
    CUPCAKE_RETURN_IF_ERROR(Wait(req));
    if (!exact) std::memcpy(recv, padded_.data(), static_cast<size_t>(count * width));
    return Status::Ok();
  }

  // Completes started requests (MpiWait in mpi.h): MPI_Testall back to back for spin_us, then
  // yielding the core (or sleeping sleep_us) between tests, so that a long collective leaves the
  // core to the job.
  Status Wait(MPI_Request* reqs, int n) {
    using Clock = std::chrono::steady_clock;
    const auto spin_until = Clock::now() + std::chrono::duration<double, std::micro>(wait_.spin_us);
    const auto sleep = std::chrono::duration<double, std::micro>(wait_.sleep_us);
    for (;;) {
      int done = 0;
      CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), rank_, host_);
      if (done != 0) return Status::Ok();
      if (Clock::now() < spin_until) continue;
      if (wait_.sleep_us > 0)
        std::this_thread::sleep_for(sleep);
      else
        std::this_thread::yield();
    }
  }
  Status Wait(MPI_Request& req) { return Wait(&req, 1); }
  // The emulated start-up (MpiWait::startup_us): the thread sleeps, as it would wait for a
  // network's latency without using its core.
  void StartUp() const {
    if (wait_.startup_us > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(wait_.startup_us));
  }
  Status Count(std::string_view call, int64_t count) const { return CheckCount(call, count, INT_MAX, rank_, host_); }
  MPI_Op Op(DataType type, ReduceOp op) const {
    if (type == DataType::kFloat16) return sum_f16_;  // max refused by CheckReduce
    if (type == DataType::kBFloat16) return op == ReduceOp::kSum ? sum_bf16_ : max_bf16_;
    return op == ReduceOp::kSum ? MPI_SUM : MPI_MAX;
  }

  MPI_Comm comm_;
  std::string host_;
  MpiWait wait_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Op sum_f16_ = MPI_OP_NULL, sum_bf16_ = MPI_OP_NULL, max_bf16_ = MPI_OP_NULL;
  std::vector<std::byte> chunks_, padded_;  // ChunkedAllreduce's buffers, kept between calls
};

class MpiProcessImpl final : public MpiProcess {
 public:
  ~MpiProcessImpl() override { MPI_Finalize(); }
  explicit MpiProcessImpl(const MpiWait& wait) : wait_(wait) {}
  StatusOr<std::unique_ptr<Communicator>> World() override { return MakeMpiCommunicator(nullptr, wait_); }

 private:
  MpiWait wait_;
};

}  // namespace

StatusOr<std::unique_ptr<MpiProcess>> MakeMpiProcess(int* argc, char*** argv, const MpiWait& wait) {
  int provided = 0;
  CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), -1, "?");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  auto process = std::make_unique<MpiProcessImpl>(wait);  // finalizes MPI on every path out
  if (provided < MPI_THREAD_SERIALIZED)
    return FailedPreconditionError("MPI_Init_thread: thread support too low; got level " + std::to_string(provided) +
                                   ", expected MPI_THREAD_SERIALIZED or more (a runtime Session makes its collectives "
                                   "on a thread of its own)");
  return std::unique_ptr<MpiProcess>(std::move(process));
}

bool MpiInitialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized != 0 && finalized == 0;
}

StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(const void* mpi_comm, const MpiWait& wait) {
  if (!MpiInitialized())
    return FailedPreconditionError(
        "MPI communicator: MPI is not initialized; expected MPI_Init_thread (or InitMpi) first");
  const std::string host = ProcessorName();
  MPI_Comm parent = mpi_comm == nullptr ? MPI_COMM_WORLD : *static_cast<const MPI_Comm*>(mpi_comm);
  int rank = -1;
  MPI_Comm_rank(parent, &rank);
  int provided = 0;
  CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Query_thread(&provided), rank, host);
  if (provided < MPI_THREAD_SERIALIZED)
    return FailedPreconditionError("MPI communicator: thread support too low; got level " + std::to_string(provided) +
                                   ", expected MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (a runtime Session makes "
                                   "its collectives on a thread of its own; use MPI_Init_thread)" +
                                   RankOnHost(rank, host));
  MPI_Comm comm = MPI_COMM_NULL;
  CUPCAKE_MPI_RETURN_IF_ERROR(MPI_Comm_dup(parent, &comm), rank, host);
  return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(comm, host, wait));
}

}  // namespace cupcake::comm::internal

// The collectives a Session runs, behind one interface (STYLE.md: a fake at every hardware
// seam): MPI on CPU memory (made by the factory when the build has MPI), NCCL on GPU memory
// (when the build has NCCL) and an in-process group of threads for unit tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::runtime {

// What an allreduce sums: float32 values, or binary16 payloads (fp16 compressor), summed in
// float and rounded to nearest even per addition (kernels::SumFp16Payloads).
enum class ReduceType { kFloat32, kFloat16 };

// Where a communicator's buffers live, and so where a Session over it keeps and compresses the
// gradients: host memory (MPI, in-process) or CUDA device memory (NCCL).
enum class MemoryKind { kHost, kDevice };

// Communicator: one rank's handle on a group of ranks. Every collective is made by all ranks of
// the group, in the same order, with matching sizes. Buffers are host memory; `send` and `recv`
// do not overlap. Errors carry the call and, for MPI, the rank and host.
// Thread-safety: collectives from one thread at a time (a Session's communication thread);
// Abort may be called from any thread, while a collective is in progress.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's host name (the processor name for MPI).
  virtual const std::string& host() const = 0;
  virtual MemoryKind memory() const { return MemoryKind::kHost; }
  // kDevice: the cudaStream_t the collectives are enqueued on; kHost: nullptr.
  virtual void* stream() const { return nullptr; }

  // recv[i] = sum over ranks of send[i], `count` elements of `type`; in place when send == recv.
  virtual Status Allreduce(const void* send, void* recv, int64_t count, ReduceType type) = 0;
  // recv = the ranks' send buffers (bytes_per_rank each) side by side, in rank order.
  virtual Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  // Gives up on the group: collectives in progress or to come fail (in-process) or the job ends
  // with a non-zero exit (MPI: MPI_Abort). Used when a peer can no longer be waited for.
  virtual void Abort(const std::string& reason) = 0;
};

// InProcessGroup: `size` ranks as threads of one process, for tests (as gloo's tests do).
// Rank(r) hands out rank r's communicator. Abort on any rank fails every rank's collectives
// with the reason, so tests can check that a dead peer gives a clear error, not a hang.
// Ownership: the communicators share the group's state and keep it alive.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  std::unique_ptr<Communicator> Rank(int rank);
  struct State;  // defined in the .cc

 private:
  std::shared_ptr<State> state_;
};

// MPI's process state as a scope object made in main and passed down (STYLE.md).
// MPI_Init_thread (MPI_THREAD_MULTIPLE requested, MPI_THREAD_SERIALIZED required: the
// session's communication thread makes the collectives) on creation, MPI_Finalize on
// destruction; at most one per process. Errors on MPI_COMM_WORLD return as Status.
class MpiProcess {
 public:
  virtual ~MpiProcess() = default;
  // A communicator on a duplicate of MPI_COMM_WORLD; must not outlive this object.
  virtual StatusOr<std::unique_ptr<Communicator>> World() = 0;
};

// Initializes MPI. FailedPrecondition when this build has no MPI (CUPCAKE_WITH_MPI=OFF).
StatusOr<std::unique_ptr<MpiProcess>> InitMpi(int* argc, char*** argv);

// A communicator on a communicator the job already owns: `mpi_comm` points to the job's
// MPI_Comm (nullptr: MPI_COMM_WORLD). The runtime duplicates it (MPI_Comm_dup), so its traffic
// never mixes with the job's, and frees the duplicate on destruction. MPI must be initialized
// with at least MPI_THREAD_SERIALIZED; with SERIALIZED the job must make no MPI call between
// its first GradientReady of a step and the end of Synchronize().
StatusOr<std::unique_ptr<Communicator>> MpiCommunicatorFromHandle(const void* mpi_comm);

// Whether this build has MPI, and whether MPI is initialized in this process (false without MPI).
bool BuiltWithMpi();
bool MpiInitialized();

// A NCCL communicator on the current CUDA device (one device per rank: NCCL refuses two ranks on
// one GPU), its collectives enqueued on a stream of its own. `bootstrap` (a host communicator:
// MPI in a job, in-process in tests; not kept) gives the group its ranks and spreads rank 0's
// ncclUniqueId; nullptr: a group of one rank with the id made locally, no MPI launcher needed.
// A collective over `bootstrap`, so every rank of it calls this. FailedPrecondition "NCCL
// communicator: no CUDA device found; ..." on a machine without a GPU (every rank fails when
// one has none), or when this build has no NCCL.
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap);
// A NCCL communicator on one the job already owns (a framework's process group): `nccl_comm`
// points to the job's ncclComm_t. The runtime makes its own over the same ranks and devices
// (ncclCommSplit with one color, NCCL's MPI_Comm_dup), so its collectives never mix with the
// job's, and destroys it on destruction. A collective over the job's communicator: every rank
// calls it, with none of the job's collectives pending on it; the current CUDA device must be
// the job's communicator's. Errors as MakeNcclCommunicator's, and InvalidArgument for a null
// pointer.
StatusOr<std::unique_ptr<Communicator>> NcclCommunicatorFromHandle(const void* nccl_comm);
bool BuiltWithNccl();

}  // namespace cupcake::runtime

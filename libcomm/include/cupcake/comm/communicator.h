// The one communication layer: the collectives the profiler times are the collectives the
// runtime calls, behind one interface with one implementation per backend (as gloo's
// transport: a context per group, algorithms on top): in-process threads (tests), MPI on host
// memory, NCCL on GPU memory. Backends are made by the factories of mpi.h and nccl.h; this
// header has the interface and the in-process group. docs/ARCHITECTURE.md places it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cupcake/kernels/buffer.h"
#include "cupcake/proto/status.h"

namespace cupcake::comm {

// Element types of reductions. Sums of kFloat16 and kBFloat16 are computed in float and
// rounded to nearest even per addition (kernels::SumFp16Payloads; NCCL adds halves the same
// way, one correctly rounded addition at a time, in its own order).
enum class DataType { kFloat32, kFloat16, kBFloat16, kFloat64, kInt8, kUint8, kInt32, kInt64 };
enum class ReduceOp { kSum, kMax };
int64_t DataTypeBytes(DataType type);
std::string_view Name(DataType type);  // "float32", "float16", ...

// Where a communicator's buffers live: host memory (in-process, MPI) or CUDA device memory
// (NCCL). Buffers are kernels::Buffer on the matching backend (BackendOf).
enum class MemoryKind { kHost, kDevice };
kernels::Backend BackendOf(MemoryKind memory);

// Communicator: one rank's handle on a group of ranks.
// Collectives: every rank of the group makes each one, in the same order, with matching sizes
// (a size that does not fit the backend is InvalidArgument naming it). `send` and `recv` live
// in the communicator's memory and do not overlap, except Allreduce, which runs in place when
// send == recv. A collective is enqueued: on host memory it is complete when the call returns;
// on device memory it runs on stream() and Synchronize() waits for it. Errors name the call,
// the library's message, the rank and the host.
// Thread-safety: collectives from one thread at a time; Abort from any thread, also while a
// collective is in progress.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's host name (the processor name for MPI); ranks on one host share it.
  virtual const std::string& host() const = 0;
  // The library and its version, e.g. "Open MPI v4.1.4", "NCCL 2.28.9", "in-process".
  virtual std::string library() const = 0;
  virtual MemoryKind memory() const { return MemoryKind::kHost; }
  // kDevice: the cudaStream_t the collectives are enqueued on; kHost: nullptr.
  virtual void* stream() const { return nullptr; }

  virtual Status Barrier() = 0;
  virtual Status Broadcast(void* buf, int64_t bytes, int root) = 0;
  // recv[i] = op over ranks of send[i], `count` elements of `type`.
  virtual Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) = 0;
  // recv = the ranks' send buffers (bytes_per_rank each) side by side, in rank order.
  virtual Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  // send: size() blocks of `count_per_rank` elements; recv: block rank() of the reduction.
  virtual Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) = 0;
  // send: size() blocks of bytes_per_rank, block j to rank j; recv: block j from rank j.
  virtual Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  // send_bytes[j] bytes to rank j, packed in rank order in `send`; recv_bytes[j] from rank j,
  // packed likewise in `recv`. Both spans have size() entries, and rank i's send_bytes[j]
  // equals rank j's recv_bytes[i].
  virtual Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                           std::span<const int64_t> recv_bytes) = 0;
  // Ranks of equal `color` >= 0 form a new communicator of the same backend, ordered by (key,
  // rank); a negative color joins none and gets nullptr. Collective over this communicator.
  virtual StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

  // Waits until every collective enqueued so far is done, and reports a failure the library
  // found meanwhile (NCCL's asynchronous errors: a peer lost). Host backends: Ok.
  virtual Status Synchronize() { return Status::Ok(); }
  // Without waiting: a failure the library has found in enqueued collectives, so that a caller
  // polling for their completion can stop (a lost peer never completes them). Host backends,
  // whose collectives fail when called: Ok.
  virtual Status AsyncError() { return Status::Ok(); }
  // Gives up on the group: collectives in progress or to come fail (in-process, NCCL) or the
  // job ends with a non-zero exit (MPI: MPI_Abort). For a peer that can no longer be waited for.
  virtual void Abort(const std::string& reason) = 0;

  // A buffer in this communicator's memory.
  StatusOr<kernels::Buffer> Allocate(int64_t bytes) const {
    return kernels::Buffer::Allocate(BackendOf(memory()), bytes);
  }
};

// InProcessGroup: `size` ranks as threads of one process, for tests (as gloo's tests do).
// Rank(r) hands out rank r's communicator, to be used by one thread; `hosts` (default all
// "localhost") gives each rank a host name, so tests can fake several nodes. Abort on any
// rank fails every rank's collectives with the reason: a dead peer is a clear error, not a hang.
// Ownership: the communicators share the group's state and keep it alive.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size, std::vector<std::string> hosts = {});
  std::unique_ptr<Communicator> Rank(int rank);
  struct State;  // defined in the .cc

 private:
  std::shared_ptr<State> state_;
  std::vector<std::string> hosts_;
};

// The element-wise reduction every host backend applies: inout[i] = op(inout[i], in[i]).
void ReduceInto(const void* in, void* inout, int64_t count, DataType type, ReduceOp op);

}  // namespace cupcake::comm

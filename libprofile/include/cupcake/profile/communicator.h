// The collectives the comm profiler measures, behind one interface (STYLE.md: a fake at every
// hardware seam): MPI (mpi.h, made by the factory), an in-process group of threads for tests,
// and a decorator that corrupts results to test the correctness check.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

enum class DataType { kFloat32, kFloat64, kInt32 };
enum class ReduceOp { kSum, kMax };
int64_t DataTypeBytes(DataType type);

// Communicator: one rank's handle on a group of ranks. Every call is collective: all ranks of
// the group make it, in the same order, with matching sizes. Buffers live in the communicator's
// memory (host memory for MPI and in-process groups, GPU memory for NCCL): made with Allocate,
// filled and read with CopyIn and CopyOut. `send` and `recv` must not overlap. A call returns
// when its result is in `recv` (NCCL: the stream is synchronized). Errors carry the call and,
// for MPI, the rank and host.
// Thread-safety: one thread per Communicator object.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // This rank's host name (the processor name for MPI).
  virtual const std::string& host() const = 0;
  // The library and its version, e.g. "Open MPI v4.1.4" (recorded in the profile's meta).
  virtual std::string library() const = 0;

  virtual Status Barrier() = 0;
  virtual Status Broadcast(void* buf, int64_t bytes, int root) = 0;
  // recv[i] = op over ranks of send[i], `count` elements.
  virtual Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) = 0;
  // recv = the ranks' send buffers (bytes_per_rank each) side by side, in rank order.
  virtual Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  // send: size() blocks of `count_per_rank` elements; recv: block rank() of the reduction.
  virtual Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) = 0;
  // send: size() blocks of bytes_per_rank, block j to rank j; recv: block j from rank j.
  virtual Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  // Ranks of equal `color` >= 0 form a new communicator ordered by (key, rank); a negative
  // color joins none and gets nullptr.
  virtual StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

  // The communicator's memory. The defaults are host memory (new[] and memcpy); NCCL's is the
  // GPU's. Buffers free themselves; they must not outlive the communicator.
  using Buffer = std::unique_ptr<void, void (*)(void*)>;
  virtual StatusOr<Buffer> Allocate(int64_t bytes);
  virtual Status CopyIn(void* dst, const void* host_src, int64_t bytes);
  virtual Status CopyOut(void* host_dst, const void* src, int64_t bytes);
};

// InProcessGroup: `size` ranks as threads of one process, for tests (as gloo's tests do).
// Rank(r) hands out rank r's communicator, to be used by one thread; `hosts` (default all
// "localhost") gives each rank a host name, so tests can fake several nodes.
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

// Wraps a communicator and corrupts the first element of every `op` result it returns (adds
// 1.0 to the first float), to test that the profiler notices wrong results. Other calls pass
// through.
std::unique_ptr<Communicator> MakeWrongResultCommunicator(std::unique_ptr<Communicator> inner, pb::CommOp op);

}  // namespace cupcake::profile

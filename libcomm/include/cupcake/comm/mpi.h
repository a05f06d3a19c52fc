// MPI: the process state as a scope object made in main and passed down, and communicators on
// MPI communicators (host memory).
#pragma once

#include <memory>

#include "cupcake/comm/communicator.h"
#include "cupcake/proto/status.h"

namespace cupcake::comm {

// How an MPI collective waits for completion. MPI makes progress only inside MPI calls, so a
// blocking collective keeps its core busy for its whole duration; where the communication thread
// shares cores with the job's computation (training on CPUs, several ranks per machine) that
// takes the CPU from backward and from encoding while a collective is in flight. Every collective
// is therefore started non-blocking and tested: back to back for its first `spin_us`, then
// yielding the core between tests (sched_yield: the job's threads run first, and when none
// wants the core the tests go on back to back), or with sleep_us > 0, sleeping that long
// between tests. Sleeping costs bandwidth over Open MPI's TCP transport, where yielding keeps the
// link's rate (docs/EVALUATION.md).
//
// startup_us > 0 emulates a larger cluster's per-collective start-up on a testbed whose links
// have next to none (scripts/testbed.sh --startup-us, docs/TESTBED.md): every data collective
// (broadcast, allreduce, allgather, reduce-scatter, alltoall, alltoallv; not barrier or split)
// first sleeps that long on every rank, as every rank of a real cluster waits out its
// collective's latency, and the profiler, timing the same calls, prices it. Never for
// production: InitMpi and MpiCommunicatorFromHandle take it from the environment variable
// kEmulatedStartupVariable when that is set, and the communicator's library() says so.
struct MpiWait {
  double spin_us = 100;
  double sleep_us = 0;
  double startup_us = 0;
};
inline constexpr const char* kEmulatedStartupVariable = "CUPCAKE_EMULATED_STARTUP_US";

// MpiProcess: MPI_Init_thread on creation (MPI_THREAD_MULTIPLE requested, at least
// MPI_THREAD_SERIALIZED required: a runtime Session makes its collectives on a thread of its
// own), MPI_Finalize on destruction; at most one per process, made in main. Errors on
// MPI_COMM_WORLD return (MPI_ERRORS_RETURN) as Status.
class MpiProcess {
 public:
  virtual ~MpiProcess() = default;
  // A communicator on a duplicate of MPI_COMM_WORLD; must not outlive this object.
  virtual StatusOr<std::unique_ptr<Communicator>> World() = 0;
};

// Initializes MPI. FailedPrecondition when this build has no MPI (CUPCAKE_WITH_MPI=OFF) or the
// library gives less than MPI_THREAD_SERIALIZED.
// `wait` applies to the communicators of World(); InvalidArgument when a time is negative, not
// finite or above 1 s, or when kEmulatedStartupVariable is set to anything but such a time.
StatusOr<std::unique_ptr<MpiProcess>> InitMpi(int* argc, char*** argv, const MpiWait& wait = {});

// A communicator on one the job already owns: `mpi_comm` points to the job's MPI_Comm
// (nullptr: MPI_COMM_WORLD). It is duplicated (MPI_Comm_dup), so our traffic never mixes with
// the job's, and the duplicate is freed on destruction. MPI must be initialized with at least
// MPI_THREAD_SERIALIZED; with SERIALIZED the job must make no MPI call while a collective of
// ours may run. `wait` as for InitMpi.
StatusOr<std::unique_ptr<Communicator>> MpiCommunicatorFromHandle(const void* mpi_comm, const MpiWait& wait = {});

// Whether this build has MPI, and whether MPI is initialized in this process (false without MPI).
bool BuiltWithMpi();
bool MpiInitialized();

}  // namespace cupcake::comm

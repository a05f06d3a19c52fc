// MPI's process state as a scope object made in main and passed down (STYLE.md).
#pragma once

#include <memory>

#include "cupcake/profile/communicator.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

// MpiProcess: MPI_Init_thread on creation, MPI_Finalize on destruction; at most one per
// process, made in main. Errors on MPI_COMM_WORLD return (MPI_ERRORS_RETURN) as Status.
class MpiProcess {
 public:
  virtual ~MpiProcess() = default;
  // MPI_COMM_WORLD. The communicator must not outlive this object.
  virtual std::unique_ptr<Communicator> World() = 0;
};

// Initializes MPI. FailedPrecondition when this build has no MPI (CUPCAKE_WITH_MPI=OFF).
StatusOr<std::unique_ptr<MpiProcess>> InitMpi(int* argc, char*** argv);
// Whether this build has MPI.
bool BuiltWithMpi();

}  // namespace cupcake::profile

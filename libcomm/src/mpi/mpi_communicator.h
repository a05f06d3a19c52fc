// Internal: the MPI backend, reached through factory.cc (built only with MPI).
#pragma once

#include <memory>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"

namespace cupcake::comm::internal {

StatusOr<std::unique_ptr<MpiProcess>> MakeMpiProcess(int* argc, char*** argv, const MpiWait& wait);
bool MpiInitialized();
StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(const void* mpi_comm, const MpiWait& wait);

}  // namespace cupcake::comm::internal

// The MPI implementation of Communicator and MpiProcess; built only with CUPCAKE_HAVE_MPI and
// reached through the factory (src/factory.cc).
#pragma once

#include <memory>

#include "cupcake/runtime/communicator.h"

namespace cupcake::runtime::internal {

StatusOr<std::unique_ptr<MpiProcess>> MakeMpiProcess(int* argc, char*** argv);
// `mpi_comm` points to an MPI_Comm (nullptr: MPI_COMM_WORLD).
StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(const void* mpi_comm);
bool MpiInitialized();

}  // namespace cupcake::runtime::internal

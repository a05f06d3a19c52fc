// The MPI implementation of Communicator and MpiProcess; built only with CUPCAKE_HAVE_MPI and
// reached through the factory (src/factory.cc).
#pragma once

#include <memory>

#include "cupcake/profile/mpi.h"

namespace cupcake::profile::internal {

StatusOr<std::unique_ptr<MpiProcess>> MakeMpiProcess(int* argc, char*** argv);

}  // namespace cupcake::profile::internal

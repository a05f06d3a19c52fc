// The NCCL implementation of Communicator; built only with CUPCAKE_HAVE_NCCL and reached
// through the factory (src/factory.cc).
#pragma once

#include <memory>

#include "cupcake/profile/communicator.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile::internal {

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap, int device);

}  // namespace cupcake::profile::internal

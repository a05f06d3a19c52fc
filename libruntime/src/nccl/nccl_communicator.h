// The NCCL implementation of Communicator; built only with CUPCAKE_HAVE_NCCL and reached
// through the factory (src/factory.cc: MakeNcclCommunicator and NcclCommunicatorFromHandle in
// communicator.h).
#pragma once

#include <memory>

#include "cupcake/runtime/communicator.h"

namespace cupcake::runtime::internal {

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap);
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicatorFromHandle(const void* nccl_comm);

}  // namespace cupcake::runtime::internal

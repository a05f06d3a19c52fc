// Internal: the NCCL backend, reached through factory.cc (built only with NCCL).
#pragma once

#include <memory>

#include "cupcake/comm/communicator.h"

namespace cupcake::comm::internal {

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap, int device);
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicatorFromHandle(const void* nccl_comm);

}  // namespace cupcake::comm::internal

// Internal: the gloo backend, reached through factory.cc (built only with gloo).
#pragma once

#include <memory>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/gloo.h"

namespace cupcake::comm::internal {

// Arguments already checked by the factory.
StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(std::shared_ptr<KeyValueStore> store, int rank, int size,
                                                             const GlooOptions& options);

}  // namespace cupcake::comm::internal

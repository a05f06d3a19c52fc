// What the C API shares with tests: a C session over any communicator (the in-process one).
#pragma once

#include <memory>

#include "cupcake/runtime/cupcake.h"
#include "cupcake/runtime/session.h"

namespace cupcake::runtime::internal {

// cupcake_session_create_with_options with a communicator made in C++.
int CreateCSession(const char* plan_path, std::unique_ptr<comm::Communicator> comm, const SessionOptions& options,
                   cupcake_session** out);

}  // namespace cupcake::runtime::internal

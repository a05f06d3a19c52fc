// What the C API shares with tests: a C session over any communicator (the in-process one), and
// the options struct as SessionOptions.
#pragma once

#include <memory>

#include "cupcake/runtime/cupcake.h"
#include "cupcake/runtime/session.h"

namespace cupcake::runtime::internal {

// cupcake_session_create_with_options with a communicator made in C++.
int CreateCSession(const char* plan_path, std::unique_ptr<comm::Communicator> comm, const SessionOptions& options,
                   cupcake_session** out);

// `o` as SessionOptions (the communicator's fields aside); InvalidArgument naming every bad field,
// each line prefixed with `call`.
StatusOr<SessionOptions> ToSessionOptions(const cupcake_session_options& o, const char* call);

// cupcake_checkpointer_create with a communicator made in C++.
int CreateCCheckpointer(const cupcake_checkpoint_options& options, std::unique_ptr<comm::Communicator> comm,
                        cupcake_checkpointer** out);

}  // namespace cupcake::runtime::internal

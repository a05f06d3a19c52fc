// Running another program from a command (cupcake-profile compute's training job, inspect's
// PNG converter).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::tools {

// Runs `argv` (argv[0] looked up on PATH) with `env` added to this process's environment and
// waits for it; returns its wait status (WIFEXITED etc.). When it cannot be started, the child
// writes "<cannot_run><argv[0]>: <reason>" to stderr and exits 127. InternalError naming
// `who` when fork or waitpid fail.
StatusOr<int> RunChild(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env, const std::string& who,
                       const std::string& cannot_run);

}  // namespace cupcake::tools

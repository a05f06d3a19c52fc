// cupcake-plan's subcommands.
#pragma once

#include <vector>

#include "cupcake/tools/cli.h"

namespace cupcake::plan_cli {

inline const tools::ToolInfo kTool{"cupcake-plan",
                                   "Plans gradient fusion and compression from a profile and a model."};

// The subcommand table, in --help order.
std::vector<tools::Command> Commands();

}  // namespace cupcake::plan_cli

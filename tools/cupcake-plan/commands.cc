// cupcake-plan's subcommand table. To add a command:
//   1. write tools/cupcake-plan/<name>.cc with `Status Run<Name>(const <Name>Options&, std::ostream& out)`
//      and `int <Name>Main(tools::Invocation&)` (flags via tools::ParseFlags, result via
//      tools::Finish); add the file to cupcake_plan_cli in tools/CMakeLists.txt;
//   2. append {"<name>", "<one-line help>", <Name>Main} below.
#include "commands.h"

namespace cupcake::plan_cli {

std::vector<tools::Command> Commands() {
  return {
      // {"plan", "search the fusion groups and options for a model", PlanMain},
  };
}

}  // namespace cupcake::plan_cli

// cupcake-plan's subcommand table. To add a command:
//   1. write tools/cupcake-plan/<name>.cc with `Status Run<Name>(const <Name>Options&, std::ostream& out)`
//      and `int <Name>Main(tools::Invocation&)` (flags via tools::ParseFlags, result via
//      tools::Finish); add the file to cupcake_plan_cli in tools/CMakeLists.txt;
//   2. append {"<name>", "<one-line help>", <Name>Main} below.
#include "commands.h"

namespace cupcake::plan_cli {

std::vector<tools::Command> Commands() {
  return {
      {"search", "search the fusion groups that minimize the predicted iteration time; write a plan", SearchMain},
      {"show", "summarize a plan: predicted times, baselines, groups", ShowMain},
      {"simulate", "re-evaluate a plan's groups on a profile and compare with its prediction", SimulateMain},
      {"trace", "write a plan's predicted timeline as a Chrome trace", TraceMain},
      {"diff", "compare two plans (exit 0 equivalent, 1 different, 2 trouble)", DiffMain},
  };
}

}  // namespace cupcake::plan_cli

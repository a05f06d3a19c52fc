#include "commands.h"
#include "cupcake/planner/report.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake::plan_cli {
namespace po = boost::program_options;

Status RunTrace(const TraceOptions& options, std::ostream& out) {
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, internal::ReadPlanOrRung(options.plan, options.rung));
  const std::string trace = planner::ChromeTrace(plan);
  if (options.output.empty() || options.output == "-") {
    out << trace;
    return out ? Status::Ok() : UnavailableError("stdout: write failed");
  }
  return WriteFileAtomic(options.output, trace);
}

int TraceMain(tools::Invocation& inv) {
  TraceOptions options;
  po::options_description flags("options");
  flags.add_options()("plan", po::value(&options.plan)->required(), "the plan file (.pb)")(
      "output,o", po::value(&options.output)->default_value("-"),
      "the Chrome trace (chrome://tracing, Perfetto), written atomically; - for stdout");
  double rung = 0;
  internal::AddRungFlag(flags, &rung);
  po::positional_options_description positional;
  positional.add("plan", 1);
  po::variables_map vm;
  if (auto code = tools::ParseFlags(inv, flags, positional, "PLAN.pb [--rung RATIO] [-o TRACE.json]", vm)) return *code;
  if (vm.count("rung") != 0) options.rung = rung;
  return tools::Finish(inv, RunTrace(options, inv.out));
}

}  // namespace cupcake::plan_cli

#include <cmath>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cupcake/planner/report.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake::plan_cli {
namespace po = boost::program_options;

StatusOr<bool> RunDiff(const DiffOptions& options, std::ostream& out) {
  if (!std::isfinite(options.tolerance_pct) || options.tolerance_pct < 0) {
    std::ostringstream os;
    os << "--tolerance: must be a percentage >= 0; got " << options.tolerance_pct;
    return InvalidArgumentError(os.str());
  }
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan a, ReadPlanFile(options.a));
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan b, ReadPlanFile(options.b));
  const planner::PlanDiff d = planner::DiffPlans(a, b, options.tolerance_pct);
  if (options.format == tools::OutputFormat::kJson) {
    nlohmann::ordered_json j;
    j["different"] = d.different;
    j["time_change_pct"] = d.time_change_pct;
    j["changes"] = d.changes;
    out << j.dump(2) << "\n";
  } else {
    for (const auto& c : d.changes) out << c << "\n";
    if (!d.different)
      out << (d.changes.empty() ? "plans are equivalent\n" : "plans are equivalent within the tolerance\n");
  }
  return d.different;
}

int DiffMain(tools::Invocation& inv) {
  constexpr int kExitDifferent = 1, kExitTrouble = 2;
  DiffOptions options;
  std::string format;
  po::options_description flags("options");
  flags.add_options()("a", po::value(&options.a)->required(), "the first plan (.pb)")(
      "b", po::value(&options.b)->required(), "the second plan (.pb)")(
      "tolerance", po::value(&options.tolerance_pct)->default_value(0.0),
      "predicted iteration times within this many percent count as equal")(
      "format", po::value(&format)->default_value("text"), "text (one change per line) or json");
  po::positional_options_description positional;
  positional.add("a", 1).add("b", 1);
  po::variables_map vm;
  // diff(1): 0 equivalent, 1 different, 2 trouble (usage errors are already 2).
  if (auto code = tools::ParseFlags(inv, flags, positional, "A.pb B.pb [--tolerance PCT] [--format text|json]", vm))
    return *code;
  auto f = tools::ParseOutputFormat("--format", format);
  if (!f.ok()) return tools::UsageError(inv, f.status().message());
  options.format = *f;
  StatusOr<bool> different = RunDiff(options, inv.out);
  if (!different.ok()) {
    inv.err << different.status().message() << "\n";
    return kExitTrouble;
  }
  return *different ? kExitDifferent : tools::kExitOk;
}

}  // namespace cupcake::plan_cli

#include <cmath>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cupcake/planner/report.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake::plan_cli {
namespace po = boost::program_options;

namespace {

bool DiffTwoPlans(const pb::Plan& a, const pb::Plan& b, const DiffOptions& options, std::ostream& out) {
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

// Rung by rung, matched by ratio: a rung in one ladder only is a difference.
bool DiffLadders(const pb::Ladder& a, const pb::Ladder& b, const DiffOptions& options, std::ostream& out) {
  bool different = false;
  nlohmann::ordered_json rungs = nlohmann::ordered_json::array();
  auto has = [](const pb::Ladder& l, double ratio) { return FindRung(l, ratio, "").ok(); };
  for (const pb::Ladder* side : {&a, &b}) {
    const pb::Ladder& other = side == &a ? b : a;
    for (const pb::Rung& r : side->rungs()) {
      if (has(other, r.ratio())) continue;
      different = true;
      const std::string where = side == &a ? "A" : "B";
      if (options.format == tools::OutputFormat::kJson)
        rungs.push_back({{"ratio", r.ratio()}, {"only_in", where}});
      else
        out << "rung " << FormatDouble(r.ratio()) << ": only in " << where << "\n";
    }
  }
  for (const pb::Rung& ra : a.rungs()) {
    auto rb = FindRung(b, ra.ratio(), "");
    if (!rb.ok()) continue;
    const planner::PlanDiff d = planner::DiffPlans(ra.plan(), (*rb)->plan(), options.tolerance_pct);
    different = different || d.different;
    if (options.format == tools::OutputFormat::kJson) {
      rungs.push_back({{"ratio", ra.ratio()},
                       {"different", d.different},
                       {"time_change_pct", d.time_change_pct},
                       {"changes", d.changes}});
      continue;
    }
    for (const auto& c : d.changes) out << "rung " << FormatDouble(ra.ratio()) << ": " << c << "\n";
  }
  if (options.format == tools::OutputFormat::kJson) {
    out << nlohmann::ordered_json{{"different", different}, {"rungs", rungs}}.dump(2) << "\n";
  } else if (!different) {
    out << "ladders are equivalent" << (options.tolerance_pct > 0 ? " within the tolerance" : "") << "\n";
  }
  return different;
}

}  // namespace

StatusOr<bool> RunDiff(const DiffOptions& options, std::ostream& out) {
  if (!std::isfinite(options.tolerance_pct) || options.tolerance_pct < 0) {
    std::ostringstream os;
    os << "--tolerance: must be a percentage >= 0; got " << options.tolerance_pct;
    return InvalidArgumentError(os.str());
  }
  CUPCAKE_ASSIGN_OR_RETURN(Plans a, ReadPlansFile(options.a));
  CUPCAKE_ASSIGN_OR_RETURN(Plans b, ReadPlansFile(options.b));
  if (a.single != b.single) {
    const std::string& ladder = a.single ? options.b : options.a;
    const std::string& plan = a.single ? options.a : options.b;
    return InvalidArgumentError(ladder + " is a ladder and " + plan +
                                " a single plan; expected two plans or two ladders (show --rung RATIO picks a rung)");
  }
  if (a.single) return DiffTwoPlans(a.ladder.rungs(0).plan(), b.ladder.rungs(0).plan(), options, out);
  return DiffLadders(a.ladder, b.ladder, options, out);
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
  if (auto code = tools::ParseFlags(
          inv, flags, positional,
          "A.pb B.pb [--tolerance PCT] [--format text|json] (two plans, or two ladders rung by rung)", vm))
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

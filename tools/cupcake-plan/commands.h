// cupcake-plan's subcommands. Each is a `RunX(const XOptions&, std::ostream& out, ...)`
// (callable from tests) plus an `int XMain(tools::Invocation&)` that parses its flags.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/planner.h"
#include "cupcake/proto/status.h"
#include "cupcake/tools/cli.h"

namespace cupcake::plan_cli {

inline const tools::ToolInfo kTool{"cupcake-plan", "Plans gradient fusion and compression from a profile and a model."};

// The subcommand table, in --help order.
std::vector<tools::Command> Commands();

// search (--model M.json | --model-name NAME) --profile P --compressor C [...] -o plan.pb
struct SearchOptions {
  std::string model;  // a cupcake.model.v1 JSON file
  std::string model_name;  // or: a model the profile (DB or JSON) carries; exactly one of the two
  std::string profile;  // a profile DB or a cupcake.profile.v1 JSON file
  planner::PlanRequest request;
  planner::SearchOptions search;
  bool require_optimal = false;
  std::string output;  // the plan (.pb), written atomically
  tools::OutputFormat format = tools::OutputFormat::kText;
};
// Searches, writes the plan and prints its summary to `out`; the warning that the search ran
// out of budget goes to `err`. With require_optimal such a plan is an error and is not written.
Status RunSearch(const SearchOptions& options, std::ostream& out, std::ostream& err);
int SearchMain(tools::Invocation& inv);

// show PLAN [--format text|json]
struct ShowOptions {
  std::string plan;
  tools::OutputFormat format = tools::OutputFormat::kText;
};
Status RunShow(const ShowOptions& options, std::ostream& out);
int ShowMain(tools::Invocation& inv);

// simulate --plan PLAN (--model M.json | --model-name NAME) --profile P [--format text|json]
struct SimulateOptions {
  std::string plan;
  std::string model;
  std::string model_name;
  std::string profile;
  tools::OutputFormat format = tools::OutputFormat::kText;
};
Status RunSimulate(const SimulateOptions& options, std::ostream& out);
int SimulateMain(tools::Invocation& inv);

// trace PLAN [-o trace.json]
struct TraceOptions {
  std::string plan;
  std::string output = "-";  // "-": `out`
};
Status RunTrace(const TraceOptions& options, std::ostream& out);
int TraceMain(tools::Invocation& inv);

// diff A B [--tolerance PCT] [--format text|json]
struct DiffOptions {
  std::string a, b;
  double tolerance_pct = 0;
  tools::OutputFormat format = tools::OutputFormat::kText;
};
// Prints the differences; returns whether the plans differ (diff(1): the caller exits 1).
StatusOr<bool> RunDiff(const DiffOptions& options, std::ostream& out);
int DiffMain(tools::Invocation& inv);

// Shared by the commands (common.cc).
namespace internal {

// The model of --model FILE or --model-name NAME (looked up in `profile`, loaded from
// `profile_path`). Exactly one must be given; the caller checks that.
StatusOr<pb::Model> ResolveModel(const std::string& model_file, const std::string& model_name,
                                 const pb::Profile& profile, const std::string& profile_path);

// "12.345" (microseconds as milliseconds, 3 decimals).
std::string Ms(double us);
// "fc.bias" or "fc.bias .. layer4.2.bn3.weight".
std::string TensorRange(const pb::Model& model, int first, int last);

// "hier gpu", "flat cpu (offloaded)": a group's option as people read it; v1 groups as their
// flat equivalent.
std::string OptionName(const pb::Plan& plan, const pb::GroupOptions& o);
// "3 x flat gpu, 2 x hier gpu (groups per option)".
std::string OptionsSummary(const pb::Plan& plan);

// The plan's summary: model, profile, compressor, groups, predicted time, speedups over the
// baselines, search statistics. One "key  value" line each.
void PrintSummary(const pb::Plan& plan, std::ostream& out);

// The plan's extrapolated curves, "; "-separated, e.g. `"comm allreduce global" read at 97.5 MiB,
// 97.5x its last measured point (1 MiB)`; empty when there are none.
std::string Extrapolations(const pb::Plan& plan);
// The warning `search` prints once on stderr when Extrapolations(plan) is not empty.
std::string ExtrapolationWarning(const pb::Plan& plan);

}  // namespace internal

}  // namespace cupcake::plan_cli

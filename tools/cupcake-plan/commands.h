// cupcake-plan's subcommands. Each is a `RunX(const XOptions&, std::ostream& out, ...)`
// (callable from tests) plus an `int XMain(tools::Invocation&)` that parses its flags.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/planner.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/status.h"
#include "cupcake/tools/cli.h"

namespace cupcake::plan_cli {

inline const tools::ToolInfo kTool{"cupcake-plan", "Plans gradient fusion and compression from a profile and a model."};

// The subcommand table, in --help order.
std::vector<tools::Command> Commands();

// Every member of an XOptions struct has a default member initializer, so a caller may set only
// some of them (`ShowOptions{.plan = p, .profile = db}`) without -Wmissing-field-initializers.

// search (--model M.json | --model-name NAME) --profile P --compressor C [...] -o plan.pb
struct SearchOptions {
  std::string model{};  // a cupcake.model.v1 JSON file
  std::string model_name{};  // or: a model the profile (DB or JSON) carries; exactly one of the two
  std::string profile{};  // a profile DB or a cupcake.profile.v1 JSON file
  planner::PlanRequest request{};
  // Non-empty: a ladder (the fp32 rung and one plan per ratio, planner::MakeLadder) instead of
  // one plan at request.ratio.
  std::vector<double> ratios{};
  // Non-empty: a ladder of PowerSGD ranks (the fp32 rung and one plan per rank,
  // planner::MakeRankLadder) instead of one plan at request.rank.
  std::vector<int> ranks{};
  planner::SearchOptions search{};
  bool require_optimal = false;
  std::string output{};  // the plan (.pb), written atomically
  tools::OutputFormat format = tools::OutputFormat::kText;
};
// Searches, writes the plan (or ladder) and prints its summary to `out`; the warning that a
// search ran out of budget goes to `err`. With require_optimal such a plan is an error and
// nothing is written.
Status RunSearch(const SearchOptions& options, std::ostream& out, std::ostream& err);
int SearchMain(tools::Invocation& inv);

// show PLAN [--rung RATIO] [--format text|json]
struct ShowOptions {
  std::string plan{};
  tools::OutputFormat format = tools::OutputFormat::kText;
  std::optional<double> rung{};  // a ladder's rung; unset: the whole ladder
  // With a profile: the replica schedule (planner::ScheduleReplica) priced by its allreduce curve,
  // for a replica of `state_bytes` (0: the plan's per-rank state: 4 bytes per parameter for each
  // of error feedback and momentum that its compressor keeps, and 8 for the iteration counter).
  std::string profile{};
  int64_t state_bytes = 0;
};
Status RunShow(const ShowOptions& options, std::ostream& out);
int ShowMain(tools::Invocation& inv);

// simulate --plan PLAN (--model M.json | --model-name NAME) --profile P [--format text|json]
struct SimulateOptions {
  std::string plan{};
  std::string model{};
  std::string model_name{};
  std::string profile{};
  tools::OutputFormat format = tools::OutputFormat::kText;
  std::optional<double> rung{};  // required for a ladder
};
Status RunSimulate(const SimulateOptions& options, std::ostream& out);
int SimulateMain(tools::Invocation& inv);

// trace PLAN [-o trace.json]
struct TraceOptions {
  std::string plan{};
  std::string output = "-";  // "-": `out`
  std::optional<double> rung{};  // required for a ladder
};
Status RunTrace(const TraceOptions& options, std::ostream& out);
int TraceMain(tools::Invocation& inv);

// diff A B [--tolerance PCT] [--format text|json]: two plans, or two ladders rung by rung
struct DiffOptions {
  std::string a{}, b{};
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

// The plan of a single-plan file, or the rung `rung` of a ladder (which needs one). Errors name
// the file and the flag: `l.pb: a ladder of 3 plans; expected --rung RATIO, one of 1 (fp32), ...`.
StatusOr<pb::Plan> ReadPlanOrRung(const std::string& path, std::optional<double> rung);
// The same for a file already read.
StatusOr<pb::Plan> SelectPlan(const Plans& plans, const std::string& path, std::optional<double> rung);
// Adds `--rung RATIO` to `flags`, stored in `rung` when given (read it after ParseFlags).
void AddRungFlag(boost::program_options::options_description& flags, double* rung);

// "12.345" (microseconds as milliseconds, 3 decimals).
std::string Ms(double us);
// "fc.bias" or "fc.bias .. layer4.2.bn3.weight".
std::string TensorRange(const pb::Model& model, int first, int last);

// "hier gpu", "flat cpu (offloaded)": a group's option as people read it; v1 groups as their
// flat equivalent.
std::string OptionName(const pb::Plan& plan, const pb::GroupOptions& o);
// "3 x flat gpu, 2 x hier gpu (groups per option)"; OptionCounts without the parenthesis.
std::string OptionsSummary(const pb::Plan& plan);
std::string OptionCounts(const pb::Plan& plan);

// Rows of columns, one line each: `left(c)` columns left-aligned, the others right-aligned;
// the last column unpadded.
void PrintTable(const std::vector<std::vector<std::string>>& rows, const std::function<bool(size_t)>& left,
                std::ostream& out);
// A ladder's rungs, one row each: ratio, compressor, groups, predicted time, speedup over the
// fp32 rung, whether each search proved its plan optimal, the options chosen.
void PrintLadder(const pb::Ladder& ladder, std::ostream& out);

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

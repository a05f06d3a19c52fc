#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <set>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cupcake/planner/replica_schedule.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake::plan_cli {
namespace po = boost::program_options;
namespace {

std::string Span(double start_us, double end_us) { return internal::Ms(start_us) + "-" + internal::Ms(end_us); }

void Text(const std::string& path, const pb::Plan& plan, std::ostream& out) {
  out << "plan        " << path << " (" << plan.format() << ")\n";
  internal::PrintSummary(plan, out);
  if (const std::string curves = internal::Extrapolations(plan); !curves.empty())
    out << "extrapolated " << curves << " (times beyond a curve's last point are extrapolated)\n";
  out << "fingerprint model " << plan.model().fingerprint() << ", profile " << plan.profile_fingerprint() << "\n";
  out << "legend      backward: the sum of the tensors' backward times (encodes share the compute stream, so "
         "backward ends later); states: prefix labels the search expanded (docs/MODEL.md)\n";

  // One row per group; times in ms from the start of backward.
  const pb::Model& m = plan.model().model();
  std::vector<std::vector<std::string>> rows;
  const bool options = !plan.search().search_space().empty();
  rows.push_back({"group", "tensors", "count", "numel", "payload", "encode ms", "comm ms", "decode ms", "names"});
  if (options) rows.back().insert(rows.back().begin() + 2, "option");
  for (int k = 0; k < plan.groups_size(); ++k) {
    const pb::Group& g = plan.groups(k);
    rows.push_back({std::to_string(k), std::to_string(g.first_tensor()) + ".." + std::to_string(g.last_tensor()),
                    std::to_string(g.last_tensor() - g.first_tensor() + 1), std::to_string(g.numel()),
                    tools::HumanBytes(g.payload_bytes()), Span(g.encode_start_us(), g.encode_end_us()),
                    Span(g.comm_start_us(), g.comm_end_us()), Span(g.decode_start_us(), g.decode_end_us()),
                    internal::TensorRange(m, g.first_tensor(), g.last_tensor())});
    if (options) rows.back().insert(rows.back().begin() + 2, internal::OptionName(plan, g.options()));
  }
  out << "groups (times in ms from the start of backward"
      << (options ? "; encode and decode: on the option's device, the CPU worker when offloaded" : "") << "):\n";
  // The tensor and option columns read left to right.
  internal::PrintTable(
      rows, [&](size_t c) { return c == 1 || (options && c == 2); }, out);
}

// What a replica carries for a session of `plan` (docs/CHECKPOINT.md, "Replicas"): the state
// each rank holds alone, a float per parameter for each per-element plane some group keeps (the
// runtime's Session::KeepsState; a PowerSGD group keeps error feedback over its elements; a
// batched group's padding and every group's Q are the same on every rank and stay home) and the
// 8-byte iteration counter.
// Error-feedback memory: a compressed group whose memory is residual or dgc; momentum: a
// compressed group whose memory is dgc or whose compressor is signum. Groups of other schemes
// (fp32 and fp16 options) keep none. The job's own per-rank
// entries are not in the plan.
int64_t PerRankStateBytes(const pb::Plan& plan) {
  const std::string& memory = plan.compressor().memory();
  bool error_feedback = false, momentum = false;
  for (const pb::Group& g : plan.groups()) {
    const SchemeInfo* scheme = FindScheme(g.options().scheme());
    if (scheme != nullptr && scheme->codec == Codec::kLowRank) error_feedback = true;
    if (scheme != nullptr && scheme->codec != Codec::kCompressor) continue;
    error_feedback = error_feedback || memory == "residual" || memory == "dgc";
    momentum = momentum || memory == "dgc" || plan.compressor().name() == "signum";
  }
  int64_t elements = 0;
  for (const pb::Tensor& t : plan.model().model().tensors()) elements += t.numel();
  return 4 * elements * ((error_feedback ? 1 : 0) + (momentum ? 1 : 0)) + 8;
}

std::string Iterations(int64_t n) { return n > 0 ? std::to_string(n) : "never (no gap fits a transfer)"; }

// The replica schedule's summary and its gaps (docs/CHECKPOINT.md, "Idle gaps").
void ScheduleText(const planner::ReplicaSchedule& s, const std::string& profile, bool plans_profile,
                  std::ostream& out) {
  out << "replica     a replica of " << tools::HumanBytes(s.state_bytes) << " in the idle network gaps, priced by "
      << profile << "'s comm allreduce global curve"
      << (plans_profile ? "" : " (not the profile the plan was made with)") << ":\n";
  out << "            every gap: " << internal::Ms(s.idle_us) << " ms idle per iteration in " << s.gaps.size()
      << " gaps, chunks of " << tools::HumanBytes(s.bytes_per_iteration) << " per iteration, a full replica in "
      << Iterations(s.iterations) << " iterations\n";
  out << "            the runtime (one chunk per commit, before the first collective): "
      << tools::HumanBytes(s.commit_chunk_bytes) << " (replica_chunk_bytes " << s.commit_chunk_bytes
      << "), a full replica in " << Iterations(s.commit_iterations) << " iterations\n";
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"gap", "after group", "ms", "idle ms", "chunk", "chunk bytes"});
  for (size_t i = 0; i < s.gaps.size(); ++i) {
    const planner::IdleGap& g = s.gaps[i];
    rows.push_back({std::to_string(i), g.after_group < 0 ? "-" : std::to_string(g.after_group),
                    Span(g.start_us, g.end_us), internal::Ms(g.end_us - g.start_us), tools::HumanBytes(g.chunk_bytes),
                    std::to_string(g.chunk_bytes)});
  }
  out << "idle gaps (times in ms from the start of forward):\n";
  internal::PrintTable(
      rows, [](size_t) { return false; }, out);
}

nlohmann::ordered_json ScheduleJson(const planner::ReplicaSchedule& s, const std::string& profile) {
  nlohmann::ordered_json j;
  j["profile"] = profile;
  j["state_bytes"] = s.state_bytes;
  j["idle_us"] = s.idle_us;
  j["bytes_per_iteration"] = s.bytes_per_iteration;
  j["iterations"] = s.iterations;
  j["commit_chunk_bytes"] = s.commit_chunk_bytes;
  j["commit_iterations"] = s.commit_iterations;
  j["gaps"] = nlohmann::ordered_json::array();
  for (const planner::IdleGap& g : s.gaps)
    j["gaps"].push_back({{"start_us", g.start_us},
                         {"end_us", g.end_us},
                         {"after_group", g.after_group},
                         {"chunk_bytes", g.chunk_bytes}});
  return j;
}

void LadderText(const std::string& path, const pb::Ladder& ladder, std::ostream& out) {
  const pb::Plan& dense = ladder.rungs(0).plan();
  const pb::Model& m = dense.model().model();
  out << "ladder      " << path << " (" << ladder.format() << "): " << ladder.rungs_size()
      << " rungs, each a plan searched on its own\n";
  out << "model       " << m.name() << ": " << m.tensors_size() << " tensors\n";
  out << "profile     " << dense.profile_name() << ": world size " << dense.world_size() << ", on "
      << Name(dense.device()) << "\n";
  if (!dense.profile_source().empty()) out << "source      " << dense.profile_source() << "\n";
  out << "rungs (show --rung RATIO prints one rung as a plan):\n";
  internal::PrintLadder(ladder, out);
}

// The proto3 JSON mapping prints 64-bit integers as strings; the plan's counts and sizes fit a
// JSON number exactly (below 2^53), so they print as numbers. A value beyond stays a string.
void IntegersAsNumbers(nlohmann::ordered_json& j) {
  static const std::set<std::string> kInt64 = {"numel", "payload_bytes", "bytes", "nodes", "pruned", "budget", "states",
                                               "seed"};
  constexpr int64_t kExact = int64_t{1} << 53;
  if (j.is_array()) {
    for (auto& v : j) IntegersAsNumbers(v);
    return;
  }
  if (!j.is_object()) return;
  for (auto& [key, value] : j.items()) {
    if (value.is_string() && kInt64.count(key) != 0) {
      const std::string& text = value.get_ref<const std::string&>();
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && *end == '\0' && errno == 0 && v < kExact && v > -kExact) value = static_cast<int64_t>(v);
    } else {
      IntegersAsNumbers(value);
    }
  }
}

// The plan's proto3 JSON (PlanToJson) with the summary first and the model, with its tensor
// list, last; the same keys and values, so it still parses as a Plan (docs/FORMATS.md).
nlohmann::ordered_json SummaryFirst(const std::string& proto_json) {
  const auto j = nlohmann::ordered_json::parse(proto_json);
  nlohmann::ordered_json out;
  for (const char* key : {"format", "profile_name", "profile_source", "profile_fingerprint", "world_size", "devices_per_node", "device",
                          "compressor", "predicted", "baselines", "search", "extrapolations", "groups", "model"})
    if (j.contains(key)) out[key] = j[key];
  for (const auto& [key, value] : j.items())
    if (!out.contains(key)) out[key] = value;
  IntegersAsNumbers(out);
  return out;
}

}  // namespace

Status RunShow(const ShowOptions& options, std::ostream& out) {
  CUPCAKE_ASSIGN_OR_RETURN(Plans plans, ReadPlansFile(options.plan));
  if (!options.profile.empty() && !plans.single && !options.rung)
    return InvalidArgumentError("--profile: " + options.plan +
                                ": a ladder; expected a plan, or --rung RATIO to schedule one rung's replica");
  if (plans.single || options.rung) {
    CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, internal::SelectPlan(plans, options.plan, options.rung));
    std::optional<planner::ReplicaSchedule> schedule;
    bool plans_profile = true;
    if (!options.profile.empty()) {
      CUPCAKE_ASSIGN_OR_RETURN(pb::Profile profile, profile::LoadProfileFile(options.profile));
      StatusOr<planner::Curve> transfer = planner::TransferCurve(profile, plan.world_size());
      if (!transfer.ok()) return transfer.status().WithPrefix(options.profile);
      plans_profile = ProfileFingerprint(profile) == plan.profile_fingerprint();
      schedule = planner::ScheduleReplica(plan, *transfer,
                                          options.state_bytes > 0 ? options.state_bytes : PerRankStateBytes(plan));
    }
    if (options.format == tools::OutputFormat::kJson) {
      nlohmann::ordered_json j = SummaryFirst(PlanToJson(plan));
      if (schedule) j["replica_schedule"] = ScheduleJson(*schedule, options.profile);
      out << j.dump(1) << "\n";
    } else {
      Text(options.plan, plan, out);
      if (schedule) ScheduleText(*schedule, options.profile, plans_profile, out);
    }
    return Status::Ok();
  }
  if (options.format == tools::OutputFormat::kJson) {
    nlohmann::ordered_json j;
    j["format"] = plans.ladder.format();
    j["rungs"] = nlohmann::ordered_json::array();
    for (const pb::Rung& r : plans.ladder.rungs())
      j["rungs"].push_back({{"ratio", r.ratio()}, {"plan", SummaryFirst(PlanToJson(r.plan()))}});
    out << j.dump(1) << "\n";
  } else {
    LadderText(options.plan, plans.ladder, out);
  }
  return Status::Ok();
}

int ShowMain(tools::Invocation& inv) {
  ShowOptions options;
  std::string format;
  po::options_description flags("options");
  flags.add_options()("plan", po::value(&options.plan)->required(), "the plan file (.pb)")(
      "format", po::value(&format)->default_value("text"), "text (summary and groups) or json (every field)")(
      "profile", po::value(&options.profile),
      "also print the replica schedule: the plan's idle network gaps and the checkpoint chunks that fit them, "
      "priced by this profile's allreduce curve (docs/CHECKPOINT.md)")(
      "state-bytes", po::value(&options.state_bytes),
      "with --profile: the replica's size in bytes (default: the plan's per-rank state, 4 per parameter for "
      "error feedback and 4 for momentum where its compressor keeps them, and the 8-byte iteration counter)");
  double rung = 0;
  internal::AddRungFlag(flags, &rung);
  po::positional_options_description positional;
  positional.add("plan", 1);
  po::variables_map vm;
  if (auto code = tools::ParseFlags(inv, flags, positional,
                                    "PLAN.pb [--rung RATIO] [--format text|json] [--profile P [--state-bytes N]]", vm))
    return *code;
  if (vm.count("rung") != 0) options.rung = rung;
  if (vm.count("state-bytes") != 0 && options.state_bytes <= 0)
    return tools::UsageError(
        inv, "--state-bytes: out of range; got " + std::to_string(options.state_bytes) + ", expected > 0");
  if (vm.count("state-bytes") != 0 && options.profile.empty())
    return tools::UsageError(inv, "--state-bytes: sizes the replica schedule; expected --profile too");
  auto f = tools::ParseOutputFormat("--format", format);
  if (!f.ok()) return tools::UsageError(inv, f.status().message());
  options.format = *f;
  return tools::Finish(inv, RunShow(options, inv.out));
}

}  // namespace cupcake::plan_cli

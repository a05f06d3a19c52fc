#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake::plan_cli {
namespace po = boost::program_options;
namespace {

std::string Us(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", us);
  return buf;
}

std::string Signed(double x, const char* unit) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%+.3f%s", x, unit);
  return buf;
}

}  // namespace

Status RunSimulate(const SimulateOptions& options, std::ostream& out) {
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, internal::ReadPlanOrRung(options.plan, options.rung));
  CUPCAKE_ASSIGN_OR_RETURN(pb::Profile profile, profile::LoadProfileFile(options.profile));
  CUPCAKE_ASSIGN_OR_RETURN(pb::Model model,
                           internal::ResolveModel(options.model, options.model_name, profile, options.profile));
  CUPCAKE_ASSIGN_OR_RETURN(planner::Timeline t, planner::Simulate(plan, model, profile));
  const double predicted = plan.predicted().iteration_us();
  const double diff_us = t.iteration_us - predicted;
  const double diff_pct = predicted > 0 ? diff_us / predicted * 100.0 : 0.0;
  const bool same_profile = ProfileFingerprint(profile) == plan.profile_fingerprint();

  if (options.format == tools::OutputFormat::kJson) {
    using nlohmann::ordered_json;
    ordered_json j;
    j["plan"] = options.plan;
    j["model"] = model.name();
    j["profile"] = profile.cluster().name();
    j["same_profile_as_plan"] = same_profile;
    ordered_json groups = ordered_json::array();
    for (size_t k = 0; k < t.groups.size(); ++k) {
      const planner::GroupTimes& g = t.groups[k];
      ordered_json jg;
      jg["group"] = k;
      jg["first_tensor"] = g.first;
      jg["last_tensor"] = g.last;
      jg["first_name"] = model.tensors(g.first).name();
      jg["last_name"] = model.tensors(g.last).name();
      if (k < static_cast<size_t>(plan.groups_size()))
        jg["option"] = internal::OptionName(plan, plan.groups(static_cast<int>(k)).options());
      jg["enc_us"] = g.cost.enc_us;
      jg["com_us"] = g.cost.com_us;
      jg["dec_us"] = g.cost.dec_us;
      jg["encode_start_us"] = g.encode_start_us;
      jg["encode_end_us"] = g.encode_end_us;
      jg["comm_start_us"] = g.comm_start_us;
      jg["comm_end_us"] = g.comm_end_us;
      jg["decode_start_us"] = g.decode_start_us;
      jg["decode_end_us"] = g.decode_end_us;
      groups.push_back(jg);
    }
    j["groups"] = groups;
    j["iteration_us"] = t.iteration_us;
    j["plan_iteration_us"] = predicted;
    j["difference_us"] = diff_us;
    j["difference_pct"] = diff_pct;
    out << j.dump(2) << "\n";
    return Status::Ok();
  }

  out << "simulate " << options.plan << " for model " << model.name() << " on profile " << profile.cluster().name()
      << (same_profile ? " (the plan's profile)"
                       : " (NOT the profile the plan was made with: fingerprint " + ProfileFingerprint(profile) +
                             ", plan " + plan.profile_fingerprint() + ")")
      << "\n";
  std::vector<std::vector<std::string>> rows;
  const bool with_options = !plan.search().search_space().empty();
  rows.push_back({"group", "tensors", "enc us", "com us", "dec us", "encode ms", "comm ms", "decode ms", "names"});
  if (with_options) rows.back().insert(rows.back().begin() + 2, "option");
  for (size_t k = 0; k < t.groups.size(); ++k) {
    const planner::GroupTimes& g = t.groups[k];
    auto span = [](double a, double b) { return internal::Ms(a) + "-" + internal::Ms(b); };
    rows.push_back({std::to_string(k), std::to_string(g.first) + ".." + std::to_string(g.last), Us(g.cost.enc_us),
                    Us(g.cost.com_us), Us(g.cost.dec_us), span(g.encode_start_us, g.encode_end_us),
                    span(g.comm_start_us, g.comm_end_us), span(g.decode_start_us, g.decode_end_us),
                    internal::TensorRange(model, g.first, g.last)});
    if (with_options)
      rows.back().insert(rows.back().begin() + 2,
                         internal::OptionName(plan, plan.groups(static_cast<int>(k)).options()));
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  for (const auto& r : rows) {
    std::string line = " ";
    for (size_t c = 0; c < r.size(); ++c) {
      const bool last = c + 1 == r.size();
      const bool left = c == 1 || last || (with_options && c == 2);
      std::string pad(width[c] - r[c].size(), ' ');
      line += " " + (left ? r[c] + (last ? "" : pad) : pad + r[c]);
    }
    out << line << "\n";
  }
  out << "iteration   " << internal::Ms(t.iteration_us) << " ms (plan predicted " << internal::Ms(predicted)
      << " ms; difference " << Signed(diff_us / 1000.0, " ms") << ", " << Signed(diff_pct, "%") << ")\n";
  return Status::Ok();
}

int SimulateMain(tools::Invocation& inv) {
  SimulateOptions options;
  std::string format;
  po::options_description flags("options");
  flags.add_options()("plan", po::value(&options.plan)->required(), "the plan file (.pb)")(
      "model", po::value(&options.model), "the model: a cupcake.model.v1 JSON file (must be the plan's model)")(
      "model-name", po::value(&options.model_name), "or: the model of this name stored in the profile")(
      "profile", po::value(&options.profile)->required(), "the profile to evaluate on: a DB or a profile JSON file")(
      "format", po::value(&format)->default_value("text"), "text or json");
  double rung = 0;
  internal::AddRungFlag(flags, &rung);
  po::variables_map vm;
  if (auto code = tools::ParseFlags(
          inv, flags, {},
          "--plan PLAN.pb [--rung RATIO] (--model M.json | --model-name NAME) --profile P [--format text|json]", vm))
    return *code;
  if (vm.count("rung") != 0) options.rung = rung;
  if (options.model.empty() == options.model_name.empty())
    return tools::UsageError(inv, "give exactly one of --model FILE and --model-name NAME");
  auto f = tools::ParseOutputFormat("--format", format);
  if (!f.ok()) return tools::UsageError(inv, f.status().message());
  options.format = *f;
  return tools::Finish(inv, RunSimulate(options, inv.out));
}

}  // namespace cupcake::plan_cli

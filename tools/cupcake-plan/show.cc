#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <set>
#include <nlohmann/json.hpp>

#include "commands.h"
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
  if (plans.single || options.rung) {
    CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, internal::SelectPlan(plans, options.plan, options.rung));
    if (options.format == tools::OutputFormat::kJson)
      out << SummaryFirst(PlanToJson(plan)).dump(1) << "\n";
    else
      Text(options.plan, plan, out);
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
      "format", po::value(&format)->default_value("text"), "text (summary and groups) or json (every field)");
  double rung = 0;
  internal::AddRungFlag(flags, &rung);
  po::positional_options_description positional;
  positional.add("plan", 1);
  po::variables_map vm;
  if (auto code = tools::ParseFlags(inv, flags, positional, "PLAN.pb [--rung RATIO] [--format text|json]", vm))
    return *code;
  if (vm.count("rung") != 0) options.rung = rung;
  auto f = tools::ParseOutputFormat("--format", format);
  if (!f.ok()) return tools::UsageError(inv, f.status().message());
  options.format = *f;
  return tools::Finish(inv, RunShow(options, inv.out));
}

}  // namespace cupcake::plan_cli

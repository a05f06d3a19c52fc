#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.h"
#include "cupcake/planner/ladder.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/host_load.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake::plan_cli {
namespace po = boost::program_options;
namespace {

// The plan's summary; `search_s`, the search's wall clock, where one search made it alone (a
// ladder's rungs have the ladder's).
nlohmann::ordered_json Json(const pb::Plan& plan, std::optional<double> search_s) {
  using nlohmann::ordered_json;
  const auto& m = plan.model().model();
  ordered_json j;
  j["model"] = m.name();
  j["tensors"] = m.tensors_size();
  j["profile"] = plan.profile_name();
  j["world_size"] = plan.world_size();
  j["compressor"] = plan.compressor().name();
  j["ratio"] = plan.compressor().ratio();
  if (plan.compressor().rank() > 0) j["rank"] = plan.compressor().rank();
  j["memory"] = plan.compressor().memory();
  j["device"] = std::string(Name(plan.device()));
  j["groups"] = plan.groups_size();
  j["iteration_us"] = plan.predicted().iteration_us();
  ordered_json baselines = ordered_json::array();
  for (const auto& b : plan.baselines()) {
    ordered_json jb;
    jb["name"] = b.name();
    jb["groups"] = b.groups();
    jb["iteration_us"] = b.iteration_us();
    jb["speedup"] = b.iteration_us() / plan.predicted().iteration_us();
    baselines.push_back(jb);
  }
  j["baselines"] = baselines;
  ordered_json s;
  s["algorithm"] = plan.search().algorithm();
  s["nodes"] = plan.search().nodes();
  s["states"] = plan.search().states();
  s["pruned"] = plan.search().pruned();
  s["budget"] = plan.search().budget();
  s["optimal"] = plan.search().optimal();
  s["search_space"] = plan.search().search_space().empty() ? "fusion" : plan.search().search_space();
  if (plan.search().lower_bound_us() > 0) {
    s["lower_bound_us"] = plan.search().lower_bound_us();
    s["gap"] = 1.0 - plan.search().lower_bound_us() / plan.predicted().iteration_us();
  }
  if (search_s) s["wall_s"] = *search_s;
  j["search"] = s;
  ordered_json extrapolations = ordered_json::array();
  for (const auto& e : plan.extrapolations())
    extrapolations.push_back(
        {{"curve", e.curve()}, {"last_size", e.last_size()}, {"max_size", e.max_size()}, {"unit", e.unit()}});
  j["extrapolations"] = extrapolations;
  return j;
}

// The warning (or, with require_optimal, the error) for a plan whose search ran out of budget.
Status CheckOptimal(const SearchOptions& options, const pb::Plan& plan, const std::string& which, std::ostream& err) {
  if (plan.search().optimal() || planner::IsFixedStrategy(options.search.algorithm) ||
      options.search.algorithm == planner::Algorithm::kEspresso)
    return Status::Ok();
  const std::string what = which + "search: stopped at --budget " + std::to_string(plan.search().budget()) +
                           " (nodes); the plan is the best found, not proven optimal";
  if (options.require_optimal)
    return FailedPreconditionError("--require-optimal: " + what + "; raise --budget (no " +
                                   (which.empty() ? "plan" : "ladder") + " written)");
  err << "warning: " << what << " (raise --budget to prove it)\n";
  return Status::Ok();
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Status RunLadderSearch(const SearchOptions& options, const pb::Model& model, const pb::Profile& profile,
                       std::ostream& out, std::ostream& err) {
  const auto start = std::chrono::steady_clock::now();
  CUPCAKE_ASSIGN_OR_RETURN(
      pb::Ladder ladder, options.ranks.empty()
                             ? planner::MakeLadder(model, profile, options.request, options.ratios, options.search)
                             : planner::MakeRankLadder(model, profile, options.request, options.ranks, options.search));
  const double search_s = Seconds(start);
  auto which = [](const pb::Rung& r) {
    return "rung " + FormatDouble(r.ratio()) +
           (IsPowerSgdRung(r.plan()) ? " (rank " + std::to_string(r.plan().compressor().rank()) + ")" : "") + ": ";
  };
  for (const pb::Rung& r : ladder.rungs()) CUPCAKE_RETURN_IF_ERROR(CheckOptimal(options, r.plan(), which(r), err));
  CUPCAKE_RETURN_IF_ERROR(WriteLadderFile(options.output, ladder));
  for (const pb::Rung& r : ladder.rungs())
    if (std::string w = internal::ExtrapolationWarning(r.plan()); !w.empty()) err << which(r) << w;
  if (options.format == tools::OutputFormat::kJson) {
    nlohmann::ordered_json j;
    j["ladder"] = options.output;
    j["rungs"] = nlohmann::ordered_json::array();
    for (const pb::Rung& r : ladder.rungs()) j["rungs"].push_back({{"ratio", r.ratio()}, {"plan", Json(r.plan(), std::nullopt)}});
    j["wall_s"] = search_s;
    out << j.dump(2) << "\n";
    return Status::Ok();
  }
  out << "wrote ladder " << options.output << " (" << ladder.rungs_size() << " rungs, each searched on its own)\n";
  internal::PrintLadder(ladder, out);
  char took[64];
  std::snprintf(took, sizeof took, "%.3f s", search_s);
  out << "took        " << took << " (wall clock of the searches; not stored in the ladder)\n";
  return Status::Ok();
}

// PowerSGD takes a tensor as a matrix by its recorded shape; a model recorded before shapes
// were (or imported without them) has tensors it can only send uncompressed.
void NoteShapeless(const pb::Model& model, std::ostream& err) {
  int shapeless = 0;
  for (const pb::Tensor& t : model.tensors()) shapeless += t.shape().empty() && t.numel() > 1 ? 1 : 0;
  if (shapeless > 0)
    err << "note: --rank: " << shapeless << " of model " << model.name() << "'s " << model.tensors_size()
        << " tensors record no shape (a model recorded before shapes were); PowerSGD treats them as vectors and "
           "sends them uncompressed (record the model again to compress them)\n";
}

}  // namespace

Status RunSearch(const SearchOptions& options, std::ostream& out, std::ostream& err) {
  CUPCAKE_ASSIGN_OR_RETURN(pb::Profile profile, profile::LoadProfileFile(options.profile));
  CUPCAKE_ASSIGN_OR_RETURN(pb::Model model,
                           internal::ResolveModel(options.model, options.model_name, profile, options.profile));
  if (options.request.rank > 0 || !options.ranks.empty()) NoteShapeless(model, err);
  if (const std::string busy = BusyNote(profile.cluster()); !busy.empty())
    err << "warning: profile " << options.profile << ": " << busy << "\n";
  if (!options.ratios.empty() || !options.ranks.empty()) return RunLadderSearch(options, model, profile, out, err);
  const auto start = std::chrono::steady_clock::now();
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, planner::MakePlan(model, profile, options.request, options.search));
  const double search_s = Seconds(start);
  CUPCAKE_RETURN_IF_ERROR(CheckOptimal(options, plan, "", err));
  CUPCAKE_RETURN_IF_ERROR(WritePlanFile(options.output, plan));
  err << internal::ExtrapolationWarning(plan);
  if (options.format == tools::OutputFormat::kJson) {
    nlohmann::ordered_json j = {{"plan", options.output}};
    j.update(Json(plan, search_s));
    out << j.dump(2) << "\n";
    return Status::Ok();
  }
  out << "wrote plan " << options.output << "\n";
  internal::PrintSummary(plan, out);
  char took[64];
  std::snprintf(took, sizeof took, "%.3f s", search_s);
  out << "took        " << took << " (wall clock of the search; not stored in the plan)\n";
  return Status::Ok();
}

int SearchMain(tools::Invocation& inv) {
  SearchOptions options;
  std::string device, algorithm, format, space, ratios, ranks, schemes;
  double bucket_mib = 25;
  po::options_description flags("options");
  flags.add_options()("model", po::value(&options.model), "the model: a cupcake.model.v1 JSON file")(
      "model-name", po::value(&options.model_name),
      "or: the model of this name stored in the profile (a DB or a profile JSON with models); "
      "give exactly one of --model and --model-name")("profile", po::value(&options.profile)->required(),
                                                      "the profile: an SQLite DB or a cupcake.profile.v1 JSON file")(
      "compressor", po::value(&options.request.compressor)->required(), "compressor name (fp32, topk, efsignsgd, ...)")(
      "ratio", po::value(&options.request.ratio)->default_value(kDefaultRatio),
      "fraction of elements kept, in (0, 1] (topk, randk, dgc)")(
      "device", po::value(&device),
      "where encode and decode run: gpu or cpu (default: gpu if the profile has its curves)")(
      "memory", po::value(&options.request.memory),
      "error feedback: residual, dgc or none (default: the compressor's)")(
      "ratios", po::value(&ratios),
      "a ladder instead of one plan: a plan per ratio, comma-separated (e.g. 0.1,0.01,0.001; topk, randk, dgc), "
      "each searched on its own, and the fp32 plan as the bottom rung; for a controller that adapts the ratio")(
      "seed", po::value(&options.request.seed)->default_value(0), "random seed (randk, qsgd, terngrad)")(
      "rank", po::value(&options.request.rank)->default_value(0),
      "PowerSGD's rank r >= 1 (--search-space options offers the powersgd schemes; the runtime keeps rank-r "
      "factors of each matrix-shaped gradient); 0: not offered")(
      "ranks", po::value(&ranks),
      "a ladder of PowerSGD ranks instead of one plan (with --compressor fp32 --search-space options, e.g. "
      "--schemes powersgd --ranks 4,2,1): a plan per rank, comma-separated, each searched on its own, and the "
      "fp32 plan as the bottom rung; each rung's ratio is the bytes its plan sends over the dense gradient's")(
      "schemes", po::value(&schemes),
      "--search-space options: offer only these schemes, comma-separated (e.g. powersgd,powersgd_batched for "
      "PowerSGD plans); the compressor's own fusion scheme (flat, or flat_fp32 for fp32) is always offered; "
      "default: every scheme")(
      "zen-union", po::value(&options.request.zen_union)->default_value(0),
      "zen groups (--search-space options): the ranks' union of selected indices as a share of their W k "
      "pairs, as measured (the runtime's zen_union / (W k)); 0: independent selections")(
      "algorithm", po::value(&algorithm)->default_value("branch_and_bound"),
      "branch_and_bound or exhaustive; espresso (Espresso's two steps, --search-space options); or a fixed "
      "strategy to compare with: layerwise, one_group, bucket")(
      "search-space", po::value(&space)->default_value("fusion"),
      "fusion: the groups, every group with the plan's option (v1); options: the groups and each group's "
      "option (scheme and device; docs/MODEL.md v2)")("bucket-mib", po::value(&bucket_mib)->default_value(25),
                                                      "--algorithm bucket: the bucket cap in MiB (DDP: 25)")(
      "budget", po::value(&options.search.node_budget),
      ("search nodes (groups priced) before the search stops with the best plan found; default " +
       std::to_string(planner::DefaultNodeBudget(planner::SearchSpace::kFusion)) + ", with --search-space options " +
       std::to_string(planner::DefaultNodeBudget(planner::SearchSpace::kOptions)))
          .c_str())("require-optimal", po::bool_switch(&options.require_optimal),
                    "fail (exit 1, nothing written) unless the plan is proven optimal")(
      "output,o", po::value(&options.output)->required(), "the plan (or ladder) file (.pb), written atomically")(
      "format", po::value(&format)->default_value("text"), "summary on stdout: text or json");
  po::variables_map vm;
  if (auto code = tools::ParseFlags(
          inv, flags, {}, "(--model M.json | --model-name NAME) --profile P --compressor NAME [options] -o PLAN.pb",
          vm))
    return *code;
  if (options.model.empty() == options.model_name.empty())
    return tools::UsageError(inv, "give exactly one of --model FILE and --model-name NAME");
  if (!device.empty()) {
    auto d = ParseDevice(device);
    if (!d)
      return tools::UsageError(inv,
                               "--device: unknown device; got \"" + device + "\", expected one of " + DeviceNames());
    options.request.device = *d;
  }
  if (vm.count("schemes") != 0) {
    std::stringstream list(schemes);
    for (std::string item; std::getline(list, item, ',');) options.request.schemes.push_back(item);
    if (options.request.schemes.empty())
      return tools::UsageError(inv, "--schemes: expected comma-separated scheme names; got \"\"");
  }
  // Flag values the planner would refuse are usage errors (exit 2), as README says.
  if (Status s = planner::CheckRequest(options.request); !s.ok())
    return tools::UsageError(inv, s.message());
  if (vm.count("ranks") != 0 && vm.count("ratios") != 0)
    return tools::UsageError(inv,
                             "give --ratios (a ladder of ratios) or --ranks (a ladder of PowerSGD ranks), not both");
  if (vm.count("ratios") != 0) {
    if (!vm["ratio"].defaulted())
      return tools::UsageError(inv, "give --ratio (one plan) or --ratios (a ladder), not both");
    std::stringstream list(ratios);
    for (std::string item; std::getline(list, item, ',');) {
      char* end = nullptr;
      const double r = std::strtod(item.c_str(), &end);
      if (item.empty() || end != item.c_str() + item.size())
        return tools::UsageError(inv, "--ratios: not a number; got \"" + item + "\" in \"" + ratios +
                                          "\", expected comma-separated ratios such as 0.1,0.01");
      options.ratios.push_back(r);
    }
    if (Status s = planner::CheckLadderRequest(options.request.compressor, options.ratios); !s.ok())
      return tools::UsageError(inv, s.message());
  } else if (!vm["ratio"].defaulted()) {
    const CompressorInfo* info = FindCompressor(options.request.compressor);
    if (info != nullptr && !info->uses_ratio)
      inv.err << "warning: --ratio: does not apply to " << info->name
              << " (only topk, randk and dgc keep a fraction of the elements); ignored\n";
  }
  if (vm.count("ranks") != 0) {
    std::stringstream list(ranks);
    for (std::string item; std::getline(list, item, ',');) {
      char* end = nullptr;
      const long r = std::strtol(item.c_str(), &end, 10);
      if (item.empty() || end != item.c_str() + item.size() || r < INT32_MIN || r > INT32_MAX)
        return tools::UsageError(inv, "--ranks: not a whole number; got \"" + item + "\" in \"" + ranks +
                                          "\", expected comma-separated PowerSGD ranks such as 4,2,1");
      options.ranks.push_back(static_cast<int>(r));
    }
    auto sp = planner::ParseSearchSpace(space);
    if (Status s = planner::CheckRankLadderRequest(options.request, sp.ok() ? *sp : planner::SearchSpace::kFusion,
                                                   options.ranks);
        !s.ok())
      return tools::UsageError(inv, s.message());
  }
  if (options.request.rank > 0 && space != "options")
    inv.err << "warning: --rank: only --search-space options offers the powersgd schemes; ignored\n";
  if (!options.request.schemes.empty() && space != "options")
    inv.err << "warning: --schemes: only --search-space options chooses schemes; ignored\n";
  if (options.request.zen_union > 0) {
    const CompressorInfo* info = FindCompressor(options.request.compressor);
    const std::string why = info != nullptr ? SchemeCodecProblem(*FindScheme("zen"), *info) : "";
    if (!why.empty())
      inv.err << "warning: --zen-union: only zen groups use it, and " << why
              << "; ignored unless the model records sparse gradients (zen_sparse)\n";
  }
  auto a = planner::ParseAlgorithm(algorithm);
  if (!a.ok()) return tools::UsageError(inv, a.status().message());
  options.search.algorithm = *a;
  auto sp = planner::ParseSearchSpace(space);
  if (!sp.ok()) return tools::UsageError(inv, sp.status().message());
  options.search.space = *sp;
  if (vm.count("budget") == 0) options.search.node_budget = planner::DefaultNodeBudget(*sp);
  if (options.search.algorithm == planner::Algorithm::kEspresso &&
      options.search.space != planner::SearchSpace::kOptions)
    return tools::UsageError(inv, "--algorithm espresso: chooses per-group options; needs --search-space options");
  if (!(bucket_mib > 0 && bucket_mib <= 1 << 20))
    return tools::UsageError(
        inv, "--bucket-mib: out of range; got " + std::to_string(bucket_mib) + ", expected 0 < MiB <= 1048576");
  options.search.bucket_bytes = static_cast<int64_t>(bucket_mib * (1 << 20));
  auto f = tools::ParseOutputFormat("--format", format);
  if (!f.ok()) return tools::UsageError(inv, f.status().message());
  options.format = *f;
  return tools::Finish(inv, RunSearch(options, inv.out, inv.err));
}

}  // namespace cupcake::plan_cli

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "commands.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/names.h"

namespace cupcake::plan_cli::internal {
namespace {

std::string Join(const std::vector<std::string_view>& names) {
  std::string s;
  for (auto n : names) s += (s.empty() ? "" : ", ") + std::string(n);
  return s;
}

}  // namespace

StatusOr<pb::Model> ResolveModel(const std::string& model_file, const std::string& model_name,
                                 const pb::Profile& profile, const std::string& profile_path) {
  if (!model_file.empty()) return profile::LoadModelFile(model_file);
  std::vector<std::string_view> names;
  for (const auto& m : profile.models()) {
    if (m.name() == model_name) return m;
    names.push_back(m.name());
  }
  std::string expected = names.empty() ? "a model the profile carries (it has none: import one with "
                                         "\"cupcake-profile import\")"
                                       : "one of " + Join(names);
  return NotFoundError(profile_path + ": models: no such model; got \"" + model_name + "\"" +
                       DidYouMean(model_name, names) + ", expected " + expected);
}

std::string Ms(double us) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", us / 1000.0);
  return buf;
}

std::string TensorRange(const pb::Model& model, int first, int last) {
  std::string s = model.tensors(first).name();
  if (last != first) s += " .. " + model.tensors(last).name();
  return s;
}

std::string OptionName(const pb::Plan& plan, const pb::GroupOptions& o) {
  const std::string scheme = o.scheme().empty() ? (o.compress() ? "flat" : "flat_fp32") : o.scheme();
  const bool offload = o.device() != plan.device();
  return scheme + " " + std::string(Name(o.device())) + (offload ? " (offloaded)" : "");
}

std::string OptionsSummary(const pb::Plan& plan) { return OptionCounts(plan) + " (groups per option)"; }

std::string OptionCounts(const pb::Plan& plan) {
  std::vector<std::pair<std::string, int>> counts;
  for (const auto& g : plan.groups()) {
    const std::string name = OptionName(plan, g.options());
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == name; });
    if (it == counts.end())
      counts.emplace_back(name, 1);
    else
      ++it->second;
  }
  std::string s;
  for (const auto& [name, n] : counts) s += (s.empty() ? "" : ", ") + std::to_string(n) + " x " + name;
  return s;
}

StatusOr<pb::Plan> ReadPlanOrRung(const std::string& path, std::optional<double> rung) {
  CUPCAKE_ASSIGN_OR_RETURN(Plans plans, ReadPlansFile(path));
  return SelectPlan(plans, path, rung);
}

StatusOr<pb::Plan> SelectPlan(const Plans& plans, const std::string& path, std::optional<double> rung) {
  if (plans.single) {
    if (rung) return InvalidArgumentError(path + ": --rung: the file holds a single plan, not a ladder");
    return plans.ladder.rungs(0).plan();
  }
  if (!rung)
    return InvalidArgumentError(path + ": a ladder of " + std::to_string(plans.ladder.rungs_size()) +
                                " plans; expected --rung RATIO, one of " + RungRatios(plans.ladder));
  CUPCAKE_ASSIGN_OR_RETURN(const pb::Rung* r, FindRung(plans.ladder, *rung, path));
  return r->plan();
}

void AddRungFlag(boost::program_options::options_description& flags, double* rung) {
  flags.add_options()(
      "rung", boost::program_options::value(rung),
      "a ladder's rung: its ratio (1 for the fp32 rung; a PowerSGD rung's is the bytes it sends over the dense "
      "gradient's), as `show LADDER` lists them");
}

void PrintTable(const std::vector<std::vector<std::string>>& rows, const std::function<bool(size_t)>& left,
                std::ostream& out) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()), 0);
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  for (const auto& r : rows) {
    std::string line = " ";
    for (size_t c = 0; c < r.size(); ++c) {
      const bool last = c + 1 == r.size();
      const std::string pad(width[c] - r[c].size(), ' ');
      line += " " + (left(c) || last ? r[c] + (last ? "" : pad) : pad + r[c]);
    }
    out << line << "\n";
  }
}

void PrintLadder(const pb::Ladder& ladder, std::ostream& out) {
  std::vector<std::vector<std::string>> rows = {
      {"ratio", "compressor", "groups", "predicted ms", "vs fp32 rung", "search", "options chosen"}};
  const double dense = ladder.rungs(0).plan().predicted().iteration_us();
  for (const pb::Rung& r : ladder.rungs()) {
    const pb::Plan& p = r.plan();
    char speedup[32];
    std::snprintf(speedup, sizeof speedup, "%.2fx", dense / p.predicted().iteration_us());
    const std::string compressor =
        IsPowerSgdRung(p) ? p.compressor().name() + ", powersgd rank " + std::to_string(p.compressor().rank())
                          : p.compressor().name();
    rows.push_back({FormatDouble(r.ratio()), compressor, std::to_string(p.groups_size()),
                    Ms(p.predicted().iteration_us()), speedup, p.search().optimal() ? "optimal" : "not proven",
                    p.search().search_space().empty() ? "-" : OptionsSummary(p)});
  }
  PrintTable(
      rows, [](size_t c) { return c == 1 || c == 5; }, out);
}

void PrintSummary(const pb::Plan& plan, std::ostream& out) {
  const pb::Model& m = plan.model().model();
  int64_t parameters = 0, bytes = 0;
  for (const auto& t : m.tensors()) {
    parameters += t.numel();
    bytes += t.numel() * DTypeBytes(t.dtype());
  }
  const pb::CompressorSpec& c = plan.compressor();
  const CompressorInfo* info = FindCompressor(c.name());
  std::ostringstream params;
  if (info != nullptr && info->uses_ratio) params << "ratio " << c.ratio();
  if (info != nullptr && info->uses_seed) params << (params.str().empty() ? "" : ", ") << "seed " << c.seed();
  if (c.zen_union() > 0) params << (params.str().empty() ? "" : ", ") << "zen union " << c.zen_union();
  if (c.rank() > 0) params << (params.str().empty() ? "" : ", ") << "powersgd rank " << c.rank();
  const pb::Predicted& p = plan.predicted();
  const double t = p.iteration_us();

  out << "model       " << m.name() << ": " << m.tensors_size() << " tensors, " << parameters << " parameters ("
      << tools::HumanBytes(bytes) << " of gradients)\n";
  out << "profile     " << plan.profile_name() << ": world size " << plan.world_size() << "\n";
  if (!plan.profile_source().empty()) out << "source      " << plan.profile_source() << "\n";
  // An options plan may leave the compressor out of some groups (fp32, fp16): say what runs.
  const bool others = std::any_of(plan.groups().begin(), plan.groups().end(), [](const pb::Group& g) {
    const SchemeInfo* s = FindScheme(g.options().scheme());
    return s != nullptr && s->codec != Codec::kCompressor;
  });
  // PowerSGD groups keep their own error feedback whatever the plan compressor's memory is.
  const bool low_rank = std::any_of(plan.groups().begin(), plan.groups().end(), [](const pb::Group& g) {
    const SchemeInfo* s = FindScheme(g.options().scheme());
    return s != nullptr && s->codec == Codec::kLowRank;
  });
  out << "compressor  " << c.name() << (params.str().empty() ? "" : " (" + params.str() + ")") << ", memory "
      << c.memory() << (low_rank && c.memory() != "residual" ? " (powersgd groups: residual)" : "") << ", on "
      << Name(plan.device())
      << (others ? "; chosen: " + OptionCounts(plan) : std::string()) << "\n";
  out << "groups      " << plan.groups_size() << "\n";
  out << "predicted   " << Ms(t) << " ms per iteration (backward " << Ms(p.backward_us()) << " ms; summed over groups: "
      << "encode " << Ms(p.encode_us()) << " ms, comm " << Ms(p.comm_us()) << " ms, decode " << Ms(p.decode_us())
      << " ms)\n";
  for (int i = 0; i < plan.baselines_size(); ++i) {
    const pb::Baseline& b = plan.baselines(i);
    char speedup[32];
    std::snprintf(speedup, sizeof speedup, "%.2fx", t > 0 ? b.iteration_us() / t : 0.0);
    out << (i == 0 ? "speedup     " : "            ") << speedup << " over " << b.name() << " (" << Ms(b.iteration_us())
        << " ms, " << b.groups() << (b.groups() == 1 ? " group" : " groups") << ")\n";
  }
  const pb::SearchStats& s = plan.search();
  out << "search      " << s.algorithm() << ": " << s.nodes() << " nodes, " << s.states() << " states, " << s.pruned()
      << " pruned";
  if (s.budget() > 0) out << ", budget " << s.budget() << " nodes";
  const auto algorithm = planner::ParseAlgorithm(s.algorithm());
  if (algorithm.ok() && planner::IsFixedStrategy(*algorithm)) {
    out << ", a fixed strategy (no search)\n";
  } else if (algorithm.ok() && *algorithm == planner::Algorithm::kEspresso) {
    out << ", a heuristic (not proven optimal)\n";
  } else if (s.optimal() || s.lower_bound_us() <= 0) {
    out << ", " << (s.optimal() ? "proven optimal" : "NOT proven optimal (budget exhausted)") << "\n";
  } else {
    char gap[64];
    std::snprintf(gap, sizeof gap, "%.2f%%", t > 0 ? (t - s.lower_bound_us()) / t * 100.0 : 0.0);
    out << ", NOT proven optimal (budget exhausted): within " << gap << " of the optimum (lower bound "
        << Ms(s.lower_bound_us()) << " ms)\n";
  }
  if (!s.search_space().empty()) out << "space       " << s.search_space() << ": " << OptionsSummary(plan) << "\n";
}

std::string Extrapolations(const pb::Plan& plan) {
  std::string s;
  for (const pb::Extrapolation& e : plan.extrapolations()) {
    if (e.unit() == "ratio") {
      s += (s.empty() ? "\"" : "; \"") + e.curve() + "\" read at ratio " + FormatDouble(e.max_size()) +
           ", outside the ratios the profile measured (nearest " + FormatDouble(e.last_size()) + ")";
      continue;
    }
    auto size = [&](double v) {
      const auto n = static_cast<int64_t>(v);
      return e.unit() == "elements" ? tools::HumanCount(n) + " elements" : tools::HumanBytes(n);
    };
    char factor[32];
    std::snprintf(factor, sizeof factor, "%.1fx", e.last_size() > 0 ? e.max_size() / e.last_size() : 0.0);
    s += (s.empty() ? "\"" : "; \"") + e.curve() + "\" read at " + size(e.max_size()) + ", " + factor +
         " its last measured point (" + size(e.last_size()) + ")";
  }
  return s;
}

std::string ExtrapolationWarning(const pb::Plan& plan) {
  const std::string curves = Extrapolations(plan);
  if (curves.empty()) return "";
  return "warning: the plan relies on curves beyond their last measured point by more than 2x, or at a ratio the "
         "profile did not measure, where their times are extrapolated: " +
         curves +
         "; measure larger sizes (cupcake-profile comm --max-bytes auto, kernels --max-elements auto) and the plan's "
         "ratio (kernels --ratios) to plan on measured times\n";
}

}  // namespace cupcake::plan_cli::internal

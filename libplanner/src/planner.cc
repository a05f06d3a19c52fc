#include "cupcake/planner/planner.h"

#include <algorithm>

#include "cupcake/planner/options.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/host_load.h"
#include "cupcake/proto/names.h"

namespace cupcake::planner {
namespace {

// The plan's `predicted`, alike in every search space: each stage's sum over the groups of its
// duration on the predicted timeline (comm_us: each group's [comm_start_us, comm_end_us], so a
// collective slowed beside busy cores counts as slowed; docs/FORMATS.md).
struct StageSums {
  double encode_us = 0, comm_us = 0, decode_us = 0;
};

void FillPredicted(double iteration_us, double backward_us, const StageSums& sums, pb::Plan& plan) {
  pb::Predicted* pred = plan.mutable_predicted();
  pred->set_iteration_us(iteration_us);
  pred->set_backward_us(backward_us);
  pred->set_encode_us(sums.encode_us);
  pred->set_comm_us(sums.comm_us);
  pred->set_decode_us(sums.decode_us);
}

void FillGroups(const Problem& p, const Timeline& t, pb::Plan& plan) {
  plan.clear_groups();
  StageSums sums;
  for (const GroupTimes& g : t.groups) {
    pb::Group* out = plan.add_groups();
    out->set_first_tensor(g.first);
    out->set_last_tensor(g.last);
    out->mutable_options()->set_compress(p.compress);
    out->mutable_options()->set_device(p.device);
    out->mutable_options()->set_collective(p.compressor->collective);
    out->set_numel(p.GroupNumel(g.first, g.last));
    out->set_payload_bytes(p.PayloadOf(out->numel()));
    out->set_encode_start_us(g.encode_start_us);
    out->set_encode_end_us(g.encode_end_us);
    out->set_comm_start_us(g.comm_start_us);
    out->set_comm_end_us(g.comm_end_us);
    out->set_decode_start_us(g.decode_start_us);
    out->set_decode_end_us(g.decode_end_us);
    sums.encode_us += g.cost.enc_us;
    sums.comm_us += g.comm_end_us - g.comm_start_us;
    sums.decode_us += g.cost.dec_us;
  }
  FillPredicted(t.iteration_us, p.backward_prefix.back(), sums, plan);
}

void AddBaseline(pb::Plan& plan, const std::string& name, const Problem& p, const std::vector<int>& ends) {
  pb::Baseline* b = plan.add_baselines();
  b->set_name(name);
  b->set_groups(static_cast<int32_t>(ends.size()));
  b->set_iteration_us(IterationTime(p, ends));
}

// Keeps `max_size` as the largest size the plan reads `curve` at.
struct CurveUse {
  const Curve* curve;
  const std::string* key;
  const char* unit;
  double max_size = 0;
};

void FillOptionGroups(const OptionProblem& p, const OptionTimeline& t, pb::Plan& plan) {
  plan.clear_groups();
  StageSums sums;
  for (const OptionGroupTimes& g : t.groups) {
    const Option& o = p.options[static_cast<size_t>(g.option)];
    pb::Group* out = plan.add_groups();
    out->set_first_tensor(g.first);
    out->set_last_tensor(g.last);
    out->set_numel(p.base.GroupNumel(g.first, g.last));
    const LowRankSizes low_rank = p.base.GroupLowRank(g.first, g.last, o.scheme->batched);
    ApplyScheme(*o.scheme, *p.base.compressor, o.device, GroupStepRatio(p, *o.scheme, g.first, g.last),
                p.base.zen_union, p.ranks(), *out, &low_rank);
    out->clear_steps();  // with their bytes and times below
    out->set_encode_start_us(g.pre_start_us);
    out->set_encode_end_us(g.pre_end_us);
    out->set_comm_start_us(g.comm_start_us);
    out->set_comm_end_us(g.comm_end_us);
    out->set_decode_start_us(g.post_start_us);
    out->set_decode_end_us(g.post_end_us);
    for (const auto& st : g.steps) {
      pb::Step* step = out->add_steps();
      step->set_op(st.op);
      step->set_scope(st.scope);
      step->set_bytes(st.bytes);
      step->set_start_us(st.start_us);
      step->set_end_us(st.end_us);
    }
    sums.encode_us += g.cost.pre();
    sums.comm_us += g.comm_end_us - g.comm_start_us;
    sums.decode_us += g.cost.post();
  }
  FillPredicted(t.iteration_us, p.base.backward_prefix.back(), sums, plan);
}

// As FindExtrapolations, over every curve the chosen options read (keyed by curve).
std::vector<pb::Extrapolation> FindOptionExtrapolations(const OptionProblem& p, const OptionTimeline& t) {
  std::vector<CurveUse> uses;
  auto use = [&](const Curve& c, const std::string& key, const char* unit, double size) {
    if (key.empty()) return;
    for (CurveUse& u : uses)
      if (*u.key == key) {
        u.max_size = std::max(u.max_size, size);
        return;
      }
    uses.push_back({&c, &key, unit, size});
  };
  for (const OptionGroupTimes& g : t.groups) {
    const Option& o = p.options[static_cast<size_t>(g.option)];
    const OptionCurves& c = p.curves[static_cast<size_t>(g.option)];
    const double s = static_cast<double>(p.base.GroupBytes(g.first, g.last));
    const double n = KernelElements(p, *o.scheme, g.first, g.last, true);
    const double m = KernelElements(p, *o.scheme, g.first, g.last, false);
    if (g.last > g.first && !o.offload) {
      use(p.base.pack, p.base.pack_key, "bytes", s);
      use(p.base.unpack, p.base.unpack_key, "bytes", s);
    }
    use(c.pre_kernel, c.pre_key, "elements", n);
    use(c.mid_encode, c.mid_encode_key, "elements", m);
    for (size_t i = 0; i < g.steps.size(); ++i) {
      use(c.steps[i], c.step_keys[i], "bytes", static_cast<double>(g.steps[i].bytes));
      use(c.steps_busy[i], c.step_busy_keys[i], "bytes", static_cast<double>(g.steps[i].bytes));
    }
    if (!g.steps.empty()) use(c.first_chained, c.first_chained_key, "bytes", static_cast<double>(g.steps[0].bytes));
    use(c.mid_decode, c.mid_decode_key, "elements", m);
    use(c.post_kernel, c.post_key, "elements", n);
  }
  std::vector<pb::Extrapolation> out;
  for (const CurveUse& u : uses) {
    if (u.curve->empty() || u.max_size <= kExtrapolationFactor * u.curve->last_size()) continue;
    pb::Extrapolation e;
    e.set_curve(*u.key);
    e.set_last_size(u.curve->last_size());
    e.set_max_size(u.max_size);
    e.set_unit(u.unit);
    out.push_back(std::move(e));
  }
  for (const OptionGroupTimes& g : t.groups) {  // kernel curves read at an unmeasured ratio
    for (const pb::Extrapolation& note : p.curves[static_cast<size_t>(g.option)].ratio_notes) {
      if (std::none_of(out.begin(), out.end(),
                       [&](const pb::Extrapolation& e) { return e.unit() == "ratio" && e.curve() == note.curve(); }))
        out.push_back(note);
    }
  }
  return out;
}

// The plan's fields every search space fills alike.
void FillHeader(const pb::Model& model, const pb::Profile& profile, const Problem& problem, const PlanRequest& request,
                const std::string& memory, pb::Plan& plan) {
  plan.set_format(kPlanFormat);
  *plan.mutable_model()->mutable_model() = model;
  plan.mutable_model()->set_fingerprint(ModelFingerprint(model));
  plan.set_profile_fingerprint(ProfileFingerprint(profile));
  plan.set_profile_name(profile.cluster().name());
  const std::string busy = BusyNote(profile.cluster());
  plan.set_profile_source(busy.empty() ? profile.cluster().source()
                                       : profile.cluster().source() + (profile.cluster().source().empty() ? "" : "; ") + busy);
  plan.set_world_size(problem.world_size);
  plan.set_device(problem.device);
  pb::CompressorSpec* spec = plan.mutable_compressor();
  spec->set_name(std::string(problem.compressor->name));
  spec->set_ratio(problem.compressor->uses_ratio ? problem.ratio : 0.0);
  spec->set_memory(memory);
  spec->set_seed(problem.compressor->uses_seed || problem.rank > 0 ? request.seed : 0);  // PowerSGD's first Q
  spec->set_zen_union(problem.zen_union);
  spec->set_rank(problem.rank);
}

Status AddV1Baselines(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                      const Problem& problem, pb::Plan& plan) {
  AddBaseline(plan, "layerwise", problem, LayerwiseStrategy(problem));
  AddBaseline(plan, "one_group", problem, OneGroupStrategy(problem));
  AddBaseline(plan, "bucket_25mib", problem, BucketStrategy(problem, int64_t{25} << 20));
  AddBaseline(plan, "bucket_64mib", problem, BucketStrategy(problem, int64_t{64} << 20));
  // No compression: fp32 allreduce in 25 MiB buckets, on the same profile.
  PlanRequest fp32 = request;
  fp32.compressor = "fp32";
  fp32.device = problem.device;
  CUPCAKE_ASSIGN_OR_RETURN(Problem dense, MakeProblem(model, profile, fp32));
  AddBaseline(plan, "fp32_bucket_25mib", dense, BucketStrategy(dense, int64_t{25} << 20));
  return Status::Ok();
}

// The search's record; `search_space` only for the options space (fusion plans keep the field
// unset, as plans from before the options space).
void FillSearchStats(const SearchStats& found, const SearchOptions& options, pb::Plan& plan) {
  pb::SearchStats* st = plan.mutable_search();
  st->set_algorithm(found.algorithm);
  st->set_nodes(found.transitions);
  st->set_states(found.states);
  st->set_pruned(found.pruned);
  st->set_budget(options.algorithm == Algorithm::kBranchAndBound ? options.node_budget : 0);
  st->set_optimal(found.optimal);
  if (options.space == SearchSpace::kOptions) st->set_search_space(SearchSpaceName(SearchSpace::kOptions));
}

// The fusion space's groups, extrapolations, baselines and search record.
Status FillFusionPlan(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                      const SearchOptions& options, const Problem& problem, pb::Plan& plan) {
  CUPCAKE_ASSIGN_OR_RETURN(SearchResult found, Search(problem, options));
  FillGroups(problem, Evaluate(problem, found.group_ends), plan);
  for (pb::Extrapolation& e : FindExtrapolations(problem, found.group_ends)) *plan.add_extrapolations() = std::move(e);
  CUPCAKE_RETURN_IF_ERROR(AddV1Baselines(model, profile, request, problem, plan));
  FillSearchStats(found.stats, options, plan);
  return Status::Ok();
}

// The options space's: as the fusion space's, plus the devices per node, each group's option and
// steps, and the search's incumbents as baselines.
Status FillOptionsPlan(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                       const SearchOptions& options, pb::Plan& plan) {
  CUPCAKE_ASSIGN_OR_RETURN(OptionProblem problem, MakeOptionProblem(model, profile, request));
  CUPCAKE_ASSIGN_OR_RETURN(OptionSearchResult found, SearchWithOptions(problem, options));
  plan.set_devices_per_node(problem.devices_per_node);
  const OptionTimeline t = EvaluateOptions(problem, found.group_ends, found.options);
  FillOptionGroups(problem, t, plan);
  for (pb::Extrapolation& e : FindOptionExtrapolations(problem, t)) *plan.add_extrapolations() = std::move(e);
  CUPCAKE_RETURN_IF_ERROR(AddV1Baselines(model, profile, request, problem.base, plan));
  if (!IsFixedStrategy(options.algorithm) && options.algorithm != Algorithm::kExhaustive) {
    pb::Baseline* b = plan.add_baselines();
    b->set_name("fusion_optimum");
    b->set_groups(found.espresso_groups);
    b->set_iteration_us(found.fusion_us);
    b = plan.add_baselines();
    b->set_name("espresso");
    b->set_groups(found.espresso_groups);
    b->set_iteration_us(found.espresso_us);
  }
  FillSearchStats(found.stats, options, plan);
  if (options.algorithm == Algorithm::kBranchAndBound && !found.stats.optimal)
    plan.mutable_search()->set_lower_bound_us(found.lower_bound_us);
  return Status::Ok();
}

}  // namespace

std::vector<pb::Extrapolation> FindExtrapolations(const Problem& p, std::span<const int> group_ends) {
  CurveUse pack{&p.pack, &p.pack_key, "bytes"}, encode{&p.encode, &p.encode_key, "elements"},
      comm{&p.comm, &p.comm_key, "bytes"}, comm_busy{&p.comm_busy, &p.comm_busy_key, "bytes"},
      comm_chained{&p.comm_chained, &p.comm_chained_key, "bytes"}, decode{&p.decode, &p.decode_key, "elements"},
      unpack{&p.unpack, &p.unpack_key, "bytes"};
  int first = 0;
  for (int last : group_ends) {  // the sizes GroupPricer::Price reads
    const double n = static_cast<double>(p.GroupNumel(first, last));
    const double s = static_cast<double>(p.GroupBytes(first, last));
    if (last > first) {
      pack.max_size = std::max(pack.max_size, s);
      unpack.max_size = std::max(unpack.max_size, s);
    }
    if (p.compress) {
      encode.max_size = std::max(encode.max_size, n);
      decode.max_size = std::max(decode.max_size, n);
    }
    comm.max_size = std::max(comm.max_size, static_cast<double>(p.PayloadOf(p.GroupNumel(first, last))));
    comm_busy.max_size = comm_chained.max_size = comm.max_size;  // read at the same payloads (empty without)
    first = last + 1;
  }
  std::vector<pb::Extrapolation> out;
  for (const CurveUse* u : {&pack, &encode, &comm, &comm_busy, &comm_chained, &decode, &unpack}) {
    if (u->curve->empty() || u->max_size <= kExtrapolationFactor * u->curve->last_size()) continue;
    pb::Extrapolation e;
    e.set_curve(*u->key);
    e.set_last_size(u->curve->last_size());
    e.set_max_size(u->max_size);
    e.set_unit(u->unit);
    out.push_back(std::move(e));
  }
  out.insert(out.end(), p.ratio_notes.begin(), p.ratio_notes.end());
  return out;
}

StatusOr<pb::Plan> MakePlan(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                            const SearchOptions& options) {
  CUPCAKE_ASSIGN_OR_RETURN(Problem problem, MakeProblem(model, profile, request));
  const std::string memory =
      request.memory.empty() ? std::string(problem.compressor->default_memory) : request.memory;  // CheckRequest
  pb::Plan plan;
  FillHeader(model, profile, problem, request, memory, plan);
  CUPCAKE_RETURN_IF_ERROR(options.space == SearchSpace::kOptions
                              ? FillOptionsPlan(model, profile, request, options, plan)
                              : FillFusionPlan(model, profile, request, options, problem, plan));
  return plan;
}

PlanRequest RequestOf(const pb::Plan& plan) {
  PlanRequest r;
  r.compressor = plan.compressor().name();
  if (plan.compressor().ratio() > 0) r.ratio = plan.compressor().ratio();
  r.device = plan.device();
  r.memory = plan.compressor().memory();
  r.seed = plan.compressor().seed();
  r.zen_union = plan.compressor().zen_union();
  r.rank = plan.compressor().rank();
  return r;
}

StatusOr<Timeline> Simulate(const pb::Plan& plan, const pb::Model& model, const pb::Profile& profile) {
  const std::string want = plan.model().fingerprint();
  const std::string got = ModelFingerprint(model);
  if (want != got)
    return FailedPreconditionError("model " + model.name() + ": model fingerprint differs; got " + got + ", expected " +
                                   want + " (the plan was made for model " + plan.model().model().name() + ")");
  bool has_options = false;
  for (const auto& g : plan.groups()) has_options = has_options || !g.options().scheme().empty();
  if (!has_options) {
    CUPCAKE_ASSIGN_OR_RETURN(Problem problem, MakeProblem(model, profile, RequestOf(plan)));
    std::vector<int> ends;
    for (const auto& g : plan.groups()) ends.push_back(g.last_tensor());
    return Evaluate(problem, ends);
  }
  CUPCAKE_ASSIGN_OR_RETURN(OptionProblem problem, MakeOptionProblem(model, profile, RequestOf(plan)));
  std::vector<int> ends, options;
  for (int k = 0; k < plan.groups_size(); ++k) {
    const pb::Group& g = plan.groups(k);
    ends.push_back(g.last_tensor());
    const std::string scheme =
        g.options().scheme().empty() ? (g.options().compress() ? "flat" : "flat_fp32") : g.options().scheme();
    const int o = FindOption(problem, scheme, g.options().device());
    if (o < 0) {
      std::string why;
      for (const std::string& d : problem.DroppedReasons(scheme)) why += "; " + d;
      return FailedPreconditionError("profile " + profile.cluster().name() + ": groups[" + std::to_string(k) +
                                     "]: option " + scheme + " on " + std::string(Name(g.options().device())) +
                                     " cannot be priced on this profile" + why);
    }
    options.push_back(o);
  }
  const OptionTimeline ot = EvaluateOptions(problem, ends, options);
  Timeline t;
  t.iteration_us = ot.iteration_us;
  for (const OptionGroupTimes& g : ot.groups) {
    GroupTimes out;
    out.first = g.first;
    out.last = g.last;
    out.cost = {.enc_us = g.cost.pre(),
                .com_us = g.cost.net,
                .com_busy_us = g.cost.net_busy,
                .chain_us = g.cost.chain,
                .dec_us = g.cost.post()};
    out.encode_start_us = g.pre_start_us;
    out.encode_end_us = g.pre_end_us;
    out.comm_start_us = g.comm_start_us;
    out.comm_end_us = g.comm_end_us;
    out.decode_start_us = g.post_start_us;
    out.decode_end_us = g.post_end_us;
    t.groups.push_back(out);
  }
  return t;
}

}  // namespace cupcake::planner

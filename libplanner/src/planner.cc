#include "cupcake/planner/planner.h"

#include <algorithm>

#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/names.h"

namespace cupcake::planner {
namespace {

void FillGroups(const Problem& p, const Timeline& t, pb::Plan& plan) {
  plan.clear_groups();
  double enc = 0, com = 0, dec = 0;
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
    enc += g.cost.enc_us;
    com += g.cost.com_us;
    dec += g.cost.dec_us;
  }
  pb::Predicted* pred = plan.mutable_predicted();
  pred->set_iteration_us(t.iteration_us);
  pred->set_backward_us(p.backward_prefix.back());
  pred->set_encode_us(enc);
  pred->set_comm_us(com);
  pred->set_decode_us(dec);
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

}  // namespace

std::vector<pb::Extrapolation> FindExtrapolations(const Problem& p, std::span<const int> group_ends) {
  CurveUse pack{&p.pack, &p.pack_key, "bytes"}, encode{&p.encode, &p.encode_key, "elements"},
      comm{&p.comm, &p.comm_key, "bytes"}, decode{&p.decode, &p.decode_key, "elements"},
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
    first = last + 1;
  }
  std::vector<pb::Extrapolation> out;
  for (const CurveUse* u : {&pack, &encode, &comm, &decode, &unpack}) {
    if (u->curve->empty() || u->max_size <= kExtrapolationFactor * u->curve->last_size()) continue;
    pb::Extrapolation e;
    e.set_curve(*u->key);
    e.set_last_size(u->curve->last_size());
    e.set_max_size(u->max_size);
    e.set_unit(u->unit);
    out.push_back(std::move(e));
  }
  return out;
}

StatusOr<pb::Plan> MakePlan(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                            const SearchOptions& options) {
  CUPCAKE_ASSIGN_OR_RETURN(Problem problem, MakeProblem(model, profile, request));
  std::string memory = request.memory.empty() ? std::string(problem.compressor->default_memory) : request.memory;
  auto memories = MemoryNames();
  if (std::find(memories.begin(), memories.end(), memory) == memories.end())
    return InvalidArgumentError("--memory: unknown memory '" + memory + "'" + DidYouMean(memory, memories) +
                                "; expected residual, dgc or none");
  CUPCAKE_ASSIGN_OR_RETURN(SearchResult found, Search(problem, options));

  pb::Plan plan;
  plan.set_format(kPlanFormat);
  *plan.mutable_model()->mutable_model() = model;
  plan.mutable_model()->set_fingerprint(ModelFingerprint(model));
  plan.set_profile_fingerprint(ProfileFingerprint(profile));
  plan.set_profile_name(profile.cluster().name());
  plan.set_world_size(problem.world_size);
  plan.set_device(problem.device);
  pb::CompressorSpec* spec = plan.mutable_compressor();
  spec->set_name(std::string(problem.compressor->name));
  spec->set_ratio(problem.compressor->uses_ratio ? problem.ratio : 0.0);
  spec->set_memory(memory);
  spec->set_seed(problem.compressor->uses_seed ? request.seed : 0);
  FillGroups(problem, Evaluate(problem, found.group_ends), plan);
  for (pb::Extrapolation& e : FindExtrapolations(problem, found.group_ends)) *plan.add_extrapolations() = std::move(e);

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

  pb::SearchStats* st = plan.mutable_search();
  st->set_algorithm(found.stats.algorithm);
  st->set_nodes(found.stats.transitions);
  st->set_states(found.stats.states);
  st->set_pruned(found.stats.pruned);
  st->set_budget(options.algorithm == Algorithm::kBranchAndBound ? options.node_budget : 0);
  st->set_optimal(found.stats.optimal);
  return plan;
}

PlanRequest RequestOf(const pb::Plan& plan) {
  PlanRequest r;
  r.compressor = plan.compressor().name();
  if (plan.compressor().ratio() > 0) r.ratio = plan.compressor().ratio();
  r.device = plan.device();
  r.memory = plan.compressor().memory();
  r.seed = plan.compressor().seed();
  return r;
}

StatusOr<Timeline> Simulate(const pb::Plan& plan, const pb::Model& model, const pb::Profile& profile) {
  const std::string want = plan.model().fingerprint();
  const std::string got = ModelFingerprint(model);
  if (want != got)
    return FailedPreconditionError("model " + model.name() + ": model fingerprint differs; got " + got + ", expected " +
                                   want + " (the plan was made for model " + plan.model().model().name() + ")");
  CUPCAKE_ASSIGN_OR_RETURN(Problem problem, MakeProblem(model, profile, RequestOf(plan)));
  std::vector<int> ends;
  for (const auto& g : plan.groups()) ends.push_back(g.last_tensor());
  return Evaluate(problem, ends);
}

}  // namespace cupcake::planner

#include "cupcake/planner/cost_model.h"

#include <algorithm>
#include <sstream>

#include "cupcake/proto/names.h"

namespace cupcake::planner {
namespace {

Status MissingCurve(const pb::Profile& profile, const std::string& key) {
  std::string kind = key.substr(0, key.find(' '));
  std::string have;
  for (const auto& c : profile.curves()) {
    std::string k = CurveKey(c);
    if (k.compare(0, kind.size() + 1, kind + " ") == 0) have += (have.empty() ? "" : ", ") + k.substr(kind.size() + 1);
  }
  return NotFoundError("profile " + profile.cluster().name() + ": curve \"" + key + "\" not found; the profile has " +
                       kind + " curves for: " + (have.empty() ? "none" : have));
}

// The kernel curve for the plan's compressor, or the missing-curve error.
StatusOr<KernelCurve> RequireKernelCurve(const pb::Profile& profile, pb::CurveKind kind, const Problem& p) {
  std::optional<KernelCurve> c = FindKernelCurve(profile, kind, p.compressor->name, p.device, p.ratio);
  if (!c)
    return MissingCurve(
        profile, std::string(Name(kind)) + " " + std::string(p.compressor->name) + " " + std::string(Name(p.device)));
  return std::move(*c);
}

// Whether the profile has an encode curve on `d`, of `compressor` (empty: of any codec).
bool HasKernelCurves(const pb::Profile& profile, std::string_view compressor, pb::Device d) {
  for (const auto& c : profile.curves())
    if (c.kind() == pb::ENCODE && (compressor.empty() || c.compressor() == compressor) && c.device() == d) return true;
  return false;
}

}  // namespace

const pb::Curve* FindProfileCurve(const pb::Profile& profile, const std::string& key) {
  for (const auto& c : profile.curves())
    if (CurveKey(c) == key) return &c;
  return nullptr;
}

std::optional<KernelCurve> FindKernelCurve(const pb::Profile& profile, pb::CurveKind kind, std::string_view name,
                                           pb::Device device, double ratio) {
  const CompressorInfo* info = FindCompressor(name);
  const bool by_ratio = name == kZenCurveName || name == kNonzeroCurveName || (info != nullptr && info->uses_ratio);
  const pb::Curve* unrecorded = nullptr;
  std::vector<const pb::Curve*> recorded;  // ascending ratio
  for (const auto& c : profile.curves()) {
    if (c.kind() != kind || c.compressor() != name || c.device() != device) continue;
    if (!c.has_ratio())
      unrecorded = &c;
    else if (by_ratio)
      recorded.push_back(&c);
  }
  if (recorded.empty()) {
    if (unrecorded == nullptr) return std::nullopt;
    return KernelCurve{Curve(*unrecorded), CurveKey(*unrecorded), std::nullopt};
  }
  std::sort(recorded.begin(), recorded.end(),
            [](const pb::Curve* a, const pb::Curve* b) { return a->ratio() < b->ratio(); });
  auto nearest = [&](const pb::Curve* c) {
    pb::Extrapolation note;
    note.set_curve(CurveKey(*c));
    note.set_last_size(c->ratio());
    note.set_max_size(ratio);
    note.set_unit("ratio");
    return KernelCurve{Curve(*c), CurveKey(*c), std::move(note)};
  };
  if (ratio < recorded.front()->ratio()) return nearest(recorded.front());
  if (ratio > recorded.back()->ratio()) return nearest(recorded.back());
  size_t hi = 0;
  while (recorded[hi]->ratio() < ratio) ++hi;
  const pb::Curve& b = *recorded[hi];
  if (b.ratio() == ratio) return KernelCurve{Curve(b), CurveKey(b), std::nullopt};
  // ratio lies strictly between a's and b's: both curves at the union of their sizes, weighted.
  const pb::Curve& a = *recorded[hi - 1];
  const Curve ca(a), cb(b);
  const double w = (ratio - a.ratio()) / (b.ratio() - a.ratio());
  std::vector<double> sizes;
  for (const pb::Curve* c : {&a, &b})
    for (const pb::Point& pt : c->points()) sizes.push_back(static_cast<double>(pt.size()));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<double> times;
  times.reserve(sizes.size());
  for (double s : sizes) times.push_back((1.0 - w) * ca.At(s) + w * cb.At(s));
  return KernelCurve{Curve(std::move(sizes), std::move(times)), CurveKey(a) + " + " + CurveKey(b), std::nullopt};
}

Status CheckRequest(const PlanRequest& request) {
  if (FindCompressor(request.compressor) == nullptr) return UnknownCompressorError("--compressor", request.compressor);
  CUPCAKE_RETURN_IF_ERROR(ValidateRatio("--ratio", request.ratio));
  CUPCAKE_RETURN_IF_ERROR(ValidateZenUnion("--zen-union", request.zen_union));
  if (request.rank < 0 || request.rank > kMaxPowerSgdRank)
    return InvalidArgumentError("--rank: out of range; got " + std::to_string(request.rank) + ", expected 1 <= rank <= " +
                                std::to_string(kMaxPowerSgdRank) + " (PowerSGD's rank), or none");
  for (const std::string& name : request.schemes)
    if (FindScheme(name) == nullptr)
      return InvalidArgumentError("--schemes: unknown scheme; got \"" + name + "\", expected some of " + SchemeNames());
  auto memories = MemoryNames();
  if (!request.memory.empty() && std::find(memories.begin(), memories.end(), request.memory) == memories.end())
    return InvalidArgumentError("--memory: unknown memory '" + request.memory + "'" +
                                DidYouMean(request.memory, memories) + "; expected residual, dgc or none");
  return Status::Ok();
}

LowRankSizes Problem::GroupLowRank(int first, int last, bool batched) const {
  const auto count = static_cast<size_t>(last - first + 1);
  return PowerSgdSizes(std::span(shapes).subspan(static_cast<size_t>(first), count),
                       std::span(numel).subspan(static_cast<size_t>(first), count), rank, batched);
}

StatusOr<Problem> MakeProblem(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request) {
  CUPCAKE_RETURN_IF_ERROR(CheckRequest(request));
  Problem p;
  p.compressor = FindCompressor(request.compressor);
  p.ratio = request.ratio;
  // Only zen groups read it (the plan keeps 0 where there can be none: a compressor without
  // sparse pairs and a model without sparse gradients).
  p.zen_union = SchemeCodecProblem(*FindScheme("zen"), *p.compressor).empty() || HasSparseGradients(model)
                    ? request.zen_union
                    : 0;
  p.compress = p.compressor->name != "fp32";
  if (model.tensors().empty())
    return InvalidArgumentError("model " + model.name() + ": tensors: empty; expected at least one tensor");

  const int n = model.tensors_size();
  p.numel.reserve(n);
  p.numel_prefix.assign(1, 0);
  p.bytes_prefix.assign(1, 0);
  p.backward_prefix.assign(1, 0.0);
  p.nonzero_prefix.assign(1, 0);
  int64_t sparse_numel = 0, sparse_nonzeros = 0;
  for (int i = 0; i < n; ++i) {
    const auto& t = model.tensors(i);
    if (t.dtype() != pb::FLOAT32) {
      std::ostringstream os;
      os << "model " << model.name() << ": tensors[" << i << "] (" << t.name() << "): dtype not supported; got "
         << Name(t.dtype()) << ", expected float32";
      return InvalidArgumentError(os.str());
    }
    p.numel.push_back(t.numel());
    p.bytes.push_back(t.numel() * DTypeBytes(t.dtype()));
    p.backward_us.push_back(t.backward_us());
    p.numel_prefix.push_back(p.numel_prefix.back() + t.numel());
    p.bytes_prefix.push_back(p.bytes_prefix.back() + p.bytes.back());
    p.backward_prefix.push_back(p.backward_prefix.back() + t.backward_us());
    p.nonzero_prefix.push_back(p.nonzero_prefix.back() + ExpectedNonzeros(t));
    p.shapes.emplace_back(t.shape().begin(), t.shape().end());
    if (IsSparseGradient(t)) {
      sparse_numel += t.numel();
      sparse_nonzeros += ExpectedNonzeros(t);
    }
  }
  if (sparse_numel > 0) p.sparse_density = static_cast<double>(sparse_nonzeros) / static_cast<double>(sparse_numel);
  p.forward_us = model.forward_us();
  p.update_us = model.update_us();
  p.rank = request.rank;

  const auto& cluster = profile.cluster();
  p.world_size = cluster.nodes() * cluster.devices_per_node();
  if (p.world_size < 1) {
    std::ostringstream os;
    os << "profile " << cluster.name() << ": cluster: world size must be positive; got nodes " << cluster.nodes()
       << " x devices_per_node " << cluster.devices_per_node();
    return InvalidArgumentError(os.str());
  }

  // Device: as requested, else the one whose curves the profile has, gpu if both. An fp32 plan
  // runs no codec of its own, but its per-group options (fp16, PowerSGD) do: it follows the
  // profile's codec curves of any kind.
  p.device = request.device;
  if (p.device == pb::DEVICE_UNSPECIFIED) {
    const std::string_view codec = p.compress ? std::string_view(request.compressor) : std::string_view();
    p.device = !HasKernelCurves(profile, codec, pb::GPU) && HasKernelCurves(profile, codec, pb::CPU) ? pb::CPU : pb::GPU;
  }
  if (p.compress) {
    CUPCAKE_ASSIGN_OR_RETURN(KernelCurve encode, RequireKernelCurve(profile, pb::ENCODE, p));
    CUPCAKE_ASSIGN_OR_RETURN(KernelCurve decode, RequireKernelCurve(profile, pb::DECODE, p));
    for (KernelCurve* c : {&encode, &decode})
      if (c->ratio_note) p.ratio_notes.push_back(*c->ratio_note);
    p.encode = std::move(encode.curve);
    p.encode_key = std::move(encode.key);
    p.decode = std::move(decode.curve);
    p.decode_key = std::move(decode.key);
  }
  // The curve of the call the runtime makes: fp16 payloads are summed as halves, which costs
  // otherwise than a float32 sum (an MPI user-defined operation); a profile from before such
  // curves were measured has only the float32 one, which then stands in.
  std::string comm_key = "comm " + std::string(Name(p.compressor->collective)) + " global";
  if (p.compress && p.compressor->payload == PayloadFormula::kDense16 &&
      FindProfileCurve(profile, comm_key + " float16"))
    comm_key += " float16";
  const pb::Curve* comm = FindProfileCurve(profile, comm_key);
  if (!comm) return MissingCurve(profile, comm_key);
  p.comm = Curve(*comm);
  p.comm_key = comm_key;
  if (const pb::Curve* busy = FindProfileCurve(profile, comm_key + " busy")) {
    p.comm_busy = Curve(*busy);
    p.comm_busy_key = comm_key + " busy";
  }
  if (const pb::Curve* chained = FindProfileCurve(profile, comm_key + " chained")) {
    p.comm_chained = Curve(*chained);
    p.comm_chained_key = comm_key + " chained";
    p.comm_chained_tail_us = ChainedTailUs(p.comm_chained, p.comm);
  }
  const std::string device(Name(p.device));
  if (const pb::Curve* c = FindProfileCurve(profile, "copy pack " + device)) {
    p.pack = Curve(*c);
    p.pack_key = "copy pack " + device;
  }
  if (const pb::Curve* c = FindProfileCurve(profile, "copy unpack " + device)) {
    p.unpack = Curve(*c);
    p.unpack_key = "copy unpack " + device;
  }
  return p;
}

void GroupPricer::Start(int first) {
  first_ = first;
  pack_.Reset();
  encode_.Reset();
  comm_.Reset();
  comm_busy_.Reset();
  comm_chained_.Reset();
  decode_.Reset();
  unpack_.Reset();
}

double ChainedTailUs(const Curve& chained, const Curve& spaced) {
  if (chained.empty()) return 0.0;
  const double last = chained.last_size();
  return std::max(0.0, chained.At(last) - spaced.At(last));
}

GroupCost GroupPricer::Price(int last) {
  const int64_t n = p_.GroupNumel(first_, last);
  const double s = static_cast<double>(p_.GroupBytes(first_, last));
  const bool fused = last > first_;  // a fused group is packed and unpacked
  GroupCost c;
  c.enc_us = (fused ? pack_.At(s) : 0.0) + (p_.compress ? encode_.At(static_cast<double>(n)) : 0.0);
  const double payload = static_cast<double>(p_.PayloadOf(n));
  c.com_us = comm_.At(payload);
  c.com_busy_us = p_.comm_busy.empty() ? c.com_us : std::max(c.com_us, comm_busy_.At(payload));
  c.chain_us = ChainUs(p_.comm_chained, comm_chained_, p_.comm_chained_tail_us, payload, c.com_us);
  c.dec_us = (p_.compress ? decode_.At(static_cast<double>(n)) : 0.0) + (fused ? unpack_.At(s) : 0.0);
  return c;
}

GroupCost CostOfGroup(const Problem& p, int first, int last) {
  GroupPricer pricer(p);
  pricer.Start(first);
  return pricer.Price(last);
}

Timeline Evaluate(const Problem& p, std::span<const int> group_ends) {
  CUPCAKE_CHECK(!group_ends.empty());
  CUPCAKE_CHECK_EQ(group_ends.back(), p.size() - 1);
  Timeline t;
  t.groups.reserve(group_ends.size());
  double encode_total = 0;
  std::optional<double> network_free;  // the previous collective's end
  int first = 0;
  for (int last : group_ends) {
    CUPCAKE_CHECK_LE(first, last);
    GroupTimes g;
    g.first = first;
    g.last = last;
    g.cost = CostOfGroup(p, first, last);
    // The compute stream runs backward and every encode in order: C_k.
    g.encode_start_us = p.backward_prefix[last + 1] + encode_total;
    encode_total += g.cost.enc_us;
    g.encode_end_us = g.encode_start_us + g.cost.enc_us;
    // The network runs collectives in group order: F_k, slowed while the compute stream has
    // backward or encodes left (busy cores), and after a collective that ended less than
    // chain_us before it was ready (chained collectives).
    // comm_start_us is when the runtime issues it; the chained part of its time follows.
    g.comm_start_us = std::max(g.encode_end_us, network_free.value_or(0.0));
    g.comm_end_us = CommEnd(CommStart(g.encode_end_us, network_free, g.cost.chain_us), g.cost.com_us,
                            g.cost.com_busy_us, p.backward_prefix.back() + encode_total);
    network_free = g.comm_end_us;
    t.groups.push_back(g);
    first = last + 1;
  }
  // Decodes run on the compute stream after backward and every encode, in group order: D_k.
  double compute_free = t.groups.back().encode_end_us;
  for (auto& g : t.groups) {
    g.decode_start_us = std::max(compute_free, g.comm_end_us);
    g.decode_end_us = g.decode_start_us + g.cost.dec_us;
    compute_free = g.decode_end_us;
  }
  t.iteration_us = p.forward_us + compute_free + p.update_us;
  return t;
}

double IterationTime(const Problem& p, std::span<const int> group_ends) { return Evaluate(p, group_ends).iteration_us; }

std::vector<int> LayerwiseStrategy(const Problem& p) {
  std::vector<int> ends(p.size());
  for (int i = 0; i < p.size(); ++i) ends[i] = i;
  return ends;
}

std::vector<int> OneGroupStrategy(const Problem& p) { return {p.size() - 1}; }

std::vector<int> BucketStrategy(const Problem& p, int64_t cap_bytes) {
  std::vector<int> ends;
  int64_t bucket = 0;
  for (int i = 0; i < p.size(); ++i) {
    bucket += p.bytes[i];
    if (bucket >= cap_bytes || i == p.size() - 1) {
      ends.push_back(i);
      bucket = 0;
    }
  }
  return ends;
}

}  // namespace cupcake::planner

#include "cupcake/planner/options.h"

#include <algorithm>
#include <cmath>

#include "cupcake/proto/names.h"

namespace cupcake::planner {
namespace {

bool HasCodec(const SchemeInfo& s) { return s.codec != Codec::kNone; }
bool EncodesBeforeNetwork(const SchemeInfo& s) { return HasCodec(s) && s.encode_before == 0; }
bool DecodesAfterNetwork(const SchemeInfo& s) { return HasCodec(s) && s.decode_after == s.step_count - 1; }
bool EncodesInNetwork(const SchemeInfo& s) { return HasCodec(s) && s.encode_before > 0; }
bool DecodesInNetwork(const SchemeInfo& s) { return HasCodec(s) && s.decode_after < s.step_count - 1; }
// Zen's work inside the network block (the pairs split by owner, the owners' merge-sum, the
// partition's encode), placed after the payload step: the "encode zen" curve, or in a profile
// without Zen's curves one more decode of the group by the codec's decode curve (docs/MODEL.md,
// "The zen scheme").
bool MergesInNetwork(const SchemeInfo& s) { return HasCodec(s) && s.zen; }
// The codec's decode curve read inside the network block: a decode between steps or Zen's merge.
bool ReadsDecodeInNetwork(const SchemeInfo& s) { return DecodesInNetwork(s) || MergesInNetwork(s); }
// PowerSGD's work between its two allreduces (P orthogonalized, Q = M^T P): one more product of
// the encode's size, priced by the codec's encode curve (docs/MODEL.md, "PowerSGD").
bool ComputesBetweenSteps(const SchemeInfo& s) { return s.codec == Codec::kLowRank; }
// The codec's encode curve read inside the network block.
bool ReadsEncodeInNetwork(const SchemeInfo& s) { return EncodesInNetwork(s) || ComputesBetweenSteps(s); }

// The ratio at which Zen's decode curve is read. Its work is a function of n and the union
// (the W partitions decoded, merged and scattered), and `cupcake-profile kernels` measures it
// with independent selections, whose union at ratio r is n (1 - (1 - r)^W). A measured union
// share S (PlanRequest::zen_union) makes the union S W r n, which independent selections
// reach at r' = 1 - (1 - S W r)^(1/W) (docs/MODEL.md, "A measured union"). The merge is read
// at the plan's ratio: it sorts the k pairs each rank sent, whatever their overlap.
double ZenDecodeRatio(const Problem& p, double ratio) {
  if (p.zen_union <= 0) return ratio;
  const double w = static_cast<double>(std::max(1, p.world_size));
  return 1.0 - std::pow(1.0 - std::min(1.0, p.zen_union * w * ratio), 1.0 / w);
}

// The ratio an option's kernel curves are read at: the plan's, or for the non-zero codec the
// model's sparse share (docs/MODEL.md, "Naturally sparse gradients").
double CurveRatio(const Problem& p, const SchemeInfo& s) {
  return s.codec == Codec::kNonzeros ? p.sparse_density : p.ratio;
}

// Resolves one option's curves; returns the key of the first missing curve, or "".
std::string ResolveCurves(const pb::Profile& profile, const Problem& base, const Option& o, OptionCurves& out) {
  const SchemeInfo& s = *o.scheme;
  const CompressorInfo& codec = CodecCompressor(s, *base.compressor);
  const std::string dev(Name(o.device));
  // Zen's own curves (`zen`: the kind of Zen's curve to read first) stand in for the codec's
  // decode where the profile has them.
  // The non-zero codec has no decode of its own: Zen's curves are required.
  const double ratio = CurveRatio(base, s);
  auto kernel = [&](pb::CurveKind kind, Curve& curve, std::string& key, std::optional<pb::CurveKind> zen) {
    std::optional<KernelCurve> c;
    if (zen) {
      c = FindKernelCurve(profile, *zen, kZenCurveName, o.device,
                          *zen == pb::DECODE ? ZenDecodeRatio(base, ratio) : ratio);
      if (!c && s.codec == Codec::kNonzeros) {
        key = std::string(Name(*zen)) + " " + std::string(kZenCurveName) + " " + dev;
        return false;
      }
    }
    if (!c) c = FindKernelCurve(profile, kind, codec.name, o.device, ratio);
    if (!c) {
      key = std::string(Name(kind)) + " " + std::string(codec.name) + " " + dev;
      return false;
    }
    curve = std::move(c->curve);
    key = std::move(c->key);
    if (c->ratio_note) out.ratio_notes.push_back(*c->ratio_note);
    return true;
  };
  const auto zen_merge = MergesInNetwork(s) ? std::optional(pb::ENCODE) : std::nullopt;
  const auto zen_decode = s.zen ? std::optional(pb::DECODE) : std::nullopt;
  if (EncodesBeforeNetwork(s) && !kernel(pb::ENCODE, out.pre_kernel, out.pre_key, std::nullopt)) return out.pre_key;
  if (ReadsEncodeInNetwork(s) && !kernel(pb::ENCODE, out.mid_encode, out.mid_encode_key, std::nullopt))
    return out.mid_encode_key;
  if (ReadsDecodeInNetwork(s) && !kernel(pb::DECODE, out.mid_decode, out.mid_decode_key, zen_merge))
    return out.mid_decode_key;
  if (DecodesAfterNetwork(s) && !kernel(pb::DECODE, out.post_kernel, out.post_key, zen_decode)) return out.post_key;
  for (int i = 0; i < s.step_count; ++i) {
    const SchemeStep& step = s.steps[i];
    std::string key =
        "comm " + std::string(Name(StepOp(s, step, *base.compressor))) + " " + std::string(Name(step.scope));
    // fp16 payloads are summed as halves: that curve when the profile has it (as v1).
    if (step.payload && codec.payload == PayloadFormula::kDense16 && FindProfileCurve(profile, key + " float16"))
      key += " float16";
    const pb::Curve* c = FindProfileCurve(profile, key);
    if (c == nullptr) return key;
    out.steps.emplace_back(*c);
    const pb::Curve* busy = FindProfileCurve(profile, key + " busy");
    out.steps_busy.push_back(busy != nullptr ? Curve(*busy) : Curve());
    out.step_busy_keys.push_back(busy != nullptr ? key + " busy" : "");
    out.step_keys.push_back(key);
    if (i == 0)
      if (const pb::Curve* chained = FindProfileCurve(profile, key + " chained")) {
        out.first_chained = Curve(*chained);
        out.first_chained_tail_us = ChainedTailUs(out.first_chained, out.steps[0]);
        out.first_chained_key = key + " chained";
      }
  }
  return "";
}

// Why the table's scheme is not offered for this plan, or "" when it is.
std::string Duplicate(const SchemeInfo& s, const CompressorInfo& compressor) {
  if (s.codec == Codec::kCompressor && compressor.name == "fp32") return "the compressor is fp32 (see flat_fp32)";
  if (s.codec == Codec::kFp16 && compressor.name == "fp16") return "the compressor is fp16 (see flat, hier)";
  return "";
}

}  // namespace

std::vector<std::string> OptionProblem::DroppedReasons(const std::string& scheme) const {
  std::vector<std::string> out;
  for (const std::string& d : dropped)
    if (d.rfind(scheme + " ", 0) == 0 || d.rfind(scheme + ":", 0) == 0) out.push_back(d);
  return out;
}

std::string Option::Name() const {
  return std::string(scheme->name) + " " + std::string(cupcake::Name(device)) + (offload ? " (offloaded)" : "");
}

StatusOr<OptionProblem> MakeOptionProblem(const pb::Model& model, const pb::Profile& profile,
                                          const PlanRequest& request) {
  OptionProblem p;
  CUPCAKE_ASSIGN_OR_RETURN(p.base, MakeProblem(model, profile, request));
  p.nodes = profile.cluster().nodes();
  p.devices_per_node = profile.cluster().devices_per_node();
  const Problem& b = p.base;

  // Host copies, tensor by tensor, for offloaded groups (GPU plans only).
  const pb::Curve* d2h = FindProfileCurve(profile, "copy d2h gpu");
  const pb::Curve* h2d = FindProfileCurve(profile, "copy h2d gpu");
  const bool can_offload = b.device == pb::GPU && d2h != nullptr && h2d != nullptr;
  if (b.device == pb::GPU && !can_offload)
    p.dropped.push_back("every offloaded option: the profile lacks \"copy d2h gpu\" or \"copy h2d gpu\"");
  p.d2h_prefix.assign(1, 0.0);
  p.h2d_prefix.assign(1, 0.0);
  if (can_offload) {
    const Curve d(*d2h), h(*h2d);
    for (int i = 0; i < b.size(); ++i) {
      p.d2h_prefix.push_back(p.d2h_prefix.back() + d.At(static_cast<double>(b.bytes[i])));
      p.h2d_prefix.push_back(p.h2d_prefix.back() + h.At(static_cast<double>(b.bytes[i])));
    }
  }

  p.fusion_option = -1;
  const std::string_view fusion_scheme = b.compress ? "flat" : "flat_fp32";
  for (const SchemeInfo& s : Schemes()) {
    if (std::string why = Duplicate(s, *b.compressor); !why.empty()) continue;
    if (!request.schemes.empty() && s.name != fusion_scheme &&
        std::find(request.schemes.begin(), request.schemes.end(), s.name) == request.schemes.end()) {
      p.dropped.push_back(std::string(s.name) + ": not in --schemes");
      continue;
    }
    if (std::string why = SchemeCodecProblem(s, *b.compressor); !why.empty()) {
      p.dropped.push_back(why);
      continue;
    }
    if (s.codec == Codec::kLowRank && b.rank < 1) {
      p.dropped.push_back(std::string(s.name) + ": no PowerSGD rank given (--rank)");
      continue;
    }
    if (s.codec == Codec::kNonzeros && b.sparse_density <= 0) {
      p.dropped.push_back(std::string(s.name) + ": the model records no sparse gradient (no tensor density <= 0.5)");
      continue;
    }
    if (s.codec == Codec::kNonzeros && b.device != pb::CPU) {
      p.dropped.push_back(std::string(s.name) + ": runs on host memory only (a cpu plan)");
      continue;
    }
    if (s.hierarchical && (p.nodes < 2 || p.devices_per_node < 2)) {
      p.dropped.push_back(std::string(s.name) + ": one node or one device per node (nothing to split)");
      continue;
    }
    std::vector<Option> candidates = {{&s, b.device, false}};
    // The runtime offloads flat schemes only (PowerSGD's middle step runs between its allreduces).
    if (can_offload && s.codec != Codec::kNonzeros && s.codec != Codec::kLowRank)
      candidates.push_back({&s, pb::CPU, true});
    for (const Option& o : candidates) {
      OptionCurves curves;
      const std::string missing = ResolveCurves(profile, b, o, curves);
      if (!missing.empty()) {
        p.dropped.push_back(o.Name() + ": the profile lacks \"" + missing + "\"");
        continue;
      }
      if (!o.offload && s.name == fusion_scheme) p.fusion_option = static_cast<int>(p.options.size());
      p.options.push_back(o);
      p.curves.push_back(std::move(curves));
    }
  }
  // MakeProblem resolved the plan's own option, so it is always offered.
  CUPCAKE_CHECK_GE(p.fusion_option, 0);
  // A scheme asked for by name that cannot be offered is the user's to fix, not to drop quietly.
  std::string refused;
  for (const std::string& name : request.schemes) {
    if (std::any_of(p.options.begin(), p.options.end(), [&](const Option& o) { return o.scheme->name == name; }))
      continue;
    for (const std::string& d : p.DroppedReasons(name)) refused += "\n  " + d;
    if (const SchemeInfo* s = FindScheme(name); s != nullptr && !Duplicate(*s, *b.compressor).empty())
      refused += "\n  " + name + ": " + Duplicate(*s, *b.compressor);
  }
  if (!refused.empty()) return InvalidArgumentError("--schemes: not offered for this plan:" + refused);
  return p;
}

OptionPricer::OptionPricer(const OptionProblem& p) : p_(p), pack_(p.base.pack), unpack_(p.base.unpack) {
  cursors_.reserve(p.curves.size());
  for (const OptionCurves& c : p.curves) {
    Cursors k{CurveCursor(c.pre_kernel),
              CurveCursor(c.mid_encode),
              CurveCursor(c.mid_decode),
              CurveCursor(c.post_kernel),
              {},
              {},
              CurveCursor(c.first_chained)};
    for (const Curve& s : c.steps) k.steps.emplace_back(s);
    for (const Curve& s : c.steps_busy) k.steps_busy.emplace_back(s);
    cursors_.push_back(std::move(k));
  }
  // An option's steps read the same curves at the same bytes as every option of its scheme (the
  // collectives' curves do not depend on where the codec runs).
  step_twin_.resize(p.options.size());
  scheme_costs_.resize(p.options.size());
  for (size_t o = 0; o < p.options.size(); ++o) {
    const SchemeInfo& s = *p.options[o].scheme;
    shapes_.push_back({EncodesBeforeNetwork(s), DecodesAfterNetwork(s), ReadsEncodeInNetwork(s), ReadsDecodeInNetwork(s)});
    step_twin_[o] = o;
    for (size_t t = 0; t < o; ++t)
      if (p.options[t].scheme == p.options[o].scheme) {
        step_twin_[o] = t;
        break;
      }
  }
}

void OptionPricer::Start(int first) {
  first_ = first;
  pack_.Reset();
  unpack_.Reset();
  for (Cursors& k : cursors_) {
    k.pre.Reset();
    k.mid_encode.Reset();
    k.mid_decode.Reset();
    k.post.Reset();
    for (CurveCursor& c : k.steps) c.Reset();
    for (CurveCursor& c : k.steps_busy) c.Reset();
    k.first_chained.Reset();
  }
}

void OptionPricer::Price(int last, std::span<StageCost> out, int only) {
  const Problem& b = p_.base;
  const int64_t n = b.GroupNumel(first_, last);
  const double s = static_cast<double>(b.GroupBytes(first_, last));
  const bool fused = last > first_;
  const double pack = fused ? pack_.At(s) : 0.0;
  const double unpack = fused ? unpack_.At(s) : 0.0;
  const double d2h = p_.d2h_prefix.size() > 1 ? p_.d2h_prefix[last + 1] - p_.d2h_prefix[first_] : 0.0;
  const double h2d = p_.h2d_prefix.size() > 1 ? p_.h2d_prefix[last + 1] - p_.h2d_prefix[first_] : 0.0;
  for (size_t o = 0; o < p_.options.size(); ++o) {
    if (only >= 0 && o != static_cast<size_t>(only)) continue;
    const Option& opt = p_.options[o];
    const SchemeInfo& scheme = *opt.scheme;
    Cursors& k = cursors_[o];
    const Shape& shape = shapes_[o];
    // What depends on the scheme alone, computed by its first option (or by `only`).
    const size_t twin = only >= 0 ? o : step_twin_[o];
    SchemeCosts& sc = scheme_costs_[twin];
    if (twin == o) {
      sc.m = KernelElements(p_, scheme, first_, last, false);
      sc.x = KernelElements(p_, scheme, first_, last, true);
      const double ratio = GroupStepRatio(p_, scheme, first_, last);
      const LowRankSizes low_rank =
          scheme.codec == Codec::kLowRank ? b.GroupLowRank(first_, last, scheme.batched) : LowRankSizes{};
      sc.idle = sc.busy_extra = sc.chain = 0;  // busy_extra: what the steps' busy curves add to the idle ones
      for (int i = 0; i < scheme.step_count; ++i) {
        const auto bytes = static_cast<double>(
            StepBytes(scheme, scheme.steps[i], *b.compressor, n, ratio, p_.ranks(), b.zen_union, &low_rank));
        const double idle = k.steps[static_cast<size_t>(i)].At(bytes);
        sc.idle += idle;
        if (!p_.curves[o].steps_busy[static_cast<size_t>(i)].empty())
          sc.busy_extra += std::max(0.0, k.steps_busy[static_cast<size_t>(i)].At(bytes) - idle);
        if (i == 0)
          sc.chain =
              ChainUs(p_.curves[o].first_chained, k.first_chained, p_.curves[o].first_chained_tail_us, bytes, idle);
      }
    }
    StageCost c;
    const double pre_kernel = shape.encode_before ? k.pre.At(sc.x) : 0.0;
    const double post_kernel = shape.decode_after ? k.post.At(sc.x) : 0.0;
    if (opt.offload) {
      c.cpu_pre = d2h + pre_kernel;
      c.cpu_post = post_kernel + h2d;
    } else {
      c.gpu_pre = pack + pre_kernel;
      c.gpu_post = post_kernel + unpack;
    }
    c.net = sc.idle;
    if (shape.encode_in_network) c.net += k.mid_encode.At(sc.m);
    if (shape.reads_decode_in_network) c.net += k.mid_decode.At(sc.m);
    c.net_busy = c.net + sc.busy_extra;
    c.chain = sc.chain;
    out[o] = c;
  }
}

double GroupStepRatio(const OptionProblem& p, const SchemeInfo& s, int first, int last) {
  if (s.codec != Codec::kNonzeros) return p.base.ratio;
  return static_cast<double>(p.base.GroupNonzeros(first, last)) / static_cast<double>(p.base.GroupNumel(first, last));
}

double KernelElements(const OptionProblem& p, const SchemeInfo& s, int first, int last, bool whole) {
  const int64_t n = p.base.GroupNumel(first, last);
  if (s.codec == Codec::kLowRank) return static_cast<double>(p.base.GroupLowRank(first, last, s.batched).work);
  if (s.codec == Codec::kNonzeros)
    return std::max(static_cast<double>(n),
                    static_cast<double>(p.base.GroupNonzeros(first, last)) / p.base.sparse_density);
  return static_cast<double>(whole ? n : ShardElements(s, n, p.devices_per_node));
}

StageCost CostOfOption(const OptionProblem& p, int option, int first, int last) {
  OptionPricer pricer(p);
  pricer.Start(first);
  std::vector<StageCost> all(p.options.size());
  pricer.Price(last, all);
  return all[static_cast<size_t>(option)];
}

// The network block's steps, back to back from `start`, with the in-network encode before
// step encode_before and decode after step decode_after (docs/MODEL.md, "Stages"); each
// stretched alike when busy cores slow the block ([comm_start_us, comm_end_us] over net).
static void PlaceSteps(const OptionProblem& p, OptionGroupTimes& g, double start) {
  const Option& o = p.options[static_cast<size_t>(g.option)];
  const SchemeInfo& s = *o.scheme;
  const OptionCurves& curves = p.curves[static_cast<size_t>(g.option)];
  const int64_t n = p.base.GroupNumel(g.first, g.last);
  const double m = KernelElements(p, s, g.first, g.last, false);
  const double ratio = GroupStepRatio(p, s, g.first, g.last);
  const LowRankSizes low_rank =
      s.codec == Codec::kLowRank ? p.base.GroupLowRank(g.first, g.last, s.batched) : LowRankSizes{};
  const double stretch = g.cost.net > 0 ? (g.comm_end_us - g.comm_start_us) / g.cost.net : 1.0;
  double t = start;
  for (int i = 0; i < s.step_count; ++i) {
    if (EncodesInNetwork(s) && i == s.encode_before) t += stretch * curves.mid_encode.At(m);
    if (ComputesBetweenSteps(s) && i == 1) t += stretch * curves.mid_encode.At(m);
    const int64_t bytes =
        StepBytes(s, s.steps[i], *p.base.compressor, n, ratio, p.ranks(), p.base.zen_union, &low_rank);
    const double dur = stretch * curves.steps[static_cast<size_t>(i)].At(static_cast<double>(bytes));
    g.steps.push_back({StepOp(s, s.steps[i], *p.base.compressor), s.steps[i].scope, bytes, t, t + dur});
    t += dur;
    if (DecodesInNetwork(s) && i == s.decode_after) t += stretch * curves.mid_decode.At(m);
    if (MergesInNetwork(s) && i == PayloadStep(s)) t += stretch * curves.mid_decode.At(m);
  }
}

OptionTimeline EvaluateOptions(const OptionProblem& p, std::span<const int> group_ends, std::span<const int> options) {
  CUPCAKE_CHECK(!group_ends.empty());
  CUPCAKE_CHECK_EQ(group_ends.size(), options.size());
  CUPCAKE_CHECK_EQ(group_ends.back(), p.size() - 1);
  OptionTimeline t;
  double e = 0, cpu = 0;  // E, G
  std::optional<double> network;  // F: the previous collective's end
  int first = 0;
  for (size_t k = 0; k < group_ends.size(); ++k) {
    const int last = group_ends[k];
    CUPCAKE_CHECK_LE(first, last);
    OptionGroupTimes g;
    g.first = first;
    g.last = last;
    g.option = options[k];
    CUPCAKE_CHECK(g.option >= 0 && g.option < p.option_count());
    g.cost = CostOfOption(p, g.option, first, last);
    const double ready = p.base.backward_prefix[static_cast<size_t>(last) + 1] + e;  // A_k before its own pre
    if (p.options[static_cast<size_t>(g.option)].offload) {
      g.pre_start_us = std::max(ready, cpu);
      g.pre_end_us = g.pre_start_us + g.cost.cpu_pre;
      cpu = g.pre_end_us;
    } else {
      g.pre_start_us = ready;
      g.pre_end_us = ready + g.cost.gpu_pre;
      e += g.cost.gpu_pre;
    }
    g.comm_start_us = std::max(g.pre_end_us, network.value_or(0.0));  // issued; then its chained part
    g.comm_end_us = CommEnd(CommStart(g.pre_end_us, network, g.cost.chain), g.cost.net, g.cost.net_busy,
                            p.base.backward_prefix.back() + e);
    network = g.comm_end_us;
    PlaceSteps(p, g, g.comm_start_us);
    t.groups.push_back(std::move(g));
    first = last + 1;
  }
  // Decodes: the compute stream after backward and every on-device pre stage; the CPU worker
  // after its last encode. Each in group order.
  double compute = p.base.backward_prefix.back() + e;
  for (auto& g : t.groups) {
    double& free = p.options[static_cast<size_t>(g.option)].offload ? cpu : compute;
    g.post_start_us = std::max(free, g.comm_end_us);
    g.post_end_us = g.post_start_us + g.cost.post();
    free = g.post_end_us;
  }
  t.iteration_us = p.base.forward_us + std::max(compute, cpu) + p.base.update_us;
  return t;
}

// One pass with docs/MODEL.md's label recurrences (v2, step 1): both decode chains are
// (max, +)-linear in their start, so they are carried from 0 and their starts added at the end.
double IterationFromCosts(const OptionProblem& p, std::span<const int> group_ends, std::span<const int> options,
                          std::span<const StageCost> costs) {
  TimelineState s;
  for (size_t k = 0; k < group_ends.size(); ++k)
    s.Add(p, group_ends[k], p.options[static_cast<size_t>(options[k])].offload, costs[k]);
  return s.Final(p);
}

void TimelineState::Add(const OptionProblem& p, int last, bool offload, const StageCost& c) {
  const double b = p.base.backward_prefix[static_cast<size_t>(last) + 1];
  const double busy_until = p.base.backward_prefix.back() + e + (offload ? 0.0 : c.gpu_pre);
  const std::optional<double> previous = any ? std::optional(f) : std::nullopt;
  if (offload) {
    g = std::max(b + e, g) + c.cpu_pre;
    f = CommEnd(CommStart(g, previous, c.chain), c.net, c.net_busy, busy_until);
    u = std::max(u, f) + c.cpu_post;
    v += c.cpu_post;
  } else {
    e += c.gpu_pre;
    f = CommEnd(CommStart(b + e, previous, c.chain), c.net, c.net_busy, busy_until);
    x = std::max(x, f) + c.gpu_post;
    y += c.gpu_pre + c.gpu_post;
  }
  any = true;
}

double TimelineState::Final(const OptionProblem& p) const {
  return p.base.forward_us + std::max({p.base.backward_prefix.back() + y, x, g + v, u}) + p.base.update_us;
}

double OptionIterationTime(const OptionProblem& p, std::span<const int> group_ends, std::span<const int> options) {
  return EvaluateOptions(p, group_ends, options).iteration_us;
}

int FindOption(const OptionProblem& p, std::string_view scheme, pb::Device device) {
  for (size_t o = 0; o < p.options.size(); ++o)
    if (p.options[o].scheme->name == scheme && p.options[o].device == device) return static_cast<int>(o);
  return -1;
}

}  // namespace cupcake::planner

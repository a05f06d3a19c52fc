#include "cupcake/proto/plan_io.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/limits.h"
#include "cupcake/proto/names.h"

namespace cupcake {
namespace {

// Enough to show what is wrong with a badly damaged file without flooding the terminal.
constexpr size_t kMaxProblems = 20;

class Problems {
 public:
  explicit Problems(std::string origin) : origin_(std::move(origin)) {}
  void Add(const std::string& field, const std::string& problem) {
    ++count_;
    if (lines_.size() < kMaxProblems) lines_.push_back(origin_ + ": " + field + ": " + problem);
  }
  // A line that already carries its origin and field.
  void AddLine(const std::string& line) {
    ++count_;
    if (lines_.size() < kMaxProblems) lines_.push_back(line);
  }
  const std::string& origin() const { return origin_; }
  Status ToStatus() const {
    if (count_ == 0) return Status::Ok();
    std::string m;
    for (const auto& l : lines_) m += (m.empty() ? "" : "\n") + l;
    if (count_ > lines_.size())
      m += "\n" + origin_ + ": ... and " + std::to_string(count_ - lines_.size()) + " more problems";
    return InvalidArgumentError(m);
  }

 private:
  std::string origin_;
  std::vector<std::string> lines_;
  size_t count_ = 0;
};

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

std::string Idx(const std::string& field, int i) { return field + "[" + std::to_string(i) + "]"; }

bool Finite(double x) { return std::isfinite(x); }

// Times are microseconds: finite and non-negative. A model's backward times are inputs and
// bounded like every input (limits.h); the predicted times are sums of them and are not.
void CheckTime(Problems& p, const std::string& field, double us, double max = kMaxPlanTimeUs) {
  if (!Finite(us) || us < 0 || us > max) {
    std::ostringstream os;
    os << "not a time; got " << us << ", expected a finite number >= 0 and <= " << max << " (microseconds)";
    p.Add(field, os.str());
  }
}

void CheckCount(Problems& p, const std::string& field, int64_t value) {
  if (value < 0) p.Add(field, "negative; got " + std::to_string(value) + ", expected >= 0");
}

// `later` must not come before `earlier` (a rounding's worth of slack: the planner adds the
// same times in different orders).
void CheckOrder(Problems& p, const std::string& field, double later, const std::string& earlier_field, double earlier) {
  if (!Finite(later) || !Finite(earlier)) return;  // reported as not a time
  if (later >= earlier - 1e-9 * std::max(1.0, std::abs(earlier))) return;
  std::ostringstream os;
  os << "out of order; got " << later << ", expected >= " << earlier << " (" << earlier_field << ")";
  p.Add(field, os.str());
}

void CheckModel(Problems& p, const pb::PlanModel& pm) {
  const pb::Model& m = pm.model();
  if (m.name().empty()) p.Add("model.model.name", "missing; expected the model's name");
  if (m.tensors().empty()) p.Add("model.model.tensors", "empty; expected at least one tensor (model " + m.name() + ")");
  if (m.tensors_size() > kMaxTensors)
    p.Add("model.model.tensors",
          "too many; got " + std::to_string(m.tensors_size()) + ", expected at most " + std::to_string(kMaxTensors));
  for (int i = 0; i < m.tensors_size(); ++i) {
    const auto& t = m.tensors(i);
    const std::string f = Idx("model.model.tensors", i);
    if (t.name().empty()) p.Add(f + ".name", "missing; expected a non-empty name");
    if (t.numel() <= 0 || t.numel() > kMaxNumel)
      p.Add(f + ".numel",
            "out of range; got " + std::to_string(t.numel()) + ", expected 1 <= x <= " + std::to_string(kMaxNumel));
    CheckTime(p, f + ".backward_us", t.backward_us(), kMaxTimeUs);
    if (std::string why = DensityProblem(t); !why.empty()) p.Add(f + ".density", why);
    if (std::string why = ShapeProblem(t); !why.empty()) p.Add(f + ".shape", why);
    if (DTypeBytes(t.dtype()) == 0)
      p.Add(f + ".dtype",
            "missing; got " + std::to_string(static_cast<int>(t.dtype())) + ", expected one of " + DTypeNames());
  }
  if (m.has_forward_us()) CheckTime(p, "model.model.forward_us", m.forward_us(), kMaxTimeUs);
  if (m.has_update_us()) CheckTime(p, "model.model.update_us", m.update_us(), kMaxTimeUs);
  if (pm.fingerprint().empty()) {
    p.Add("model.fingerprint", "missing; expected " + ModelFingerprint(m) + " (model " + m.name() + ")");
  } else if (!m.tensors().empty() && pm.fingerprint() != ModelFingerprint(m)) {
    p.Add("model.fingerprint", "does not match the embedded model; got " + pm.fingerprint() + ", expected " +
                                   ModelFingerprint(m) + " (model " + m.name() + ")");
  }
}

// A curve read beyond its measurements: its key, two positive sizes in a known unit.
void CheckExtrapolation(Problems& p, const pb::Extrapolation& e, int i) {
  const std::string f = Idx("extrapolations", i);
  if (e.curve().empty()) p.Add(f + ".curve", "missing; expected the curve's key");
  for (const auto& [field, size] : {std::pair{".last_size", e.last_size()}, std::pair{".max_size", e.max_size()}}) {
    if (!(Finite(size) && size > 0 && size <= static_cast<double>(kMaxCurveSize))) {
      std::ostringstream os;
      os << "out of range; got " << size << ", expected a finite size > 0 and <= " << kMaxCurveSize;
      p.Add(f + field, os.str());
    }
  }
  if (e.unit() != "bytes" && e.unit() != "elements" && e.unit() != "ratio")
    p.Add(f + ".unit", "unknown unit; got " + Quoted(e.unit()) + ", expected one of bytes, elements, ratio");
}

void CheckCompressor(Problems& p, const pb::CompressorSpec& c) {
  const CompressorInfo* info = FindCompressor(c.name());
  if (c.name().empty()) {
    p.Add("compressor.name", "missing; expected a compressor name");
  } else if (info == nullptr) {
    p.AddLine(UnknownCompressorError(p.origin() + ": compressor.name", c.name()).message());
  }
  auto memories = MemoryNames();
  if (std::find(memories.begin(), memories.end(), c.memory()) == memories.end())
    p.Add("compressor.memory", "unknown memory; got " + Quoted(c.memory()) + ", expected one of residual, dgc, none");
  if (!(c.ratio() >= 0 && c.ratio() <= 1) || (info != nullptr && info->uses_ratio && c.ratio() == 0)) {
    std::ostringstream os;
    if (info != nullptr && info->uses_ratio)
      os << "out of range; got " << c.ratio() << ", expected in (0, 1] for " << c.name();
    else
      os << "out of range; got " << c.ratio() << ", expected in [0, 1] (unused by " << c.name() << ")";
    p.Add("compressor.ratio", os.str());
  }
  if (c.rank() < 0 || c.rank() > kMaxPowerSgdRank)
    p.Add("compressor.rank", "out of range; got " + std::to_string(c.rank()) + ", expected 0 <= rank <= " +
                                 std::to_string(kMaxPowerSgdRank) + " (0: no PowerSGD group)");
  if (Status s = ValidateZenUnion(p.origin() + ": compressor.zen_union", c.zen_union()); !s.ok())
    p.AddLine(s.message());
}

// A group's phases run in order; the groups run in order on the network (collectives) and on
// each device's chains (pre stages, post stages): the compute stream, and for groups offloaded
// to the CPU (options plans, docs/MODEL.md v2) the CPU worker. In v1 plans every group is on
// the plan's device, so each group follows the one before it.
void CheckPhaseOrder(Problems& p, const pb::Plan& plan, int k) {
  const pb::Group& g = plan.groups(k);
  const std::string f = Idx("groups", k);
  CheckOrder(p, f + ".encode_end_us", g.encode_end_us(), f + ".encode_start_us", g.encode_start_us());
  CheckOrder(p, f + ".comm_start_us", g.comm_start_us(), f + ".encode_end_us", g.encode_end_us());
  CheckOrder(p, f + ".comm_end_us", g.comm_end_us(), f + ".comm_start_us", g.comm_start_us());
  CheckOrder(p, f + ".decode_start_us", g.decode_start_us(), f + ".comm_end_us", g.comm_end_us());
  CheckOrder(p, f + ".decode_end_us", g.decode_end_us(), f + ".decode_start_us", g.decode_start_us());
  double step_end = g.comm_start_us();
  std::string step_end_field = f + ".comm_start_us";
  for (int i = 0; i < g.steps_size(); ++i) {
    const pb::Step& st = g.steps(i);
    const std::string sf = f + Idx(".steps", i);
    CheckTime(p, sf + ".start_us", st.start_us());
    CheckTime(p, sf + ".end_us", st.end_us());
    CheckOrder(p, sf + ".start_us", st.start_us(), step_end_field, step_end);
    CheckOrder(p, sf + ".end_us", st.end_us(), sf + ".start_us", st.start_us());
    step_end = st.end_us();
    step_end_field = sf + ".end_us";
  }
  if (g.steps_size() > 0) CheckOrder(p, f + ".comm_end_us", g.comm_end_us(), step_end_field, step_end);
  if (k > 0) {
    const pb::Group& prev = plan.groups(k - 1);
    const std::string pf = Idx("groups", k - 1);
    CheckOrder(p, f + ".comm_start_us", g.comm_start_us(), pf + ".comm_end_us", prev.comm_end_us());
  }
  for (int j = k - 1; j >= 0; --j) {
    const pb::Group& prev = plan.groups(j);
    if (prev.options().device() != g.options().device()) continue;
    const std::string pf = Idx("groups", j);
    CheckOrder(p, f + ".encode_start_us", g.encode_start_us(), pf + ".encode_end_us", prev.encode_end_us());
    CheckOrder(p, f + ".decode_start_us", g.decode_start_us(), pf + ".decode_end_us", prev.decode_end_us());
    break;
  }
}

// A PowerSGD group's two allreduce sizes, from its tensors' shapes and the plan's rank; zeros
// for other schemes. The group's tensors are in range (the caller checked).
LowRankSizes GroupLowRank(const pb::Plan& plan, const pb::Group& g, const SchemeInfo& s) {
  if (s.codec != Codec::kLowRank) return {};
  return PowerSgdGroupSizes(plan.model().model(), g.first_tensor(), g.last_tensor(), plan.compressor().rank(),
                            s.batched);
}

// Each step of an options plan's group is the scheme's: its collective, its scope and, when
// `sized` (the group, compressor, scheme and world can be priced), its bytes per rank (what the
// planner priced).
void CheckSteps(Problems& p, const pb::Plan& plan, int k, const SchemeInfo& s, bool sized) {
  const pb::Group& g = plan.groups(k);
  const CompressorInfo* info = FindCompressor(plan.compressor().name());
  const double ratio = plan.compressor().ratio();
  const pb::Model& m = plan.model().model();
  for (int i = 0; i < g.steps_size(); ++i) {
    const pb::Step& st = g.steps(i);
    const SchemeStep& want = s.steps[i];
    const std::string sf = Idx("groups", k) + Idx(".steps", i);
    const std::string of = " (" + std::string(s.name) + " step " + std::to_string(i) + ")";
    if (info != nullptr && st.op() != StepOp(s, want, *info))
      p.Add(sf + ".op", "does not match the scheme; got " +
                            (pb::CommOp_IsValid(st.op()) ? std::string(Name(st.op())) : std::to_string(st.op())) +
                            ", expected " + std::string(Name(StepOp(s, want, *info))) + of);
    if (st.scope() != want.scope)
      p.Add(sf + ".scope", "does not match the scheme; got " +
                               (pb::Scope_IsValid(st.scope()) ? std::string(Name(st.scope())) : std::to_string(st.scope())) +
                               ", expected " + std::string(Name(want.scope)) + of);
    if (!sized) {
      if (st.bytes() <= 0) p.Add(sf + ".bytes", "must be positive; got " + std::to_string(st.bytes()));
      continue;
    }
    const LowRankSizes low_rank = GroupLowRank(plan, g, s);
    const int64_t bytes = StepBytes(s, want, *info, g.numel(), SchemeRatio(s, ratio, m, g.first_tensor(), g.last_tensor()),
                                    {plan.world_size(), plan.devices_per_node()}, plan.compressor().zen_union(),
                                    &low_rank);
    if (st.bytes() != bytes)
      p.Add(sf + ".bytes", "does not match the scheme; got " + std::to_string(st.bytes()) + ", expected " +
                               std::to_string(bytes) + of);
  }
}

// An options plan's group (docs/MODEL.md, v2): its scheme is in the catalogue, its flags agree
// with it, and its steps are the scheme's. Returns the scheme, or nullptr (v1 group or unknown).
const SchemeInfo* CheckScheme(Problems& p, const pb::Plan& plan, int k) {
  const pb::Group& g = plan.groups(k);
  const std::string f = Idx("groups", k);
  if (g.options().scheme().empty()) {
    if (g.steps_size() > 0)
      p.Add(f + ".steps", "set without options.scheme; got " + std::to_string(g.steps_size()) +
                              " steps, expected none (a v1 group has one collective)");
    return nullptr;
  }
  const SchemeInfo* s = FindScheme(g.options().scheme());
  if (s == nullptr) {
    p.Add(f + ".options.scheme",
          "unknown scheme; got " + Quoted(g.options().scheme()) + ", expected one of " + SchemeNames());
    return nullptr;
  }
  if (g.options().compress() != (s->codec != Codec::kNone))
    p.Add(f + ".options.compress",
          std::string("does not match the scheme; got ") + (g.options().compress() ? "true" : "false") + ", expected " +
              (s->codec != Codec::kNone ? "true" : "false") + " (" + std::string(s->name) + ")");
  if (g.options().device() != plan.device() && !(plan.device() == pb::GPU && g.options().device() == pb::CPU))
    p.Add(f + ".options.device", "not the plan's device and not an offload to the CPU; got " +
                                     std::string(Name(g.options().device())) + ", plan device " +
                                     std::string(Name(plan.device())));
  if (s->hierarchical && (plan.devices_per_node() < 2 || plan.world_size() % plan.devices_per_node() != 0 ||
                          plan.world_size() / plan.devices_per_node() < 2))
    p.Add(f + ".options.scheme",
          "hierarchical on a plan without several nodes of several devices; got "
          "devices_per_node " +
              std::to_string(plan.devices_per_node()) + ", world_size " + std::to_string(plan.world_size()) +
              ", expected devices_per_node >= 2 dividing world_size into >= 2 nodes");
  if (const CompressorInfo* info = FindCompressor(plan.compressor().name()); info != nullptr) {
    if (std::string why = SchemeCodecProblem(*s, *info); !why.empty()) p.Add(f + ".options.scheme", why);
  }
  if (s->codec == Codec::kLowRank && plan.compressor().rank() < 1)
    p.Add(f + ".options.scheme", std::string(s->name) + " needs the plan's compressor.rank; got " +
                                     std::to_string(plan.compressor().rank()) + ", expected rank >= 1");
  if (g.steps_size() != s->step_count)
    p.Add(f + ".steps", "do not match the scheme; got " + std::to_string(g.steps_size()) + " steps, expected " +
                            std::to_string(s->step_count) + " (" + std::string(s->name) + ")");
  return s;
}

void CheckGroups(Problems& p, const pb::Plan& plan) {
  const pb::Model& m = plan.model().model();
  const int n = m.tensors_size();
  const std::string of_model = " (model " + m.name() + ")";
  if (plan.groups().empty()) {
    p.Add("groups", "empty; expected groups covering tensors 0.." + std::to_string(n - 1) + of_model);
    return;
  }
  // The compressor every group's payload and collective are checked against (reported
  // elsewhere when unknown or its ratio is out of range).
  const CompressorInfo* info = FindCompressor(plan.compressor().name());
  const double ratio = plan.compressor().ratio();
  const bool ratio_ok = info != nullptr && (!info->uses_ratio || (ratio > 0 && ratio <= 1));
  int expected_first = 0;
  bool in_range = true;
  for (int k = 0; k < plan.groups_size(); ++k) {
    const pb::Group& g = plan.groups(k);
    const std::string f = Idx("groups", k);
    bool ok = true;
    if (g.first_tensor() < 0 || g.first_tensor() >= n) {
      p.Add(f + ".first_tensor", "out of range; got " + std::to_string(g.first_tensor()) + ", expected 0 <= x < " +
                                     std::to_string(n) + of_model);
      ok = false;
    } else if (g.first_tensor() != expected_first) {
      p.Add(f + ".first_tensor", "not contiguous; got " + std::to_string(g.first_tensor()) + ", expected " +
                                     std::to_string(expected_first) +
                                     (k == 0 ? " (the first group starts at tensor 0)"
                                             : " (groups[" + std::to_string(k - 1) + "].last_tensor + 1)"));
    }
    if (g.last_tensor() < 0 || g.last_tensor() >= n) {
      p.Add(f + ".last_tensor",
            "out of range; got " + std::to_string(g.last_tensor()) + ", expected < " + std::to_string(n) + of_model);
      ok = false;
    }
    if (ok && g.first_tensor() > g.last_tensor()) {
      p.Add(f, "first_tensor after last_tensor; got " + std::to_string(g.first_tensor()) + " > " +
                   std::to_string(g.last_tensor()) + ", expected first_tensor <= last_tensor");
      ok = false;
    }
    if (ok) {
      // Tensors out of range are reported by CheckModel; the sum is checked over bounded ones
      // only (at most 2^20 x 2^40 elements: no overflow).
      int64_t numel = 0;
      bool bounded = true;
      for (int i = g.first_tensor(); i <= g.last_tensor(); ++i) {
        const int64_t n = m.tensors(i).numel();
        bounded = bounded && n >= 1 && n <= kMaxNumel;
        if (bounded) numel += n;
      }
      if (bounded && g.numel() != numel)
        p.Add(f + ".numel", "does not match its tensors; got " + std::to_string(g.numel()) + ", expected " +
                                std::to_string(numel) + " (tensors " + std::to_string(g.first_tensor()) + ".." +
                                std::to_string(g.last_tensor()) + ")");
      expected_first = g.last_tensor() + 1;
    } else {
      in_range = false;
      expected_first = std::max(expected_first, g.last_tensor() + 1);
    }
    const SchemeInfo* scheme = CheckScheme(p, plan, k);
    const bool scheme_ok =
        g.options().scheme().empty() || (scheme != nullptr && (!scheme->hierarchical || plan.devices_per_node() >= 2));
    const bool priced = ok && ratio_ok && scheme_ok && g.numel() > 0 && g.numel() <= kMaxNumel;
    if (scheme != nullptr && g.steps_size() == scheme->step_count)
      CheckSteps(p, plan, k, *scheme,
                 priced && plan.world_size() >= 1 && SchemeCodecProblem(*scheme, *info).empty());
    if (priced) {
      const LowRankSizes low_rank = scheme != nullptr ? GroupLowRank(plan, g, *scheme) : LowRankSizes{};
      const int64_t expected =
          scheme != nullptr        ? StepBytes(*scheme, scheme->steps[PayloadStep(*scheme)], *info, g.numel(),
                                               SchemeRatio(*scheme, ratio, m, g.first_tensor(), g.last_tensor()),
                                               {plan.world_size(), plan.devices_per_node()}, plan.compressor().zen_union(),
                                               &low_rank)
          : g.options().compress() ? PayloadBytes(*info, g.numel(), ratio)
                                   : 4 * g.numel();
      if (g.payload_bytes() != expected)
        p.Add(f + ".payload_bytes",
              "does not match the compressor; got " + std::to_string(g.payload_bytes()) + ", expected " +
                  std::to_string(expected) + " (" +
                  (scheme != nullptr ? "scheme " + std::string(scheme->name) + ", " : std::string()) +
                  (g.options().compress() ? plan.compressor().name() : "fp32") + " of " + std::to_string(g.numel()) +
                  " elements)");
    } else if (g.payload_bytes() <= 0) {
      p.Add(f + ".payload_bytes", "must be positive; got " + std::to_string(g.payload_bytes()) + ", expected > 0");
    }
    if (info != nullptr && g.options().collective() != pb::COMM_OP_UNSPECIFIED && scheme_ok) {
      const pb::CommOp op = scheme != nullptr        ? StepOp(*scheme, scheme->steps[PayloadStep(*scheme)], *info)
                            : g.options().compress() ? info->collective
                                                     : pb::ALLREDUCE;
      if (g.options().collective() != op)
        p.Add(f + ".options.collective",
              "does not match the compressor; got " + std::string(Name(g.options().collective())) + ", expected " +
                  std::string(Name(op)) + " (" + (g.options().compress() ? plan.compressor().name() : "fp32") + ")");
    }
    if (!g.has_options() || g.options().collective() == pb::COMM_OP_UNSPECIFIED)
      p.Add(f + ".options.collective", "missing; expected one of " + CommOpNames());
    if (g.has_options() && g.options().device() != pb::GPU && g.options().device() != pb::CPU)
      p.Add(f + ".options.device", "unknown device; got " + std::to_string(static_cast<int>(g.options().device())) +
                                       ", expected one of " + DeviceNames());
    CheckTime(p, f + ".encode_start_us", g.encode_start_us());
    CheckTime(p, f + ".encode_end_us", g.encode_end_us());
    CheckTime(p, f + ".comm_start_us", g.comm_start_us());
    CheckTime(p, f + ".comm_end_us", g.comm_end_us());
    CheckTime(p, f + ".decode_start_us", g.decode_start_us());
    CheckTime(p, f + ".decode_end_us", g.decode_end_us());
    CheckPhaseOrder(p, plan, k);
  }
  const pb::Group& last = plan.groups(plan.groups_size() - 1);
  if (in_range && n > 0 && last.last_tensor() != n - 1)
    p.Add(Idx("groups", plan.groups_size() - 1) + ".last_tensor", "does not end the model; got " +
                                                                      std::to_string(last.last_tensor()) +
                                                                      ", expected " + std::to_string(n - 1) + of_model);
}

}  // namespace

Status ValidatePlan(const pb::Plan& plan, const std::string& origin) {
  Problems p(origin);
  if (plan.format() != kPlanFileFormat) {
    if (plan.format().empty())
      p.Add("format", "missing; expected " + Quoted(std::string(kPlanFileFormat)));
    else
      p.Add("format",
            "unsupported; got " + Quoted(plan.format()) + ", expected " + Quoted(std::string(kPlanFileFormat)));
  }
  if (!plan.has_model()) {
    p.Add("model", "missing; expected the model the plan was made for");
    return p.ToStatus();  // nothing below can be checked without it
  }
  CheckModel(p, plan.model());
  if (plan.profile_fingerprint().empty()) p.Add("profile_fingerprint", "missing; expected 16 hex digits");
  if (plan.world_size() < 1 || plan.world_size() > kMaxWorldSize)
    p.Add("world_size", "out of range; got " + std::to_string(plan.world_size()) +
                            ", expected 1 <= x <= " + std::to_string(kMaxWorldSize));
  if (plan.device() != pb::GPU && plan.device() != pb::CPU)
    p.Add("device",
          "missing; got " + std::to_string(static_cast<int>(plan.device())) + ", expected one of " + DeviceNames());
  if (!plan.has_compressor())
    p.Add("compressor", "missing; expected the compressor and its parameters");
  else
    CheckCompressor(p, plan.compressor());
  if (plan.model().model().tensors_size() > 0) CheckGroups(p, plan);
  if (!plan.has_predicted()) {
    p.Add("predicted", "missing; expected the predicted times");
  } else if (!Finite(plan.predicted().iteration_us()) || plan.predicted().iteration_us() <= 0 ||
             plan.predicted().iteration_us() > kMaxPlanTimeUs) {
    std::ostringstream os;
    os << "not a time; got " << plan.predicted().iteration_us() << ", expected a finite number > 0 and <= "
       << kMaxPlanTimeUs << " (microseconds)";
    p.Add("predicted.iteration_us", os.str());
  } else if (!plan.groups().empty()) {
    const int last = plan.groups_size() - 1;
    CheckOrder(p, "predicted.iteration_us", plan.predicted().iteration_us(), Idx("groups", last) + ".decode_end_us",
               plan.groups(last).decode_end_us());
  }
  if (plan.has_predicted()) {
    CheckTime(p, "predicted.backward_us", plan.predicted().backward_us());
    CheckTime(p, "predicted.encode_us", plan.predicted().encode_us());
    CheckTime(p, "predicted.comm_us", plan.predicted().comm_us());
    CheckTime(p, "predicted.decode_us", plan.predicted().decode_us());
  }
  for (int i = 0; i < plan.baselines_size(); ++i) {
    const pb::Baseline& b = plan.baselines(i);
    if (b.name().empty()) p.Add(Idx("baselines", i) + ".name", "missing; expected a baseline name");
    if (b.groups() < 1)
      p.Add(Idx("baselines", i) + ".groups", "must be positive; got " + std::to_string(b.groups()) + ", expected >= 1");
    CheckTime(p, Idx("baselines", i) + ".iteration_us", b.iteration_us());
  }
  if (plan.devices_per_node() < 0 || plan.devices_per_node() > std::max(plan.world_size(), 1))
    p.Add("devices_per_node", "out of range; got " + std::to_string(plan.devices_per_node()) +
                                  ", expected 0 (fusion plans) or 1 <= x <= world_size " +
                                  std::to_string(plan.world_size()));
  for (int i = 0; i < plan.extrapolations_size(); ++i) CheckExtrapolation(p, plan.extrapolations(i), i);
  // The last field written: a plan cut short at a field boundary parses, but lacks it.
  if (!plan.has_search() || plan.search().algorithm().empty()) {
    p.Add("search", "missing; expected the search statistics (a truncated file?)");
  } else {
    const pb::SearchStats& st = plan.search();
    CheckCount(p, "search.nodes", st.nodes());
    CheckCount(p, "search.pruned", st.pruned());
    CheckCount(p, "search.budget", st.budget());
    CheckCount(p, "search.states", st.states());
    if (!st.search_space().empty() && st.search_space() != "options")
      p.Add("search.search_space",
            "unknown search space; got " + Quoted(st.search_space()) + ", expected \"options\" or none (fusion)");
    CheckTime(p, "search.lower_bound_us", st.lower_bound_us());
    if (plan.has_predicted() && Finite(st.lower_bound_us()) && st.lower_bound_us() > 0)
      CheckOrder(p, "predicted.iteration_us", plan.predicted().iteration_us(), "search.lower_bound_us",
                 st.lower_bound_us());
  }
  return p.ToStatus();
}

StatusOr<pb::Plan> ParsePlan(std::string_view bytes, const std::string& origin) {
  if (bytes.empty())
    return DataLossError(origin + ": empty file; expected a " + std::string(kPlanFileFormat) + " plan");
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    return InvalidArgumentError(origin + ": too large; got " + std::to_string(bytes.size()) +
                                " bytes, expected < 2 GiB");
  if (FileFormatOf(bytes) == kLadderFileFormat)
    return InvalidArgumentError(origin + ": a ladder of plans (" + std::string(kLadderFileFormat) +
                                "); expected a single plan here (cupcake-plan show lists the rungs; simulate and "
                                "trace take --rung RATIO)");
  pb::Plan plan;
  // Damaged strings make protobuf log "invalid UTF-8" to stderr; the Status says it instead.
  google::protobuf::LogSilencer silence_protobuf_log;
  if (!plan.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    std::string hint = bytes.front() == '{' ? " (this looks like JSON; plans are read as binary .pb)" : "";
    return DataLossError(origin + ": not a valid plan: corrupt or truncated protobuf; got " +
                         std::to_string(bytes.size()) + " bytes, expected a " + std::string(kPlanFileFormat) + " plan" +
                         hint);
  }
  CUPCAKE_RETURN_IF_ERROR(ValidatePlan(plan, origin));
  return plan;
}

StatusOr<pb::Plan> ReadPlanFile(const std::string& path) {
  CUPCAKE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return ParsePlan(bytes, path);
}

std::string SerializeDeterministic(const google::protobuf::MessageLite& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return bytes;
}

std::string SerializePlan(const pb::Plan& plan) { return SerializeDeterministic(plan); }

std::string FileFormatOf(std::string_view bytes) {
  pb::FileFormat header;
  google::protobuf::LogSilencer silence_protobuf_log;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !header.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return "";
  return header.format();
}

Status WritePlanFile(const std::string& path, const pb::Plan& plan) {
  return WriteFileAtomic(path, SerializePlan(plan));
}

std::string PlanToJson(const pb::Plan& plan) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(plan, &json, options);
  CUPCAKE_CHECK(status.ok());  // every message of cupcake.proto converts
  return json;
}

std::string PlanToTextProto(const pb::Plan& plan) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(plan, &text);
  return text;
}

}  // namespace cupcake

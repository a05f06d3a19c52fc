// The semantic checks of models and profiles (docs/FORMATS.md), shared by the JSON parser
// and the store's imports.
#include <cmath>
#include <map>
#include <set>

#include "cupcake/profile/json_io.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/limits.h"
#include "cupcake/proto/names.h"
#include "problems.h"
#include "validate.h"

namespace cupcake::profile {
namespace internal {

std::string Join(const std::string& path, std::string_view key) {
  if (path.empty()) return std::string(key);
  return path + "." + std::string(key);
}

std::string Index(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

void Problems::Add(const std::string& path, const std::string& text) {
  // A problem at "tensors[3]" covers "tensors[3].name" and "tensors[3][0]".
  for (const std::string& p : paths_) {
    if (path == p) return;
    if (path.size() > p.size() && path.compare(0, p.size(), p) == 0 &&
        (path[p.size()] == '.' || path[p.size()] == '[') && !p.empty())
      return;
  }
  paths_.insert(path);
  lines_.push_back(origin_ + ": " + (path.empty() ? "" : path + ": ") + text);
}

Status Problems::ToStatus(StatusCode code) const {
  if (lines_.empty()) return Status::Ok();
  std::string message;
  for (size_t i = 0; i < lines_.size() && i < kMaxLines; ++i) {
    if (i > 0) message += "\n";
    message += lines_[i];
  }
  if (lines_.size() > kMaxLines)
    message += "\n" + origin_ + ": ... and " + std::to_string(lines_.size() - kMaxLines) + " more problems";
  return Status(code, message);
}

std::string JoinNames(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

std::vector<std::string_view> SplitNames(const std::string& joined) {
  std::vector<std::string_view> out;
  size_t start = 0;
  std::string_view s(joined);
  while (start <= s.size()) {
    size_t comma = s.find(", ", start);
    if (comma == std::string_view::npos) comma = s.size();
    out.push_back(s.substr(start, comma - start));
    start = comma + 2;
  }
  return out;
}

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

const std::vector<std::string_view>& MethodNames() {
  static const std::vector<std::string_view> kMethods{"event", "kernel", "wall"};
  return kMethods;
}

namespace {

void CheckTime(const std::string& path, double v, Problems& p) {
  if (!std::isfinite(v))
    p.Add(path, "must be finite; got " + FormatDouble(v) + ", expected a finite time >= 0");
  else if (v < 0)
    p.Add(path, "must not be negative; got " + FormatDouble(v) + ", expected >= 0");
  else if (v > kMaxTimeUs)
    p.Add(path, "out of range; got " + FormatDouble(v) + ", expected at most " + FormatDouble(kMaxTimeUs) +
                    " (microseconds)");
}

// An integer field in [min, max].
void CheckRange(const std::string& path, int64_t v, int64_t min, int64_t max, Problems& p) {
  if (v < min || v > max)
    p.Add(path, "out of range; got " + std::to_string(v) + ", expected " + std::to_string(min) +
                    " <= x <= " + std::to_string(max));
}

// Text fields must be UTF-8: JSON cannot carry anything else.
void CheckText(const std::string& path, const std::string& v, Problems& p) {
  if (!IsValidUtf8(v)) p.Add(path, "not valid UTF-8; got \"" + EscapeBytes(v) + "\", expected UTF-8 text");
}

void CheckNonNegative(const std::string& path, int64_t v, Problems& p) {
  if (v < 0) p.Add(path, "must not be negative; got " + std::to_string(v) + ", expected >= 0");
}

void NotAllowed(const std::string& path, std::string_view kind, const std::string& got, Problems& p) {
  p.Add(path, "not allowed for kind " + std::string(kind) + "; got " + got + ", expected no value");
}

}  // namespace

void CheckModel(const pb::Model& m, const std::string& path, Problems& p) {
  if (m.name().empty()) p.Add(Join(path, "name"), "missing; expected a non-empty string");
  CheckText(Join(path, "name"), m.name(), p);
  CheckText(Join(path, "source"), m.source(), p);
  if (m.has_forward_us()) CheckTime(Join(path, "forward_us"), m.forward_us(), p);
  if (m.has_update_us()) CheckTime(Join(path, "update_us"), m.update_us(), p);
  const std::string tensors = Join(path, "tensors");
  if (m.tensors_size() == 0) p.Add(tensors, "empty tensor list; got 0 tensors, expected at least 1");
  if (m.tensors_size() > kMaxTensors)
    p.Add(tensors, "too many tensors; got " + std::to_string(m.tensors_size()) + ", expected at most " +
                       std::to_string(kMaxTensors));
  std::map<std::string, int> first;
  int64_t total_numel = 0;
  for (int i = 0; i < m.tensors_size(); ++i) {
    const pb::Tensor& t = m.tensors(i);
    const std::string tp = Index(tensors, static_cast<size_t>(i));
    CheckText(Join(tp, "name"), t.name(), p);
    if (t.name().empty()) {
      p.Add(Join(tp, "name"), "missing; expected a non-empty string");
    } else {
      auto [it, inserted] = first.emplace(t.name(), i);
      if (!inserted)
        p.Add(Join(tp, "name"), "duplicate name; got " + Quote(t.name()) + ", expected unique names (first at " +
                                    Index(tensors, static_cast<size_t>(it->second)) + ")");
    }
    if (t.numel() <= 0)
      p.Add(Join(tp, "numel"), "must be positive; got " + std::to_string(t.numel()) + ", expected > 0");
    else
      CheckRange(Join(tp, "numel"), t.numel(), 1, kMaxNumel, p);
    if (t.numel() > 0 && t.numel() <= kMaxNumel) total_numel += t.numel();  // no overflow: <= 2^20 x 2^40
    if (DTypeBytes(t.dtype()) == 0)
      p.Add(Join(tp, "dtype"),
            "unknown dtype; got " + std::to_string(static_cast<int>(t.dtype())) + ", expected one of " + DTypeNames());
    CheckTime(Join(tp, "backward_us"), t.backward_us(), p);
    if (std::string why = DensityProblem(t); !why.empty()) p.Add(Join(tp, "density"), why);
    if (std::string why = ShapeProblem(t); !why.empty()) p.Add(Join(tp, "shape"), why);
  }
  if (total_numel > kMaxNumel)
    p.Add(tensors, "too many elements in all; got " + std::to_string(total_numel) + ", expected at most " +
                       std::to_string(kMaxNumel));
}

// A kernel curve's ratio: recorded for the compressors that select ratio n elements (optional:
// older profiles lack it) and for Zen's and the non-zero scan's curves (required), in (0, 1];
// nowhere else.
void CheckRatio(const pb::Curve& c, const std::string& path, Problems& p) {
  const CompressorInfo* info = FindCompressor(c.compressor());
  const bool required = c.compressor() == kZenCurveName || c.compressor() == kNonzeroCurveName;
  if (!c.has_ratio()) {
    if (required)
      p.Add(path, std::string("missing; expected the ratio ") +
                      (c.compressor() == kZenCurveName ? "Zen's curves were" : "the non-zero scan's curve was") +
                      " measured at, 0 < ratio <= 1");
    return;
  }
  if (!required && (info == nullptr || !info->uses_ratio)) {  // info: nullptr for powersgd
    p.Add(path, "not allowed for compressor " + c.compressor() + "; got " + FormatDouble(c.ratio()) +
                    ", expected none (it selects no ratio of the elements)");
  } else if (!(c.ratio() > 0.0 && c.ratio() <= 1.0)) {
    p.Add(path, "out of range; got " + FormatDouble(c.ratio()) + ", expected 0 < ratio <= 1");
  }
}

void CheckCurveKey(const pb::Curve& c, const std::string& path, Problems& p) {
  const std::string_view kind = Name(c.kind());
  auto require = [&](bool present, std::string_view key, const std::string& expected) {
    if (!present) p.Add(Join(path, key), "missing; expected one of " + expected);
  };
  switch (c.kind()) {
    case pb::COMM:
      if (c.has_ratio()) NotAllowed(Join(path, "ratio"), kind, FormatDouble(c.ratio()), p);
      require(c.comm_op() != pb::COMM_OP_UNSPECIFIED, "op", CommOpNames());
      require(c.scope() != pb::SCOPE_UNSPECIFIED, "scope", ScopeNames());
      if (!c.compressor().empty()) NotAllowed(Join(path, "compressor"), kind, Quote(c.compressor()), p);
      if (c.device() != pb::DEVICE_UNSPECIFIED) NotAllowed(Join(path, "device"), kind, Quote(Name(c.device())), p);
      if (c.copy_op() != pb::COPY_OP_UNSPECIFIED) NotAllowed(Join(path, "op"), kind, Quote(Name(c.copy_op())), p);
      if (c.dtype() == pb::FLOAT32)
        p.Add(Join(path, "dtype"), "float32 is the default; got \"float32\", expected float16, bfloat16 or none");
      else if (c.dtype() != pb::DTYPE_UNSPECIFIED && c.comm_op() != pb::ALLREDUCE && c.comm_op() != pb::REDUCE_SCATTER)
        p.Add(Join(path, "dtype"), "not allowed for op " + std::string(Name(c.comm_op())) + "; got " +
                                       Quote(Name(c.dtype())) + ", expected none (it moves bytes, it sums nothing)");
      break;
    case pb::ENCODE:
    case pb::DECODE:
      if (c.busy()) NotAllowed(Join(path, "busy"), kind, "true", p);
      if (c.chained()) NotAllowed(Join(path, "chained"), kind, "true", p);
      CheckText(Join(path, "compressor"), c.compressor(), p);
      if (c.compressor().empty()) {
        p.Add(Join(path, "compressor"),
              "missing; expected one of " + JoinNames({CompressorNames().begin(), CompressorNames().end()}));
      } else if (FindCompressor(c.compressor()) == nullptr && c.compressor() != kZenCurveName &&
                 c.compressor() != kNonzeroCurveName && c.compressor() != kPowerSgdName) {
        p.Add(Join(path, "compressor"), "unknown compressor; got " + Quote(c.compressor()) +
                                            DidYouMean(c.compressor(), CompressorNames()) + ", expected one of " +
                                            JoinNames({CompressorNames().begin(), CompressorNames().end()}) + ", " +
                                            std::string(kZenCurveName) + ", " + std::string(kNonzeroCurveName) +
                                            " or " + std::string(kPowerSgdName));
      } else {
        CheckRatio(c, Join(path, "ratio"), p);
      }
      require(c.device() != pb::DEVICE_UNSPECIFIED, "device", DeviceNames());
      if (c.comm_op() != pb::COMM_OP_UNSPECIFIED) NotAllowed(Join(path, "op"), kind, Quote(Name(c.comm_op())), p);
      if (c.copy_op() != pb::COPY_OP_UNSPECIFIED) NotAllowed(Join(path, "op"), kind, Quote(Name(c.copy_op())), p);
      if (c.scope() != pb::SCOPE_UNSPECIFIED) NotAllowed(Join(path, "scope"), kind, Quote(Name(c.scope())), p);
      if (c.dtype() != pb::DTYPE_UNSPECIFIED) NotAllowed(Join(path, "dtype"), kind, Quote(Name(c.dtype())), p);
      break;
    case pb::COPY:
      if (c.has_ratio()) NotAllowed(Join(path, "ratio"), kind, FormatDouble(c.ratio()), p);
      if (c.busy()) NotAllowed(Join(path, "busy"), kind, "true", p);
      if (c.chained()) NotAllowed(Join(path, "chained"), kind, "true", p);
      require(c.copy_op() != pb::COPY_OP_UNSPECIFIED, "op", CopyOpNames());
      require(c.device() != pb::DEVICE_UNSPECIFIED, "device", DeviceNames());
      if (!c.compressor().empty()) NotAllowed(Join(path, "compressor"), kind, Quote(c.compressor()), p);
      if (c.comm_op() != pb::COMM_OP_UNSPECIFIED) NotAllowed(Join(path, "op"), kind, Quote(Name(c.comm_op())), p);
      if (c.scope() != pb::SCOPE_UNSPECIFIED) NotAllowed(Join(path, "scope"), kind, Quote(Name(c.scope())), p);
      if (c.dtype() != pb::DTYPE_UNSPECIFIED) NotAllowed(Join(path, "dtype"), kind, Quote(Name(c.dtype())), p);
      break;
    default: p.Add(Join(path, "kind"), "missing; expected one of " + CurveKindNames()); break;
  }
  CheckText(Join(path, "method"), c.method(), p);
  if (c.has_method() && c.method() != "event" && c.method() != "kernel" && c.method() != "wall")
    p.Add(Join(path, "method"), "unknown method; got " + Quote(c.method()) + DidYouMean(c.method(), MethodNames()) +
                                    ", expected one of event, kernel, wall");
  if (c.has_warmup()) CheckNonNegative(Join(path, "warmup"), c.warmup(), p);
  if (c.has_iters()) CheckNonNegative(Join(path, "iters"), c.iters(), p);
  if (c.has_wrong()) CheckNonNegative(Join(path, "wrong"), c.wrong(), p);
}

void CheckPoint(int64_t size, double us, const std::string& path, Problems& p) {
  if (size <= 0)
    p.Add(Join(path, "size"), "must be positive; got " + std::to_string(size) + ", expected > 0");
  else
    CheckRange(Join(path, "size"), size, 1, kMaxCurveSize, p);
  CheckTime(Join(path, "us"), us, p);
}

void CheckCurve(const pb::Curve& c, const std::string& path, Problems& p) {
  CheckCurveKey(c, path, p);
  const std::string points = Join(path, "points");
  if (c.points_size() == 0) p.Add(points, "no points; got 0 points, expected at least 1");
  for (int j = 0; j < c.points_size(); ++j) {
    const std::string pp = Index(points, static_cast<size_t>(j));
    const pb::Point& pt = c.points(j);
    CheckPoint(pt.size(), pt.us(), pp, p);
    if (j == 0) continue;
    int64_t prev = c.points(j - 1).size();
    if (pt.size() == prev)
      p.Add(Join(pp, "size"), "duplicate size; got " + std::to_string(pt.size()) + " again, expected distinct sizes");
    else if (pt.size() < prev)
      p.Add(Join(pp, "size"), "sizes not sorted; got " + std::to_string(pt.size()) + " after " + std::to_string(prev) +
                                  ", expected increasing sizes");
  }
}

void CheckProfile(const pb::Profile& profile, const std::string& path, Problems& p) {
  const std::string cluster = Join(path, "cluster");
  if (!profile.has_cluster()) {
    p.Add(cluster, "missing; expected an object with name, nodes, devices_per_node");
  } else {
    const pb::Cluster& c = profile.cluster();
    if (c.name().empty()) p.Add(Join(cluster, "name"), "missing; expected a non-empty string");
    CheckText(Join(cluster, "name"), c.name(), p);
    CheckText(Join(cluster, "device"), c.device(), p);
    CheckText(Join(cluster, "interconnect"), c.interconnect(), p);
    CheckText(Join(cluster, "network"), c.network(), p);
    CheckText(Join(cluster, "source"), c.source(), p);
    for (const auto& [key, value] : c.meta()) {
      CheckText(Join(cluster, "meta"), key, p);
      CheckText(Join(Join(cluster, "meta"), EscapeBytes(key)), value, p);
    }
    if (c.nodes() < 1)
      p.Add(Join(cluster, "nodes"), "must be positive; got " + std::to_string(c.nodes()) + ", expected >= 1");
    if (c.devices_per_node() < 1)
      p.Add(Join(cluster, "devices_per_node"),
            "must be positive; got " + std::to_string(c.devices_per_node()) + ", expected >= 1");
    const int64_t world = int64_t{c.nodes()} * c.devices_per_node();  // int32 x int32 fits int64
    if (c.nodes() >= 1 && c.devices_per_node() >= 1 && world > kMaxWorldSize)
      p.Add(cluster, "world too large; got " + std::to_string(c.nodes()) + " nodes x " +
                         std::to_string(c.devices_per_node()) + " devices = " + std::to_string(world) +
                         " ranks, expected at most " + std::to_string(kMaxWorldSize));
  }
  const std::string curves = Join(path, "curves");
  std::map<std::string, int> first;
  for (int i = 0; i < profile.curves_size(); ++i) {
    const std::string cp = Index(curves, static_cast<size_t>(i));
    CheckCurve(profile.curves(i), cp, p);
    if (profile.curves(i).kind() == pb::CURVE_KIND_UNSPECIFIED) continue;
    std::string key = CurveKey(profile.curves(i));
    auto [it, inserted] = first.emplace(key, i);
    if (!inserted)
      p.Add(cp, "duplicate curve; got " + Quote(key) + ", expected one curve per key (first at " +
                    Index(curves, static_cast<size_t>(it->second)) + ")");
  }
  const std::string models = Join(path, "models");
  std::map<std::string, int> first_model;
  for (int i = 0; i < profile.models_size(); ++i) {
    const std::string mp = Index(models, static_cast<size_t>(i));
    CheckModel(profile.models(i), mp, p);
    const std::string& name = profile.models(i).name();
    if (name.empty()) continue;
    auto [it, inserted] = first_model.emplace(name, i);
    if (!inserted)
      p.Add(Join(mp, "name"), "duplicate model; got " + Quote(name) + ", expected unique names (first at " +
                                  Index(models, static_cast<size_t>(it->second)) + ")");
  }
}

}  // namespace internal

Status ValidateModel(const pb::Model& model, const std::string& origin) {
  internal::Problems p(origin);
  internal::CheckModel(model, "", p);
  return p.ToStatus();
}

Status ValidateProfile(const pb::Profile& profile, const std::string& origin) {
  internal::Problems p(origin);
  internal::CheckProfile(profile, "", p);
  return p.ToStatus();
}

Status ValidateCurveKey(const pb::Curve& curve, const std::string& origin) {
  internal::Problems p(origin);
  internal::CheckCurveKey(curve, "", p);
  return p.ToStatus();
}

}  // namespace cupcake::profile

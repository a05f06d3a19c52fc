// JSON <-> proto for cupcake.model.v1 and cupcake.profile.v1.
//
// Parsing is two passes over one Problems list: a structural pass (types, unknown keys,
// required keys, enum names) builds the proto, then the semantic checks of validate.cc run on
// it; a path reported by the first pass is not reported again by the second.
#include "cupcake/profile/json_io.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/limits.h"
#include "cupcake/proto/names.h"
#include "problems.h"
#include "validate.h"

namespace cupcake::profile {
namespace {

using internal::Index;
using internal::Join;
using internal::Problems;
using internal::Quote;
using nlohmann::json;
using nlohmann::ordered_json;

std::string Got(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string TypeName(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  if (v.is_boolean()) return "a boolean";
  return "null";
}

// What the parser callback found wrong: too deep a nesting, or a key given twice (JSON's
// "last one wins" would let a typo'd duplicate silently replace a value).
struct StructureError {
  std::string path;
  std::string problem;
};

// Follows the parse as a stack of open objects and arrays, for the path of a problem.
class StructureGuard {
 public:
  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(frames_.size()) >= kMaxJsonDepth)
          throw StructureError{Path(), "nested too deep; got more than " + std::to_string(kMaxJsonDepth) +
                                           " levels of objects and arrays, expected at most " +
                                           std::to_string(kMaxJsonDepth)};
        frames_.push_back({event == json::parse_event_t::object_start, {}, {}, 0});
        break;
      case json::parse_event_t::key: {
        Frame& top = frames_.back();
        top.key = parsed.get<std::string>();
        if (!top.keys.insert(top.key).second)
          throw StructureError{Path(),
                               "duplicate key; got " + Quote(top.key) + " twice in one object, expected each key once"};
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        ValueDone();
        break;
      case json::parse_event_t::value: ValueDone(); break;
    }
    return true;
  }

 private:
  struct Frame {
    bool object;
    std::set<std::string> keys;
    std::string key;  // of the member being read
    size_t index;  // of the element being read
  };

  void ValueDone() {
    if (!frames_.empty() && !frames_.back().object) ++frames_.back().index;
  }

  std::string Path() const {
    std::string path;
    for (const Frame& f : frames_) path = f.object ? Join(path, f.key) : Index(path, f.index);
    return path.empty() ? "(top level)" : path;
  }

  std::vector<Frame> frames_;
};

StatusOr<json> ParseText(std::string_view text, const std::string& origin) {
  // The parser takes a NUL byte for the end of the input, so text after one would be ignored.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    const std::string_view before = text.substr(0, nul);
    const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
    const size_t last_newline = before.rfind('\n');
    const size_t column = last_newline == std::string_view::npos ? nul + 1 : nul - last_newline;
    return InvalidArgumentError(origin + ":" + std::to_string(line) + ":" + std::to_string(column) +
                                ": not valid JSON: a NUL byte; expected text");
  }
  try {
    return json::parse(text.begin(), text.end(), StructureGuard());
  } catch (const StructureError& e) {
    return InvalidArgumentError(origin + ": " + e.path + ": " + e.problem);
  } catch (const json::parse_error& e) {
    // what(): "[json.exception.parse_error.101] parse error at line 3, column 1: <detail>"
    std::string what = e.what();
    unsigned line = 0, column = 0;
    size_t at = what.find("at line ");
    size_t colon = at == std::string::npos ? std::string::npos : what.find(": ", at);
    if (at != std::string::npos && colon != std::string::npos &&
        std::sscanf(what.c_str() + at, "at line %u, column %u", &line, &column) == 2) {
      return InvalidArgumentError(origin + ":" + std::to_string(line) + ":" + std::to_string(column) +
                                  ": not valid JSON: " + what.substr(colon + 2));
    }
    return InvalidArgumentError(origin + ": not valid JSON: " + what);
  } catch (const json::exception& e) {
    // e.g. "[json.exception.out_of_range.406] number overflow parsing '1e999'"
    std::string what = e.what();
    size_t bracket = what.find("] ");
    if (what.starts_with("[json.exception.") && bracket != std::string::npos) what = what.substr(bracket + 2);
    return InvalidArgumentError(origin + ": not valid JSON: " + what);
  }
}

// Reads typed fields of JSON objects, reporting what is wrong into a Problems list.
class Reader {
 public:
  explicit Reader(Problems& p) : p_(p) {}

  bool Object(const json& v, const std::string& path, std::string_view expected) {
    if (v.is_object()) return true;
    p_.Add(path.empty() ? "(top level)" : path,
           "wrong type; got " + TypeName(v) + " " + Got(v) + ", expected " + std::string(expected));
    return false;
  }

  void Keys(const json& obj, const std::string& path, const std::vector<std::string_view>& allowed,
            std::string_view context = "") {
    for (const auto& [key, value] : obj.items()) {
      bool known = false;
      for (std::string_view a : allowed) known = known || a == key;
      if (known) continue;
      p_.Add(Join(path, key), "unknown key" + std::string(context) + "; got " + Quote(key) + DidYouMean(key, allowed) +
                                  ", expected one of " + internal::JoinNames(allowed));
    }
  }

  // nullptr when absent (reported when required).
  const json* Field(const json& obj, const std::string& path, std::string_view key, bool required,
                    std::string_view expected) {
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) p_.Add(Join(path, key), "missing; expected " + std::string(expected));
      return nullptr;
    }
    return &*it;
  }

  void WrongType(const std::string& path, const json& v, std::string_view expected) {
    p_.Add(path, "wrong type; got " + TypeName(v) + " " + Got(v) + ", expected " + std::string(expected));
  }

  std::optional<std::string> String(const json& obj, const std::string& path, std::string_view key, bool required,
                                    std::string_view expected = "a string") {
    const json* v = Field(obj, path, key, required, expected);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) {
      WrongType(Join(path, key), *v, expected);
      return std::nullopt;
    }
    return v->get<std::string>();
  }

  std::optional<int64_t> IntegerValue(const json& v, const std::string& path, int64_t max) {
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > static_cast<uint64_t>(max)) {
        p_.Add(path, "out of range; got " + Got(v) + ", expected at most " + std::to_string(max));
        return std::nullopt;
      }
      return static_cast<int64_t>(v.get<uint64_t>());
    }
    if (v.is_number_integer()) {
      int64_t x = v.get<int64_t>();
      if (x < -max - 1) {
        p_.Add(path, "out of range; got " + Got(v) + ", expected at least " + std::to_string(-max - 1));
        return std::nullopt;
      }
      return x;
    }
    WrongType(path, v, "an integer");
    return std::nullopt;
  }

  std::optional<int64_t> Integer(const json& obj, const std::string& path, std::string_view key, bool required,
                                 int64_t max = std::numeric_limits<int64_t>::max()) {
    const json* v = Field(obj, path, key, required, "an integer");
    if (v == nullptr) return std::nullopt;
    return IntegerValue(*v, Join(path, key), max);
  }

  std::optional<double> NumberValue(const json& v, const std::string& path) {
    if (!v.is_number()) {
      WrongType(path, v, "a number");
      return std::nullopt;
    }
    return v.get<double>();
  }

  std::optional<double> Number(const json& obj, const std::string& path, std::string_view key, bool required) {
    const json* v = Field(obj, path, key, required, "a number");
    if (v == nullptr) return std::nullopt;
    return NumberValue(*v, Join(path, key));
  }

  const json* Array(const json& obj, const std::string& path, std::string_view key, bool required,
                    std::string_view expected) {
    const json* v = Field(obj, path, key, required, expected);
    if (v == nullptr) return nullptr;
    if (!v->is_array()) {
      WrongType(Join(path, key), *v, expected);
      return nullptr;
    }
    return v;
  }

  // An enum given by name; `parse` maps a name to the value or nullopt.
  template <typename E, typename ParseFn>
  std::optional<E> Enum(const json& obj, const std::string& path, std::string_view key, bool required,
                        std::string_view what, const std::string& names, ParseFn parse) {
    auto s = String(obj, path, key, required, "one of " + names);
    if (!s) return std::nullopt;
    std::optional<E> e = parse(*s);
    if (!e) {
      std::vector<std::string_view> candidates = internal::SplitNames(names);
      p_.Add(Join(path, key), "unknown " + std::string(what) + "; got " + Quote(*s) + DidYouMean(*s, candidates) +
                                  ", expected one of " + names);
    }
    return e;
  }

  Problems& problems() { return p_; }

 private:
  Problems& p_;
};

const std::vector<std::string_view> kModelKeys{"format", "name", "source", "forward_us", "update_us", "tensors"};
const std::vector<std::string_view> kTensorKeys{"name", "numel", "dtype", "backward_us", "density", "shape"};
const std::vector<std::string_view> kProfileKeys{"format", "cluster", "curves", "models"};
const std::vector<std::string_view> kClusterKeys{"name",         "nodes",   "devices_per_node", "device",
                                                 "interconnect", "network", "source",           "meta"};
const std::vector<std::string_view> kCommKeys{"kind",   "op",     "scope",  "dtype", "busy", "chained",
                                              "points", "method", "warmup", "iters", "wrong"};
const std::vector<std::string_view> kCodecKeys{"kind",   "compressor", "device", "ratio", "points",
                                               "method", "warmup",     "iters",  "wrong"};
const std::vector<std::string_view> kCopyKeys{"kind", "op", "device", "points", "method", "warmup", "iters", "wrong"};
const std::vector<std::string_view> kAnyCurveKeys{"kind",   "op",     "scope",   "compressor", "device",
                                                  "dtype",  "busy",   "chained", "ratio",      "points",
                                                  "method", "warmup", "iters",   "wrong"};

// Checks "format". Returns false when the document is of another format (stop reading it).
bool CheckFormat(Reader& r, const json& doc, const std::string& path, std::string_view expected, bool required) {
  const std::string want = Quote(expected);
  const json* v = r.Field(doc, path, "format", required, want);
  if (v == nullptr) return !required;
  if (!v->is_string()) {
    r.WrongType(Join(path, "format"), *v, want);
    return false;
  }
  std::string got = v->get<std::string>();
  if (got == expected) return true;
  std::string hint;
  if (got == kProfileFormat) hint = " (this is a profile)";
  if (got == kModelFormat) hint = " (this is a model)";
  r.problems().Add(Join(path, "format"), "wrong format; got " + Quote(got) + hint + ", expected " + want);
  return false;
}

// "shape" (optional): an array of integers; their range and product are validate.cc's.
void ReadShape(Reader& r, const json& t, const std::string& tp, pb::Tensor& tensor) {
  const json* dims = r.Array(t, tp, "shape", false, "an array of integers (the tensor's dimensions)");
  if (dims == nullptr) return;
  for (size_t j = 0; j < dims->size(); ++j) {
    if (!(*dims)[j].is_number_integer()) {
      r.WrongType(Index(Join(tp, "shape"), j), (*dims)[j], "an integer");
      continue;
    }
    if (auto d = r.IntegerValue((*dims)[j], Index(Join(tp, "shape"), j), std::numeric_limits<int64_t>::max())) {
      tensor.add_shape(*d);
    }
  }
}

// Returns false when `obj` is no model at all (not an object, another format): its other
// problems would be noise, so its path is covered.
bool ReadModel(Reader& r, const json& obj, const std::string& path, bool format_required, pb::Model& m) {
  if (!r.Object(obj, path, "a JSON object (a cupcake.model.v1 model)") ||
      !CheckFormat(r, obj, path, kModelFormat, format_required)) {
    if (!path.empty()) r.problems().Cover(path);
    return false;
  }
  r.Keys(obj, path, kModelKeys);
  if (auto s = r.String(obj, path, "name", true, "a non-empty string")) m.set_name(*s);
  if (auto s = r.String(obj, path, "source", false)) m.set_source(*s);
  if (auto x = r.Number(obj, path, "forward_us", false)) m.set_forward_us(*x);
  if (auto x = r.Number(obj, path, "update_us", false)) m.set_update_us(*x);
  const std::string tensors_path = Join(path, "tensors");
  const json* tensors = r.Array(obj, path, "tensors", true, "an array of tensors");
  if (tensors == nullptr) {
    r.problems().Cover(tensors_path);  // do not report the tensors' contents too
    return true;
  }
  for (size_t i = 0; i < tensors->size(); ++i) {
    const json& t = (*tensors)[i];
    const std::string tp = Index(tensors_path, i);
    pb::Tensor* tensor = m.add_tensors();
    if (!r.Object(t, tp, "an object with name, numel, dtype, backward_us")) continue;
    r.Keys(t, tp, kTensorKeys);
    if (auto s = r.String(t, tp, "name", true, "a non-empty string")) tensor->set_name(*s);
    if (auto n = r.Integer(t, tp, "numel", true)) tensor->set_numel(*n);
    if (auto d = r.Enum<pb::DType>(t, tp, "dtype", true, "dtype", DTypeNames(), ParseDType)) tensor->set_dtype(*d);
    if (auto x = r.Number(t, tp, "backward_us", true)) tensor->set_backward_us(*x);
    if (auto x = r.Number(t, tp, "density", false)) tensor->set_density(*x);
    ReadShape(r, t, tp, *tensor);
  }
  return true;
}

void ReadCurve(Reader& r, const json& obj, const std::string& path, pb::Curve& c) {
  if (!r.Object(obj, path, "an object with kind, its key and points")) return;
  auto kind = r.Enum<pb::CurveKind>(obj, path, "kind", true, "kind", CurveKindNames(), ParseCurveKind);
  if (!kind) {
    r.Keys(obj, path, kAnyCurveKeys);
  } else {
    c.set_kind(*kind);
    const std::string context = " for kind " + std::string(Name(*kind));
    switch (*kind) {
      case pb::COMM:
        r.Keys(obj, path, kCommKeys, context);
        if (auto op = r.Enum<pb::CommOp>(obj, path, "op", true, "op", CommOpNames(), ParseCommOp)) c.set_comm_op(*op);
        if (auto s = r.Enum<pb::Scope>(obj, path, "scope", true, "scope", ScopeNames(), ParseScope)) c.set_scope(*s);
        // float32, the default, is canonically absent, so a profile writes back as it was read.
        if (auto d = r.Enum<pb::DType>(obj, path, "dtype", false, "dtype", DTypeNames(), ParseDType);
            d && *d != pb::FLOAT32)
          c.set_dtype(*d);
        for (auto [name, set] : {std::pair{"busy", &pb::Curve::set_busy}, {"chained", &pb::Curve::set_chained}})
          if (const json* b = r.Field(obj, path, name, false, "true or false")) {
            if (b->is_boolean())
              (c.*set)(b->get<bool>());
            else
              r.WrongType(Join(path, name), *b, "true or false");
          }
        break;
      case pb::ENCODE:
      case pb::DECODE: {
        r.Keys(obj, path, kCodecKeys, context);
        std::string names = internal::JoinNames({CompressorNames().begin(), CompressorNames().end()});
        if (auto s = r.String(obj, path, "compressor", true, "one of " + names)) {
          c.set_compressor(*s);  // checked against the catalogue by CheckCurveKey
        }
        if (auto d = r.Enum<pb::Device>(obj, path, "device", true, "device", DeviceNames(), ParseDevice))
          c.set_device(*d);
        if (auto x = r.Number(obj, path, "ratio", false)) c.set_ratio(*x);  // range: CheckCurveKey
        break;
      }
      case pb::COPY:
        r.Keys(obj, path, kCopyKeys, context);
        if (auto op = r.Enum<pb::CopyOp>(obj, path, "op", true, "op", CopyOpNames(), ParseCopyOp)) c.set_copy_op(*op);
        if (auto d = r.Enum<pb::Device>(obj, path, "device", true, "device", DeviceNames(), ParseDevice))
          c.set_device(*d);
        break;
      default: break;
    }
  }
  if (auto s = r.String(obj, path, "method", false, "one of event, kernel, wall")) c.set_method(*s);
  const int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  if (auto n = r.Integer(obj, path, "warmup", false, kInt32Max)) c.set_warmup(static_cast<int32_t>(*n));
  if (auto n = r.Integer(obj, path, "iters", false, kInt32Max)) c.set_iters(static_cast<int32_t>(*n));
  if (auto n = r.Integer(obj, path, "wrong", false, kInt32Max)) c.set_wrong(static_cast<int32_t>(*n));

  const std::string points_path = Join(path, "points");
  const json* points = r.Array(obj, path, "points", true, "an array of [size, us] pairs");
  if (points == nullptr) {
    r.problems().Cover(points_path);
    return;
  }
  for (size_t j = 0; j < points->size(); ++j) {
    const json& pt = (*points)[j];
    const std::string pp = Index(points_path, j);
    pb::Point* point = c.add_points();
    if (!pt.is_array() || pt.size() != 2) {
      r.WrongType(pp, pt, "a [size, us] pair");
      continue;
    }
    if (auto n = r.IntegerValue(pt[0], Join(pp, "size"), std::numeric_limits<int64_t>::max())) point->set_size(*n);
    if (auto x = r.NumberValue(pt[1], Join(pp, "us"))) point->set_us(*x);
  }
}

// Returns false when `doc` is no profile at all (not an object, another format).
bool ReadProfile(Reader& r, const json& doc, pb::Profile& profile) {
  if (!r.Object(doc, "", "a JSON object (a cupcake.profile.v1 profile)")) return false;
  if (!CheckFormat(r, doc, "", kProfileFormat, true)) return false;
  r.Keys(doc, "", kProfileKeys);

  const json* cluster = r.Field(doc, "", "cluster", true, "an object with name, nodes, devices_per_node");
  if (cluster != nullptr && r.Object(*cluster, "cluster", "an object with name, nodes, devices_per_node")) {
    pb::Cluster* c = profile.mutable_cluster();
    r.Keys(*cluster, "cluster", kClusterKeys);
    if (auto s = r.String(*cluster, "cluster", "name", true, "a non-empty string")) c->set_name(*s);
    const int64_t kInt32Max = std::numeric_limits<int32_t>::max();
    if (auto n = r.Integer(*cluster, "cluster", "nodes", true, kInt32Max)) c->set_nodes(static_cast<int32_t>(*n));
    if (auto n = r.Integer(*cluster, "cluster", "devices_per_node", true, kInt32Max))
      c->set_devices_per_node(static_cast<int32_t>(*n));
    if (auto s = r.String(*cluster, "cluster", "device", false)) c->set_device(*s);
    if (auto s = r.String(*cluster, "cluster", "interconnect", false)) c->set_interconnect(*s);
    if (auto s = r.String(*cluster, "cluster", "network", false)) c->set_network(*s);
    if (auto s = r.String(*cluster, "cluster", "source", false)) c->set_source(*s);
    if (const json* meta = r.Field(*cluster, "cluster", "meta", false, "an object of strings")) {
      if (!meta->is_object()) {
        r.WrongType("cluster.meta", *meta, "an object of strings");
      } else {
        for (const auto& [key, value] : meta->items()) {
          if (value.is_string())
            (*c->mutable_meta())[key] = value.get<std::string>();
          else
            r.WrongType(Join("cluster.meta", key), value, "a string");
        }
      }
    }
  } else if (cluster != nullptr) {
    profile.mutable_cluster();  // reported; keep CheckProfile from reporting it missing
  }

  if (const json* curves = r.Array(doc, "", "curves", true, "an array of curves")) {
    for (size_t i = 0; i < curves->size(); ++i) ReadCurve(r, (*curves)[i], Index("curves", i), *profile.add_curves());
  } else {
    r.problems().Cover("curves");
  }
  if (const json* models = r.Array(doc, "", "models", false, "an array of cupcake.model.v1 models")) {
    for (size_t i = 0; i < models->size(); ++i)
      ReadModel(r, (*models)[i], Index("models", i), false, *profile.add_models());
  } else if (doc.contains("models")) {
    r.problems().Cover("models");
  }
  return true;
}

// ---------------------------------------------------------------- writing

ordered_json ModelObject(const pb::Model& m) {
  ordered_json o;
  o["format"] = kModelFormat;
  o["name"] = m.name();
  if (m.has_source()) o["source"] = m.source();
  if (m.has_forward_us()) o["forward_us"] = m.forward_us();
  if (m.has_update_us()) o["update_us"] = m.update_us();
  ordered_json tensors = ordered_json::array();
  for (const pb::Tensor& t : m.tensors()) {
    ordered_json jt;
    jt["name"] = t.name();
    jt["numel"] = t.numel();
    jt["dtype"] = Name(t.dtype());
    jt["backward_us"] = t.backward_us();
    if (t.has_density()) jt["density"] = t.density();
    if (!t.shape().empty()) jt["shape"] = std::vector<int64_t>(t.shape().begin(), t.shape().end());
    tensors.push_back(std::move(jt));
  }
  o["tensors"] = std::move(tensors);
  return o;
}

ordered_json CurveObject(const pb::Curve& c) {
  ordered_json o;
  o["kind"] = Name(c.kind());
  switch (c.kind()) {
    case pb::COMM:
      o["op"] = Name(c.comm_op());
      o["scope"] = Name(c.scope());
      if (c.dtype() != pb::DTYPE_UNSPECIFIED) o["dtype"] = Name(c.dtype());
      if (c.busy()) o["busy"] = true;
      if (c.chained()) o["chained"] = true;
      break;
    case pb::ENCODE:
    case pb::DECODE:
      o["compressor"] = c.compressor();
      o["device"] = Name(c.device());
      if (c.has_ratio()) o["ratio"] = c.ratio();
      break;
    case pb::COPY:
      o["op"] = Name(c.copy_op());
      o["device"] = Name(c.device());
      break;
    default: break;
  }
  if (c.has_method()) o["method"] = c.method();
  if (c.has_warmup()) o["warmup"] = c.warmup();
  if (c.has_iters()) o["iters"] = c.iters();
  if (c.has_wrong()) o["wrong"] = c.wrong();
  ordered_json points = ordered_json::array();
  for (const pb::Point& p : c.points()) points.push_back(ordered_json::array({p.size(), p.us()}));
  o["points"] = std::move(points);
  return o;
}

bool IsScalar(const ordered_json& v) { return !v.is_array() && !v.is_object(); }

// Pretty-prints with two-space indents; arrays of scalars (a point) stay on one line.
void Write(const ordered_json& v, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  if (v.is_object() && !v.empty()) {
    out += "{\n";
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) out += ",\n";
      first = false;
      out += pad + ordered_json(key).dump() + ": ";
      Write(value, indent + 2, out);
    }
    out += "\n" + std::string(static_cast<size_t>(indent), ' ') + "}";
  } else if (v.is_array() && !v.empty()) {
    bool scalars = true;
    for (const auto& e : v) scalars = scalars && IsScalar(e);
    if (scalars) {
      out += "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i].dump();
      out += "]";
      return;
    }
    out += "[\n";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ",\n";
      out += pad;
      Write(v[i], indent + 2, out);
    }
    out += "\n" + std::string(static_cast<size_t>(indent), ' ') + "]";
  } else {
    out += v.dump();
  }
}

std::string Dump(const ordered_json& v) {
  std::string out;
  Write(v, 0, out);
  out += "\n";
  return out;
}

}  // namespace

StatusOr<JsonFormat> DetectJsonFormat(std::string_view text, const std::string& origin) {
  CUPCAKE_ASSIGN_OR_RETURN(json doc, ParseText(text, origin));
  const std::string expected = Quote(kModelFormat) + " or " + Quote(kProfileFormat);
  if (!doc.is_object())
    return InvalidArgumentError(origin + ": (top level): wrong type; got " + TypeName(doc) +
                                ", expected a JSON object");
  auto it = doc.find("format");
  if (it == doc.end()) return InvalidArgumentError(origin + ": format: missing; expected " + expected);
  if (it->is_string() && it->get<std::string>() == kModelFormat) return JsonFormat::kModel;
  if (it->is_string() && it->get<std::string>() == kProfileFormat) return JsonFormat::kProfile;
  return InvalidArgumentError(origin + ": format: unknown format; got " + Got(*it) + ", expected " + expected);
}

StatusOr<pb::Model> ParseModelJson(std::string_view text, const std::string& origin) {
  CUPCAKE_ASSIGN_OR_RETURN(json doc, ParseText(text, origin));
  Problems problems(origin);
  Reader reader(problems);
  pb::Model model;
  if (ReadModel(reader, doc, "", true, model)) internal::CheckModel(model, "", problems);
  CUPCAKE_RETURN_IF_ERROR(problems.ToStatus());
  return model;
}

StatusOr<pb::Profile> ParseProfileJson(std::string_view text, const std::string& origin) {
  CUPCAKE_ASSIGN_OR_RETURN(json doc, ParseText(text, origin));
  Problems problems(origin);
  Reader reader(problems);
  pb::Profile profile;
  if (ReadProfile(reader, doc, profile)) internal::CheckProfile(profile, "", problems);
  CUPCAKE_RETURN_IF_ERROR(problems.ToStatus());
  return profile;
}

std::string ModelToJson(const pb::Model& model) { return Dump(ModelObject(model)); }

std::string ProfileToJson(const pb::Profile& profile) {
  ordered_json o;
  o["format"] = kProfileFormat;
  if (profile.has_cluster()) {
    const pb::Cluster& c = profile.cluster();
    ordered_json jc;
    jc["name"] = c.name();
    jc["nodes"] = c.nodes();
    jc["devices_per_node"] = c.devices_per_node();
    if (c.has_device()) jc["device"] = c.device();
    if (c.has_interconnect()) jc["interconnect"] = c.interconnect();
    if (c.has_network()) jc["network"] = c.network();
    if (c.has_source()) jc["source"] = c.source();
    if (!c.meta().empty()) {
      std::map<std::string, std::string> sorted(c.meta().begin(), c.meta().end());
      ordered_json meta = ordered_json::object();
      for (const auto& [k, v] : sorted) meta[k] = v;
      jc["meta"] = std::move(meta);
    }
    o["cluster"] = std::move(jc);
  }
  ordered_json curves = ordered_json::array();
  for (const pb::Curve& c : profile.curves()) curves.push_back(CurveObject(c));
  o["curves"] = std::move(curves);
  if (profile.models_size() > 0) {
    ordered_json models = ordered_json::array();
    for (const pb::Model& m : profile.models()) models.push_back(ModelObject(m));
    o["models"] = std::move(models);
  }
  return Dump(o);
}

}  // namespace cupcake::profile

#include "cupcake/planner/report.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <sstream>

#include "cupcake/proto/names.h"

namespace cupcake::planner {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", ch);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

// Exact: two different doubles never print the same.
std::string Exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class TraceWriter {
 public:
  // `args`: the slice's sizes, e.g. {"elements", 1024}, {"bytes", 4096}; shown on selection.
  void Slice(int tid, const std::string& name, const std::string& cat, double start_us, double dur_us,
             std::initializer_list<std::pair<const char*, int64_t>> args = {}) {
    os_ << (first_ ? "\n" : ",\n") << "{\"ph\":\"X\",\"pid\":1,\"tid\":" << tid << ",\"name\":" << JsonString(name)
        << ",\"cat\":\"" << cat << "\",\"ts\":" << Num(start_us) << ",\"dur\":" << Num(dur_us);
    if (args.size() > 0) {
      os_ << ",\"args\":{";
      bool first_arg = true;
      for (const auto& [key, value] : args) {
        os_ << (first_arg ? "" : ",") << "\"" << key << "\":" << value;
        first_arg = false;
      }
      os_ << "}";
    }
    os_ << "}";
    first_ = false;
  }
  void ThreadName(int tid, const std::string& name) {
    os_ << (first_ ? "\n" : ",\n") << "{\"ph\":\"M\",\"pid\":1,\"tid\":" << tid
        << ",\"name\":\"thread_name\",\"args\":{\"name\":" << JsonString(name) << "}}";
    first_ = false;
  }
  std::string Finish() { return "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[" + os_.str() + "\n]}\n"; }

 private:
  std::ostringstream os_;
  bool first_ = true;
};

std::string GroupName(const pb::Plan& plan, int k) {
  const auto& g = plan.groups(k);
  const auto& t = plan.model().model().tensors();
  std::string name = "group " + std::to_string(k) + " [" + t[g.first_tensor()].name();
  if (g.last_tensor() != g.first_tensor()) name += " .. " + t[g.last_tensor()].name();
  return name + "]";
}

// "fc.bias .. layer4.2.bn3.bias" boundaries of each group.
std::vector<std::string> Boundaries(const pb::Plan& p) {
  std::vector<std::string> out;
  const auto& t = p.model().model().tensors();
  for (const auto& g : p.groups()) {
    std::string s = t[g.first_tensor()].name();
    if (g.last_tensor() != g.first_tensor()) s += " .. " + t[g.last_tensor()].name();
    out.push_back(s);
  }
  return out;
}

std::string Options(const pb::GroupOptions& o) {
  if (!o.scheme().empty())
    return o.scheme() + (o.compress() ? " compress" : " fp32") + " on " + std::string(Name(o.device())) + " via " +
           std::string(Name(o.collective()));
  return std::string(o.compress() ? "compress" : "fp32") + " on " + std::string(Name(o.device())) + " via " +
         std::string(Name(o.collective()));
}

}  // namespace

std::string ChromeTrace(const pb::Plan& plan) {
  constexpr int kCompute = 1, kNetwork = 2, kCpu = 3;
  TraceWriter w;
  w.ThreadName(kCompute, "compute");
  w.ThreadName(kNetwork, "network");
  auto offloaded = [&](const pb::Group& g) { return g.options().device() != plan.device(); };
  bool any_offloaded = false;
  for (const auto& g : plan.groups()) any_offloaded = any_offloaded || offloaded(g);
  if (any_offloaded) w.ThreadName(kCpu, "cpu worker");
  const auto& model = plan.model().model();
  const double t0 = model.forward_us();  // plan times start at backward
  if (model.forward_us() > 0) w.Slice(kCompute, "forward", "forward", 0, model.forward_us());
  // Backward runs on the compute stream, delayed by the encodes of the groups before it that
  // run there (not by those offloaded to the CPU worker).
  double delay = 0, backward = 0;
  int k = 0;
  for (int i = 0; i < model.tensors_size(); ++i) {
    const auto& t = model.tensors(i);
    if (t.backward_us() > 0) w.Slice(kCompute, t.name(), "backward", t0 + backward + delay, t.backward_us());
    backward += t.backward_us();
    if (k < plan.groups_size() && plan.groups(k).last_tensor() == i) {
      const auto& g = plan.groups(k);
      if (!offloaded(g)) delay += g.encode_end_us() - g.encode_start_us();
      ++k;
    }
  }
  double end = 0;
  for (int g = 0; g < plan.groups_size(); ++g) {
    const auto& grp = plan.groups(g);
    const std::string name = GroupName(plan, g);
    const int device = offloaded(grp) ? kCpu : kCompute;
    if (grp.encode_end_us() > grp.encode_start_us())
      w.Slice(device, (offloaded(grp) ? "copy to host, encode " : "encode ") + name, "encode",
              t0 + grp.encode_start_us(), grp.encode_end_us() - grp.encode_start_us(),
              {{"elements", grp.numel()}, {"bytes", grp.payload_bytes()}});
    if (grp.steps().empty()) {
      w.Slice(kNetwork, std::string(Name(grp.options().collective())) + " " + name, "comm", t0 + grp.comm_start_us(),
              grp.comm_end_us() - grp.comm_start_us(), {{"elements", grp.numel()}, {"bytes", grp.payload_bytes()}});
    } else {
      // One slice per collective (intra, inter, global), and the encode or decode between them.
      double at = grp.comm_start_us();
      for (const auto& st : grp.steps()) {
        if (st.start_us() > at) w.Slice(kNetwork, "codec " + name, "codec", t0 + at, st.start_us() - at);
        w.Slice(kNetwork, std::string(Name(st.op())) + " " + std::string(Name(st.scope())) + " " + name, "comm",
                t0 + st.start_us(), st.end_us() - st.start_us(), {{"elements", grp.numel()}, {"bytes", st.bytes()}});
        at = st.end_us();
      }
      if (grp.comm_end_us() > at) w.Slice(kNetwork, "codec " + name, "codec", t0 + at, grp.comm_end_us() - at);
    }
    if (grp.decode_end_us() > grp.decode_start_us())
      w.Slice(device, (offloaded(grp) ? "decode, copy back " : "decode ") + name, "decode", t0 + grp.decode_start_us(),
              grp.decode_end_us() - grp.decode_start_us(), {{"elements", grp.numel()}, {"bytes", grp.payload_bytes()}});
    end = std::max(end, grp.decode_end_us());
  }
  if (model.update_us() > 0) w.Slice(kCompute, "update", "update", t0 + end, model.update_us());
  return w.Finish();
}

PlanDiff DiffPlans(const pb::Plan& a, const pb::Plan& b, double tolerance_pct) {
  PlanDiff d;
  auto change = [&](const std::string& what, const std::string& from, const std::string& to) {
    if (from != to) d.changes.push_back(what + ": " + from + " -> " + to);
  };
  change("model", a.model().model().name() + " (" + a.model().fingerprint() + ")",
         b.model().model().name() + " (" + b.model().fingerprint() + ")");
  change("profile", a.profile_name() + " (" + a.profile_fingerprint() + ")",
         b.profile_name() + " (" + b.profile_fingerprint() + ")");
  change("world_size", std::to_string(a.world_size()), std::to_string(b.world_size()));
  change("device", std::string(Name(a.device())), std::string(Name(b.device())));
  change("compressor", a.compressor().name(), b.compressor().name());
  change("compressor.ratio", Exact(a.compressor().ratio()), Exact(b.compressor().ratio()));
  change("compressor.memory", a.compressor().memory(), b.compressor().memory());
  change("compressor.seed", std::to_string(a.compressor().seed()), std::to_string(b.compressor().seed()));
  change("compressor.zen_union", Exact(a.compressor().zen_union()), Exact(b.compressor().zen_union()));
  change("compressor.rank", std::to_string(a.compressor().rank()), std::to_string(b.compressor().rank()));

  // Groups: compared by their boundaries as tensor names, so the report reads as the model.
  std::vector<std::string> ga = Boundaries(a), gb = Boundaries(b);
  std::map<std::string, int> in_b;
  for (size_t i = 0; i < gb.size(); ++i) in_b[gb[i]] = static_cast<int>(i);
  std::map<std::string, int> in_a;
  for (size_t i = 0; i < ga.size(); ++i) in_a[ga[i]] = static_cast<int>(i);
  if (ga.size() != gb.size()) change("groups", std::to_string(ga.size()), std::to_string(gb.size()));
  for (size_t i = 0; i < ga.size(); ++i) {
    auto it = in_b.find(ga[i]);
    if (it == in_b.end()) {
      d.changes.push_back("- group [" + ga[i] + "] (" + Options(a.groups(static_cast<int>(i)).options()) + ")");
    } else {
      change("group [" + ga[i] + "] options", Options(a.groups(i).options()), Options(b.groups(it->second).options()));
    }
  }
  for (size_t i = 0; i < gb.size(); ++i)
    if (!in_a.count(gb[i]))
      d.changes.push_back("+ group [" + gb[i] + "] (" + Options(b.groups(static_cast<int>(i)).options()) + ")");
  const bool structural = !d.changes.empty();

  const double ta = a.predicted().iteration_us(), tb = b.predicted().iteration_us();
  d.time_change_pct = ta > 0 ? (tb - ta) / ta * 100.0 : (tb > 0 ? 100.0 : 0.0);
  const bool slower_or_faster = std::abs(d.time_change_pct) > tolerance_pct;
  if (ta != tb)
    d.changes.push_back("predicted.iteration_us: " + Num(ta) + " -> " + Num(tb) + " (" +
                        (d.time_change_pct >= 0 ? "+" : "") + Num(d.time_change_pct) + "%, tolerance " +
                        Num(tolerance_pct) + "%)");
  d.different = structural || slower_or_faster;
  return d;
}

}  // namespace cupcake::planner

// Random and hand-made planner problems for the tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/cost_model.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/names.h"

namespace cupcake::planner::testing {

inline pb::Curve MakeCurve(pb::CurveKind kind, std::initializer_list<std::pair<int64_t, double>> points) {
  pb::Curve c;
  c.set_kind(kind);
  for (auto [size, us] : points) {
    auto* p = c.add_points();
    p->set_size(size);
    p->set_us(us);
  }
  return c;
}

// A collective's curve: `op` in `scope`.
inline pb::Curve MakeCommCurve(pb::CommOp op, pb::Scope scope,
                               std::initializer_list<std::pair<int64_t, double>> points) {
  pb::Curve c = MakeCurve(pb::COMM, points);
  c.set_comm_op(op);
  c.set_scope(scope);
  return c;
}

// A jagged curve: random sizes and times, neither monotone nor subadditive.
inline pb::Curve RandomCurve(std::mt19937_64& rng, pb::CurveKind kind, int64_t max_size) {
  pb::Curve c;
  c.set_kind(kind);
  std::uniform_int_distribution<int> count(1, 6);
  std::uniform_real_distribution<double> time(0.0, 200.0);
  std::uniform_int_distribution<int64_t> size(1, max_size);
  std::vector<int64_t> sizes;
  for (int i = count(rng); i > 0; --i) sizes.push_back(size(rng));
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int64_t s : sizes) {
    auto* p = c.add_points();
    p->set_size(s);
    // Some zero times, so ties and free operations are exercised.
    p->set_us(rng() % 5 == 0 ? 0.0 : time(rng));
  }
  return c;
}

inline pb::Model RandomModel(std::mt19937_64& rng, int n) {
  pb::Model m;
  m.set_name("random" + std::to_string(n));
  std::uniform_int_distribution<int64_t> numel(1, 5000);
  std::uniform_real_distribution<double> gap(0.0, 300.0);
  for (int i = 0; i < n; ++i) {
    auto* t = m.add_tensors();
    t->set_name("t" + std::to_string(i));
    t->set_numel(numel(rng));
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(rng() % 4 == 0 ? 0.0 : gap(rng));
  }
  if (rng() % 2) m.set_forward_us(gap(rng));
  if (rng() % 2) m.set_update_us(gap(rng));
  return m;
}

// A profile with jagged curves for every compressor on both devices, allreduce and
// allgather, and (sometimes) pack and unpack.
inline pb::Profile RandomProfile(std::mt19937_64& rng) {
  pb::Profile p;
  p.mutable_cluster()->set_name("random");
  p.mutable_cluster()->set_nodes(1 + static_cast<int>(rng() % 4));
  p.mutable_cluster()->set_devices_per_node(1 + static_cast<int>(rng() % 4));
  for (pb::CommOp op : {pb::ALLREDUCE, pb::ALLGATHER}) {
    pb::Curve c = RandomCurve(rng, pb::COMM, 200000);
    c.set_comm_op(op);
    c.set_scope(pb::GLOBAL);
    *p.add_curves() = c;
  }
  for (pb::Device d : {pb::GPU, pb::CPU}) {
    for (std::string_view name : CompressorNames()) {
      if (name == "fp32") continue;
      for (pb::CurveKind k : {pb::ENCODE, pb::DECODE}) {
        pb::Curve c = RandomCurve(rng, k, 50000);
        c.set_compressor(std::string(name));
        c.set_device(d);
        *p.add_curves() = c;
      }
    }
    for (pb::CopyOp op : {pb::PACK, pb::UNPACK}) {
      if (rng() % 3 == 0) continue;
      pb::Curve c = RandomCurve(rng, pb::COPY, 200000);
      c.set_copy_op(op);
      c.set_device(d);
      *p.add_curves() = c;
    }
  }
  // Half the time, busy curves of the global collectives (docs/MODEL.md, "Busy cores").
  if (rng() % 2) {
    for (pb::CommOp op : {pb::ALLREDUCE, pb::ALLGATHER}) {
      pb::Curve c = RandomCurve(rng, pb::COMM, 200000);
      c.set_comm_op(op);
      c.set_scope(pb::GLOBAL);
      c.set_busy(true);
      *p.add_curves() = c;
    }
  }
  return p;
}

// Affine curves (startup + per-unit cost) for every compressor on the gpu: the shape real
// profiles have, where the best strategy has several groups.
inline pb::Profile AffineProfile(double comm_startup_us, double us_per_byte, double kernel_startup_us) {
  pb::Profile p;
  p.mutable_cluster()->set_name("affine");
  p.mutable_cluster()->set_nodes(2);
  p.mutable_cluster()->set_devices_per_node(4);
  for (pb::CommOp op : {pb::ALLREDUCE, pb::ALLGATHER}) {
    pb::Curve c = MakeCurve(pb::COMM, {{1, comm_startup_us}, {1 << 30, comm_startup_us + us_per_byte * (1 << 30)}});
    c.set_comm_op(op);
    c.set_scope(pb::GLOBAL);
    *p.add_curves() = c;
  }
  for (std::string_view name : CompressorNames()) {
    for (pb::CurveKind k : {pb::ENCODE, pb::DECODE}) {
      pb::Curve c = MakeCurve(k, {{1, kernel_startup_us}, {1 << 30, kernel_startup_us + 1e-4 * (1 << 30)}});
      c.set_compressor(std::string(name));
      c.set_device(pb::GPU);
      *p.add_curves() = c;
    }
  }
  return p;
}

// A fusion instance small enough to solve by hand: three fp32 tensors of 100 floats (400
// bytes), backward 10 us each, forward 100, update 5; linear curves on the gpu:
// allreduce(b) = 20 + 0.01 b us (points 400 -> 24, 1200 -> 32), pack(s) = s / 800 us
// (points 800 -> 1, 1200 -> 1.5), no unpack curve (0), and fp32 has no encode or decode.
// The four strategies (group ends), with docs/MODEL.md's recurrences (C, F; D = F here, since
// every dec is 0), times relative to the start of the backward pass; an fp32 payload is the
// group's 4 n bytes:
//   {0,1,2}: enc 0,0,0; com allreduce(400) = 24 each; C = 10,20,30; F = 34,
//            max(20,34)+24 = 58, max(30,58)+24 = 82              -> 100 + 82 + 5   = 187
//   {0,2}:   enc 0, pack(800) = 1; com 24, allreduce(800) = 28; C = 10, 30 + 1 = 31;
//            F = 34, max(31,34)+28 = 62                         -> 100 + 62 + 5   = 167
//   {1,2}:   enc pack(800) = 1, 0; com 28, 24; C = 20 + 1 = 21, 30 + 1 = 31;
//            F = 49, max(31,49)+24 = 73                         -> 100 + 73 + 5   = 178
//   {2}:     enc pack(1200) = 1.5; com 32; C = 31.5; F = 63.5   -> 100 + 63.5 + 5 = 168.5
// The optimum is {0,2} at 167.
struct HandInstance {
  pb::Model model;
  pb::Profile profile;
  PlanRequest request;
};

inline HandInstance HandFusionInstance() {
  HandInstance h;
  h.model.set_name("hand3");
  h.model.set_forward_us(100);
  h.model.set_update_us(5);
  for (int i = 0; i < 3; ++i) {
    auto* t = h.model.add_tensors();
    t->set_name("t" + std::to_string(i));
    t->set_numel(100);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(10);
  }
  h.profile.mutable_cluster()->set_name("hand");
  h.profile.mutable_cluster()->set_nodes(1);
  h.profile.mutable_cluster()->set_devices_per_node(2);
  pb::Curve ar = MakeCurve(pb::COMM, {{400, 24}, {1200, 32}});
  ar.set_comm_op(pb::ALLREDUCE);
  ar.set_scope(pb::GLOBAL);
  *h.profile.add_curves() = ar;
  pb::Curve pack = MakeCurve(pb::COPY, {{800, 1}, {1200, 1.5}});
  pack.set_copy_op(pb::PACK);
  pack.set_device(pb::GPU);
  *h.profile.add_curves() = pack;
  h.request.compressor = "fp32";
  h.request.device = pb::GPU;
  return h;
}

// docs/MODEL.md's iteration time restated term by term, one group at a time (no GroupPricer,
// no CurveCursor, no Evaluate): the independent check of the search's and the plan's times.
// Uses only the curves and sizes MakeProblem resolved and the catalogue's payload formula.
// A collective of `idle` us (`busy` us beside busy cores, >= idle) started at `start`, while the
// compute stream has work until `until`: the share of it done before `until` goes at the busy
// speed, the rest at the idle one.
inline double ReferenceCommEnd(double start, double idle, double busy, double until) {
  const double busy_time = std::clamp(until - start, 0.0, busy);
  const double share_done = busy > 0 ? busy_time / busy : 1.0;
  return start + busy_time + (1.0 - share_done) * idle;
}

inline double ReferenceIterationUs(const Problem& p, const std::vector<int>& group_ends) {
  double total_backward = 0;
  for (double b : p.backward_us) total_backward += b;
  double enc_sum = 0, f = 0, backward = 0;
  std::vector<double> ready, dec;
  int first = 0;
  for (int last : group_ends) {
    int64_t n = 0, s = 0;
    for (int i = first; i <= last; ++i) {
      n += p.numel[static_cast<size_t>(i)];
      s += p.bytes[static_cast<size_t>(i)];
      backward += p.backward_us[static_cast<size_t>(i)];
    }
    const bool fused = last > first;
    const double enc =
        (fused ? p.pack.At(static_cast<double>(s)) : 0.0) + (p.compress ? p.encode.At(static_cast<double>(n)) : 0.0);
    const double payload = static_cast<double>(PayloadBytes(*p.compressor, n, p.ratio));
    const double com = p.comm.At(payload);
    const double com_busy = p.comm_busy.empty() ? com : std::max(com, p.comm_busy.At(payload));
    // After another collective, the network rests until chain us past its end (chained collectives).
    // Above the chained curve's last point, the excess at that point.
    const double x_c = p.comm_chained.last_size();
    const double chain = p.comm_chained.empty() ? 0.0
                                                : std::max(0.0, payload > x_c ? p.comm_chained.At(x_c) - p.comm.At(x_c)
                                                                              : p.comm_chained.At(payload) - com);
    dec.push_back((p.compress ? p.decode.At(static_cast<double>(n)) : 0.0) +
                  (fused ? p.unpack.At(static_cast<double>(s)) : 0.0));
    enc_sum += enc;
    const double c = backward + enc_sum;  // C_k
    const double start = ready.empty() ? c : std::max(c, f + chain);
    f = ReferenceCommEnd(start, com, com_busy, total_backward + enc_sum);  // F_k
    ready.push_back(f);
    first = last + 1;
  }
  double d = backward + enc_sum;  // D_0 = C_K
  for (size_t k = 0; k < dec.size(); ++k) d = std::max(d, ready[k]) + dec[k];
  return p.forward_us + d + p.update_us;
}

}  // namespace cupcake::planner::testing

namespace cupcake::planner::testing {

// A profile for the options space (docs/MODEL.md, v2): RandomProfile's curves plus, each
// sometimes missing, the intra and inter collectives, fp16 sums, the host copies and the global
// alltoall (zen); several nodes of several devices most of the time.
inline pb::Profile RandomOptionsProfile(std::mt19937_64& rng) {
  pb::Profile p = RandomProfile(rng);
  p.mutable_cluster()->set_nodes(1 + static_cast<int>(rng() % 3));
  p.mutable_cluster()->set_devices_per_node(1 + static_cast<int>(rng() % 4));
  for (pb::Scope scope : {pb::INTRA, pb::INTER}) {
    for (pb::CommOp op : {pb::ALLREDUCE, pb::ALLGATHER, pb::REDUCE_SCATTER}) {
      if (rng() % 6 == 0) continue;
      pb::Curve c = RandomCurve(rng, pb::COMM, 200000);
      c.set_comm_op(op);
      c.set_scope(scope);
      *p.add_curves() = c;
    }
  }
  if (rng() % 2) {
    pb::Curve c = RandomCurve(rng, pb::COMM, 200000);
    c.set_comm_op(pb::ALLREDUCE);
    c.set_scope(pb::GLOBAL);
    c.set_dtype(pb::FLOAT16);
    *p.add_curves() = c;
  }
  for (pb::CopyOp op : {pb::D2H, pb::H2D}) {
    if (rng() % 5 == 0) continue;
    pb::Curve c = RandomCurve(rng, pb::COPY, 200000);
    c.set_copy_op(op);
    c.set_device(pb::GPU);
    *p.add_curves() = c;
  }
  if (rng() % 2) {
    pb::Curve c = RandomCurve(rng, pb::COMM, 200000);
    c.set_comm_op(pb::ALLTOALL);
    c.set_scope(pb::GLOBAL);
    *p.add_curves() = c;
  }
  return p;
}

// Zen's partition step restated (docs/MODEL.md, "The zen scheme"): each of w ranks sends k of n
// indices; the expected union of independent uniform selections, u = n (1 - (1 - k/n)^w); an
// owner's share round(u / w) over ceil(n / w) rows, as a row list (4 bytes each) or a bitmap,
// the smaller, plus 4 bytes per value and the 8-byte header.
inline double ZenPartitionStepBytes(int64_t n, int64_t k, int w) {
  const double u = static_cast<double>(n) * (1.0 - std::pow(1.0 - static_cast<double>(k) / static_cast<double>(n), w));
  const double count = std::round(u / w);
  const double rows = std::ceil(static_cast<double>(n) / w);
  return 8 + 4 * count + std::min(4 * count, std::ceil(rows / 8));
}

// One group's option as the reference reads it: a scheme's name and a device.
struct RefOption {
  std::string scheme;
  pb::Device device;
};

// docs/MODEL.md's v2 timeline restated for the tests: every option priced from its scheme's
// name (not from the catalogue's table), curves looked up in the profile by key, and the three
// resources' chains run explicitly (not through labels). `plan_device` is the job's device; an
// option on another device is offloaded. Returns -1 when a curve the option needs is missing.
inline double ReferenceOptionsIterationUs(const pb::Model& model, const pb::Profile& profile,
                                          const std::string& compressor, double ratio, pb::Device plan_device,
                                          const std::vector<int>& ends, const std::vector<RefOption>& options) {
  auto curve = [&](const std::string& key, bool& found) -> Curve {
    for (const auto& c : profile.curves())
      if (CurveKey(c) == key) {
        found = true;
        return Curve(c);
      }
    found = false;
    return Curve();
  };
  bool ok = true;
  auto at = [&](const std::string& key, double size) {
    bool found = false;
    Curve c = curve(key, found);
    if (!found) ok = false;
    return c.At(size);
  };
  auto optional_at = [&](const std::string& key, double size) {
    bool found = false;
    Curve c = curve(key, found);
    return found ? c.At(size) : 0.0;
  };
  const int d = profile.cluster().devices_per_node();
  const std::string dev_plan(Name(plan_device));
  double total_backward = 0;
  for (const auto& t : model.tensors()) total_backward += t.backward_us();
  double backward = 0, e = 0, f = 0, g = 0;
  std::vector<double> net_end, post;
  std::vector<bool> offloaded;
  int first = 0;
  for (size_t k = 0; k < ends.size(); ++k) {
    const RefOption& o = options[k];
    const bool hier = o.scheme.rfind("hier", 0) == 0;
    const bool zen = o.scheme == "zen";
    const bool zen_sparse = o.scheme == "zen_sparse";
    std::string codec = compressor;
    if (o.scheme == "flat_fp32" || o.scheme == "hier_fp32") codec = "fp32";
    if (o.scheme == "flat_fp16" || o.scheme == "hier_fp16") codec = "fp16";
    const CompressorInfo* info = FindCompressor(codec);
    const bool has_codec = codec != "fp32";
    const std::string op(Name(info->collective));
    const std::string dev(Name(o.device));
    const bool offload = o.device != plan_device;
    int64_t n = 0, s = 0;
    double d2h = 0, h2d = 0;
    for (int i = first; i <= ends[k]; ++i) {
      const auto& t = model.tensors(i);
      n += t.numel();
      s += 4 * t.numel();
      backward += t.backward_us();
      if (offload) {
        d2h += at("copy d2h gpu", 4.0 * static_cast<double>(t.numel()));
        h2d += at("copy h2d gpu", 4.0 * static_cast<double>(t.numel()));
      }
    }
    const bool fused = ends[k] > first;
    bool f16 = false;
    curve("comm allreduce global float16", f16);
    const std::string sum16 = codec == "fp16" && f16 ? " float16" : "";
    double pre = 0, net = 0, pst = 0, busy_extra = 0, chain = 0;
    bool first_step = true;
    // A collective step: its idle time into the block, what its busy curve adds (if any) aside;
    // for the block's first, what its chained curve adds (if any) after another block.
    auto step = [&](const std::string& key, double size) {
      const double idle = at(key, size);
      bool found = false;
      const Curve busy = curve(key + " busy", found);
      if (found) busy_extra += std::max(0.0, busy.At(size) - idle);
      const Curve chained = curve(key + " chained", found);
      // Above the chained curve's last point, the excess at that point.
      const double x_c = chained.last_size();
      if (first_step && found)
        chain = std::max(0.0, size > x_c ? chained.At(x_c) - at(key, x_c) : chained.At(size) - idle);
      first_step = false;
      return idle;
    };
    if (zen_sparse) {
      // Zen's four steps on the group's expected non-zeros (round(density x numel) in [1, numel]
      // per tensor; numel without a density), every kernel read at x = max(n, k / R) elements,
      // R the non-zero share of the model's tensors of density <= 1/2 (docs/MODEL.md,
      // "Naturally sparse gradients"); curves recorded without a ratio.
      auto nonzeros = [](const pb::Tensor& t) {
        return t.has_density()
                   ? std::clamp<int64_t>(std::llround(t.density() * static_cast<double>(t.numel())), 1, t.numel())
                   : t.numel();
      };
      int64_t k_nz = 0, sparse_n = 0, sparse_nz = 0;
      for (int i = first; i <= ends[k]; ++i) k_nz += nonzeros(model.tensors(i));
      for (const auto& t : model.tensors())
        if (t.has_density() && t.density() <= 0.5) {
          sparse_n += t.numel();
          sparse_nz += nonzeros(t);
        }
      const double share = static_cast<double>(sparse_nz) / static_cast<double>(sparse_n);
      const double x = std::max(static_cast<double>(n), static_cast<double>(k_nz) / share);
      const int w = profile.cluster().nodes() * d;
      pre += at("encode nonzero " + dev, x);
      net += step("comm alltoall global", 8.0 * w) + step("comm alltoall global", 8.0 * static_cast<double>(k_nz)) +
             at("encode zen " + dev, x) + step("comm allgather global", 8.0) +
             step("comm allgather global", ZenPartitionStepBytes(n, k_nz, w));
      pst += at("decode zen " + dev, x);
    } else if (zen) {
      // counts, pairs (8 k bytes: the payload), the owners' merge (a decode), sizes, partitions.
      const int w = profile.cluster().nodes() * d;
      const int64_t selected = PayloadBytes(*info, n, ratio) / 8;
      // The merge and the post stage: Zen's own curves (without a ratio here) where the profile
      // has them, else the codec's decode.
      auto zen_or_decode = [&](const std::string& zen_key) {
        bool found = false;
        const Curve c = curve(zen_key, found);
        return found ? c.At(static_cast<double>(n)) : at("decode " + codec + " " + dev, static_cast<double>(n));
      };
      pre += at("encode " + codec + " " + dev, static_cast<double>(n));
      net += step("comm alltoall global", 8.0 * w) + step("comm alltoall global", 8.0 * static_cast<double>(selected)) +
             zen_or_decode("encode zen " + dev) + step("comm allgather global", 8.0) +
             step("comm allgather global", ZenPartitionStepBytes(n, selected, w));
      pst += zen_or_decode("decode zen " + dev);
    } else if (!hier) {
      if (has_codec) pre += at("encode " + codec + " " + dev, static_cast<double>(n));
      net += step("comm " + op + " global" + sum16, static_cast<double>(PayloadBytes(*info, n, ratio)));
      if (has_codec) pst += at("decode " + codec + " " + dev, static_cast<double>(n));
    } else {
      bool intra16 = false, inter16 = false;
      curve("comm allreduce inter float16", inter16);
      (void)intra16;
      const int64_t m = (n + d - 1) / d;
      net += step("comm reduce_scatter intra", 4.0 * static_cast<double>(d * m));
      if (has_codec) net += at("encode " + codec + " " + dev, static_cast<double>(m));
      net += step("comm " + op + " inter" + (codec == "fp16" && inter16 ? " float16" : ""),
                  static_cast<double>(PayloadBytes(*info, m, ratio)));
      if (has_codec) net += at("decode " + codec + " " + dev, static_cast<double>(m));
      net += step("comm allgather intra", 4.0 * static_cast<double>(m));
    }
    if (!offload && fused) {
      pre += optional_at("copy pack " + dev_plan, static_cast<double>(s));
      pst += optional_at("copy unpack " + dev_plan, static_cast<double>(s));
    }
    pre += d2h;
    pst += h2d;
    double ready;
    if (offload) {
      g = std::max(backward + e, g) + pre;  // the CPU worker
      ready = g;
    } else {
      e += pre;  // the compute stream
      ready = backward + e;
    }
    const double start = k == 0 ? ready : std::max(ready, f + chain);
    f = ReferenceCommEnd(start, net, net + busy_extra, total_backward + e);  // the network
    net_end.push_back(f);
    post.push_back(pst);
    offloaded.push_back(offload);
    first = ends[k] + 1;
  }
  double compute = backward + e, cpu = g;  // D_0 and H_0
  for (size_t k = 0; k < ends.size(); ++k) {
    double& chain = offloaded[k] ? cpu : compute;
    chain = std::max(chain, net_end[k]) + post[k];
  }
  if (!ok) return -1;
  return model.forward_us() + std::max(compute, cpu) + model.update_us();
}

}  // namespace cupcake::planner::testing

// Random and hand-made planner problems for the tests.
#pragma once

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
inline double ReferenceIterationUs(const Problem& p, const std::vector<int>& group_ends) {
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
    const double enc = (fused ? p.pack.At(static_cast<double>(s)) : 0.0) +
                       (p.compress ? p.encode.At(static_cast<double>(n)) : 0.0);
    const double com = p.comm.At(static_cast<double>(PayloadBytes(*p.compressor, n, p.ratio)));
    dec.push_back((p.compress ? p.decode.At(static_cast<double>(n)) : 0.0) +
                  (fused ? p.unpack.At(static_cast<double>(s)) : 0.0));
    enc_sum += enc;
    const double c = backward + enc_sum;  // C_k
    f = std::max(c, f) + com;              // F_k
    ready.push_back(f);
    first = last + 1;
  }
  double d = backward + enc_sum;  // D_0 = C_K
  for (size_t k = 0; k < dec.size(); ++k) d = std::max(d, ready[k]) + dec[k];
  return p.forward_us + d + p.update_us;
}

}  // namespace cupcake::planner::testing

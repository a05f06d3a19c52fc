// Random and hand-made planner problems for the tests.
#pragma once

#include <random>
#include <string>

#include "cupcake/cupcake.pb.h"
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

}  // namespace cupcake::planner::testing

#include "cupcake/proto/fingerprint.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake {
namespace {

class Fnv1a {
 public:
  void Bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      hash_ ^= p[i];
      hash_ *= 1099511628211ull;
    }
  }
  void Str(std::string_view s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
  void U64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    Bytes(b, 8);
  }
  void F64(double v) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    U64(bits);
  }
  std::string Hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash_));
    return buf;
  }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

}  // namespace

std::string ModelFingerprint(const pb::Model& model) {
  Fnv1a h;
  h.Str("cupcake.model");
  h.U64(static_cast<uint64_t>(model.tensors_size()));
  for (const auto& t : model.tensors()) {
    h.Str(t.name());
    h.U64(static_cast<uint64_t>(t.numel()));
    h.U64(static_cast<uint64_t>(t.dtype()));
  }
  return h.Hex();
}

std::string ProfileFingerprint(const pb::Profile& profile) {
  Fnv1a h;
  h.Str("cupcake.profile");
  const auto& c = profile.cluster();
  h.Str(c.name());
  h.U64(static_cast<uint64_t>(c.nodes()));
  h.U64(static_cast<uint64_t>(c.devices_per_node()));
  h.Str(c.device());
  h.Str(c.interconnect());
  h.Str(c.network());
  std::vector<const pb::Curve*> curves;
  for (const auto& curve : profile.curves()) curves.push_back(&curve);
  std::sort(curves.begin(), curves.end(),
            [](const pb::Curve* a, const pb::Curve* b) { return CurveKey(*a) < CurveKey(*b); });
  h.U64(curves.size());
  for (const pb::Curve* curve : curves) {
    h.Str(CurveKey(*curve));
    h.U64(static_cast<uint64_t>(curve->points_size()));
    for (const auto& p : curve->points()) {
      h.U64(static_cast<uint64_t>(p.size()));
      h.F64(p.us());
    }
  }
  return h.Hex();
}

std::string PlanFingerprint(const pb::Plan& plan) {
  Fnv1a h;
  h.Str("cupcake.plan");
  h.Str(SerializePlan(plan));
  return h.Hex();
}

}  // namespace cupcake

#include "cupcake/planner/curve.h"

#include <algorithm>

#include "cupcake/proto/status.h"

namespace cupcake::planner {

Curve::Curve(const pb::Curve& curve) {
  sizes_.reserve(curve.points_size());
  times_.reserve(curve.points_size());
  for (const auto& p : curve.points()) {
    sizes_.push_back(static_cast<double>(p.size()));
    times_.push_back(p.us());
  }
}

Curve::Curve(std::vector<double> sizes, std::vector<double> times)
    : sizes_(std::move(sizes)), times_(std::move(times)) {
  CUPCAKE_CHECK_EQ(sizes_.size(), times_.size());
  for (size_t i = 1; i < sizes_.size(); ++i) CUPCAKE_CHECK_LT(sizes_[i - 1], sizes_[i]);
}

double Curve::At(double size) const {
  size_t hi = std::upper_bound(sizes_.begin(), sizes_.end(), size) - sizes_.begin();
  return internal::EvalAt(sizes_, times_, hi, size);
}

}  // namespace cupcake::planner

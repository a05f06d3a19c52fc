#include "cupcake/planner/curve.h"

#include <algorithm>

#include "cupcake/proto/status.h"

namespace cupcake::planner {
namespace {

// The value on the line through (x0, y0) and (x1, y1) at x, clamped at 0.
double Interpolate(double x0, double y0, double x1, double y1, double x) {
  double y = y0 + (y1 - y0) * ((x - x0) / (x1 - x0));
  return y > 0.0 ? y : 0.0;
}

// Evaluates with `hi` = index of the first point whose size is > x (0..n).
double EvalAt(const std::vector<double>& xs, const std::vector<double>& ys, size_t hi, double x) {
  const size_t n = xs.size();
  if (n == 0) return 0.0;
  if (n == 1 || hi == 0) return ys[0];
  if (hi == n) hi = n - 1;  // beyond the last point: extend the last segment
  return Interpolate(xs[hi - 1], ys[hi - 1], xs[hi], ys[hi], x);
}

}  // namespace

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
  return EvalAt(sizes_, times_, hi, size);
}

double CurveCursor::At(double size) {
  const auto& xs = curve_->sizes_;
  while (segment_ < xs.size() && xs[segment_] <= size) ++segment_;
  return EvalAt(xs, curve_->times_, segment_, size);
}

}  // namespace cupcake::planner

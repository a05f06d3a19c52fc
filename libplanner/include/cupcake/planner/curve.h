// A measured cost curve as the planner reads it (docs/FORMATS.md): piecewise-linear between
// points; below the first point, the first point's time; above the last point, the last
// segment's slope continued, never below 0; a one-point curve is constant.
// Immutable after construction; safe to share between threads.
#pragma once

#include <cstdint>
#include <vector>

#include "cupcake/cupcake.pb.h"

namespace cupcake::planner {

namespace internal {

// The value on the line through (x0, y0) and (x1, y1) at x, clamped at 0.
inline double Interpolate(double x0, double y0, double x1, double y1, double x) {
  double y = y0 + (y1 - y0) * ((x - x0) / (x1 - x0));
  return y > 0.0 ? y : 0.0;
}

// A curve's value at x, with `hi` = the index of its first point whose size is > x (0..n).
inline double EvalAt(const std::vector<double>& xs, const std::vector<double>& ys, size_t hi, double x) {
  const size_t n = xs.size();
  if (n == 0) return 0.0;
  if (n == 1 || hi == 0) return ys[0];
  if (hi == n) hi = n - 1;  // beyond the last point: extend the last segment
  return Interpolate(xs[hi - 1], ys[hi - 1], xs[hi], ys[hi], x);
}

}  // namespace internal

class Curve {
 public:
  Curve() = default;  // the zero curve (a missing pack or unpack curve)
  // Points must be sorted by size with distinct sizes and times >= 0 (validated at load).
  explicit Curve(const pb::Curve& curve);
  Curve(std::vector<double> sizes, std::vector<double> times);

  double At(double size) const;
  bool empty() const { return sizes_.empty(); }
  // The largest measured size (0 for the zero curve): beyond it, At() extrapolates.
  double last_size() const { return sizes_.empty() ? 0.0 : sizes_.back(); }
  // The measured sizes, increasing: At() is linear between two of them (and beyond the last).
  const std::vector<double>& sizes() const { return sizes_; }

 private:
  friend class CurveCursor;
  std::vector<double> sizes_;
  std::vector<double> times_;
};

// Evaluates a curve at non-decreasing sizes in amortized O(1), for the search's inner loop.
// Gives exactly Curve::At's values. Not thread-safe; cheap to copy.
class CurveCursor {
 public:
  explicit CurveCursor(const Curve& curve) : curve_(&curve) {}
  // Inline: the searches call it for every group they price.
  double At(double size) {
    const auto& xs = curve_->sizes_;
    while (segment_ < xs.size() && xs[segment_] <= size) ++segment_;
    return internal::EvalAt(xs, curve_->times_, segment_, size);
  }
  void Reset() { segment_ = 0; }

 private:
  const Curve* curve_;
  size_t segment_ = 0;  // index of the first point with size > the last query, clamped
};

}  // namespace cupcake::planner

// A measured cost curve as the planner reads it (docs/FORMATS.md): piecewise-linear between
// points; below the first point, the first point's time; above the last point, the last
// segment's slope continued, never below 0; a one-point curve is constant.
// Immutable after construction; safe to share between threads.
#pragma once

#include <cstdint>
#include <vector>

#include "cupcake/cupcake.pb.h"

namespace cupcake::planner {

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
  double At(double size);
  void Reset() { segment_ = 0; }

 private:
  const Curve* curve_;
  size_t segment_ = 0;  // index of the first point with size > the last query, clamped
};

}  // namespace cupcake::planner

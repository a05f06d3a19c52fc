// What the profiler's sweeps share: size ranges, medians, progress.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::profile {

// The powers of two in [min, max], every `step`-th one (step 1: all; 2: x4 apart), plus max
// itself when it is a power of two that the stepping skipped. `min_flag`/`max_flag` name the
// flags in errors: min and max must be powers of two with 1 <= min <= max <= limit.
StatusOr<std::vector<int64_t>> PowerOfTwoSizes(std::string_view min_flag, int64_t min, std::string_view max_flag,
                                               int64_t max, int64_t limit, int step = 1);

// The median of `values` (the mean of the two middle ones for an even count); 0 when empty.
double Median(std::vector<double> values);

// Called after each point: points done (measured or skipped), total. Skipped points count.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// One measured (or refused) point, for reports.
struct SweepPoint {
  std::string curve;  // CurveKey
  int64_t size = 0;
  double us = 0;
  int wrong = 0;  // comm: collectives whose result was wrong (the point is then not stored)
};

struct SweepReport {
  int64_t measured = 0;  // points measured and stored
  int64_t skipped = 0;  // points the sink had already (resume)
  int64_t wrong = 0;  // comm: points not stored because a result was wrong
  std::vector<SweepPoint> points;  // the measured ones, in order
};

}  // namespace cupcake::profile

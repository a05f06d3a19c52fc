// The clock the profiler measures with (proto/clock.h), and a fake for tests.
#pragma once

#include <cstdint>

#include "cupcake/proto/clock.h"

namespace cupcake::profile {

using ::cupcake::Clock;
using ::cupcake::SteadyClock;

// A fake: every NowUs() returns the previous value plus `step_us` (the first returns 0).
// Not thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(double step_us = 1.0) : step_us_(step_us) {}
  double NowUs() override {
    double t = now_us_;
    now_us_ += step_us_;
    return t;
  }
  int64_t calls() const { return static_cast<int64_t>(now_us_ / step_us_); }

 private:
  double step_us_;
  double now_us_ = 0;
};

}  // namespace cupcake::profile

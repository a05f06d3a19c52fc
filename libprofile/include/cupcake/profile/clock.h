// The clock the profiler measures with, passed in so tests run on a fake one (STYLE.md: no
// sleeps, time comes in from outside).
#pragma once

#include <cstdint>

namespace cupcake::profile {

// A monotonic clock in microseconds. Implementations say their own thread-safety.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual double NowUs() = 0;
};

// std::chrono::steady_clock. Thread-safe.
class SteadyClock final : public Clock {
 public:
  double NowUs() override;
};

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

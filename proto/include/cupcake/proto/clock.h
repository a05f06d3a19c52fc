// The clock every library measures or waits with, passed in so tests run on a fake one
// (no sleeps: time comes in from outside).
#pragma once

namespace cupcake {

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

}  // namespace cupcake

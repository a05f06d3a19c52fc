// EmulatedDevice: the accelerator of the replay job (train_replay.cc). Recorded compute times
// are played by sleeping through them, so the emulated forward, backward and update cost no CPU
// time, as a GPU's kernels cost the host none; the host's real work (the runtime's encodes,
// collectives and decodes) runs beside them as it would beside a GPU.
//
// Backward runs on the device's own thread, as a framework runs backward (and its gradient
// hooks) on a device thread while the training loop waits: gradient i becomes ready at
//   deadline_i = deadline_{i-1} + (how long ready(i-1) took) + gap_i,   deadline_{-1} = start,
// so the work of a hook (the runtime's encode of a group the gradient completes) delays the
// later gradients, as an encode on the compute stream does in the planner's model (C_k,
// docs/MODEL.md), while a late wake-up does not accumulate: a thread woken late by L makes the
// next gradient ready at once when its gap is shorter than L, and the backward as a whole
// ends late by the last wake-up's lateness only.
//
// A sleeping thread wakes up late (the scheduler's wake-up latency, longer on a loaded
// machine). That lateness is part of the emulation and is measured: every sleep's (actual
// wake-up minus deadline), and the two hand-offs between the loop's thread and the device
// thread (post to start, end to the loop's wake-up). WakeStats summarizes them.
//
// Ownership: owns its thread (joined by the destructor). Thread-safety: Backward, SleepFor and
// the statistics from one thread (the training loop's); ready() is called on the device thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::examples {

// Count, median, p90 and maximum of a set of durations, in microseconds (zeros when empty).
struct WakeSummary {
  int64_t count = 0;
  double median_us = 0, p90_us = 0, max_us = 0;
};
WakeSummary Summarize(std::vector<double> samples_us);

// Microseconds on std::chrono::steady_clock (SteadyClock's scale).
double SteadyNowUs();

// Sleeps until `deadline_us` (SteadyNowUs' scale) without spinning; returns how late it woke
// (>= 0), or a negative number when the deadline had passed and it did not sleep.
double SleepUntilUs(double deadline_us);

class EmulatedDevice {
 public:
  EmulatedDevice();
  ~EmulatedDevice();
  EmulatedDevice(const EmulatedDevice&) = delete;
  EmulatedDevice& operator=(const EmulatedDevice&) = delete;

  // Plays one backward pass of `gaps_us.size()` gradients on the device thread, from
  // `start_us` (SteadyNowUs' scale): ready(i) at deadline_i above, in order. Blocks until the
  // last ready() returned, or the first one that failed (its status is returned; the later
  // gradients are not made ready).
  Status Backward(double start_us, std::span<const double> gaps_us, const std::function<Status(int)>& ready);

  // Sleeps `us` on the calling thread (the emulated forward or update, which the loop's thread
  // waits for), measured like the device thread's sleeps.
  void SleepFor(double us);

  // Every sleep's lateness (the device thread's and SleepFor's), the hand-offs to the device
  // thread and back. Between Backward calls.
  const std::vector<double>& late_us() const { return late_us_; }
  const std::vector<double>& handoff_us() const { return handoff_us_; }
  const std::vector<double>& handback_us() const { return handback_us_; }

 private:
  void Run();
  Status Play(double start_us);

  std::mutex mu_;
  std::condition_variable posted_cv_, done_cv_;
  bool stop_ = false, posted_ = false, done_ = false;
  double start_us_ = 0, posted_us_ = 0, finished_us_ = 0;
  std::span<const double> gaps_us_;
  const std::function<Status(int)>* ready_ = nullptr;
  Status status_;
  // Written by the device thread while it plays, read by the loop's thread between plays.
  std::vector<double> late_us_, handoff_us_, handback_us_;
  std::thread thread_;  // last: started when every member above exists
};

}  // namespace cupcake::examples

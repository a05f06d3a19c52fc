#include "emulated_device.h"

#include <algorithm>
#include <chrono>

namespace cupcake::examples {

WakeSummary Summarize(std::vector<double> samples_us) {
  WakeSummary s;
  if (samples_us.empty()) return s;
  std::sort(samples_us.begin(), samples_us.end());
  const size_t n = samples_us.size();
  s.count = static_cast<int64_t>(n);
  s.median_us = n % 2 == 1 ? samples_us[n / 2] : (samples_us[n / 2 - 1] + samples_us[n / 2]) / 2;
  s.p90_us = samples_us[std::min(n - 1, static_cast<size_t>(0.9 * static_cast<double>(n)))];
  s.max_us = samples_us.back();
  return s;
}

double SteadyNowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double SleepUntilUs(double deadline_us) {
  if (SteadyNowUs() >= deadline_us) return -1;
  const auto deadline =
      std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double, std::micro>(deadline_us)));
  std::this_thread::sleep_until(deadline);
  return std::max(0.0, SteadyNowUs() - deadline_us);
}

EmulatedDevice::EmulatedDevice() : thread_([this] { Run(); }) {}

EmulatedDevice::~EmulatedDevice() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  posted_cv_.notify_all();
  thread_.join();
}

Status EmulatedDevice::Backward(double start_us, std::span<const double> gaps_us,
                                const std::function<Status(int)>& ready) {
  std::unique_lock lock(mu_);
  start_us_ = start_us;
  gaps_us_ = gaps_us;
  ready_ = &ready;
  done_ = false;
  posted_ = true;
  posted_us_ = SteadyNowUs();
  posted_cv_.notify_one();
  done_cv_.wait(lock, [this] { return done_; });
  handback_us_.push_back(SteadyNowUs() - finished_us_);
  ready_ = nullptr;
  return status_;
}

void EmulatedDevice::SleepFor(double us) {
  if (us <= 0) return;
  const double late = SleepUntilUs(SteadyNowUs() + us);
  if (late >= 0) late_us_.push_back(late);
}

void EmulatedDevice::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    posted_cv_.wait(lock, [this] { return stop_ || posted_; });
    if (stop_) return;
    posted_ = false;
    handoff_us_.push_back(SteadyNowUs() - posted_us_);
    const double start_us = start_us_;
    lock.unlock();
    Status status = Play(start_us);
    lock.lock();
    status_ = status;
    finished_us_ = SteadyNowUs();
    done_ = true;
    done_cv_.notify_one();
  }
}

Status EmulatedDevice::Play(double start_us) {
  double deadline_us = start_us;
  for (size_t i = 0; i < gaps_us_.size(); ++i) {
    deadline_us += gaps_us_[i];
    const double late = SleepUntilUs(deadline_us);
    if (late >= 0) late_us_.push_back(late);
    const double called_us = SteadyNowUs();
    CUPCAKE_RETURN_IF_ERROR((*ready_)(static_cast<int>(i)));
    // The hook's own work (an encode) runs on the emulated compute stream: it delays the rest.
    deadline_us += SteadyNowUs() - called_us;
  }
  return Status::Ok();
}

}  // namespace cupcake::examples

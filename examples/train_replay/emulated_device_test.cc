// The emulated accelerator's contract (emulated_device.h): gradients ready in order and never
// before their deadlines, a hook's work delaying the later gradients, the first failure ending
// the pass, and the statistics' summary. The device sleeps by design, so these tests take real
// time (milliseconds); they check only lower bounds and order, which no load can break.
#include "emulated_device.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace cupcake::examples {
namespace {

TEST(EmulatedDevice, MakesGradientsReadyInOrderNoEarlierThanTheirDeadlines) {
  EmulatedDevice device;
  const std::vector<double> gaps_us = {2000, 0, 500, 3000, 0};
  std::vector<int> order;
  std::vector<double> at_us;
  const double start_us = SteadyNowUs();
  ASSERT_TRUE(device
                  .Backward(start_us, gaps_us,
                            [&](int i) {
                              order.push_back(i);
                              at_us.push_back(SteadyNowUs());
                              return Status::Ok();
                            })
                  .ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  const std::vector<double> cumulative_us = {2000, 2000, 2500, 5500, 5500};
  for (size_t i = 0; i < at_us.size(); ++i) EXPECT_GE(at_us[i] - start_us, cumulative_us[i]) << "gradient " << i;
  EXPECT_EQ(device.handoff_us().size(), 1u);
  EXPECT_EQ(device.handback_us().size(), 1u);
}

TEST(EmulatedDevice, AHooksWorkDelaysTheLaterGradients) {
  EmulatedDevice device;
  const std::vector<double> gaps_us = {0, 1000};
  std::vector<double> at_us;
  const double start_us = SteadyNowUs();
  ASSERT_TRUE(device
                  .Backward(start_us, gaps_us,
                            [&](int i) {
                              at_us.push_back(SteadyNowUs());
                              // An encode of 5 ms inside gradient 0's hook.
                              if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
                              return Status::Ok();
                            })
                  .ok());
  ASSERT_EQ(at_us.size(), 2u);
  EXPECT_GE(at_us[1] - start_us, 5000 + 1000);
}

TEST(EmulatedDevice, StopsAtTheFirstFailedGradient) {
  EmulatedDevice device;
  const std::vector<double> gaps_us = {0, 0, 0};
  std::vector<int> order;
  Status s = device.Backward(SteadyNowUs(), gaps_us, [&](int i) {
    order.push_back(i);
    return i == 1 ? InternalError("gradient 1 failed") : Status::Ok();
  });
  EXPECT_EQ(s.message(), "gradient 1 failed");
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  // The device is still usable for the next pass.
  order.clear();
  EXPECT_TRUE(device
                  .Backward(SteadyNowUs(), gaps_us,
                            [&](int i) {
                              order.push_back(i);
                              return Status::Ok();
                            })
                  .ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(EmulatedDevice, SleepForSleepsAtLeastItsTimeAndRecordsTheLateness) {
  EmulatedDevice device;
  const double before_us = SteadyNowUs();
  device.SleepFor(3000);
  EXPECT_GE(SteadyNowUs() - before_us, 3000);
  ASSERT_EQ(device.late_us().size(), 1u);
  EXPECT_GE(device.late_us()[0], 0);
  device.SleepFor(0);  // nothing to sleep: no sample
  EXPECT_EQ(device.late_us().size(), 1u);
}

TEST(WakeSummary, MedianP90AndMaxOfHandWorkedSets) {
  const WakeSummary odd = Summarize({5, 1, 3, 2, 4});
  EXPECT_EQ(odd.count, 5);
  EXPECT_EQ(odd.median_us, 3);
  EXPECT_EQ(odd.p90_us, 5);  // sorted[floor(0.9 * 5)] = sorted[4]
  EXPECT_EQ(odd.max_us, 5);
  const WakeSummary even = Summarize({4, 1, 3, 2});
  EXPECT_EQ(even.median_us, 2.5);
  EXPECT_EQ(even.p90_us, 4);  // sorted[floor(0.9 * 4)] = sorted[3]
  const WakeSummary none = Summarize({});
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.max_us, 0);
}

}  // namespace
}  // namespace cupcake::examples

// The kernel-activity seam with no GPU: replayed records, and kernel-only time from them.
#include <gtest/gtest.h>

#include "cupcake/proto/activity.h"

namespace cupcake {
namespace {

TEST(KernelBusyUs, CountsOverlapsOnceAndGapsNot) {
  EXPECT_EQ(*KernelBusyUs({}), 0.0);
  // Two kernels 1 us each with a 5 us launch gap: 2 us of kernel time.
  EXPECT_DOUBLE_EQ(*KernelBusyUs({{"a", 0, 1000, 1}, {"b", 6000, 7000, 2}}), 2.0);
  // Concurrent kernels (streams) overlap: [0, 3000) u [1000, 2000) u [2500, 4000) = 4 us.
  EXPECT_DOUBLE_EQ(*KernelBusyUs({{"c", 2500, 4000, 3}, {"a", 0, 3000, 1}, {"b", 1000, 2000, 2}}), 4.0);
  EXPECT_EQ(KernelBusyUs({{"bad", 10, 5, 7}}).status().message(),
            "kernel 'bad' (correlation 7): ends before it starts; got start 10 ns, end 5 ns, expected end >= start");
}

TEST(FakeActivitySource, ReplaysBatchesPerStartFlush) {
  FakeActivitySource source({{{"encode", 0, 2000, 1}}, {{"decode", 0, 500, 2}, {"decode", 500, 1500, 3}}});
  EXPECT_EQ(source.Flush().status().message(), "activity source: Flush() without Start()");
  ASSERT_TRUE(source.Start().ok());
  EXPECT_EQ(source.Start().message(), "activity source: Start() twice without Flush()");
  auto first = source.Flush();
  ASSERT_TRUE(first.ok());
  EXPECT_DOUBLE_EQ(*KernelBusyUs(*first), 2.0);
  ASSERT_TRUE(source.Start().ok());
  EXPECT_DOUBLE_EQ(*KernelBusyUs(*source.Flush()), 1.5);
  ASSERT_TRUE(source.Start().ok());
  EXPECT_TRUE(source.Flush()->empty());
  EXPECT_EQ(source.started(), 3);
  source.start_error = UnavailableError("CUPTI: no device");
  EXPECT_EQ(source.Start().message(), "CUPTI: no device");
}

TEST(FakeActivitySource, KeepsTheMarksAndReturnsItsFlushError) {
  FakeActivitySource source({});
  ASSERT_TRUE(source.SetMark(3).ok());
  ASSERT_TRUE(source.ClearMark().ok());
  EXPECT_EQ(source.SetMark(0).message(), "activity source: SetMark: mark out of range; got 0, expected >= 1");
  EXPECT_EQ(source.marks(), (std::vector<uint64_t>{3, 0}));
  source.flush_error = UnavailableError("cupti: dropped 2 activity records");
  ASSERT_TRUE(source.Start().ok());
  EXPECT_EQ(source.Flush().status().message(), "cupti: dropped 2 activity records");
}

}  // namespace
}  // namespace cupcake

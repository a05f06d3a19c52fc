#include "cupcake/proto/host_load.h"

#include <gtest/gtest.h>

namespace cupcake {
namespace {

TEST(HostLoad, FormatsAndParsesTheMetaValue) {
  EXPECT_EQ(FormatHostLoad({0.3125, 2}), "other work 0.31 of 2 cores");
  const auto other = ParseHostLoad("other work 1.50 of 16 cores");
  ASSERT_TRUE(other.has_value());
  EXPECT_DOUBLE_EQ(other->load, 1.5);
  EXPECT_EQ(other->cores, 16);
  EXPECT_FALSE(other->load_average);
  for (const char* bad : {"", "3.1", "other work 3.1 of 2", "other work 3.1 of 0 cores", "other work -1 of 2 cores",
                          "other work 0.1 of 2 cores!", "other work x of 2 cores"})
    EXPECT_FALSE(ParseHostLoad(bad).has_value()) << bad;
}

// Older profiles recorded the 1-minute load average; they still read, and print as they were.
TEST(HostLoad, ReadsAnOlderProfilesLoadAverage) {
  const auto load = ParseHostLoad("0.75 on 16 cores");
  ASSERT_TRUE(load.has_value());
  EXPECT_DOUBLE_EQ(load->load, 0.75);
  EXPECT_EQ(load->cores, 16);
  EXPECT_TRUE(load->load_average);
  EXPECT_EQ(FormatHostLoad(*load), "0.75 on 16 cores");
  for (const char* bad : {"3.1 on 2", "3.1 on 0 cores", "-1 on 2 cores", "3.1 on 2 cores!", "x on 2 cores"})
    EXPECT_FALSE(ParseHostLoad(bad).has_value()) << bad;
}

// Busy: other work above a quarter of the cores; a load average above half (it counts the sweep).
TEST(HostLoad, BusyNoteNamesTheBusyCommands) {
  EXPECT_FALSE(IsBusy({0.5, 2}));
  EXPECT_TRUE(IsBusy({0.51, 2}));
  EXPECT_FALSE(IsBusy({1.0, 2, /*load_average=*/true}));
  EXPECT_TRUE(IsBusy({1.01, 2, /*load_average=*/true}));
  pb::Cluster c;
  EXPECT_EQ(BusyNote(c), "");
  (*c.mutable_meta())["comm.load"] = "other work 0.50 of 2 cores";
  (*c.mutable_meta())["kernels.load"] = "not a load";
  EXPECT_EQ(BusyNote(c), "");
  (*c.mutable_meta())["kernels.load"] = "other work 1.20 of 2 cores";
  EXPECT_EQ(BusyNote(c), "measured busy (kernels: other work 1.20 of 2 cores): its times, and predictions from them, "
                         "carry that load");
  (*c.mutable_meta())["comm.load"] = "9.00 on 16 cores";
  EXPECT_EQ(BusyNote(c), "measured busy (comm at load 9.00 on 16 cores, kernels: other work 1.20 of 2 cores): its "
                         "times, and predictions from them, carry that load");
}

}  // namespace
}  // namespace cupcake

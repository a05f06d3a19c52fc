#include "cupcake/proto/host_load.h"

#include <gtest/gtest.h>

namespace cupcake {
namespace {

TEST(HostLoad, FormatsAndParsesTheMetaValue) {
  EXPECT_EQ(FormatHostLoad({3.125, 2}), "3.12 on 2 cores");
  const auto load = ParseHostLoad("0.75 on 16 cores");
  ASSERT_TRUE(load.has_value());
  EXPECT_DOUBLE_EQ(load->load1, 0.75);
  EXPECT_EQ(load->cores, 16);
  for (const char* bad : {"", "3.1", "3.1 on 2", "3.1 on 0 cores", "-1 on 2 cores", "3.1 on 2 cores!", "x on 2 cores"})
    EXPECT_FALSE(ParseHostLoad(bad).has_value()) << bad;
}

// Busy above half the cores; the note names each command whose load says so.
TEST(HostLoad, BusyNoteNamesTheBusyCommands) {
  EXPECT_FALSE(IsBusy({1.0, 2}));
  EXPECT_TRUE(IsBusy({1.01, 2}));
  pb::Cluster c;
  EXPECT_EQ(BusyNote(c), "");
  (*c.mutable_meta())["comm.load"] = "0.50 on 2 cores";
  (*c.mutable_meta())["kernels.load"] = "not a load";
  EXPECT_EQ(BusyNote(c), "");
  (*c.mutable_meta())["kernels.load"] = "5.00 on 2 cores";
  EXPECT_EQ(BusyNote(c), "measured busy (kernels at load 5.00 on 2 cores): its times, and predictions from them, "
                         "carry that load");
  (*c.mutable_meta())["comm.load"] = "9.00 on 16 cores";
  EXPECT_EQ(BusyNote(c), "measured busy (comm at load 9.00 on 16 cores, kernels at load 5.00 on 2 cores): its times, "
                         "and predictions from them, carry that load");
}

}  // namespace
}  // namespace cupcake

// A ladder: the fp32 rung and one plan per ratio, each the plan its own search makes.
#include "cupcake/planner/ladder.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <vector>

#include "cupcake/profile/load.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/plan_io.h"
#include "test_problems.h"

namespace cupcake::planner {
namespace {

class LadderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(CUPCAKE_SOURCE_DIR) + "/examples/";
    auto m = profile::LoadModelFile(dir + "models/resnet50.json");
    auto p = profile::LoadProfileFile(dir + "profiles/v100-8x8-pcie-25g.json");
    ASSERT_TRUE(m.ok() && p.ok());
    model_ = *m;
    profile_ = *p;
  }
  pb::Model model_;
  pb::Profile profile_;
  std::mt19937_64 rng_{7};
};

// Each rung is byte for byte the plan a search at its ratio alone makes (fp32 for rung 0), in
// decreasing ratio whatever the order given; the ladder is valid; and the grouping is not one
// for all rungs (so re-planning per rung matters on this profile).
TEST_F(LadderTest, EveryRungIsItsOwnSearchAndTheGroupingsDiffer) {
  PlanRequest request;
  request.compressor = "topk";
  request.ratio = 0.5;  // not used by a ladder
  SearchOptions search;
  auto ladder = MakeLadder(model_, profile_, request, {0.001, 0.1, 0.01}, search);
  ASSERT_TRUE(ladder.ok()) << ladder.status().ToString();
  EXPECT_TRUE(ValidateLadder(*ladder, "ladder").ok()) << ValidateLadder(*ladder, "ladder").ToString();
  ASSERT_EQ(ladder->rungs_size(), 4);
  const double want[] = {1, 0.1, 0.01, 0.001};
  std::set<int> group_counts;
  for (int i = 0; i < 4; ++i) {
    const pb::Rung& r = ladder->rungs(i);
    EXPECT_EQ(r.ratio(), want[i]);
    PlanRequest alone = request;
    alone.compressor = i == 0 ? "fp32" : "topk";
    alone.ratio = i == 0 ? kDefaultRatio : want[i];
    auto plan = MakePlan(model_, profile_, alone, search);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(SerializePlan(r.plan()), SerializePlan(*plan)) << "rung " << i;
    group_counts.insert(r.plan().groups_size());
  }
  EXPECT_EQ(ladder->rungs(0).plan().compressor().memory(), "none");
  EXPECT_GT(group_counts.size(), 1u);
}

// With the device left to the planner, every rung runs where the compressed rungs' curves are:
// on a profile with CPU kernel curves only, the fp32 rung (which reads no kernel curve) is a
// cpu plan too, so the ladder loads.
TEST_F(LadderTest, EveryRungOnTheCompressedRungsDevice) {
  pb::Profile cpu_only = testing::AffineProfile(20, 1e-3, 5);
  for (pb::Curve& c : *cpu_only.mutable_curves())
    if (c.kind() != pb::COMM) c.set_device(pb::CPU);
  PlanRequest request;
  request.compressor = "topk";
  auto ladder = MakeLadder(testing::RandomModel(rng_, 6), cpu_only, request, {0.1, 0.01}, SearchOptions{});
  ASSERT_TRUE(ladder.ok()) << ladder.status().ToString();
  for (const pb::Rung& r : ladder->rungs()) EXPECT_EQ(r.plan().device(), pb::CPU) << r.ratio();
  EXPECT_TRUE(ValidateLadder(*ladder, "ladder").ok()) << ValidateLadder(*ladder, "ladder").ToString();
}

TEST_F(LadderTest, RefusesWhatNoLadderCanHold) {
  SearchOptions search;
  PlanRequest request;
  request.compressor = "efsignsgd";
  EXPECT_EQ(MakeLadder(model_, profile_, request, {0.1}, search).status().message(),
            "--ratios: efsignsgd keeps no fraction of the elements; expected topk, randk or dgc");
  request.compressor = "dgc";
  EXPECT_EQ(MakeLadder(model_, profile_, request, {}, search).status().message(),
            "--ratios: empty; expected at least one ratio in (0, 1)");
  for (double bad : {0.0, 1.0, -0.5}) {
    EXPECT_EQ(MakeLadder(model_, profile_, request, {0.1, bad}, search).status().message(),
              "--ratios: out of range; got " +
                  std::string(bad == 1   ? "1"
                              : bad == 0 ? "0"
                                         : "-0.5") +
                  ", expected 0 < ratio < 1 (the fp32 rung is always added)");
  }
  EXPECT_EQ(MakeLadder(model_, profile_, request, {0.1, 0.01, 0.1}, search).status().message(),
            "--ratios: 0.1 appears twice; expected distinct ratios");
}

}  // namespace
}  // namespace cupcake::planner

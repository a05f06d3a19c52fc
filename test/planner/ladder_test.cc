// A ladder: the fp32 rung and one plan per ratio, each the plan its own search makes.
#include "cupcake/planner/ladder.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <string>
#include <utility>
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

// A ladder of PowerSGD ranks over one [100, 100] tensor (backward 100 us) on one node of 2 CPUs:
// allreduce 0.25 us per byte, "encode powersgd cpu" 10 us and "decode powersgd cpu" 20 us, as
// OptionsPowerSgd works out by hand (powersgd about 540 us against flat_fp32's 10100 us).
class RankLadderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pb::Tensor* t = model_.add_tensors();
    model_.set_name("square");
    t->set_name("w");
    t->set_numel(10000);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(100);
    t->add_shape(100);
    t->add_shape(100);
    profile_.mutable_cluster()->set_name("hand-powersgd");
    profile_.mutable_cluster()->set_nodes(1);
    profile_.mutable_cluster()->set_devices_per_node(2);
    *profile_.add_curves() = testing::MakeCommCurve(pb::ALLREDUCE, pb::GLOBAL, {{8, 2}, {80000, 20000}});
    for (auto [kind, us] : {std::pair{pb::ENCODE, 10.0}, std::pair{pb::DECODE, 20.0}}) {
      pb::Curve c = testing::MakeCurve(kind, {{1, us}});
      c.set_compressor("powersgd");
      c.set_device(pb::CPU);
      *profile_.add_curves() = c;
    }
    request_.compressor = "fp32";
    request_.device = pb::CPU;
    request_.schemes = {"powersgd"};
    search_.space = SearchSpace::kOptions;
  }
  pb::Model model_;
  pb::Profile profile_;
  PlanRequest request_;
  SearchOptions search_;
};

// The rungs: the dense fp32 plan, then ranks 4, 2, 1 whatever the order given, each byte for byte
// the plan its own search at that rank makes, each rung's ratio the bytes it sends over the dense
// 40000: P and Q of 100 x r floats each, 4 x 200 r bytes, so 0.08, 0.04 and 0.02.
TEST_F(RankLadderTest, OnePlanPerRankAndTheDensePlanAtTheBottom) {
  auto ladder = MakeRankLadder(model_, profile_, request_, {1, 4, 2}, search_);
  ASSERT_TRUE(ladder.ok()) << ladder.status().ToString();
  EXPECT_TRUE(ValidateLadder(*ladder, "ladder").ok()) << ValidateLadder(*ladder, "ladder").ToString();
  ASSERT_EQ(ladder->rungs_size(), 4);
  EXPECT_EQ(RungRatios(*ladder), "1 (fp32), 0.08 (rank 4), 0.04 (rank 2), 0.02 (rank 1)");
  const pb::Plan& bottom = ladder->rungs(0).plan();
  EXPECT_EQ(ladder->rungs(0).ratio(), 1);
  EXPECT_EQ(bottom.compressor().name(), "fp32");
  EXPECT_EQ(bottom.compressor().rank(), 0);
  for (const pb::Group& g : bottom.groups()) EXPECT_EQ(g.options().scheme(), "flat_fp32");
  const int ranks[] = {4, 2, 1};
  const double ratios[] = {0.08, 0.04, 0.02};
  for (int i = 1; i < 4; ++i) {
    const pb::Rung& r = ladder->rungs(i);
    EXPECT_EQ(r.ratio(), ratios[i - 1]) << "rung " << i;
    EXPECT_EQ(r.plan().compressor().rank(), ranks[i - 1]);
    ASSERT_EQ(r.plan().groups_size(), 1);
    EXPECT_EQ(r.plan().groups(0).options().scheme(), "powersgd");
    PlanRequest alone = request_;
    alone.rank = ranks[i - 1];
    auto plan = MakePlan(model_, profile_, alone, search_);
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(SerializePlan(r.plan()), SerializePlan(*plan)) << "rung " << i;
  }
}

TEST_F(RankLadderTest, RefusesWhatNoRankLadderCanHold) {
  auto message = [&](PlanRequest request, std::vector<int> ranks, SearchSpace space = SearchSpace::kOptions) {
    SearchOptions search = search_;
    search.space = space;
    return MakeRankLadder(model_, profile_, request, std::move(ranks), search).status().message();
  };
  PlanRequest topk = request_;
  topk.compressor = "topk";
  EXPECT_EQ(message(topk, {2}),
            "--ranks: PowerSGD plans are fp32 plans whose groups may run PowerSGD; got --compressor topk, expected "
            "--compressor fp32");
  EXPECT_EQ(message(request_, {2}, SearchSpace::kFusion),
            "--ranks: only --search-space options offers the powersgd schemes; expected --search-space options");
  PlanRequest ranked = request_;
  ranked.rank = 2;
  EXPECT_EQ(message(ranked, {2}), "--ranks: give --rank (one plan) or --ranks (a ladder), not both");
  EXPECT_EQ(message(request_, {}), "--ranks: empty; expected at least one PowerSGD rank >= 1");
  EXPECT_EQ(message(request_, {2, 0}),
            "--ranks: out of range; got 0, expected 1 <= rank <= 65536 (the fp32 rung is always added)");
  EXPECT_EQ(message(request_, {2, 1, 2}), "--ranks: 2 appears twice; expected distinct ranks");
  // At rank 40 the [100, 100] matrix is not compressed ((100 + 100) x 40 x 2 >= 10000): PowerSGD
  // would send it whole and slower, so the search keeps flat_fp32.
  EXPECT_EQ(message(request_, {40, 2}),
            "--ranks: rank 40's plan runs no group with PowerSGD: it does not pay on this profile; expected at "
            "least one powersgd group (leave the rank out)");
}

}  // namespace
}  // namespace cupcake::planner

#include "cupcake/planner/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "cupcake/planner/report.h"
#include "cupcake/proto/fingerprint.h"
#include "test_problems.h"

namespace cupcake::planner {
namespace {

using ::testing::HasSubstr;

struct Fixture {
  pb::Model model;
  pb::Profile profile;
};

Fixture RandomFixture(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  return {testing::RandomModel(rng, n), testing::RandomProfile(rng)};
}

TEST(MakePlan, IsDeterministic) {
  Fixture f = RandomFixture(1, 30);
  PlanRequest req;
  req.compressor = "dgc";
  auto a = MakePlan(f.model, f.profile, req, SearchOptions{});
  auto b = MakePlan(f.model, f.profile, req, SearchOptions{});
  ASSERT_TRUE(a.ok() && b.ok());
  std::string sa, sb;
  ASSERT_TRUE(a->SerializeToString(&sa));
  ASSERT_TRUE(b->SerializeToString(&sb));
  EXPECT_EQ(sa, sb);
}

TEST(MakePlan, RecordsEverythingTheDesignNames) {
  Fixture f = RandomFixture(2, 12);
  PlanRequest req;
  req.compressor = "topk";
  req.ratio = 0.05;
  auto plan = MakePlan(f.model, f.profile, req, SearchOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->format(), "cupcake.plan.v1");
  EXPECT_EQ(plan->model().fingerprint(), ModelFingerprint(f.model));
  EXPECT_EQ(plan->model().model().tensors_size(), 12);
  EXPECT_EQ(plan->profile_fingerprint(), ProfileFingerprint(f.profile));
  EXPECT_EQ(plan->compressor().name(), "topk");
  EXPECT_DOUBLE_EQ(plan->compressor().ratio(), 0.05);
  EXPECT_EQ(plan->compressor().memory(), "residual");
  EXPECT_TRUE(plan->search().optimal());
  ASSERT_EQ(plan->baselines_size(), 5);
  EXPECT_EQ(plan->baselines(4).name(), "fp32_bucket_25mib");
  // Groups cover the tensors in order and their times agree with the prediction.
  int next = 0;
  double last_end = 0;
  for (const auto& g : plan->groups()) {
    EXPECT_EQ(g.first_tensor(), next);
    next = g.last_tensor() + 1;
    EXPECT_TRUE(g.options().compress());
    EXPECT_EQ(g.options().collective(), pb::ALLGATHER);
    EXPECT_LE(g.encode_end_us(), g.comm_start_us());
    EXPECT_LE(g.comm_end_us(), g.decode_start_us());
    last_end = g.decode_end_us();
  }
  EXPECT_EQ(next, 12);
  EXPECT_DOUBLE_EQ(plan->predicted().iteration_us(), f.model.forward_us() + last_end + f.model.update_us());
  for (const auto& b : plan->baselines()) {
    if (b.name() != "fp32_bucket_25mib") {
      EXPECT_LE(plan->predicted().iteration_us(), b.iteration_us()) << b.name();
    }
  }
}

TEST(MakePlan, RejectsUnknownMemory) {
  Fixture f = RandomFixture(3, 4);
  PlanRequest req;
  req.compressor = "topk";
  req.memory = "residul";
  auto plan = MakePlan(f.model, f.profile, req, SearchOptions{});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message(),
            "--memory: unknown memory 'residul' (did you mean 'residual'?); expected residual, dgc or none");
}

TEST(Simulate, ReproducesThePlansPrediction) {
  Fixture f = RandomFixture(4, 20);
  PlanRequest req;
  req.compressor = "qsgd";
  auto plan = MakePlan(f.model, f.profile, req, SearchOptions{});
  ASSERT_TRUE(plan.ok());
  auto t = Simulate(*plan, f.model, f.profile);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_DOUBLE_EQ(t->iteration_us, plan->predicted().iteration_us());
}

TEST(Simulate, RejectsPlanForOtherModel) {
  Fixture f = RandomFixture(5, 6);
  auto plan = MakePlan(f.model, f.profile, PlanRequest{}, SearchOptions{});
  ASSERT_TRUE(plan.ok());
  pb::Model other = f.model;
  other.set_name("other");
  other.mutable_tensors(2)->set_numel(other.tensors(2).numel() + 1);
  auto t = Simulate(*plan, other, f.profile);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "model other: model fingerprint differs; got " + ModelFingerprint(other) +
                                      ", expected " + ModelFingerprint(f.model) +
                                      " (the plan was made for model random6)");
}

}  // namespace
}  // namespace cupcake::planner

namespace cupcake::planner {
namespace {

TEST(DiffPlans, SamePlanIsEquivalent) {
  Fixture f = RandomFixture(6, 10);
  auto plan = MakePlan(f.model, f.profile, PlanRequest{}, SearchOptions{});
  ASSERT_TRUE(plan.ok());
  PlanDiff d = DiffPlans(*plan, *plan, 0);
  EXPECT_FALSE(d.different);
  EXPECT_TRUE(d.changes.empty());
}

TEST(DiffPlans, SeesASmallRatioChange) {
  Fixture f = RandomFixture(7, 10);
  PlanRequest a;
  a.compressor = "topk";
  a.ratio = 0.001;
  PlanRequest b = a;
  b.ratio = 0.0012;
  auto pa = MakePlan(f.model, f.profile, a, SearchOptions{});
  auto pb = MakePlan(f.model, f.profile, b, SearchOptions{});
  ASSERT_TRUE(pa.ok() && pb.ok());
  PlanDiff d = DiffPlans(*pa, *pb, 100);
  EXPECT_TRUE(d.different);
  ASSERT_FALSE(d.changes.empty());
  EXPECT_EQ(d.changes[0], "compressor.ratio: 0.001 -> 0.0011999999999999999");
}

TEST(DiffPlans, TimeChangeWithinToleranceIsEquivalent) {
  Fixture f = RandomFixture(8, 10);
  auto plan = MakePlan(f.model, f.profile, PlanRequest{}, SearchOptions{});
  ASSERT_TRUE(plan.ok());
  pb::Plan slower = *plan;
  slower.mutable_predicted()->set_iteration_us(plan->predicted().iteration_us() * 1.02);
  EXPECT_FALSE(DiffPlans(*plan, slower, 5).different);
  PlanDiff d = DiffPlans(*plan, slower, 1);
  EXPECT_TRUE(d.different);
  EXPECT_NEAR(d.time_change_pct, 2.0, 1e-9);
}

TEST(ChromeTrace, HasOneCollectivePerGroupOnTheNetworkTrack) {
  Fixture f = RandomFixture(9, 12);
  PlanRequest req;
  req.compressor = "efsignsgd";
  auto plan = MakePlan(f.model, f.profile, req, SearchOptions{});
  ASSERT_TRUE(plan.ok());
  const std::string trace = ChromeTrace(*plan);
  size_t comm = 0;
  for (size_t at = trace.find("\"cat\":\"comm\""); at != std::string::npos; at = trace.find("\"cat\":\"comm\"", at + 1))
    ++comm;
  EXPECT_EQ(comm, static_cast<size_t>(plan->groups_size()));
  EXPECT_NE(trace.find("\"name\":\"network\""), std::string::npos);
}

}  // namespace
}  // namespace cupcake::planner

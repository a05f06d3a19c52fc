#include "cupcake/planner/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

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

// The plan's strategy timed by the test's own restatement of the model (test_problems.h).
double ReferenceTimeOfPlan(const pb::Plan& plan, const Fixture& f, const PlanRequest& req) {
  auto problem = MakeProblem(f.model, f.profile, req);
  EXPECT_TRUE(problem.ok()) << problem.status().ToString();
  if (!problem.ok()) return -1;
  std::vector<int> ends;
  for (const auto& g : plan.groups()) ends.push_back(g.last_tensor());
  return testing::ReferenceIterationUs(*problem, ends);
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
  const double reference = ReferenceTimeOfPlan(*plan, f, req);
  EXPECT_NEAR(plan->predicted().iteration_us(), reference, 1e-9 * reference);
  EXPECT_NEAR(f.model.forward_us() + last_end + f.model.update_us(), reference, 1e-9 * reference);
  for (const auto& b : plan->baselines()) {
    if (b.name() != "fp32_bucket_25mib") {
      EXPECT_LE(plan->predicted().iteration_us(), b.iteration_us()) << b.name();
    }
  }
}

// The plan's header is the same in both search spaces, the measured union share included
// (the fusion space once left it out).
TEST(MakePlan, BothSearchSpacesRecordTheSameHeader) {
  Fixture f = RandomFixture(3, 6);
  PlanRequest req;
  req.compressor = "topk";
  req.ratio = 0.05;
  req.zen_union = 0.5;
  SearchOptions fusion, options;
  options.space = SearchSpace::kOptions;
  auto a = MakePlan(f.model, f.profile, req, fusion);
  auto b = MakePlan(f.model, f.profile, req, options);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->compressor().zen_union(), 0.5);
  EXPECT_EQ(b->compressor().zen_union(), 0.5);
  auto header = [](pb::Plan p) {
    p.clear_groups();
    p.clear_predicted();
    p.clear_baselines();
    p.clear_search();
    p.clear_extrapolations();
    p.clear_devices_per_node();
    std::string s;
    EXPECT_TRUE(p.SerializeToString(&s));
    return s;
  };
  EXPECT_EQ(header(*a), header(*b));
}

// Fixed strategies plan what users run today, so the runtime can run them beside the optimum:
// the groups as the test restates each rule (one per tensor; one; DDP's buckets, closed when
// their bytes reach the cap), timed as the test's own model restatement times them, never
// claimed optimal.
TEST(MakePlan, FixedStrategiesPlanTheGroupsTheirRuleMakes) {
  Fixture f = RandomFixture(5, 20);
  PlanRequest req;
  req.compressor = "efsignsgd";
  const int64_t cap = 3000;  // bytes: a few of the random model's tensors each
  std::vector<int> buckets;
  int64_t bytes = 0;
  for (int i = 0; i < f.model.tensors_size(); ++i) {
    bytes += f.model.tensors(i).numel() * 4;
    if (bytes >= cap || i == f.model.tensors_size() - 1) {
      buckets.push_back(i);
      bytes = 0;
    }
  }
  for (auto [algorithm, groups] : std::vector<std::pair<Algorithm, size_t>>{
           {Algorithm::kLayerwise, 20}, {Algorithm::kOneGroup, 1}, {Algorithm::kBucket, buckets.size()}}) {
    SearchOptions options;
    options.algorithm = algorithm;
    options.bucket_bytes = cap;
    auto plan = MakePlan(f.model, f.profile, req, options);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    SCOPED_TRACE(AlgorithmName(algorithm));
    ASSERT_EQ(static_cast<size_t>(plan->groups_size()), groups);
    if (algorithm == Algorithm::kBucket) {
      for (size_t k = 0; k < groups; ++k) EXPECT_EQ(plan->groups(static_cast<int>(k)).last_tensor(), buckets[k]);
    }
    EXPECT_EQ(plan->search().algorithm(), AlgorithmName(algorithm));
    EXPECT_FALSE(plan->search().optimal());
    EXPECT_EQ(plan->search().budget(), 0);
    EXPECT_DOUBLE_EQ(plan->predicted().iteration_us(), ReferenceTimeOfPlan(*plan, f, req));
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
  const double reference = ReferenceTimeOfPlan(*plan, f, req);
  EXPECT_NEAR(t->iteration_us, reference, 1e-9 * reference);
}

// test_problems.h's instance worked by hand: the plan's groups, their timeline, its prediction,
// the baselines and Simulate's time are the hand-computed numbers.
TEST(MakePlan, MatchesTheHandWorkedInstance) {
  const testing::HandInstance h = testing::HandFusionInstance();
  auto plan = MakePlan(h.model, h.profile, h.request, SearchOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->groups_size(), 2);
  const pb::Group& a = plan->groups(0);
  const pb::Group& b = plan->groups(1);
  EXPECT_EQ(a.first_tensor(), 0);
  EXPECT_EQ(a.last_tensor(), 0);
  EXPECT_EQ(b.first_tensor(), 1);
  EXPECT_EQ(b.last_tensor(), 2);
  // Group {t0}: C = 10, com 24 from 10 to 34. Group {t1,t2}: packed from 30 to C = 31; the
  // network is busy until 34, so com 28 from 34 to 62; no decode (fp32), so D = F.
  EXPECT_DOUBLE_EQ(a.encode_end_us(), 10);
  EXPECT_DOUBLE_EQ(a.comm_start_us(), 10);
  EXPECT_DOUBLE_EQ(a.comm_end_us(), 34);
  EXPECT_DOUBLE_EQ(b.encode_end_us(), 31);
  EXPECT_DOUBLE_EQ(b.comm_start_us(), 34);
  EXPECT_DOUBLE_EQ(b.comm_end_us(), 62);
  EXPECT_DOUBLE_EQ(b.decode_end_us(), 62);
  EXPECT_DOUBLE_EQ(plan->predicted().iteration_us(), 167);  // 100 + 62 + 5
  std::map<std::string, double> baselines;
  for (const auto& bl : plan->baselines()) baselines[bl.name()] = bl.iteration_us();
  EXPECT_DOUBLE_EQ(baselines["layerwise"], 187);
  EXPECT_DOUBLE_EQ(baselines["one_group"], 168.5);
  auto t = Simulate(*plan, h.model, h.profile);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_DOUBLE_EQ(t->iteration_us, 167);
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

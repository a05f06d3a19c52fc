#include "cupcake/planner/search.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "test_problems.h"

namespace cupcake::planner {
namespace {

using ::testing::HasSubstr;

// The minimum over all 2^(N-1) strategies of the test's own restatement of the model
// (testing::ReferenceIterationUs): an oracle that shares no code with the planner's timeline.
double ReferenceMinimum(const Problem& p) {
  const int n = p.size();
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {  // bit i: a group ends at tensor i
    std::vector<int> ends;
    for (int i = 0; i + 1 < n; ++i)
      if (cuts & (1u << i)) ends.push_back(i);
    ends.push_back(n - 1);
    best = std::min(best, testing::ReferenceIterationUs(p, ends));
  }
  return best;
}

// Searches with branch and bound and with the exhaustive oracle; expects the same time, a
// proof of optimality, a strategy whose time by the test's restatement of the model is the
// reported one, and that time the minimum of the restatement over all strategies. Returns
// the states the search expanded.
int64_t ExpectMatchesOracle(const pb::Model& model, const pb::Profile& profile, const PlanRequest& req) {
  auto problem = MakeProblem(model, profile, req);
  EXPECT_TRUE(problem.ok()) << problem.status().ToString();
  if (!problem.ok()) return 0;
  auto fast = Search(*problem, SearchOptions{});
  auto oracle = Search(*problem, SearchOptions{Algorithm::kExhaustive});
  EXPECT_TRUE(fast.ok() && oracle.ok());
  if (!fast.ok() || !oracle.ok()) return 0;
  EXPECT_TRUE(fast->stats.optimal);
  EXPECT_NEAR(fast->iteration_us, oracle->iteration_us, 1e-9 * oracle->iteration_us)
      << model.tensors_size() << " tensors, " << req.compressor;
  EXPECT_NEAR(fast->iteration_us, testing::ReferenceIterationUs(*problem, fast->group_ends), 1e-9 * fast->iteration_us);
  EXPECT_NEAR(fast->iteration_us, ReferenceMinimum(*problem), 1e-9 * fast->iteration_us);
  return fast->stats.states;
}

// Every strategy of a hand-worked instance at its time (model and reference), and both
// algorithms finding `best` at `best_us`, proven.
void ExpectByHand(const Problem& problem, const std::vector<std::pair<std::vector<int>, double>>& by_hand,
                  const std::vector<int>& best, double best_us) {
  for (const auto& [ends, us] : by_hand) {
    EXPECT_DOUBLE_EQ(IterationTime(problem, ends), us) << ends.size() << " groups";
    EXPECT_DOUBLE_EQ(testing::ReferenceIterationUs(problem, ends), us) << ends.size() << " groups";
  }
  for (Algorithm a : {Algorithm::kBranchAndBound, Algorithm::kExhaustive}) {
    auto r = Search(problem, SearchOptions{a});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->group_ends, best);
    EXPECT_DOUBLE_EQ(r->iteration_us, best_us);
    EXPECT_TRUE(r->stats.optimal);
  }
}

// The instance of test_problems.h worked by hand: every strategy's time, and both algorithms
// find {0,2} at 167 us.
TEST(FusionSearch, FindsTheHandWorkedOptimum) {
  const testing::HandInstance h = testing::HandFusionInstance();
  auto problem = MakeProblem(h.model, h.profile, h.request);
  ASSERT_TRUE(problem.ok()) << problem.status().ToString();
  ExpectByHand(*problem, {{{0, 1, 2}, 187}, {{0, 2}, 167}, {{1, 2}, 178}, {{2}, 168.5}}, {0, 2}, 167);
}

// The same instance with a busy curve for the allreduce, twice the idle one (busy(b) = 40 +
// 0.02 b: 400 -> 48, 800 -> 56, 1200 -> 64): a collective progresses at 1 / busy of its work per
// us until the compute stream's known work ends (U = all backward, 30, + the encodes so far),
// at 1 / idle after (docs/MODEL.md, "Busy cores"):
//   {0,1,2}: U = 30; F = 30 + (1 - 20/48) 24 = 44, 44 + 24 = 68, 68 + 24 = 92  -> 197
//   {0,2}:   F = 44; C = 31, U = 31, start 44: 44 + 28 = 72                     -> 177
//   {1,2}:   C = 21, U = 31: F = 31 + (1 - 10/56) 28 = 54; 54 + 24 = 78         -> 183
//   {2}:     C = U = 31.5: idle, 31.5 + 32 = 63.5                               -> 168.5
// Overlapping backward no longer pays: the optimum is one group.
TEST(FusionSearch, BusyCoresSlowCollectivesThatOverlapBackward) {
  testing::HandInstance h = testing::HandFusionInstance();
  pb::Curve busy = testing::MakeCurve(pb::COMM, {{400, 48}, {1200, 64}});
  busy.set_comm_op(pb::ALLREDUCE);
  busy.set_scope(pb::GLOBAL);
  busy.set_busy(true);
  *h.profile.add_curves() = busy;
  auto problem = MakeProblem(h.model, h.profile, h.request);
  ASSERT_TRUE(problem.ok()) << problem.status().ToString();
  EXPECT_EQ(problem->comm_busy_key, "comm allreduce global busy");
  ExpectByHand(*problem, {{{0, 1, 2}, 197}, {{0, 2}, 177}, {{1, 2}, 183}, {{2}, 168.5}}, {2}, 168.5);
  const Timeline t = Evaluate(*problem, std::vector<int>{1, 2});
  EXPECT_DOUBLE_EQ(t.groups[0].comm_start_us, 21);
  EXPECT_DOUBLE_EQ(t.groups[0].comm_end_us, 54);
}

std::string RandomCompressor(std::mt19937_64& rng) {
  auto names = CompressorNames();
  return std::string(names[rng() % names.size()]);
}

// The property the search is built for: on random small instances with jagged curves, for
// every compressor and both devices, it equals the exhaustive oracle and proves it.
TEST(FusionSearch, MatchesExhaustiveSearch) {
  std::mt19937_64 rng(20261122);
  for (int trial = 0; trial < 600; ++trial) {
    SCOPED_TRACE(trial);
    pb::Model model = testing::RandomModel(rng, 1 + static_cast<int>(rng() % 11));
    pb::Profile profile = testing::RandomProfile(rng);
    PlanRequest req;
    req.compressor = RandomCompressor(rng);
    req.ratio = (rng() % 2) ? 0.01 : 0.3;
    req.device = (rng() % 2) ? pb::GPU : pb::CPU;
    ExpectMatchesOracle(model, profile, req);
  }
}

// Affine curves like real profiles: the bounds are tight, so the search must explore labels
// and dominance to prove optimality.
TEST(FusionSearch, MatchesExhaustiveSearchOnAffineCurves) {
  std::mt19937_64 rng(77);
  int explored = 0;
  for (int trial = 0; trial < 120; ++trial) {
    SCOPED_TRACE(trial);
    pb::Model model = testing::RandomModel(rng, 8 + static_cast<int>(rng() % 9));
    std::uniform_real_distribution<double> startup(1, 300), per_byte(1e-5, 1e-2);
    pb::Profile profile = testing::AffineProfile(startup(rng), per_byte(rng), startup(rng) / 3);
    PlanRequest req;
    req.compressor = RandomCompressor(rng);
    if (ExpectMatchesOracle(model, profile, req) > 0) ++explored;
  }
  EXPECT_GT(explored, 20) << "the instances should make the search work";
}

TEST(FusionSearch, StrategyCoversEveryTensorInOrder) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 50; ++trial) {
    pb::Model model = testing::RandomModel(rng, 40);
    pb::Profile profile = testing::RandomProfile(rng);
    PlanRequest req;
    req.compressor = "efsignsgd";
    auto problem = MakeProblem(model, profile, req);
    ASSERT_TRUE(problem.ok());
    auto r = Search(*problem, SearchOptions{});
    ASSERT_TRUE(r.ok());
    ASSERT_FALSE(r->group_ends.empty());
    EXPECT_EQ(r->group_ends.back(), 39);
    for (size_t i = 1; i < r->group_ends.size(); ++i) EXPECT_LT(r->group_ends[i - 1], r->group_ends[i]);
    // Never worse than a baseline.
    EXPECT_LE(r->iteration_us, IterationTime(*problem, LayerwiseStrategy(*problem)));
    EXPECT_LE(r->iteration_us, IterationTime(*problem, OneGroupStrategy(*problem)));
  }
}

TEST(FusionSearch, BudgetExhaustedIsNotProvenOptimal) {
  std::mt19937_64 rng(11);
  pb::Model model = testing::RandomModel(rng, 60);
  pb::Profile profile = testing::AffineProfile(50, 1e-2, 20);
  PlanRequest req;
  req.compressor = "fp16";
  auto problem = MakeProblem(model, profile, req);
  ASSERT_TRUE(problem.ok());
  auto full = Search(*problem, SearchOptions{});
  ASSERT_TRUE(full.ok());
  ASSERT_GT(full->stats.states, 1) << "instance too easy to exhaust the budget";
  auto cut = Search(*problem, SearchOptions{Algorithm::kBranchAndBound, full->stats.transitions / 2});
  ASSERT_TRUE(cut.ok());
  EXPECT_FALSE(cut->stats.optimal);
  EXPECT_EQ(cut->stats.budget, full->stats.transitions / 2);
  EXPECT_GE(cut->iteration_us, full->iteration_us);
  EXPECT_NEAR(cut->iteration_us, testing::ReferenceIterationUs(*problem, cut->group_ends), 1e-9 * cut->iteration_us);
}

TEST(FusionSearch, ExhaustiveRefusesLargeModels) {
  std::mt19937_64 rng(3);
  auto problem = MakeProblem(testing::RandomModel(rng, kMaxExhaustiveTensors + 1), testing::RandomProfile(rng),
                             PlanRequest{});
  ASSERT_TRUE(problem.ok());
  auto r = Search(*problem, SearchOptions{Algorithm::kExhaustive});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "--algorithm exhaustive: too many tensors; got 25, expected <= 24 (2^(N-1) partitions); use "
            "branch_and_bound");
}

TEST(FusionSearch, RejectsNonPositiveBudget) {
  std::mt19937_64 rng(3);
  auto problem = MakeProblem(testing::RandomModel(rng, 3), testing::RandomProfile(rng), PlanRequest{});
  ASSERT_TRUE(problem.ok());
  auto r = Search(*problem, SearchOptions{Algorithm::kBranchAndBound, 0});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "--budget: must be positive; got 0");
}

TEST(ParseAlgorithm, NamesTheChoices) {
  EXPECT_TRUE(ParseAlgorithm("exhaustive").ok());
  auto a = ParseAlgorithm("greedy");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().message(),
            "--algorithm: unknown algorithm 'greedy'; expected branch_and_bound, exhaustive, espresso (--search-space "
            "options), or a fixed strategy: layerwise, one_group, bucket");
  EXPECT_EQ(*ParseAlgorithm("espresso"), Algorithm::kEspresso);
  EXPECT_EQ(*ParseAlgorithm("bucket"), Algorithm::kBucket);
  EXPECT_TRUE(IsFixedStrategy(Algorithm::kLayerwise));
  EXPECT_FALSE(IsFixedStrategy(Algorithm::kBranchAndBound));
}

}  // namespace
}  // namespace cupcake::planner

// The label DP's own rules (docs/MODEL.md: dominance, bounds, cutoff, canonical labels, useful
// options, the busy window, chained collectives) with no incumbent to hide behind: every search
// here starts from nothing (SearchOptions::seed_incumbents = false), so a rule that drops the
// optimum's label returns a worse plan. Oracles: the exhaustive searches and the test's own
// restatements of the timelines (test_problems.h), which price every strategy without the
// planner's pricers.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cupcake/planner/options.h"
#include "cupcake/planner/search.h"
#include "test_problems.h"

namespace cupcake::planner {
namespace {

using testing::MakeCommCurve;
using testing::MakeCurve;
using testing::RefOption;

SearchOptions Unseeded() {
  SearchOptions o;
  o.seed_incumbents = false;
  return o;
}

// docs/MODEL.md, step 7, with busy curves: two tensors, B = [0, 10, 60], no forward, update,
// encode or decode (fp16 codec at 0 us), one node of two GPUs. Options: flat_fp32 ("A": allreduce
// 4 bytes per element) and flat (fp16, "B": the float16 allreduce, 2 bytes per element).
//   group [t0]:     A: net 10, net_busy 100;  B: net 11, net_busy 11
//   group [t1]:     both 0;   group [t0, t1]: both 1000
// By hand: t0 ready at 10, the compute stream busy until 60.
//   A then any: End(10, 10, 100, 60) = 60 + (1 - 50/100) 10 = 65; t1 at 65 + 0  -> 65
//   B then any: 10 + 11 = 21; t1 at 60 + 0                                       -> 60
//   one group: 60 + 1000                                                         -> 1060
// A is below B in the five idle stage costs but not in net_busy: a rule over five costs drops B
// and returns 65.
TEST(OptionsSearch, UsefulOptionsCompareTheBusyBlockToo) {
  pb::Model model;
  model.set_name("two");
  for (auto [numel, backward] : {std::pair{1000, 10.0}, std::pair{100, 50.0}}) {
    auto* t = model.add_tensors();
    t->set_name("t" + std::to_string(model.tensors_size()));
    t->set_numel(numel);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(backward);
  }
  pb::Profile profile;
  profile.mutable_cluster()->set_name("busy-useful");
  profile.mutable_cluster()->set_nodes(1);
  profile.mutable_cluster()->set_devices_per_node(2);
  *profile.add_curves() = MakeCommCurve(pb::ALLREDUCE, pb::GLOBAL, {{400, 0}, {4000, 10}, {4400, 1000}});
  pb::Curve busy = MakeCommCurve(pb::ALLREDUCE, pb::GLOBAL, {{400, 0}, {4000, 100}, {4400, 1000}});
  busy.set_busy(true);
  *profile.add_curves() = busy;
  pb::Curve f16 = MakeCommCurve(pb::ALLREDUCE, pb::GLOBAL, {{200, 0}, {2000, 11}, {2200, 1000}});
  f16.set_dtype(pb::FLOAT16);
  *profile.add_curves() = f16;
  for (pb::CurveKind k : {pb::ENCODE, pb::DECODE}) {
    pb::Curve c = MakeCurve(k, {{1, 0}});
    c.set_compressor("fp16");
    c.set_device(pb::GPU);
    *profile.add_curves() = c;
  }
  PlanRequest req;
  req.compressor = "fp16";
  req.device = pb::GPU;
  auto p = MakeOptionProblem(model, profile, req);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const int a = FindOption(*p, "flat_fp32", pb::GPU), b = FindOption(*p, "flat", pb::GPU);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  const std::vector<int> ends{0, 1};
  for (auto [first, expected] : {std::pair{a, 65.0}, std::pair{b, 60.0}}) {
    EXPECT_DOUBLE_EQ(
        testing::ReferenceOptionsIterationUs(model, profile, "fp16", kDefaultRatio, pb::GPU, ends,
                                             {{first == a ? "flat_fp32" : "flat", pb::GPU}, {"flat", pb::GPU}}),
        expected);
  }
  for (const SearchOptions& options : {Unseeded(), SearchOptions{}, SearchOptions{Algorithm::kExhaustive}}) {
    auto r = SearchWithOptions(*p, options);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_DOUBLE_EQ(r->iteration_us, 60);
    EXPECT_EQ(r->group_ends, ends);
    ASSERT_EQ(r->options.size(), 2u);
    EXPECT_EQ(r->options[0], b);
    EXPECT_TRUE(r->stats.optimal);
  }
}

// `profile` with a busy twin of every collective curve (global, intra, inter, alltoall,
// float16) in place of its own busy curves: the idle curve's points slowed by one random factor
// in [1, max_factor] per curve, so that collectives that overlap backward or on-device encodes are
// slowed, each by its own amount.
pb::Profile WithBusyCurves(std::mt19937_64& rng, const pb::Profile& profile, double max_factor = 6) {
  std::uniform_real_distribution<double> factor(1.0, max_factor);
  pb::Profile out = profile;
  out.clear_curves();
  for (const pb::Curve& c : profile.curves())
    if (!c.busy()) *out.add_curves() = c;
  for (const pb::Curve& idle : profile.curves()) {
    if (idle.kind() != pb::COMM || idle.busy()) continue;
    pb::Curve busy = idle;
    busy.set_busy(true);
    const double f = factor(rng);
    for (auto& point : *busy.mutable_points()) point.set_us(point.us() * f);
    *out.add_curves() = busy;
  }
  return out;
}

// `profile` with a chained twin of every collective curve (docs/MODEL.md, "Chained
// collectives"): the spaced curve's points times one random factor in [0.8, max_factor] per
// curve, so that a collective that follows another back to back costs more (or, below 1, no
// less: the excess is never negative); for half the curves only the first half of the points,
// so that larger payloads read the chained curve beyond its last point.
pb::Profile WithChainedCurves(std::mt19937_64& rng, const pb::Profile& profile, double max_factor) {
  std::uniform_real_distribution<double> factor(0.8, max_factor);
  pb::Profile out = profile;
  for (const pb::Curve& spaced : profile.curves()) {
    if (spaced.kind() != pb::COMM || spaced.busy() || spaced.chained()) continue;
    pb::Curve chained = spaced;
    chained.set_chained(true);
    const double f = factor(rng);
    for (auto& point : *chained.mutable_points()) point.set_us(point.us() * f);
    if (rng() % 2 && chained.points_size() > 1)
      chained.mutable_points()->DeleteSubrange((chained.points_size() + 1) / 2, chained.points_size() / 2);
    *out.add_curves() = chained;
  }
  return out;
}

// The fusion search alone (no baselines, no greedy incumbent) on one instance: its plan is
// optimal by the minimum of the test's restatement over every strategy, at the time the
// restatement gives its strategy. Returns whether it is; adds a multi-group plan to `multi`.
bool FusionRight(const pb::Model& model, const pb::Profile& profile, const PlanRequest& req, int& multi) {
  auto p = MakeProblem(model, profile, req);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return false;
  auto fast = Search(*p, Unseeded());
  EXPECT_TRUE(fast.ok());
  if (!fast.ok()) return false;
  const int n = p->size();
  double best = std::numeric_limits<double>::infinity();
  for (uint32_t cuts = 0; cuts < (1u << (n - 1)); ++cuts) {
    std::vector<int> ends;
    for (int i = 0; i + 1 < n; ++i)
      if (cuts & (1u << i)) ends.push_back(i);
    ends.push_back(n - 1);
    best = std::min(best, testing::ReferenceIterationUs(*p, ends));
  }
  multi += fast->group_ends.size() > 1;
  return fast->stats.optimal && std::abs(fast->iteration_us - best) <= 1e-9 * best &&
         std::abs(testing::ReferenceIterationUs(*p, fast->group_ends) - fast->iteration_us) <= 1e-9 * best;
}

// FusionRight on `trials` random instances of 2-12 tensors, every compressor, GPU and CPU plans,
// each profile made by `make` (from RandomProfile's) for the trial; at least `min_multi` of the
// plans have several groups.
void ExpectFusionRight(uint64_t seed, int trials, int min_multi,
                       const std::function<pb::Profile(std::mt19937_64&, int trial)>& make) {
  std::mt19937_64 rng(seed);
  int multi = 0;
  std::vector<int> wrong;
  for (int trial = 0; trial < trials; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 11);
    pb::Model model = testing::RandomModel(rng, n);
    pb::Profile profile = make(rng, trial);
    PlanRequest req;
    req.compressor = std::string(CompressorNames()[rng() % CompressorNames().size()]);
    req.device = rng() % 3 ? pb::GPU : pb::CPU;
    if (!FusionRight(model, profile, req, multi)) wrong.push_back(trial);
  }
  std::string shown;
  for (size_t i = 0; i < wrong.size() && i < 20; ++i) shown += " " + std::to_string(wrong[i]);
  EXPECT_TRUE(wrong.empty()) << wrong.size() << " of " << trials << " instances wrong; trials" << shown;
  EXPECT_GT(multi, min_multi);
}

// Busy curves on every profile; in half the instances encodes as long as the collectives and
// busy curves up to 20x the idle ones, so that a collective often ends inside its own encode's
// share of the busy window.
TEST(FusionSearch, LabelSearchAloneFindsTheReferenceMinimum) {
  ExpectFusionRight(20261126, 1500, 250, [](std::mt19937_64& rng, int trial) {
    const bool decisive = trial % 2;
    pb::Profile profile = WithBusyCurves(rng, testing::RandomProfile(rng), decisive ? 20 : 6);
    if (decisive)
      for (auto& c : *profile.mutable_curves())
        if (c.kind() == pb::ENCODE)
          for (auto& point : *c.mutable_points()) point.set_us(4 * point.us());
    return profile;
  });
}

// Chained curves on every profile (busy ones too, half the time), up to 4x the spaced ones:
// collectives that queue start after a rest, so a label's network end matters past the next
// group's readiness.
TEST(FusionSearch, LabelSearchAloneFindsTheReferenceMinimumWithChainedCurves) {
  ExpectFusionRight(20261127, 1000, 150, [](std::mt19937_64& rng, int trial) {
    pb::Profile profile = testing::RandomProfile(rng);
    if (trial % 2) profile = WithBusyCurves(rng, profile, 6);
    return WithChainedCurves(rng, profile, 4);
  });
}

// Random kernel curves of the non-zero scan and Zen's merge and decode on the CPU, and a density
// <= 1/2 on some tensors, so that CPU plans are offered zen_sparse (docs/MODEL.md, "Naturally
// sparse gradients").
void AddSparseGradients(std::mt19937_64& rng, pb::Model& model, pb::Profile& profile) {
  for (auto [kind, name] : {std::pair{pb::ENCODE, "nonzero"}, std::pair{pb::ENCODE, "zen"}, std::pair{pb::DECODE, "zen"}}) {
    pb::Curve c = testing::RandomCurve(rng, kind, 50000);
    c.set_compressor(name);
    c.set_device(pb::CPU);
    *profile.add_curves() = c;
  }
  std::uniform_real_distribution<double> density(0.001, 0.6);
  for (auto& t : *model.mutable_tensors())
    if (rng() % 2) t.set_density(density(rng));
}

// What the options search's unseeded runs exercised, and the instances where it erred.
struct Tally {
  int instances = 0, offloaded = 0, hier = 0, sparse_offered = 0;
  std::vector<int> wrong;  // the trials where the search did not return the oracles' optimum
  std::string Wrong() const {
    std::string s = std::to_string(wrong.size()) + " of " + std::to_string(instances) + " instances wrong; trials";
    for (size_t i = 0; i < wrong.size() && i < 20; ++i) s += " " + std::to_string(wrong[i]);
    return s;
  }
};

// The options search alone (no Espresso, fusion optimum, seeds or greedy pass) on one instance:
// its plan is the exhaustive search's optimum, at the time the test's restatement gives its
// strategy; where zen_sparse is offered, the restatement's price of its groups all zen_sparse
// is the planner's.
void CheckUnseeded(const pb::Model& model, const pb::Profile& profile, const PlanRequest& req, int trial,
                   Tally& tally) {
  auto p = MakeOptionProblem(model, profile, req);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto fast = SearchWithOptions(*p, Unseeded());
  auto oracle = SearchWithOptions(*p, SearchOptions{Algorithm::kExhaustive});
  ASSERT_TRUE(fast.ok() && oracle.ok());
  ++tally.instances;
  bool right = fast->stats.optimal && std::abs(fast->iteration_us - oracle->iteration_us) <= 1e-9 * oracle->iteration_us;
  tally.sparse_offered += FindOption(*p, "zen_sparse", pb::CPU) >= 0;
  std::vector<RefOption> ref;
  for (int o : fast->options) {
    const Option& opt = p->options[static_cast<size_t>(o)];
    ref.push_back({std::string(opt.scheme->name), opt.device});
    tally.offloaded += opt.offload;
    tally.hier += opt.scheme->hierarchical;
  }
  const double t = testing::ReferenceOptionsIterationUs(model, profile, req.compressor, req.ratio, p->base.device,
                                                        fast->group_ends, ref);
  right = right && std::abs(fast->iteration_us - t) <= 1e-9 * t;
  // zen_sparse is rarely the best on jagged curves: its price on the search's groups, every
  // group zen_sparse, against the restatement.
  if (const int zs = FindOption(*p, "zen_sparse", pb::CPU); zs >= 0) {
    const std::vector<int> all(fast->group_ends.size(), zs);
    const double priced = OptionIterationTime(*p, fast->group_ends, all);
    const double restated =
        testing::ReferenceOptionsIterationUs(model, profile, req.compressor, req.ratio, p->base.device,
                                             fast->group_ends, std::vector<RefOption>(all.size(), {"zen_sparse", pb::CPU}));
    right = right && std::abs(priced - restated) <= 1e-9 * restated;
  }
  if (!right) tally.wrong.push_back(trial);
}

// A random instance of 2-6 tensors for the unseeded options search: RandomOptionsProfile's
// curves with busy twins of every collective; a third of them CPU plans with sparse gradients.
struct Instance {
  pb::Model model;
  pb::Profile profile;
  PlanRequest req;
};
Instance RandomBusyInstance(std::mt19937_64& rng, double busy_max) {
  Instance in;
  in.model = testing::RandomModel(rng, 2 + static_cast<int>(rng() % 5));
  in.profile = testing::RandomOptionsProfile(rng);
  const bool cpu = rng() % 3 == 0;
  if (cpu) AddSparseGradients(rng, in.model, in.profile);
  in.profile = WithBusyCurves(rng, in.profile, busy_max);
  in.req.compressor = std::string(CompressorNames()[rng() % CompressorNames().size()]);
  in.req.ratio = (rng() % 2) ? 0.01 : 0.3;
  in.req.device = cpu ? pb::CPU : pb::GPU;
  return in;
}

// Busy curves on every collective (so on hierarchical steps, zen's alltoall and float16 sums
// too), GPU plans (offloaded options beside on-device ones) and CPU plans (zen_sparse where a
// tensor is sparse).
TEST(OptionsSearch, LabelSearchAloneMatchesTheOraclesWithBusyCurves) {
  std::mt19937_64 rng(202611262);
  Tally tally;
  for (int trial = 0; trial < 1500; ++trial) {
    Instance in = RandomBusyInstance(rng, 6);
    CheckUnseeded(in.model, in.profile, in.req, trial, tally);
  }
  EXPECT_TRUE(tally.wrong.empty()) << tally.Wrong();
  EXPECT_GT(tally.offloaded, 100);
  EXPECT_GT(tally.hier, 50);
  EXPECT_GT(tally.sparse_offered, 100);
}

// Chained twins of every collective (the first step of a hierarchical or zen block included),
// up to 4x the spaced ones, beside busy curves: step 1's canonical form must keep a network end
// that a later block's rest still reaches.
TEST(OptionsSearch, LabelSearchAloneMatchesTheOraclesWithChainedCurves) {
  std::mt19937_64 rng(20261127);
  Tally tally;
  for (int trial = 0; trial < 1000; ++trial) {
    Instance in = RandomBusyInstance(rng, 6);
    in.profile = WithChainedCurves(rng, in.profile, 4);
    CheckUnseeded(in.model, in.profile, in.req, trial, tally);
  }
  EXPECT_TRUE(tally.wrong.empty()) << tally.Wrong();
  EXPECT_GT(tally.offloaded, 60);
  EXPECT_GT(tally.hier, 30);
}

// Where the busy window decides: encodes on the compute stream as long as the collectives
// (encode curves x 4), busy curves up to 20x the idle ones, so that a group's block often ends
// inside its own encode's share of the window (B(N) + E_k, docs/MODEL.md "Busy cores").
TEST(OptionsSearch, LabelSearchAloneMatchesTheOraclesWhereTheBusyWindowDecides) {
  std::mt19937_64 rng(26112026);
  Tally tally;
  for (int trial = 0; trial < 800; ++trial) {
    Instance in = RandomBusyInstance(rng, 20);
    in.req.device = pb::GPU;
    for (auto& c : *in.profile.mutable_curves())
      if (c.kind() == pb::ENCODE)
        for (auto& point : *c.mutable_points()) point.set_us(4 * point.us());
    CheckUnseeded(in.model, in.profile, in.req, trial, tally);
  }
  EXPECT_TRUE(tally.wrong.empty()) << tally.Wrong();
}

// Options of one kind that differ only in their blocks (fp32 and fp16 on two or three nodes:
// flat and hierarchical schemes with no codec, or the same codec), each collective slowed by its
// own factor beside busy cores: one option's block is often the cheaper idle and the dearer
// busy (step 7's six costs).
TEST(OptionsSearch, LabelSearchAloneMatchesTheOraclesWhereOnlyTheBlocksDiffer) {
  std::mt19937_64 rng(611);
  Tally tally;
  for (int trial = 0; trial < 800; ++trial) {
    Instance in = RandomBusyInstance(rng, 20);
    in.profile.mutable_cluster()->set_nodes(2 + static_cast<int>(rng() % 2));
    in.profile.mutable_cluster()->set_devices_per_node(2 + static_cast<int>(rng() % 3));
    in.req.compressor = rng() % 2 ? "fp32" : "fp16";
    CheckUnseeded(in.model, in.profile, in.req, trial, tally);
  }
  EXPECT_TRUE(tally.wrong.empty()) << tally.Wrong();
  EXPECT_GT(tally.hier, 60);
}

// The largest instances the exhaustive oracle allows (7 tensors), with few options so that it
// stays quick: fp32 on one node (flat_fp32 and flat_fp16, on the GPU and offloaded), busy
// curves up to 20x: longer prefixes, more labels per prefix for dominance to sort.
TEST(OptionsSearch, LabelSearchAloneMatchesTheOraclesOnSevenTensors) {
  std::mt19937_64 rng(7007);
  Tally tally;
  for (int trial = 0; trial < 400; ++trial) {
    Instance in = RandomBusyInstance(rng, 20);
    in.model = testing::RandomModel(rng, kMaxExhaustiveOptionTensors);
    in.profile.mutable_cluster()->set_nodes(1);
    in.req.compressor = "fp32";
    in.req.device = pb::GPU;
    CheckUnseeded(in.model, in.profile, in.req, trial, tally);
  }
  EXPECT_TRUE(tally.wrong.empty()) << tally.Wrong();
  EXPECT_GT(tally.offloaded, 50);
}

}  // namespace
}  // namespace cupcake::planner

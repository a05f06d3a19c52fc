// GraVAC (docs/ADAPTIVE.md): the controller's rules and the gain probe alone, then in sessions
// over in-process ranks: every rank takes the same decisions, residuals carry across the
// controller's switches exactly as across SwitchPlan, a job restored from a snapshot decides as
// the uninterrupted one, bad options and plans that are not a ladder are refused. And the
// self-check every session runs: the drift warning.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <cmath>

#include "cupcake/runtime/checkpoint.h"
#include "gravac.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using internal::GainProbe;
using internal::GainSums;
using internal::GroupLayout;
using internal::GravacController;
using internal::Selection;
using testing::OnEveryRank;
using Floats = std::vector<float>;

// Returns what the test sets; the session's reads do not move it.
class ManualClock final : public Clock {
 public:
  double NowUs() override { return now_.load(); }
  void Set(double us) { now_.store(us); }

 private:
  std::atomic<double> now_{0};
};

GravacOptions Options(int window, double epsilon, double omega) {
  GravacOptions o;
  o.window = window;
  o.epsilon = epsilon;
  o.omega = omega;
  return o;
}

// fp32 at 100 us, then ratios 0.1, 0.01, 0.001 at 50, 20 and 19 us.
std::vector<GravacController::Rung> FourRungs() { return {{1, 100}, {0.1, 50}, {0.01, 20}, {0.001, 19}}; }

GainSums Gains(double gain_min, double gain_c) { return {100, 100 * gain_min, 100 * gain_c}; }

TEST(GravacController, StartsDenseProbingTheFirstTwoRungs) {
  GravacController c(FourRungs(), Options(10, 0.7, 0.01));
  EXPECT_EQ(c.sent(), 0);
  EXPECT_EQ(c.min_rung(), 1);
  EXPECT_EQ(c.cand_rung(), 2);
}

TEST(GravacController, SendsTheCandidateThenCfMinThenDenseByTheGainThreshold) {
  GravacController c(FourRungs(), Options(10, 0.7, 0.01));
  GravacDecision d = c.Decide(0, 10, Gains(0.9, 0.8), 100e3, 4000, 5);
  EXPECT_EQ(d.step, 0u);
  EXPECT_EQ(d.steps, 10);
  EXPECT_EQ(d.ratio, 1);  // the first window ran the fp32 rung
  EXPECT_EQ(d.ratio_min, 0.1);
  EXPECT_EQ(d.ratio_c, 0.01);
  EXPECT_DOUBLE_EQ(d.gain_min, 0.9);
  EXPECT_DOUBLE_EQ(d.gain_c, 0.8);
  EXPECT_DOUBLE_EQ(d.predicted_ms, 0.1);
  EXPECT_DOUBLE_EQ(d.measured_ms, 100);
  EXPECT_EQ(d.bytes_sent, 4000);
  EXPECT_DOUBLE_EQ(d.probe_ms, 0.005);
  EXPECT_EQ(d.next_ratio, 0.01);  // gain_c >= epsilon: the candidate
  EXPECT_EQ(c.sent(), 2);
  EXPECT_EQ(c.cand_rung(), 3);  // exploring: one rung further

  d = c.Decide(10, 10, Gains(0.9, 0.5), 0, 0, 0);
  EXPECT_EQ(d.ratio, 0.01);
  EXPECT_EQ(d.ratio_c, 0.001);
  EXPECT_EQ(d.next_ratio, 0.1);  // gain_c < epsilon <= gain_min: cf_min
  d = c.Decide(20, 10, Gains(0.6, 0.5), 0, 0, 0);
  EXPECT_EQ(d.next_ratio, 1);  // both below: the dense gradient
  EXPECT_EQ(c.sent(), 0);
}

TEST(GravacController, ScalesCfMinUpWhenTheCandidateLosesLessThanOmega) {
  GravacController c(FourRungs(), Options(10, 0.7, 0.01));
  c.Decide(0, 10, Gains(0.9, 0.895), 0, 0, 0);  // |0.9 - 0.895| / 0.9 = 0.0056 <= 0.01
  EXPECT_EQ(c.min_rung(), 2);
  EXPECT_EQ(c.cand_rung(), 3);
  GravacController d(FourRungs(), Options(10, 0.7, 0.01));
  d.Decide(0, 10, Gains(0.9, 0.88), 0, 0, 0);  // 0.022 > 0.01: cf_min stays
  EXPECT_EQ(d.min_rung(), 1);
  EXPECT_EQ(d.cand_rung(), 3);
}

// Every rung probed, the candidate becomes the least compression whose gain per microsecond is
// within omega of the best: gains 0.9 everywhere give 0.9/50, 0.9/20, 0.9/19 for rungs 1-3.
TEST(GravacController, SettlesWhereTheThroughputSaturates) {
  GravacController tight(FourRungs(), Options(10, 0.7, 0.01));
  tight.Decide(0, 10, Gains(0.9, 0.8), 0, 0, 0);  // probes rungs 1 and 2 (0.8 / 20)
  tight.Decide(10, 10, Gains(0.9, 0.9), 0, 0, 0);  // probes 1 and 3: 0.9/19 is the best
  EXPECT_EQ(tight.min_rung(), 3);  // and the gains were equal: cf_min scaled up to it
  EXPECT_EQ(tight.cand_rung(), 3);

  GravacController loose(FourRungs(), Options(10, 0.7, 0.1));
  loose.Decide(0, 10, Gains(0.9, 0.9 * 0.95), 0, 0, 0);  // 0.05 <= omega: cf_min becomes rung 2
  loose.Decide(10, 10, Gains(0.9, 0.7), 0, 0, 0);  // rung 2: 0.9/20 = 0.045; rung 3: 0.7/19 = 0.0368
  EXPECT_EQ(loose.min_rung(), 2);
  EXPECT_EQ(loose.cand_rung(), 2);  // saturation: rung 3 is not within omega of rung 2
}

// A rung's system time is its prediction until a measured window differs by more than 10%.
TEST(GravacController, TrustsTheMeasuredTimeOnlyBeyondTheTolerance) {
  // Rung 2 runs (sent) in the second window, measured 21 us (5%: the prediction, 20, stays)
  // or 40 us (twice: 40 is used). Gains 0.9 at rung 2, 0.8 at rung 3 (19 us): with 20 us the
  // throughput saturates at rung 2 (0.045 > 0.0421), with 40 us at rung 3 (0.0225 < 0.0421).
  for (double measured : {21.0, 40.0}) {
    GravacController c({{1, 100}, {0.1, 50}, {0.01, 20}, {0.001, 19}}, Options(10, 0.7, 0.01));
    c.Decide(0, 10, Gains(0.95, 0.9), 0, 0, 0);  // sends rung 2 next
    ASSERT_EQ(c.sent(), 2);
    c.Decide(10, 10, Gains(0.95, 0.8), measured, 0, 0);  // probes rung 3; rung 2 measured
    EXPECT_EQ(c.cand_rung(), measured == 21.0 ? 2 : 3) << measured;
  }
}

TEST(GravacController, ASingleCompressedRungIsItsOwnCandidate) {
  GravacController c({{1, 100}, {0.01, 20}}, Options(10, 0.7, 0.01));
  EXPECT_EQ(c.min_rung(), 1);
  EXPECT_EQ(c.cand_rung(), 1);
  EXPECT_EQ(c.Decide(0, 10, Gains(0.8, 0.8), 0, 0, 0).next_ratio, 0.01);
  EXPECT_EQ(c.Decide(10, 10, Gains(0.5, 0.5), 0, 0, 0).next_ratio, 1);
}

TEST(GravacOptions, OutOfRangeFieldsAreNamed) {
  EXPECT_TRUE(internal::CheckGravacOptions(GravacOptions{}).ok());
  GravacOptions o;
  o.window = 0;
  o.epsilon = 1.5;
  o.omega = -0.1;
  const Status s = internal::CheckGravacOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("GravacOptions.window: out of range; got 0, expected >= 1"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("GravacOptions.epsilon: out of range; got 1.5"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("GravacOptions.omega: out of range; got -0.1"), std::string::npos) << s.message();
}

TEST(GainProbe, KeepsTheLargestMagnitudesOfTheGradientWithItsMemory) {
  ManualClock clock;
  GainProbe probe(Selection::kMagnitude, 8, 0, &clock);
  probe.SetRatios(0.4, 0.2);  // of 5 elements: 2, then 1
  const Floats g = {3, -4, 1, 0, 2};
  ASSERT_TRUE(probe.Observe(g, nullptr, 0, 0).ok());
  double cost = 0;
  GainSums s = probe.Take(&cost).value();
  EXPECT_EQ(s.input, 30);  // 9 + 16 + 1 + 0 + 4
  EXPECT_EQ(s.min, 25);  // 16 + 9
  EXPECT_EQ(s.cand, 16);
  const Floats memory = {1, 1, 1, 1, 1};  // g_ef = 4, -3, 2, 1, 3
  ASSERT_TRUE(probe.Observe(g, memory.data(), 0, 0).ok());
  ASSERT_TRUE(probe.Observe(g, nullptr, 1, 0).ok());  // sums add over groups
  s = probe.Take(&cost).value();
  EXPECT_EQ(s.input, 39 + 30);
  EXPECT_EQ(s.min, 25 + 25);
  EXPECT_EQ(s.cand, 16 + 16);
  EXPECT_EQ(probe.Take(&cost).value().input, 0);  // Take zeroes
}

// PowerSGD rungs (rank 2 as cf_min, rank 1 as the candidate) on one group: a 10 x 10 matrix whose
// g_ef = gradient + memory is diag(3, 1, 0, ...), and a 5-vector (1, 2, 0, 0, 0) that PowerSGD
// sends whole ((5 + 1) x 1 x 2 >= 5). By Eckart-Young the best rank-2 part of the matrix keeps all
// of its energy 10 and the best rank-1 part 9; the warm-started power iteration reaches both
// (rank 2 at once: P spans the matrix's columns; rank 1 at a rate of (1/3)^2 a step). The
// vector counts whole in all three sums: 15, 15, 14.
TEST(GainProbe, LowRankKeepsTheEnergyOfTheBestApproximations) {
  ManualClock clock;
  GainProbe probe(Selection::kLowRank, 105, 7, &clock);
  probe.SetTensors({{10, 10}, {5}}, {100, 5}, 2);
  std::vector<GroupLayout> groups(1);  // one group from tensor 0
  groups[0].first = 0;
  probe.SetRanks(2, 1, groups);
  Floats g(105, 0.0f), memory(105, 0.5f);
  for (size_t i = 0; i < 105; ++i) g[i] = -0.5f;
  g[0] += 3;
  g[11] += 1;
  g[100] += 1;
  g[101] += 2;
  double cost = 0;
  for (int step = 0; step < 12; ++step) ASSERT_TRUE(probe.Observe(g, memory.data(), 0, 0).ok());
  (void)probe.Take(&cost).value();
  ASSERT_TRUE(probe.Observe(g, memory.data(), 0, 0).ok());
  const GainSums s = probe.Take(&cost).value();
  EXPECT_NEAR(s.input, 15, 1e-9);
  EXPECT_NEAR(s.min, 15, 1e-9);
  EXPECT_NEAR(s.cand, 14, 1e-6);
  EXPECT_EQ(s.skipped, 0);
}

// Large groups take the sampled path (a threshold from 2048 sampled squares, candidates above it);
// the sums must equal a full sort's, also when the sample misjudges the group and every square
// is taken again.
TEST(GainProbe, LargeGroupsMatchAFullSort) {
  const int64_t n = 100000;
  const auto sorted_sums = [](const Floats& g, int64_t k_min, int64_t k_c) {
    std::vector<double> sq;
    for (float v : g) sq.push_back(v * v);  // squared in float, as the probe does
    std::sort(sq.begin(), sq.end(), std::greater<>());
    GainSums s;
    for (size_t i = 0; i < sq.size(); ++i) {
      s.input += sq[i];
      if (static_cast<int64_t>(i) < k_min) s.min += sq[i];
      if (static_cast<int64_t>(i) < k_c) s.cand += sq[i];
    }
    return s;
  };
  Floats smooth(n), spiky(n);
  for (int64_t i = 0; i < n; ++i) {
    smooth[static_cast<size_t>(i)] = static_cast<float>((i * 7919) % 1000) / 100.0f - 5.0f;
    spiky[static_cast<size_t>(i)] = 1.0f + static_cast<float>(i % 3);
  }
  // Large exactly where the sample looks (element j n / 2048): it sees 2048 large squares and
  // sets the threshold there, fewer candidates than the 10000 kept.
  for (int64_t j = 0; j < 2048; ++j) spiky[static_cast<size_t>(j * n / 2048)] = 100.0f;
  for (const Floats* g : {&smooth, &spiky}) {
    ManualClock clock;
    GainProbe probe(Selection::kMagnitude, n, 0, &clock);
    probe.SetRatios(0.1, 0.01);
    ASSERT_TRUE(probe.Observe(*g, nullptr, 0, 0).ok());
    double cost = 0;
    const GainSums got = probe.Take(&cost).value(), want = sorted_sums(*g, n / 10, n / 100);
    EXPECT_NEAR(got.input, want.input, 1e-9 * want.input);
    EXPECT_NEAR(got.min, want.min, 1e-9 * want.min);
    EXPECT_NEAR(got.cand, want.cand, 1e-9 * want.cand);
  }
}

TEST(GainProbe, LeavesOutAGroupThatIsNotFinite) {
  ManualClock clock;
  GainProbe probe(Selection::kMagnitude, 4, 0, &clock);
  probe.SetRatios(0.5, 0.25);
  ASSERT_TRUE(probe.Observe(Floats{1, NAN, 2, 3}, nullptr, 0, 0).ok());
  ASSERT_TRUE(probe.Observe(Floats{1, 1, 1, 1}, nullptr, 1, 0).ok());
  double cost = 0;
  const GainSums s = probe.Take(&cost).value();
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.input, 4);
  EXPECT_EQ(s.min, 2);
  EXPECT_EQ(s.cand, 1);
}

// randk's probe keeps what randk itself keeps: the payload's values, at each ratio.
TEST(GainProbe, RandomSelectionIsRandksOwn) {
  ManualClock clock;
  const uint64_t plan_seed = 42;
  const int group = 3;
  const uint64_t iteration = 7;
  Floats g(1000);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  const auto randk_kept = [&](double ratio) {
    kernels::CompressorConfig config;
    config.name = "randk";
    config.memory = "none";
    config.n = static_cast<int64_t>(g.size());
    config.ratio = ratio;
    config.seed = testing::ExpectedGroupSeed(plan_seed, group, 0, true);
    auto c = kernels::MakeCompressor(config, kernels::Backend::kCpu).value();
    std::vector<std::byte> payload(static_cast<size_t>(c->payload_bytes()));
    Floats state(static_cast<size_t>(c->state_floats()));
    EXPECT_TRUE(c->Encode(g, state, iteration, payload).ok());
    double sum = 0;
    for (int64_t j = 0; j < c->layout().k; ++j) {
      float v;
      std::memcpy(&v, payload.data() + 4 * j, 4);
      sum += static_cast<double>(v) * v;
    }
    return sum;
  };
  GainProbe probe(Selection::kRandom, 1000, plan_seed, &clock);
  probe.SetRatios(0.1, 0.01);
  ASSERT_TRUE(probe.Observe(g, nullptr, group, iteration).ok());
  double cost = 0;
  const GainSums s = probe.Take(&cost).value();
  EXPECT_EQ(s.min, randk_kept(0.1));
  EXPECT_EQ(s.cand, randk_kept(0.01));
}

// Sessions over in-process ranks: plan 0 fp32, then topk at decreasing ratios with different
// groupings (the rungs of a ladder).
std::vector<pb::Plan> Ladder(const pb::Model& m, int world) {
  using testing::MakePlan;
  return {MakePlan(m, testing::OneGroup(m), "fp32", world), MakePlan(m, testing::Planned(), "topk", world, 0.5),
          MakePlan(m, testing::LayerWise(m), "topk", world, 0.25), MakePlan(m, testing::Planned(), "topk", world, 0.05)};
}

struct Job {
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<testing::Gradients> grads;
};

Job MakeJob(comm::InProcessGroup& group, const std::vector<pb::Plan>& plans, int world,
            const SessionOptions& options = {}) {
  auto made = testing::CreateOnEveryRank(group, world, [&](int, std::unique_ptr<comm::Communicator> c) {
    return Session::Create(plans[0], std::move(c), options);
  });
  Job job;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(made[static_cast<size_t>(r)].ok()) << made[static_cast<size_t>(r)].status().ToString();
    job.sessions.push_back(std::move(made[static_cast<size_t>(r)]).value());
    job.grads.emplace_back(plans[0].model().model(), testing::Layout::kSeparate);
    EXPECT_TRUE(testing::RegisterAll(*job.sessions.back(), plans[0].model().model(), job.grads.back()).ok());
  }
  for (size_t p = 1; p < plans.size(); ++p)
    OnEveryRank(world, [&](int r) { EXPECT_TRUE(job.sessions[static_cast<size_t>(r)]->AddPlan(plans[p]).ok()); });
  return job;
}

std::vector<Floats> Step(Job& job, int it) {
  const int world = static_cast<int>(job.sessions.size());
  OnEveryRank(world, [&](int r) {
    testing::FillGradients(job.grads[static_cast<size_t>(r)], r, it);
    Session& s = *job.sessions[static_cast<size_t>(r)];
    for (int i = 0; i < s.tensor_count(); ++i) EXPECT_TRUE(s.GradientReady(i).ok());
    const Status done = s.Synchronize();
    EXPECT_TRUE(done.ok()) << done.ToString();
  });
  std::vector<Floats> out;
  for (const testing::Gradients& g : job.grads)
    for (size_t t = 0; t < g.size(); ++t) out.emplace_back(g[t].begin(), g[t].end());
  return out;
}

void ExpectSameDecisions(const GravacDecision& a, const GravacDecision& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.ratio, b.ratio);
  EXPECT_EQ(a.ratio_min, b.ratio_min);
  EXPECT_EQ(a.ratio_c, b.ratio_c);
  EXPECT_EQ(a.gain_min, b.gain_min);
  EXPECT_EQ(a.gain_c, b.gain_c);
  EXPECT_EQ(a.measured_ms, b.measured_ms);
  EXPECT_EQ(a.next_ratio, b.next_ratio);
}

// Every rank of `job` holds rank 0's decisions, field by field.
void ExpectRanksDecideAlike(const Job& job, int world) {
  const std::vector<GravacDecision>& d0 = job.sessions[0]->decisions();
  for (int r = 1; r < world; ++r) {
    const std::vector<GravacDecision>& dr = job.sessions[static_cast<size_t>(r)]->decisions();
    ASSERT_EQ(dr.size(), d0.size()) << "rank " << r;
    for (size_t i = 0; i < d0.size(); ++i) ExpectSameDecisions(d0[i], dr[i]);
  }
}

// The ranks' gradients differ, so do their local gains; the decisions are the same on every
// rank, and a twin job that switches by hand (SwitchPlan) at the decided steps gets bitwise the
// same averages and residuals: the controller's switches carry the error feedback as
// SwitchPlan does (without the carry, the first step after a switch between two topk rungs
// would differ).
TEST(GravacSession, RanksDecideAlikeAndSwitchesCarryResiduals) {
  const int world = 2;
  const pb::Model m = testing::SmallModel();
  const std::vector<pb::Plan> plans = Ladder(m, world);
  comm::InProcessGroup adaptive_group(world), twin_group(world);
  Job adaptive = MakeJob(adaptive_group, plans, world);
  Job twin = MakeJob(twin_group, plans, world);
  OnEveryRank(world, [&](int r) {
    const Status s = adaptive.sessions[static_cast<size_t>(r)]->EnableGravac(Options(2, 0.2, 0.0));
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  ASSERT_EQ(adaptive.sessions[0]->active_plan(), 0);
  const std::vector<double> ratios = {1, 0.5, 0.25, 0.05};
  int compressed_switches = 0;
  size_t seen = 0;
  for (int it = 0; it < 16; ++it) {
    EXPECT_EQ(Step(adaptive, it), Step(twin, it)) << "step " << it;
    const std::vector<GravacDecision>& d0 = adaptive.sessions[0]->decisions();
    ASSERT_EQ(d0.size(), static_cast<size_t>((it + 1) / 2));
    ExpectRanksDecideAlike(adaptive, world);
    if (d0.size() == seen) continue;
    seen = d0.size();
    const GravacDecision& d = d0.back();
    const int next = static_cast<int>(std::find(ratios.begin(), ratios.end(), d.next_ratio) - ratios.begin());
    ASSERT_LT(next, 4);
    EXPECT_EQ(adaptive.sessions[0]->active_plan(), next);
    if (d.ratio < 1 && d.next_ratio < 1 && d.ratio != d.next_ratio) ++compressed_switches;
    OnEveryRank(world, [&](int r) { EXPECT_TRUE(twin.sessions[static_cast<size_t>(r)]->SwitchPlan(next).ok()); });
  }
  EXPECT_GT(compressed_switches, 0) << "the test needs a switch between two topk rungs";
  for (int r = 0; r < world; ++r)
    EXPECT_EQ(adaptive.sessions[static_cast<size_t>(r)]->ReadState().value(),
              twin.sessions[static_cast<size_t>(r)]->ReadState().value());
  // The probe's gains are those of the gradient: in (0, 1], the candidate's at most cf_min's.
  for (const GravacDecision& d : adaptive.sessions[0]->decisions()) {
    EXPECT_GT(d.gain_min, 0);
    EXPECT_LE(d.gain_min, 1);
    EXPECT_LE(d.gain_c, d.gain_min);
    EXPECT_GT(d.bytes_sent, 0);
  }
}

// A ladder of PowerSGD ranks (rank 2 in the planned groups, rank 1 layer by layer): the ranks
// decide alike, the decisions name the rungs' ratios (the share of the dense bytes each sends)
// and count the bytes PowerSGD sends,
// and a twin job that switches by hand at the decided steps gets bitwise the same averages and
// memories (the controller's switches carry PowerSGD's error feedback and restart Q as
// SwitchPlan does). With epsilon 0.01 every window after the first sends a PowerSGD rung.
TEST(GravacSession, DecidesOverPowerSgdRanks) {
  const int world = 2;
  const pb::Model m = testing::ShapedModel();
  const std::vector<pb::Plan> plans = {testing::MakePlan(m, testing::OneGroup(m), "fp32", world),
                                       testing::PowerSgdPlan(m, testing::Planned(), world, "powersgd", 2),
                                       testing::PowerSgdPlan(m, testing::LayerWise(m), world, "powersgd", 1)};
  // 220 and 97 of the 534 floats (runtime_plans_test works out rank 2's; rank 1 sends t0 16 + 12,
  // t1 5, t2 8 + 9, t3 1, t4 8 + 8, t5 20 + 10).
  const std::vector<double> ratios = {1, 0.412, 0.182};
  comm::InProcessGroup adaptive_group(world), twin_group(world);
  Job adaptive = MakeJob(adaptive_group, plans, world);
  Job twin = MakeJob(twin_group, plans, world);
  OnEveryRank(world, [&](int r) {
    const Status s = adaptive.sessions[static_cast<size_t>(r)]->EnableGravac(Options(2, 0.01, 0.0));
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  std::vector<double> sent;
  size_t seen = 0;
  for (int it = 0; it < 12; ++it) {
    EXPECT_EQ(Step(adaptive, it), Step(twin, it)) << "step " << it;
    const std::vector<GravacDecision>& d0 = adaptive.sessions[0]->decisions();
    ExpectRanksDecideAlike(adaptive, world);
    if (d0.size() == seen) continue;
    seen = d0.size();
    const GravacDecision& d = d0.back();
    const int next = static_cast<int>(std::find(ratios.begin(), ratios.end(), d.next_ratio) - ratios.begin());
    ASSERT_LT(next, 3) << d.next_ratio;
    EXPECT_EQ(adaptive.sessions[0]->active_plan(), next);
    sent.push_back(d.next_ratio);
    OnEveryRank(world, [&](int r) { EXPECT_TRUE(twin.sessions[static_cast<size_t>(r)]->SwitchPlan(next).ok()); });
  }
  ASSERT_EQ(sent.size(), 6u);
  for (double ratio : sent) EXPECT_LT(ratio, 1);
  for (int r = 0; r < world; ++r)
    EXPECT_EQ(adaptive.sessions[static_cast<size_t>(r)]->ReadState().value(),
              twin.sessions[static_cast<size_t>(r)]->ReadState().value());
  for (const GravacDecision& d : adaptive.sessions[0]->decisions()) {
    EXPECT_GT(d.gain_min, 0);
    EXPECT_LE(d.gain_min, 1 + 1e-12);
    EXPECT_LE(d.gain_c, d.gain_min * (1 + 1e-12));
    EXPECT_EQ(d.ratio_min, 0.412);
    // A window of 2 steps of the sent rung's floats: 534 dense, 220 at rank 2, 97 at rank 1.
    EXPECT_EQ(d.bytes_sent, 2 * 4 * (d.ratio == 1 ? 534 : d.ratio == 0.412 ? 220 : 97)) << d.ratio;
  }
}

// probe_every = 2 with a window of 2: only each window's first step is probed. One rank on the
// fp32 rung (epsilon 1 keeps it dense; one group, no memory): the first decision's gain_min is
// step 0's top half of the squares over all of them, not steps 0 and 1 together.
TEST(GravacSession, ProbesEveryNthStepOnly) {
  const pb::Model m = testing::SmallModel();
  const auto top_half = [&](std::vector<int> steps) {
    std::vector<float> sq;
    for (int it : steps)
      for (int t = 0; t < m.tensors_size(); ++t)
        for (int64_t j = 0; j < m.tensors(t).numel(); ++j) {
          const float v = testing::TestGradient(0, it, t, j);
          sq.push_back(v * v);
        }
    // Per step: the probe keeps floor(n / 2) of each step's one group.
    double input = 0, kept = 0;
    const size_t n = sq.size() / steps.size();
    for (size_t s = 0; s < steps.size(); ++s) {
      std::vector<float> one(sq.begin() + s * n, sq.begin() + (s + 1) * n);
      std::sort(one.begin(), one.end(), std::greater<>());
      for (size_t i = 0; i < n; ++i) (i < n / 2 ? kept : input) += one[i];
    }
    return kept / (input + kept);
  };
  ASSERT_NE(top_half({0}), top_half({0, 1})) << "the test needs steps whose gains differ";
  for (int every : {1, 2}) {
    comm::InProcessGroup group(1);
    Job job = MakeJob(group, Ladder(m, 1), 1);
    GravacOptions o = Options(2, 1.0, 0.0);
    o.probe_every = every;
    ASSERT_TRUE(job.sessions[0]->EnableGravac(o).ok());
    Step(job, 0);
    Step(job, 1);
    ASSERT_EQ(job.sessions[0]->decisions().size(), 1u);
    EXPECT_DOUBLE_EQ(job.sessions[0]->decisions()[0].gain_min, every == 2 ? top_half({0}) : top_half({0, 1}))
        << "probe_every " << every;
  }
}

// A rank whose gradient is not finite has its group left out of the gains, and every rank's
// decision says so: 2 ranks, one group, windows of one step; rank 1's group holds a NaN in step 1
// only. Step 0's gain is both ranks' groups', step 1's rank 0's alone.
TEST(GravacSession, DecisionsCountTheGroupsLeftOut) {
  const pb::Model m = testing::SmallModel();
  const auto top_half = [&](std::vector<int> ranks, int it) {
    double input = 0, kept = 0;
    for (int r : ranks) {
      std::vector<float> sq;
      for (int t = 0; t < m.tensors_size(); ++t)
        for (int64_t j = 0; j < m.tensors(t).numel(); ++j) {
          const float v = testing::TestGradient(r, it, t, j);
          sq.push_back(v * v);
        }
      std::sort(sq.begin(), sq.end(), std::greater<>());
      for (size_t i = 0; i < sq.size(); ++i) (i < sq.size() / 2 ? kept : input) += sq[i];
    }
    return kept / (input + kept);
  };
  comm::InProcessGroup group(2);
  Job job = MakeJob(group, Ladder(m, 2), 2);
  OnEveryRank(
      2, [&](int r) { EXPECT_TRUE(job.sessions[static_cast<size_t>(r)]->EnableGravac(Options(1, 1.0, 0.0)).ok()); });
  Step(job, 0);
  OnEveryRank(2, [&](int r) {
    testing::FillGradients(job.grads[static_cast<size_t>(r)], r, 1);
    if (r == 1) job.grads[1][0][0] = NAN;
    Session& s = *job.sessions[static_cast<size_t>(r)];
    for (int i = 0; i < s.tensor_count(); ++i) EXPECT_TRUE(s.GradientReady(i).ok());
    EXPECT_TRUE(s.Synchronize().ok());
  });
  for (const auto& s : job.sessions) {
    const std::vector<GravacDecision>& d = s->decisions();
    ASSERT_EQ(d.size(), 2u);
    EXPECT_EQ(d[0].groups_skipped, 0);
    EXPECT_NEAR(d[0].gain_min, top_half({0, 1}, 0), 1e-12);
    EXPECT_EQ(d[1].groups_skipped, 1);
    EXPECT_NEAR(d[1].gain_min, top_half({0}, 1), 1e-12);
  }
}

// A GraVAC job restored from a snapshot goes on as the uninterrupted run: the same decisions and
// bitwise the same gradients, residuals and rung. Run 0 runs iterations 0..13 in windows of 3,
// probing every 2nd step, and commits step 7 after iteration 6, in the middle of its third window
// (iterations 6..8: 6 probed and timed, 7 not probed); run 1, new sessions with GraVAC enabled
// alike, restores that snapshot and runs iterations 7..13. The steps take the times the test sets on
// the sessions' clock, per rung and far from the plans' prediction (1000 us each), so the
// controller goes by the measured ones. The restored run leaves out the step across the restart
// (the time between the processes is no iteration), which changes no window's mean: every step
// of a rung takes the same time. For the topk ladder and a ladder of PowerSGD ranks (whose probe
// keeps a warm-start Q per tensor, this rank's own).
TEST(GravacSession, RestoredFromASnapshotDecidesAsTheUninterruptedRun) {
  const int world = 2;
  constexpr int kSteps = 14, kCommitted = 7;
  const double step_us[] = {2000, 1500, 700, 300};  // per rung
  struct Case {
    std::string name;
    std::vector<pb::Plan> plans;
    GravacOptions options;
  };
  const pb::Model small = testing::SmallModel(), shaped = testing::ShapedModel();
  GravacOptions topk = Options(3, 0.2, 0.0), ranks = Options(3, 0.01, 0.0);
  topk.probe_every = ranks.probe_every = 2;
  const std::vector<Case> cases = {
      {"topk", Ladder(small, world), topk},
      {"powersgd",
       {testing::MakePlan(shaped, testing::OneGroup(shaped), "fp32", world),
        testing::PowerSgdPlan(shaped, testing::Planned(), world, "powersgd", 2),
        testing::PowerSgdPlan(shaped, testing::LayerWise(shaped), world, "powersgd", 1)},
       ranks},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    CheckpointOptions options;
    options.name = "test-gravac-restored-" + c.name + "-" + std::to_string(::getpid());
    std::vector<std::vector<Floats>> uninterrupted(kSteps);  // run 0's gradients per step
    std::vector<GravacDecision> want;
    std::vector<Floats> want_state;
    int want_plan = -1;
    for (int run = 0; run < 2; ++run) {
      ManualClock clock;
      SessionOptions session_options;
      session_options.clock = &clock;
      comm::InProcessGroup group(world), ckpt_group(world);
      Job job = MakeJob(group, c.plans, world, session_options);
      std::vector<std::unique_ptr<comm::Communicator>> comms;
      std::vector<std::unique_ptr<Checkpointer>> ckpts;
      ASSERT_EQ(job.sessions.size(), static_cast<size_t>(world));
      for (int r = 0; r < world; ++r) {
        comms.push_back(ckpt_group.Rank(r));
        ckpts.push_back(Checkpointer::Create(options, comms.back().get()).value());
      }
      OnEveryRank(world, [&](int r) {
        Session& s = *job.sessions[static_cast<size_t>(r)];
        ASSERT_TRUE(s.EnableGravac(c.options).ok());
        ASSERT_TRUE(ckpts[static_cast<size_t>(r)]->AttachSession(&s).ok());
        if (run == 0) return;
        auto point = ckpts[static_cast<size_t>(r)]->Restore();
        ASSERT_TRUE(point.ok()) << point.status().ToString();
        EXPECT_EQ(point->step, kCommitted);
        EXPECT_EQ(s.iteration(), static_cast<uint64_t>(kCommitted));
      });
      double now_us = 0;
      for (int it = run == 0 ? 0 : kCommitted; it < kSteps; ++it) {
        now_us += step_us[job.sessions[0]->active_plan()];
        clock.Set(now_us);
        const std::vector<Floats> got = Step(job, it);
        if (run == 0)
          uninterrupted[static_cast<size_t>(it)] = got;
        else
          EXPECT_TRUE(got == uninterrupted[static_cast<size_t>(it)]) << "step " << it;
        ExpectRanksDecideAlike(job, world);
        if (run == 0 && it + 1 == kCommitted)
          OnEveryRank(world, [&](int r) {
            ASSERT_TRUE(ckpts[static_cast<size_t>(r)]->Commit(kCommitted).ok());
            ASSERT_TRUE(ckpts[static_cast<size_t>(r)]->WaitForCopy().ok());
          });
      }
      const std::vector<GravacDecision>& decided = job.sessions[0]->decisions();
      std::vector<Floats> state;
      for (const auto& s : job.sessions) state.push_back(s->ReadState().value());
      if (run == 0) {
        // Windows from steps 0, 3, 6 and 9; the restored run decides the last two.
        ASSERT_EQ(decided.size(), 4u);
        want.assign(decided.begin() + 2, decided.end());
        want_state = state;
        want_plan = job.sessions[0]->active_plan();
        continue;
      }
      ASSERT_EQ(decided.size(), want.size());
      bool switched = false;
      for (size_t i = 0; i < want.size(); ++i) {
        SCOPED_TRACE("decision " + std::to_string(i));
        ExpectSameDecisions(decided[i], want[i]);
        EXPECT_EQ(decided[i].steps, want[i].steps);
        EXPECT_EQ(decided[i].predicted_ms, want[i].predicted_ms);
        EXPECT_EQ(decided[i].bytes_sent, want[i].bytes_sent);
        EXPECT_GT(decided[i].measured_ms, 0);
        switched = switched || decided[i].next_ratio != decided[i].ratio;
      }
      EXPECT_EQ(decided[0].step, 6u);
      EXPECT_TRUE(switched) << "the test needs a switch after the restore";
      EXPECT_TRUE(state == want_state) << "the residuals differ";
      EXPECT_EQ(job.sessions[0]->active_plan(), want_plan);
    }
    for (int r = 0; r < world; ++r) EXPECT_TRUE(Checkpointer::RemoveSegment(options.name, r).ok());
  }
}

// GraVAC's part of a session's control state, worked by hand after one step of a window of 3 on
// the four-rung topk ladder: plan 0 active; the controller sends rung 0, probes cf_min 1 and the
// candidate 2 and explores, nothing measured or probed yet; 1 step. Values that are not this
// session's are refused naming them, and so is an iteration before the window's steps.
TEST(GravacSession, ControlStateIsTheControllersAndTheWindows) {
  const pb::Model m = testing::SmallModel();
  comm::InProcessGroup group(1);
  Job job = MakeJob(group, Ladder(m, 1), 1);
  Session& s = *job.sessions[0];
  EXPECT_EQ(s.ReadControlState(ControlState::kPlan).value(), std::vector<double>{0});
  EXPECT_EQ(s.ReadControlState(ControlState::kGravacWindow).value(), std::vector<double>{});
  ASSERT_TRUE(s.EnableGravac(Options(3, 0.7, 0.01)).ok());
  Step(job, 0);
  const std::vector<double> plan = s.ReadControlState(ControlState::kPlan).value();
  EXPECT_EQ(plan, (std::vector<double>{0, 0, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1}));
  // Measured time and steps (the first step has none before it), bytes (the fp32 rung sends the
  // 435 floats), the probe's three sums and its time (the default clock: any).
  const std::vector<double> window = s.ReadControlState(ControlState::kGravacWindow).value();
  ASSERT_EQ(window.size(), 7u);
  EXPECT_EQ(window[0], 0);
  EXPECT_EQ(window[1], 0);
  EXPECT_EQ(window[2], 4 * 435);
  EXPECT_GT(window[3], 0);
  EXPECT_EQ(s.WriteControlState(std::vector<double>{1}, ControlState::kPlan).message(),
            "WriteControlState: wrong size; got 1 doubles, expected 14 (4 plans, GraVAC enabled)");
  std::vector<double> bad = plan;
  bad[0] = 4;
  EXPECT_EQ(s.WriteControlState(bad, ControlState::kPlan).message(),
            "WriteControlState: plan or window out of range; got plan 4, window steps 1, expected 0 <= plan < 4 "
            "(plans added) and 0 <= steps < 3 (GraVAC's window)");
  bad = plan;
  bad[1] = 7;
  EXPECT_EQ(s.WriteControlState(bad, ControlState::kPlan).message(),
            "WriteControlState: GraVAC's controller: rungs out of range; got sent 7, cf_min 1, candidate 2, "
            "exploring 1, expected 0 <= sent < 4, 1 <= cf_min <= candidate < 4 (the ladder's rungs) and exploring 0 "
            "or 1");
  EXPECT_EQ(s.SetIteration(0).message(),
            "SetIteration: before GraVAC's window; got 0, expected >= 1 (the steps of its current window so far)");
  EXPECT_TRUE(s.SetIteration(1).ok());
  // A write of what was read changes nothing.
  ASSERT_TRUE(s.WriteControlState(plan, ControlState::kPlan).ok());
  ASSERT_TRUE(s.WriteControlState(window, ControlState::kGravacWindow).ok());
  EXPECT_EQ(s.ReadControlState(ControlState::kPlan).value(), plan);
  EXPECT_EQ(s.ReadControlState(ControlState::kGravacWindow).value(), window);
}

TEST(GravacSession, RefusesWhatIsNotALadderAndOptionsThatDiffer) {
  const int world = 2;
  const pb::Model m = testing::SmallModel();
  {
    comm::InProcessGroup group(world);
    Job job = MakeJob(group, {testing::MakePlan(m, testing::Planned(), "topk", world)}, world);
    OnEveryRank(world, [&](int r) {
      const Status s = job.sessions[static_cast<size_t>(r)]->EnableGravac(GravacOptions{});
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
      EXPECT_NE(s.message().find("EnableGravac: the session's plans are not a ladder"), std::string::npos)
          << s.message();
    });
  }
  {
    comm::InProcessGroup group(world);
    Job job = MakeJob(group, Ladder(m, world), world);
    OnEveryRank(world, [&](int r) {
      const Status s = job.sessions[static_cast<size_t>(r)]->EnableGravac(Options(r == 0 ? 100 : 200, 0.7, 0.01));
      EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
      EXPECT_NE(s.message().find("EnableGravac: the ranks' options differ; got rank 0: window 100"), std::string::npos)
          << s.message();
    });
    OnEveryRank(world, [&](int r) {
      const Status s = job.sessions[static_cast<size_t>(r)]->EnableGravac(Options(r == 0 ? 0 : 10, 0.7, 0.01));
      EXPECT_EQ(s.code(), r == 0 ? StatusCode::kInvalidArgument : StatusCode::kFailedPrecondition) << s.message();
      EXPECT_NE(s.message().find(r == 0 ? "GravacOptions.window" : "ranks 0 could not enable it"), std::string::npos)
          << s.message();
    });
    EXPECT_TRUE(job.sessions[0]->decisions().empty());
  }
}

// One rank, a plan predicting 1000 us from tensor 0's gradient to the last decode; steps whose
// span the test sets on the session's clock.
struct DriftJob {
  explicit DriftJob(double threshold) : group(1) {
    const pb::Model m = testing::SmallModel();
    pb::Plan plan = testing::MakePlan(m, testing::Planned(), "fp32", 1);
    plan.mutable_groups(plan.groups_size() - 1)->set_decode_end_us(1010);  // tensor 0 ready at 10
    plan.mutable_predicted()->set_iteration_us(1100);
    SessionOptions options;
    options.clock = &clock;
    options.drift_window = 4;
    options.drift_threshold = threshold;
    options.on_warning = [this](const std::string& w) { heard.push_back(w); };
    session = Session::Create(plan, group.Rank(0), options).value();
    grads = testing::Gradients(m, testing::Layout::kSeparate);
    EXPECT_TRUE(testing::RegisterAll(*session, m, grads).ok());
  }
  void Steps(int count, double span_us) {
    for (int i = 0; i < count; ++i) {
      clock.Set(now_us);
      for (int t = 0; t < session->tensor_count(); ++t) ASSERT_TRUE(session->GradientReady(t).ok());
      clock.Set(now_us + span_us);
      ASSERT_TRUE(session->Synchronize().ok());
      now_us += span_us + 500;
    }
  }
  ManualClock clock;
  comm::InProcessGroup group;
  std::unique_ptr<Session> session;
  testing::Gradients grads;
  std::vector<std::string> heard;
  double now_us = 0;
};

TEST(DriftCheck, WarnsOnceWhenTheStepsLeaveThePrediction) {
  DriftJob job(0.2);
  job.Steps(4, 5000);  // the warm-up window is not judged
  job.Steps(8, 1100);  // within 20%
  EXPECT_TRUE(job.heard.empty());
  job.Steps(4, 3000);  // +200%
  ASSERT_EQ(job.heard.size(), 1u);
  EXPECT_EQ(job.session->warnings(), job.heard);
  const std::string& w = job.heard[0];
  EXPECT_NE(w.find("plan: drift: steps 12-15 took 3 ms (median)"), std::string::npos) << w;
  EXPECT_NE(w.find("the plan predicts 1 ms (+200%"), std::string::npos) << w;
  EXPECT_NE(w.find("cupcake-profile"), std::string::npos) << w;
  EXPECT_NE(w.find("cupcake-plan search"), std::string::npos) << w;
  job.Steps(8, 300);  // once only
  EXPECT_EQ(job.heard.size(), 1u);
}

TEST(DriftCheck, JudgesTheMedianAndCanBeTurnedOff) {
  DriftJob job(0.2);
  job.Steps(4, 1000);
  job.Steps(1, 50000);  // one slow step in a window of 4: the median stays at 1000
  job.Steps(3, 1000);
  EXPECT_TRUE(job.heard.empty());
  job.Steps(4, 700);  // -30%
  EXPECT_EQ(job.heard.size(), 1u);
  DriftJob off(0);
  off.Steps(12, 9000);
  EXPECT_TRUE(off.heard.empty());
}

}  // namespace
}  // namespace cupcake::runtime

// The Session over the in-process communicator (ranks as threads): every compressor and
// grouping against the reference, fp32 exactly the average, the validation messages, the
// missing-gradient timeout on a fake clock, accumulation steps and a peer that gives up.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>

#include <filesystem>
#include <thread>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/plan_io.h"
#include "cupcake/runtime/session.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using testing::OnEveryRank;

using comm::BuiltWithNccl;
using comm::Communicator;
using comm::DataType;
using comm::InProcessGroup;
using comm::MakeNcclCommunicator;
using comm::MemoryKind;
using comm::ReduceOp;

using testing::FillGradients;
using testing::Grouping;
using testing::MakePlan;
using testing::SmallModel;

// A fake: every NowUs() returns the previous value plus `step_us`. One per thread.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(double step_us) : step_us_(step_us) {}
  double NowUs() override {
    double t = now_us_;
    now_us_ += step_us_;
    return t;
  }

 private:
  double step_us_;
  double now_us_ = 0;
};

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("cupcake_runtime_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

struct Rank {
  std::unique_ptr<Session> session;
  testing::Gradients grads;
};

// W sessions over one in-process group, made together (Create is collective), each with its
// gradients registered.
std::vector<Rank> MakeRanks(const pb::Plan& plan, int world, const SessionOptions& options = {},
                            testing::Layout layout = testing::Layout::kSeparate) {
  InProcessGroup group(world);
  auto made = testing::CreateOnEveryRank(group, world, [&](int, std::unique_ptr<comm::Communicator> c) {
    return Session::Create(plan, std::move(c), options);
  });
  std::vector<Rank> ranks(static_cast<size_t>(world));
  const pb::Model& m = plan.model().model();
  for (int r = 0; r < world; ++r) {
    auto& s = made[static_cast<size_t>(r)];
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return {};
    Rank& rank = ranks[static_cast<size_t>(r)];
    rank.session = std::move(s).value();
    rank.grads = testing::Gradients(m, layout);
    Status st = testing::RegisterAll(*rank.session, m, rank.grads);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  return ranks;
}

struct Case {
  std::string compressor;
  std::string grouping;  // layerwise, one_group, planned
  int world;
  testing::Layout layout;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.compressor << "/" << c.grouping << "/w" << c.world << "/" << testing::LayoutName(c.layout);
}

class MatchesReference : public ::testing::TestWithParam<Case> {};

TEST_P(MatchesReference, OverSeveralIterationsWithErrorFeedback) {
  const Case c = GetParam();
  const pb::Model model = SmallModel();
  const Grouping grouping = c.grouping == "layerwise"   ? testing::LayerWise(model)
                            : c.grouping == "one_group" ? testing::OneGroup(model)
                                                        : testing::Planned();
  const pb::Plan plan = MakePlan(model, grouping, c.compressor, c.world);
  ASSERT_TRUE(ValidatePlan(plan, "plan").ok()) << ValidatePlan(plan, "plan").ToString();
  std::vector<Rank> ranks = MakeRanks(plan, c.world, {}, c.layout);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(c.world));
  // Adjacent buffers need no fusion buffer; separate ones one per multi-tensor group.
  int64_t fused_floats = 0;
  for (auto [first, last] : grouping)
    for (int i = first; i <= last && last > first; ++i) fused_floats += model.tensors(i).numel();
  EXPECT_EQ(ranks[0].session->fusion_bytes(), c.layout == testing::Layout::kFlat ? 0 : 4 * fused_floats);
  testing::Reference reference(plan, c.world);
  constexpr int kIterations = 4;
  for (int it = 0; it < kIterations; ++it) {
    const auto want = reference.Step(it);
    OnEveryRank(c.world, [&](int r) {
      Rank& rank = ranks[static_cast<size_t>(r)];
      FillGradients(rank.grads, r, it);
      for (int i = 0; i < model.tensors_size(); ++i) {
        Status s = rank.session->GradientReady(i);
        EXPECT_TRUE(s.ok()) << s.ToString();
      }
      Status s = rank.session->Synchronize();
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
    for (int r = 0; r < c.world; ++r)
      ASSERT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "")
          << "rank " << r << ", iteration " << it;
  }
  EXPECT_EQ(ranks[0].session->iteration(), static_cast<uint64_t>(kIterations));
}

// A clock that counts its readings (thread-safe): every later event reads a larger time, so
// the recorded timeline shows the order the session did things in.
class CountingClock final : public Clock {
 public:
  double NowUs() override { return static_cast<double>(++count_); }

 private:
  std::atomic<int64_t> count_{0};
};

// The timeline a host session records: per group encode, then collective (on the
// communication thread), then decode, in group order on each resource.
TEST(Session, RecordsWhatEachGroupDidWhenAsked) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::Planned(), "efsignsgd", 2);
  std::vector<CountingClock> clocks(2);
  std::vector<Rank> ranks(2);
  InProcessGroup group(2);
  auto made = testing::CreateOnEveryRank(group, 2, [&](int r, std::unique_ptr<comm::Communicator> c) {
    SessionOptions options;
    options.clock = &clocks[static_cast<size_t>(r)];
    options.record_timeline = true;
    return Session::Create(plan, std::move(c), options);
  });
  for (int r = 0; r < 2; ++r) {
    auto& created = made[static_cast<size_t>(r)];
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    Rank& rank = ranks[static_cast<size_t>(r)];
    rank.session = std::move(created).value();
    rank.grads = testing::Gradients(model, testing::Layout::kSeparate);
    ASSERT_TRUE(testing::RegisterAll(*rank.session, model, rank.grads).ok());
  }
  EXPECT_EQ(ranks[0].session->Timeline().status().message(), "Timeline: no step synchronized yet");
  OnEveryRank(2, [&](int r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    FillGradients(rank.grads, r, 0);
    for (int i = 0; i < model.tensors_size(); ++i) EXPECT_TRUE(rank.session->GradientReady(i).ok());
    EXPECT_TRUE(rank.session->Synchronize().ok());
  });
  for (int r = 0; r < 2; ++r) {
    auto timeline = ranks[static_cast<size_t>(r)].session->Timeline();
    ASSERT_TRUE(timeline.ok()) << timeline.status().ToString();
    ASSERT_EQ(timeline->size(), 3u);
    for (size_t k = 0; k < 3; ++k) {
      const GroupTimeline& g = (*timeline)[k];
      SCOPED_TRACE("rank " + std::to_string(r) + ", group " + std::to_string(k));
      EXPECT_GT(g.encode_start_us, 0);
      EXPECT_LT(g.encode_start_us, g.encode_end_us);
      EXPECT_LT(g.encode_end_us, g.comm_start_us);
      EXPECT_LT(g.comm_start_us, g.comm_end_us);
      EXPECT_LT(g.comm_end_us, g.decode_start_us);
      EXPECT_LT(g.decode_start_us, g.decode_end_us);
      if (k == 0) continue;
      const GroupTimeline& prev = (*timeline)[k - 1];
      EXPECT_LT(prev.encode_end_us, g.encode_start_us);
      EXPECT_LT(prev.comm_end_us, g.comm_start_us);
      EXPECT_LT(prev.decode_end_us, g.decode_start_us);
    }
  }
  auto one = Session::Create(MakePlan(model, testing::Planned(), "efsignsgd", 1), InProcessGroup(1).Rank(0));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)->Timeline().status().message(),
            "Timeline: not recorded; expected SessionOptions::record_timeline = true");
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (std::string_view name : CompressorNames())
    for (const char* grouping : {"layerwise", "one_group", "planned"})
      for (int world : {2, 3})
        for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat})
          cases.push_back({std::string(name), grouping, world, layout});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCompressors, MatchesReference, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return p.param.compressor + "_" + p.param.grouping + "_w" + std::to_string(p.param.world) +
                                  "_" + testing::LayoutName(p.param.layout);
                         });

// The seeds, against values computed by hand from the formula in session.h:
// 2 * 0x9E3779B97F4A7C15 = 0x13C6EF372FE94F82A, which wraps to 0x3C6EF372FE94F82A.
TEST(GroupSeed, IsPlanSeedPlusGroupTimesGoldenPlusRankForAllgather) {
  EXPECT_EQ(GroupSeed(7, 0, 0, false), 7u);
  EXPECT_EQ(GroupSeed(7, 0, 3, false), 10u);  // allgather (qsgd, terngrad): each rank its own
  EXPECT_EQ(GroupSeed(7, 0, 3, true), 7u);  // allreduce (randk): the same on every rank
  EXPECT_EQ(GroupSeed(7, 1, 0, true), 0x9E3779B97F4A7C1Cull);
  EXPECT_EQ(GroupSeed(7, 2, 3, false), 0x3C6EF372FE94F834ull);
  EXPECT_EQ(GroupSeed(7, 2, 3, true), 0x3C6EF372FE94F831ull);
  EXPECT_EQ(GroupSeed(0xFFFFFFFFFFFFFFFFull, 0, 1, false), 0u);  // wraps, as unsigned arithmetic
  // The tests' reference uses the same documented formula (runtime_test_util.h).
  for (int group : {0, 1, 5})
    for (int rank : {0, 1, 3})
      for (bool allreduce : {false, true})
        EXPECT_EQ(GroupSeed(42, group, rank, allreduce), testing::ExpectedGroupSeed(42, group, rank, allreduce));
}

TEST(Session, Fp32GivesExactlyTheAverage) {
  const pb::Model model = SmallModel();
  for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
    for (const Grouping& grouping : {testing::Planned(), testing::LayerWise(model), testing::OneGroup(model)}) {
      const pb::Plan plan = MakePlan(model, grouping, "fp32", 4);
      std::vector<Rank> ranks = MakeRanks(plan, 4, {}, layout);
      ASSERT_EQ(ranks.size(), 4u);
      OnEveryRank(4, [&](int r) {
        FillGradients(ranks[static_cast<size_t>(r)].grads, r, 0);
        for (int i = model.tensors_size() - 1; i >= 0; --i)  // any ready order works
          EXPECT_TRUE(ranks[static_cast<size_t>(r)].session->GradientReady(i).ok());
        EXPECT_TRUE(ranks[static_cast<size_t>(r)].session->Synchronize().ok());
      });
      for (int t = 0; t < model.tensors_size(); ++t)
        for (int64_t j = 0; j < model.tensors(t).numel(); ++j) {
          float sum = 0;
          for (int r = 0; r < 4; ++r) sum += testing::TestGradient(r, 0, t, j);
          for (int r = 0; r < 4; ++r)
            ASSERT_EQ(ranks[static_cast<size_t>(r)].grads[static_cast<size_t>(t)][static_cast<size_t>(j)], sum / 4)
                << testing::LayoutName(layout) << ", " << grouping.size() << " groups, rank " << r;
        }
    }
  }
}

// Registered buffers that are adjacent in memory but not in plan order (or overlap) are not one
// buffer: the group packs them, and the result is still right.
TEST(Session, AdjacentButReorderedBuffersArePacked) {
  const pb::Model model = SmallModel("tiny", {3, 4});
  const pb::Plan plan = MakePlan(model, testing::OneGroup(model), "fp32", 2);
  std::vector<std::vector<float>> flat(2, std::vector<float>(7));
  std::vector<std::unique_ptr<Session>> sessions;
  InProcessGroup group(2);
  auto made = testing::CreateOnEveryRank(
      group, 2, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
  for (int r = 0; r < 2; ++r) {
    sessions.push_back(std::move(made[static_cast<size_t>(r)]).value());
    auto& f = flat[static_cast<size_t>(r)];
    ASSERT_TRUE(sessions.back()->Register("t0", std::span<float>(f.data() + 4, 3)).ok());  // t0 after t1
    ASSERT_TRUE(sessions.back()->Register("t1", std::span<float>(f.data(), 4)).ok());
    EXPECT_EQ(sessions.back()->fusion_bytes(), 28);
    for (int j = 0; j < 7; ++j) f[static_cast<size_t>(j)] = static_cast<float>(j * (r + 1));
  }
  OnEveryRank(2, [&](int r) {
    EXPECT_TRUE(sessions[static_cast<size_t>(r)]->GradientReady(0).ok());
    EXPECT_TRUE(sessions[static_cast<size_t>(r)]->GradientReady(1).ok());
    EXPECT_TRUE(sessions[static_cast<size_t>(r)]->Synchronize().ok());
  });
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < 7; ++j)
      EXPECT_EQ(flat[static_cast<size_t>(r)][static_cast<size_t>(j)], 1.5f * static_cast<float>(j)) << j;
}

TEST(Session, AccumulationStepsSkipSynchronization) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::OneGroup(model), "fp32", 2);
  std::vector<Rank> ranks = MakeRanks(plan, 2);
  ASSERT_EQ(ranks.size(), 2u);
  OnEveryRank(2, [&](int r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    FillGradients(rank.grads, r, 0);
    ASSERT_TRUE(rank.session->SetAccumulating(true).ok());
    for (int i = 0; i < model.tensors_size(); ++i) ASSERT_TRUE(rank.session->GradientReady(i).ok());
    ASSERT_TRUE(rank.session->Synchronize().ok());
    // Untouched: the job accumulates the next micro-batch on top.
    EXPECT_EQ(rank.grads[2][1], testing::TestGradient(r, 0, 2, 1));
    for (std::span<float> g : rank.grads)
      for (float& x : g) x *= 2;
    ASSERT_TRUE(rank.session->SetAccumulating(false).ok());
    for (int i = 0; i < model.tensors_size(); ++i) ASSERT_TRUE(rank.session->GradientReady(i).ok());
    ASSERT_TRUE(rank.session->Synchronize().ok());
  });
  EXPECT_EQ(ranks[0].session->iteration(), 1u);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(ranks[static_cast<size_t>(r)].grads[2][1],
              testing::TestGradient(0, 0, 2, 1) + testing::TestGradient(1, 0, 2, 1));
}

TEST(Session, MissingGradientFailsAfterTheTimeoutNamingIt) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::Planned(), "topk", 2);
  std::vector<FakeClock> clocks(2, FakeClock(1e4));  // 10 ms per read
  std::vector<Status> results(2);
  {
    InProcessGroup group(2);
    std::vector<Rank> ranks(2);
    auto made = testing::CreateOnEveryRank(group, 2, [&](int r, std::unique_ptr<comm::Communicator> c) {
      SessionOptions options;
      options.clock = &clocks[static_cast<size_t>(r)];
      options.ready_timeout_us = 5e6;
      return Session::Create(plan, std::move(c), options);
    });
    for (int r = 0; r < 2; ++r) {
      Rank& rank = ranks[static_cast<size_t>(r)];
      rank.session = std::move(made[static_cast<size_t>(r)]).value();
      rank.grads = testing::Gradients(model, testing::Layout::kSeparate, 1.0f);
      ASSERT_TRUE(testing::RegisterAll(*rank.session, model, rank.grads).ok());
    }
    OnEveryRank(2, [&](int r) {
      Session& s = *ranks[static_cast<size_t>(r)].session;
      for (int i = 0; i < model.tensors_size(); ++i)
        if (!(i == 4 && r == 1)) {  // rank 1 never reports tensor 4
          EXPECT_TRUE(s.GradientReady(i).ok());
        }
      results[static_cast<size_t>(r)] = s.Synchronize();
    });
    // Rank 0 sits in the last group's collective: destroying it gives up on the group.
    EXPECT_EQ(ranks[0].session->GradientReady(0).code(), StatusCode::kFailedPrecondition);
  }
  EXPECT_EQ(results[1].code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(results[1].message(),
            "Synchronize: gradients never became ready; got no GradientReady within 5 s for 1 of 6 tensors: 4 ('t4') "
            "(iteration 0, rank 1 on localhost)");
  EXPECT_EQ(results[0].message(),
            "Synchronize: groups[2] allgather did not finish within 5 s; every gradient of this rank is ready, so a "
            "peer is missing gradients or has died (iteration 0, rank 0 on localhost)");
}

TEST(Session, AbortedPeerFailsTheCollectiveWithItsReason) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::OneGroup(model), "fp32", 2);
  InProcessGroup group(2);
  auto made = testing::CreateOnEveryRank(
      group, 2, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
  ASSERT_TRUE(made[0].ok() && made[1].ok());
  Session& session = *made[0].value();
  std::vector<std::vector<float>> grads;
  for (const auto& t : model.tensors()) grads.emplace_back(static_cast<size_t>(t.numel()), 1.0f);
  for (int i = 0; i < model.tensors_size(); ++i)
    ASSERT_TRUE(session.Register(model.tensors(i).name(), grads[static_cast<size_t>(i)]).ok());
  for (int i = 0; i < model.tensors_size(); ++i) ASSERT_TRUE(session.GradientReady(i).ok());
  group.Rank(1)->Abort("rank 1 died");  // a handle on rank 1's group state: as rank 1 would
  Status st = session.Synchronize();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(st.message(),
            "Synchronize: groups[0] allreduce: in-process group aborted: rank 1 died (rank 0 on localhost)");
}

// ---------------------------------------------------------------- plan agreement

// Create is collective: the ranks compare their plans' fingerprints before any collective, and
// every rank fails when they differ, naming each plan once with its ranks and a file.
TEST(SessionAgreement, RanksWithDifferentPlansAllFailNamingEachPlan) {
  const pb::Model model = SmallModel();
  const pb::Plan a = MakePlan(model, testing::Planned(), "topk", 3);
  const pb::Plan b = MakePlan(model, testing::Planned(), "topk", 3, 0.1);
  InProcessGroup group(3);
  auto made = testing::CreateOnEveryRank(group, 3, [&](int r, std::unique_ptr<comm::Communicator> c) {
    SessionOptions options;
    options.origin = r == 1 ? "b.pb" : "a" + std::to_string(r) + ".pb";
    return Session::Create(r == 1 ? b : a, std::move(c), options);
  });
  for (int r = 0; r < 3; ++r) {
    const auto& s = made[static_cast<size_t>(r)];
    ASSERT_FALSE(s.ok()) << r;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message(), (r == 1 ? "b.pb" : "a" + std::to_string(r) + ".pb") +
                                        ": the ranks run different plans; expected one plan on every rank:\n"
                                        "  ranks 0, 2: plan " +
                                        PlanFingerprint(a) + " (a0.pb)\n  rank 1: plan " + PlanFingerprint(b) +
                                        " (b.pb)");
    EXPECT_EQ(s.status().reporter(), 0) << r;  // the same on every rank: rank 0 prints it
  }
}

// The same plan read from different files is one plan; a rank whose plan is invalid reports its
// own problem, and the others name it instead of waiting for it in a collective.
TEST(SessionAgreement, SamePlanFromOtherFilesAgreesAndAnInvalidPlanStopsEveryRank) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::Planned(), "fp32", 2);
  {
    InProcessGroup group(2);
    auto made = testing::CreateOnEveryRank(group, 2, [&](int r, std::unique_ptr<comm::Communicator> c) {
      SessionOptions options;
      options.origin = "rank" + std::to_string(r) + ".pb";
      return Session::Create(plan, std::move(c), options);
    });
    EXPECT_TRUE(made[0].ok() && made[1].ok());
  }
  pb::Plan invalid = plan;
  invalid.mutable_groups(0)->set_payload_bytes(3);
  InProcessGroup group(2);
  auto made = testing::CreateOnEveryRank(group, 2, [&](int r, std::unique_ptr<comm::Communicator> c) {
    SessionOptions options;
    options.origin = "rank" + std::to_string(r) + ".pb";
    return Session::Create(r == 1 ? invalid : plan, std::move(c), options);
  });
  ASSERT_FALSE(made[0].ok());
  ASSERT_FALSE(made[1].ok());
  EXPECT_EQ(made[0].status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(made[0].status().message(),
            "rank0.pb: other ranks could not use their plan: rank 1 (rank1.pb); every rank stops (each of those "
            "ranks reports why)");
  EXPECT_EQ(made[1].status().message().rfind("rank1.pb: groups[0].payload_bytes: ", 0), 0u)
      << made[1].status().message();
  // Rank 1 alone found its problem: it prints it; rank 0, whose plan passed, prints the pointer.
  EXPECT_EQ(made[1].status().reporter(), 1);
  EXPECT_EQ(made[0].status().reporter(), 0);
}

// Sessions of one plan for 2 ranks, on an in-process group of 2.
std::vector<std::unique_ptr<Session>> TwoSessions(InProcessGroup& group, const pb::Plan& plan) {
  auto made = testing::CreateOnEveryRank(
      group, 2, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
  std::vector<std::unique_ptr<Session>> sessions;
  for (auto& m : made) {
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (m.ok()) sessions.push_back(std::move(m).value());
  }
  return sessions;
}

// Two ranks' sessions of one fp32 plan for the model "tiny" (two tensors of 4), for RegisterAll.
class SessionRegisterAll : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(sessions.size(), 2u); }
  const pb::Model model = SmallModel("tiny", {4, 4});
  const pb::Plan plan = MakePlan(model, testing::OneGroup(model), "fp32", 2);
  InProcessGroup group{2};
  std::vector<std::unique_ptr<Session>> sessions = TwoSessions(group, plan);
};

// RegisterAll is collective: the ranks agree on their gradients as on their plan. Ranks that all
// hold another model fail alike, rank 0 reporting it, and their sessions stay failed.
TEST_F(SessionRegisterAll, FailsEveryRankAlikeForAnotherModel) {
  std::vector<std::vector<float>> a(2, std::vector<float>(4)), b(2, std::vector<float>(5));
  std::vector<Status> got(2);
  OnEveryRank(2, [&](int r) {
    const auto i = static_cast<size_t>(r);
    const GradientBuffer grads[] = {{"t0", a[i].data(), 4}, {"t1", b[i].data(), 5}};
    got[i] = sessions[i]->RegisterAll(grads);
  });
  const std::string want =
      "plan: tensor 1: the job's gradient is not the plan's; got 't1' with 5 elements (the job's gradient 1), "
      "expected 't1' with 4 elements (the plan's model tiny)";
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(got[r].code(), StatusCode::kInvalidArgument) << r;
    EXPECT_EQ(got[r].message(), want) << r;
    EXPECT_EQ(got[r].reporter(), 0) << r;
    const Status later = sessions[r]->GradientReady(0);
    EXPECT_EQ(later.message(), "session failed earlier: " + want) << r;
    EXPECT_EQ(later.reporter(), 0) << r;
  }
}

// One rank's own problem (fewer gradients than the plan) is its own to report; the other rank,
// whose gradients passed, fails naming it instead of going on to a step.
TEST_F(SessionRegisterAll, StopsEveryRankWhenOneCannotRegister) {
  std::vector<std::vector<float>> a(2, std::vector<float>(4)), b(2, std::vector<float>(4));
  std::vector<Status> got(2);
  OnEveryRank(2, [&](int r) {
    const auto i = static_cast<size_t>(r);
    const GradientBuffer grads[] = {{"t0", a[i].data(), 4}, {"t1", b[i].data(), 4}};
    got[i] = sessions[i]->RegisterAll(std::span<const GradientBuffer>(grads, r == 1 ? 1 : 2));
  });
  EXPECT_EQ(got[1].message(),
            "plan: tensors: the job has fewer gradients than the plan; got 1, expected 2 (the plan's tensors from "
            "index 1 on are missing from the job; the plan's model tiny)");
  EXPECT_EQ(got[1].reporter(), 1);
  EXPECT_EQ(got[0].code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(got[0].message(),
            "plan: other ranks could not use their plan: rank 1 (plan); every rank stops (each of those ranks "
            "reports why)");
  EXPECT_EQ(got[0].reporter(), 0);
}

// Gradients that match: every rank registers them at once, and a step averages them.
TEST_F(SessionRegisterAll, RegistersEveryGradient) {
  std::vector<std::vector<float>> a(2, std::vector<float>(4)), b(2, std::vector<float>(4));
  OnEveryRank(2, [&](int r) {
    const auto i = static_cast<size_t>(r);
    const GradientBuffer grads[] = {{"t0", a[i].data(), 4}, {"t1", b[i].data(), 4}};
    std::fill(a[i].begin(), a[i].end(), static_cast<float>(r + 1));
    std::fill(b[i].begin(), b[i].end(), static_cast<float>(10 * (r + 1)));
    EXPECT_TRUE(sessions[i]->RegisterAll(grads).ok());
    EXPECT_EQ(sessions[i]->registered(), 2);
    EXPECT_TRUE(sessions[i]->GradientReady(0).ok());
    EXPECT_TRUE(sessions[i]->GradientReady(1).ok());
    EXPECT_TRUE(sessions[i]->Synchronize().ok());
  });
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(a[r], std::vector<float>(4, 1.5f)) << r;  // (1 + 2) / 2
    EXPECT_EQ(b[r], std::vector<float>(4, 15.0f)) << r;  // (10 + 20) / 2
  }
}

// ---------------------------------------------------------------- validation messages

TEST(SessionValidation, RejectsPlanForOtherWorldSizeCompressorAndModel) {
  const std::string path = TempPath("other.pb");
  ASSERT_TRUE(WritePlanFile(path, MakePlan(SmallModel("resnet"), testing::Planned(), "topk", 4)).ok());
  InProcessGroup group(2);
  SessionOptions options;
  options.compressor = "fp16";
  options.model_fingerprint = ModelFingerprint(SmallModel("tiny", {3, 4}));
  auto made = testing::CreateOnEveryRank(group, 2, [&](int, std::unique_ptr<comm::Communicator> c) {
    return Session::Create(path, std::move(c), options);
  });
  for (const auto& s : made) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.status().message(),
              path + ": world_size: does not match the job; got 4, expected 2 (ranks in the communicator)\n" + path +
                  ": compressor.name: does not match the job; got 'topk', expected 'fp16'\n" + path +
                  ": model.fingerprint: plan for another model; got " + ModelFingerprint(SmallModel()) +
                  " (model resnet), expected " + options.model_fingerprint + " (the job's model)");
    EXPECT_EQ(s.status().reporter(), 0);  // every rank found it alike: rank 0 prints it
  }
  std::filesystem::remove(path);
}

TEST(SessionValidation, RejectsMissingPlanFile) {
  InProcessGroup group(1);
  auto s = Session::Create(TempPath("absent.pb"), group.Rank(0));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
}

TEST(SessionValidation, RejectsPayloadThatDoesNotMatchTheCompressor) {
  pb::Plan plan = MakePlan(SmallModel(), testing::Planned(), "topk", 1);
  plan.mutable_groups(1)->set_payload_bytes(9);
  plan.mutable_groups(2)->mutable_options()->set_collective(pb::ALLREDUCE);
  InProcessGroup group(1);
  auto s = Session::Create(plan, group.Rank(0));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "plan: groups[1].payload_bytes: does not match the compressor; got 9, expected 256 (topk of 128 elements)\n"
            "plan: groups[2].options.collective: does not match the compressor; got allreduce, expected allgather "
            "(topk)");
}

TEST(SessionValidation, RejectsGradientOfOtherNameOrSize) {
  const pb::Plan plan = MakePlan(SmallModel(), testing::Planned(), "fp32", 1);
  InProcessGroup group(1);
  auto s = Session::Create(plan, group.Rank(0));
  ASSERT_TRUE(s.ok());
  std::vector<float> a(37), b(6);
  ASSERT_TRUE((*s)->Register("t0", a).ok());
  Status st = (*s)->Register("t1", b);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "plan: tensor 1: the job's gradient is not the plan's; got 't1' with 6 elements (the job's gradient 1), "
            "expected 't1' with 5 elements (the plan's model tiny)");
  EXPECT_EQ((*s)->GradientReady(0).message(),
            "GradientReady: gradients not all registered; got 1, expected 6 (model tiny)");
}

TEST(SessionValidation, RejectsMoreGradientsThanThePlanHas) {
  const pb::Model model = SmallModel("tiny", {4, 4});
  const pb::Plan plan = MakePlan(model, testing::OneGroup(model), "fp32", 1);
  InProcessGroup group(1);
  auto s = Session::Create(plan, group.Rank(0));
  ASSERT_TRUE(s.ok());
  std::vector<float> a(4);
  ASSERT_TRUE((*s)->Register("t0", a).ok());
  ASSERT_TRUE((*s)->Register("t1", a).ok());
  EXPECT_EQ((*s)->Register("t2", a).message(),
            "plan: tensors: the job has more gradients than the plan; got at least 3 (gradient 2 is 't2'), expected 2 "
            "(the plan's model tiny)");
}

TEST(SessionValidation, RejectsGradientReportedTwice) {
  const pb::Model model = SmallModel("tiny", {4, 4});
  const pb::Plan plan = MakePlan(model, testing::OneGroup(model), "fp32", 1);
  InProcessGroup group(1);
  auto s = Session::Create(plan, group.Rank(0));
  ASSERT_TRUE(s.ok());
  std::vector<float> a(4), b(4);
  ASSERT_TRUE((*s)->Register("t0", a).ok());
  ASSERT_TRUE((*s)->Register("t1", b).ok());
  ASSERT_TRUE((*s)->GradientReady(0).ok());
  EXPECT_EQ((*s)->GradientReady(0).message(),
            "GradientReady: tensor 0 ('t0') reported twice in one step; got a second call, expected one per step "
            "(iteration 0)");
  EXPECT_EQ((*s)->GradientReady(2).message(),
            "GradientReady: tensor index out of range; got 2, expected 0 <= i < 2 (model tiny)");
}

// ---------------------------------------------------------------- GPU paths without a GPU

// A communicator that claims device memory, so that a session takes its GPU path on a machine
// without a GPU; every collective fails.
class FakeDeviceCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& host() const override { return host_; }
  std::string library() const override { return "fake"; }
  MemoryKind memory() const override { return MemoryKind::kDevice; }
  Status Barrier() override { return UnavailableError("fake"); }
  Status Broadcast(void*, int64_t, int) override { return UnavailableError("fake"); }
  Status Allreduce(const void*, void*, int64_t, DataType, ReduceOp) override { return UnavailableError("fake"); }
  Status Allgather(const void*, void*, int64_t) override { return UnavailableError("fake"); }
  Status ReduceScatter(const void*, void*, int64_t, DataType, ReduceOp) override { return UnavailableError("fake"); }
  Status Alltoall(const void*, void*, int64_t) override { return UnavailableError("fake"); }
  Status Alltoallv(const void*, std::span<const int64_t>, void*, std::span<const int64_t>) override {
    return UnavailableError("fake");
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int, int) override { return UnavailableError("fake"); }
  void Abort(const std::string&) override {}

 private:
  std::string host_ = "fakehost";
};

bool HaveGpu() { return kernels::BackendAvailable(kernels::Backend::kCuda).ok(); }

TEST(NoGpu, NcclCommunicatorSaysNoCudaDeviceFoundOnEveryRank) {
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present; the no-GPU path cannot be reached here";
  if (!BuiltWithNccl()) {
    EXPECT_EQ(MakeNcclCommunicator(nullptr).status().message(),
              "NCCL communicator: this build has no NCCL; expected a build with the CUDA toolkit and NCCL found "
              "(CUPCAKE_WITH_NCCL=ON or AUTO)");
    return;
  }
  auto alone = MakeNcclCommunicator(nullptr);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), StatusCode::kFailedPrecondition);
  const std::string m = alone.status().message();
  EXPECT_EQ(m.rfind("NCCL communicator: no CUDA device found; got ", 0), 0u) << m;
  EXPECT_NE(m.find(" from cudaGetDeviceCount, expected >= 1 device (rank 0 on "), std::string::npos) << m;
  // Bootstrapped over a group of 2: both ranks fail (none waits in ncclCommInitRank).
  InProcessGroup group(2);
  std::vector<Status> results(2);
  OnEveryRank(2, [&](int r) {
    auto bootstrap = group.Rank(r);
    results[static_cast<size_t>(r)] = MakeNcclCommunicator(bootstrap.get()).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[static_cast<size_t>(r)].message().rfind("NCCL communicator: no CUDA device found; got ", 0), 0u);
    EXPECT_NE(results[static_cast<size_t>(r)].message().find("(rank " + std::to_string(r) + " on localhost)"),
              std::string::npos)
        << results[static_cast<size_t>(r)].message();
  }
}

TEST(NoGpu, GpuSessionSaysNoCudaDeviceFound) {
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present; the no-GPU path cannot be reached here";
  const pb::Model model = SmallModel("tiny", {4, 4});
  pb::Plan plan = MakePlan(model, testing::OneGroup(model), "fp32", 1);
  plan.set_device(pb::GPU);
  auto s = Session::Create(plan, std::make_unique<FakeDeviceCommunicator>());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  const std::string m = s.status().message();
  EXPECT_EQ(m.rfind(BuiltWithNccl() ? "Session: no CUDA device found; got " : "Session: this build has no CUDA", 0), 0u)
      << m;
  EXPECT_NE(m.find("(rank 0 on fakehost)"), std::string::npos) << m;
}

TEST(SessionValidation, RejectsCpuPlanOnADeviceCommunicator) {
  const pb::Model model = SmallModel("tiny", {4, 4});
  auto s =
      Session::Create(MakePlan(model, testing::OneGroup(model), "fp32", 1), std::make_unique<FakeDeviceCommunicator>());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "plan: device: does not match the communicator; got cpu, expected gpu (the communicator works on GPU "
            "memory)");
}

TEST(SessionValidation, RejectsDeviceMemoryOnAHostSession) {
  const pb::Model model = SmallModel("tiny", {4, 4});
  InProcessGroup group(1);
  auto s = Session::Create(MakePlan(model, testing::OneGroup(model), "fp32", 1), group.Rank(0));
  ASSERT_TRUE(s.ok());
  std::vector<float> a(4);
  EXPECT_EQ((*s)->RegisterDevice("t0", a.data(), 4).message(),
            "RegisterDevice: gradient 0 ('t0'): device memory for a session on host memory; expected Register (the "
            "communicator works on host memory)");
  EXPECT_EQ((*s)->RegisterDevice("t0", nullptr, 4).message(),
            "RegisterDevice: gradient 0 ('t0'): bad arguments; got numel 4, expected a device buffer and numel >= 0");
  EXPECT_EQ((*s)->registered(), 0);
}

}  // namespace
}  // namespace cupcake::runtime

namespace cupcake::runtime {
namespace {

// Options plans (docs/MODEL.md, v2): a group offloaded to the CPU is refused, naming the group,
// never run as something else; the same plan with every group on the plan's device runs.
TEST(Session, RefusesPlanOptionsItDoesNotExecute) {
  const pb::Model model = SmallModel("small", {8, 8, 8, 8, 8, 8});
  pb::Plan plan = testing::WithScheme(MakePlan(model, testing::Planned(), "efsignsgd", 1), "flat", 1);
  plan.set_device(pb::GPU);
  for (pb::Group& g : *plan.mutable_groups()) g.mutable_options()->set_device(pb::GPU);
  plan.mutable_groups(1)->mutable_options()->set_device(pb::CPU);
  ASSERT_TRUE(ValidatePlan(plan, "plan").ok()) << ValidatePlan(plan, "plan").ToString();
  auto s = Session::Create(plan, InProcessGroup(1).Rank(0));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "plan: groups[1].options.device: offload to the CPU is not executed by this runtime yet; got cpu, "
            "expected gpu (the plan's device; plan with --search-space fusion)");
  plan.mutable_groups(1)->mutable_options()->set_device(pb::GPU);
  EXPECT_TRUE(Session::Create(plan, InProcessGroup(1).Rank(0)).ok());
}

}  // namespace
}  // namespace cupcake::runtime

namespace cupcake::runtime {
namespace {

struct HierCase {
  std::string compressor;
  std::string scheme;
  testing::Layout layout;
};

void PrintTo(const HierCase& c, std::ostream* os) {
  *os << c.compressor << "/" << c.scheme << "/" << testing::LayoutName(c.layout);
}

class HierarchicalMatchesReference : public ::testing::TestWithParam<HierCase> {};

// Hierarchical schemes on host memory (docs/MODEL.md, v2): 4 ranks as 2 nodes of 2, over
// several iterations with error feedback; every rank ends with the restatement's result
// (runtime_test_util.h, HierarchicalReference), bit for bit.
TEST_P(HierarchicalMatchesReference, OnTwoNodesOfTwoRanks) {
  const HierCase c = GetParam();
  constexpr int kWorld = 4, kDevices = 2;
  const pb::Model model = SmallModel();
  const pb::Plan plan =
      testing::WithScheme(MakePlan(model, testing::Planned(), c.compressor, kWorld), c.scheme, kDevices);
  ASSERT_TRUE(ValidatePlan(plan, "plan").ok()) << ValidatePlan(plan, "plan").ToString();
  std::vector<Rank> ranks = MakeRanks(plan, kWorld, {}, c.layout);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  testing::HierarchicalReference reference(plan, kWorld, kDevices);
  for (int it = 0; it < 3; ++it) {
    const auto want = reference.Step(it);
    OnEveryRank(kWorld, [&](int r) {
      Rank& rank = ranks[static_cast<size_t>(r)];
      FillGradients(rank.grads, r, it);
      for (int i = 0; i < model.tensors_size(); ++i) EXPECT_TRUE(rank.session->GradientReady(i).ok());
      Status s = rank.session->Synchronize();
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
    for (int r = 0; r < kWorld; ++r)
      ASSERT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "")
          << "rank " << r << ", iteration " << it;
  }
}

INSTANTIATE_TEST_SUITE_P(Schemes, HierarchicalMatchesReference,
                         ::testing::Values(HierCase{"fp32", "hier_fp32", testing::Layout::kSeparate},
                                           HierCase{"efsignsgd", "hier_fp32", testing::Layout::kFlat},
                                           HierCase{"efsignsgd", "hier", testing::Layout::kSeparate},
                                           HierCase{"efsignsgd", "hier", testing::Layout::kFlat},
                                           HierCase{"topk", "hier", testing::Layout::kSeparate},
                                           HierCase{"randk", "hier", testing::Layout::kFlat},
                                           HierCase{"fp16", "hier", testing::Layout::kSeparate},
                                           HierCase{"topk", "hier_fp16", testing::Layout::kSeparate},
                                           HierCase{"onebit", "hier", testing::Layout::kFlat}));

// hier_fp32 sums exactly what a flat fp32 allreduce sums (small integers): the flat
// reference's means, bit for bit.
TEST(Session, HierarchicalFp32EqualsTheFlatAverage) {
  constexpr int kWorld = 4;
  const pb::Model model = SmallModel();
  const pb::Plan flat = MakePlan(model, testing::Planned(), "fp32", kWorld);
  const pb::Plan plan = testing::WithScheme(flat, "hier_fp32", 2);
  std::vector<Rank> ranks = MakeRanks(plan, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  testing::Reference reference(flat, kWorld);
  const auto want = reference.Step(0);
  OnEveryRank(kWorld, [&](int r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    FillGradients(rank.grads, r, 0);
    for (int i = 0; i < model.tensors_size(); ++i) EXPECT_TRUE(rank.session->GradientReady(i).ok());
    EXPECT_TRUE(rank.session->Synchronize().ok());
  });
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "");
}

}  // namespace
}  // namespace cupcake::runtime

namespace cupcake::runtime {
namespace {

// flat_fp16 groups of an efsignsgd plan run the fp16 codec: the means of an fp16 plan with the
// same groups (its reference), bit for bit.
TEST(Session, FlatFp16GroupsRunTheFp16Codec) {
  constexpr int kWorld = 2;
  const pb::Model model = SmallModel();
  const pb::Plan plan = testing::WithScheme(MakePlan(model, testing::Planned(), "efsignsgd", kWorld), "flat_fp16", 1);
  ASSERT_TRUE(ValidatePlan(plan, "plan").ok()) << ValidatePlan(plan, "plan").ToString();
  std::vector<Rank> ranks = MakeRanks(plan, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  testing::Reference reference(MakePlan(model, testing::Planned(), "fp16", kWorld), kWorld);
  for (int it = 0; it < 2; ++it) {
    const auto want = reference.Step(it);
    OnEveryRank(kWorld, [&](int r) {
      Rank& rank = ranks[static_cast<size_t>(r)];
      FillGradients(rank.grads, r, it);
      for (int i = 0; i < model.tensors_size(); ++i) EXPECT_TRUE(rank.session->GradientReady(i).ok());
      EXPECT_TRUE(rank.session->Synchronize().ok());
    });
    for (int r = 0; r < kWorld; ++r)
      ASSERT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "") << "rank " << r;
  }
}

}  // namespace
}  // namespace cupcake::runtime

namespace cupcake::runtime {
namespace {

struct ZenCase {
  std::string compressor;
  int world;
  testing::Layout layout;
};

void PrintTo(const ZenCase& c, std::ostream* os) {
  *os << c.compressor << "/w" << c.world << "/" << testing::LayoutName(c.layout);
}

class ZenMatchesFlat : public ::testing::TestWithParam<ZenCase> {};

// Zen groups (docs/ZEN.md) on host memory, each rank's gradients different: the allgather
// scheme's means bit for bit, that is the reference of the same plan without the scheme (every
// rank's payload encoded by the kernels, the values added into zeros in rank order, divided by
// W by the compressor's decode). Zen adds each index's values at its owner in sender rank order
// too, and divides the same sums by W, so the results agree exactly (the gradients are small
// integers besides: exact sums in any order). One difference is left: where an index's only
// values are -0, the allgather decode gives +0 (0 + -0) and Zen -0; top-k selects a zero only
// when fewer than k entries are non-zero, which these gradients never have. Over iterations with error feedback, with
// the timeline recorded: the collective between the encode and the decode of each group.
TEST_P(ZenMatchesFlat, BitForBitOverIterations) {
  const ZenCase c = GetParam();
  const pb::Model model = SmallModel();
  const pb::Plan flat = MakePlan(model, testing::Planned(), c.compressor, c.world);
  const pb::Plan plan = testing::WithScheme(flat, "zen", 1);
  ASSERT_TRUE(ValidatePlan(plan, "plan").ok()) << ValidatePlan(plan, "plan").ToString();
  CountingClock clock;
  SessionOptions options;
  options.clock = &clock;
  options.record_timeline = true;
  std::vector<Rank> ranks = MakeRanks(plan, c.world, options, c.layout);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(c.world));
  testing::Reference reference(flat, c.world);
  for (int it = 0; it < 3; ++it) {
    const auto want = reference.Step(it);
    OnEveryRank(c.world, [&](int r) {
      Rank& rank = ranks[static_cast<size_t>(r)];
      FillGradients(rank.grads, r, it);
      for (int i = 0; i < model.tensors_size(); ++i) EXPECT_TRUE(rank.session->GradientReady(i).ok());
      Status s = rank.session->Synchronize();
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
    for (int r = 0; r < c.world; ++r)
      ASSERT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "")
          << "rank " << r << ", iteration " << it;
  }
  // Each group's union, the same on every rank: at least its k pairs and the entries of its last
  // mean that are not zero, at most every rank's k pairs.
  auto first = ranks[0].session->Timeline();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  for (int r = 0; r < c.world; ++r) {
    auto timeline = ranks[static_cast<size_t>(r)].session->Timeline();
    ASSERT_TRUE(timeline.ok()) << timeline.status().ToString();
    ASSERT_EQ(timeline->size(), static_cast<size_t>(plan.groups_size()));
    for (int g = 0; g < plan.groups_size(); ++g) {
      const GroupTimeline& t = (*timeline)[static_cast<size_t>(g)];
      EXPECT_LT(t.encode_end_us, t.comm_start_us);
      EXPECT_LT(t.comm_start_us, t.comm_end_us);
      EXPECT_LT(t.comm_end_us, t.decode_start_us);
      const pb::Group& group = plan.groups(g);
      int64_t nonzero = 0;
      for (int i = group.first_tensor(); i <= group.last_tensor(); ++i)
        for (float v : ranks[0].grads[static_cast<size_t>(i)]) nonzero += v != 0.0f;
      const int64_t k = SelectedCount(group.numel(), plan.compressor().ratio());
      EXPECT_GE(t.zen_union, std::max(nonzero, k)) << "rank " << r << ", group " << g;
      EXPECT_LE(t.zen_union, c.world * k) << "rank " << r << ", group " << g;
      EXPECT_EQ(t.zen_union, (*first)[static_cast<size_t>(g)].zen_union) << "rank " << r << ", group " << g;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    SparseCompressors, ZenMatchesFlat,
    ::testing::Values(ZenCase{"topk", 2, testing::Layout::kSeparate}, ZenCase{"topk", 2, testing::Layout::kFlat},
                      ZenCase{"topk", 3, testing::Layout::kSeparate}, ZenCase{"topk", 3, testing::Layout::kFlat},
                      ZenCase{"topk", 4, testing::Layout::kSeparate}, ZenCase{"topk", 4, testing::Layout::kFlat},
                      ZenCase{"dgc", 3, testing::Layout::kSeparate}, ZenCase{"dgc", 4, testing::Layout::kFlat}));

// Zen for a compressor whose payload is not sparse pairs is refused on load, naming the field.
TEST(SessionValidation, RejectsZenForADenseCompressor) {
  const pb::Model model = SmallModel("tiny", {4, 4});
  const pb::Plan plan = testing::WithScheme(MakePlan(model, testing::OneGroup(model), "efsignsgd", 2), "zen", 1);
  InProcessGroup group(2);
  auto made = testing::CreateOnEveryRank(
      group, 2, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
  for (const auto& s : made) {
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().message(),
              "plan: groups[0].options.scheme: zen needs a compressor whose payload is sparse pairs; got efsignsgd, "
              "expected topk or dgc");
  }
}

// zen_sparse (naturally sparse gradients, docs/ZEN.md): each group's non-zero entries are summed
// by Zen, losslessly, whatever the plan's compressor (testing::SparseModel's gradients); the mean
// is exact. Separate and flat buffers, 2, 3 and 4 ranks, three iterations.
class ZenSparseIsExact : public ::testing::TestWithParam<std::tuple<int, testing::Layout>> {};

TEST_P(ZenSparseIsExact, MeanOfTheRanksNonzeros) {
  const auto [world, layout] = GetParam();
  const pb::Model model = testing::SparseModel();
  const pb::Plan plan = testing::WithScheme(MakePlan(model, testing::Planned(), "fp32", world), "zen_sparse", 1);
  ASSERT_TRUE(ValidatePlan(plan, "plan").ok()) << ValidatePlan(plan, "plan").ToString();
  // Group 1 is tensor 2 alone: 13 expected non-zeros (0.1 x 128), 8 bytes each.
  EXPECT_EQ(plan.groups(1).payload_bytes(), 8 * 13);
  std::vector<Rank> ranks = MakeRanks(plan, world, {}, layout);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(world));
  for (int it = 0; it < 3; ++it) {
    const std::vector<std::vector<float>> want = testing::SparseMean(model, world, it);
    OnEveryRank(world, [&](int r) {
      Rank& rank = ranks[static_cast<size_t>(r)];
      testing::FillSparseGradients(rank.grads, r, it);
      for (int i = 0; i < model.tensors_size(); ++i) EXPECT_TRUE(rank.session->GradientReady(i).ok());
      Status s = rank.session->Synchronize();
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
    for (int r = 0; r < world; ++r)
      ASSERT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "")
          << "rank " << r << ", iteration " << it;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ZenSparseIsExact,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(testing::Layout::kSeparate, testing::Layout::kFlat)));

// zen_sparse on GPU memory is refused on load, naming the group's scheme (host sessions only).
TEST(SessionValidation, RejectsZenSparseOnGpuMemory) {
  pb::Model model = SmallModel("tiny", {4, 4});
  model.mutable_tensors(0)->set_density(0.5);
  pb::Plan plan = testing::WithScheme(MakePlan(model, testing::OneGroup(model), "fp32", 1), "zen_sparse", 1);
  plan.set_device(pb::GPU);
  plan.mutable_groups(0)->mutable_options()->set_device(pb::GPU);
  auto s = Session::Create(plan, std::make_unique<FakeDeviceCommunicator>());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message(),
            "plan: groups[0].options.scheme: 'zen_sparse' runs on host memory only in this runtime; got a "
            "session on GPU memory (plan with --device cpu)");
}

// Zen groups in a session on GPU memory are accepted (runtime_gpu_test runs them, and
// hierarchical ones); without a device the session fails as any GPU session does, not with a
// refusal of the scheme.
TEST(NoGpu, ZenGroupOnGpuMemorySaysNoCudaDeviceFound) {
  if (HaveGpu()) GTEST_SKIP() << "a GPU is present; the no-GPU path cannot be reached here";
  const pb::Model model = SmallModel("tiny", {4, 4});
  pb::Plan plan = testing::WithScheme(MakePlan(model, testing::OneGroup(model), "topk", 1), "zen", 1);
  plan.set_device(pb::GPU);
  plan.mutable_groups(0)->mutable_options()->set_device(pb::GPU);
  auto s = Session::Create(plan, std::make_unique<FakeDeviceCommunicator>());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  const std::string m = s.status().message();
  EXPECT_EQ(m.rfind(BuiltWithNccl() ? "Session: no CUDA device found; got " : "Session: this build has no CUDA", 0), 0u)
      << m;
}

}  // namespace
}  // namespace cupcake::runtime

// Several plans in one session (Session::AddPlan, SwitchPlan) and its state (ReadState,
// WriteState), over the in-process communicator: the residual of element e carries from one plan
// to the next, PowerSGD's state is every plan's own, a switch is refused mid-step, a plan for another model is
// refused, and ranks that add or switch to different plans all fail.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/ladder_io.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using testing::OnEveryRank;

using testing::MakePlan;
using testing::SmallModel;
using Floats = std::vector<float>;

struct Rank {
  std::unique_ptr<Session> session;
  testing::Gradients grads;
};

std::vector<Rank> MakeRanks(comm::InProcessGroup& group, const pb::Plan& plan, int world) {
  auto made = testing::CreateOnEveryRank(
      group, world, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
  std::vector<Rank> ranks(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(made[static_cast<size_t>(r)].ok()) << made[static_cast<size_t>(r)].status().ToString();
    if (!made[static_cast<size_t>(r)].ok()) return {};
    ranks[static_cast<size_t>(r)].session = std::move(made[static_cast<size_t>(r)]).value();
    ranks[static_cast<size_t>(r)].grads = testing::Gradients(plan.model().model(), testing::Layout::kSeparate);
    EXPECT_TRUE(testing::RegisterAll(*ranks[static_cast<size_t>(r)].session, plan.model().model(),
                                     ranks[static_cast<size_t>(r)].grads)
                    .ok());
  }
  return ranks;
}

void Step(std::vector<Rank>& ranks, int it) {
  OnEveryRank(static_cast<int>(ranks.size()), [&](int r) {
    Rank& rank = ranks[static_cast<size_t>(r)];
    testing::FillGradients(rank.grads, r, it);
    for (int i = 0; i < static_cast<int>(rank.grads.size()); ++i) EXPECT_TRUE(rank.session->GradientReady(i).ok());
    Status s = rank.session->Synchronize();
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
}

// A plan of residual compressors restated with the kernels, per rank, keeping each rank's
// residual in model element order (so it can start from any residual): Encode on every rank,
// the payloads side by side (allgather) or summed (allreduce, small integers: exact), Decode.
class ResidualReference {
 public:
  ResidualReference(const pb::Plan& plan, int world, std::vector<Floats> residual)
      : plan_(plan), world_(world), residual_(std::move(residual)) {}

  std::vector<Floats> Step(int it) {
    const pb::Model& m = plan_.model().model();
    std::vector<Floats> out;
    int64_t at = 0;
    for (int k = 0; k < plan_.groups_size(); ++k) {
      const pb::Group& pg = plan_.groups(k);
      std::vector<std::vector<std::byte>> payloads;
      std::unique_ptr<kernels::Compressor> decoder;
      for (int r = 0; r < world_; ++r) {
        auto c = Make(k, r);
        Floats grad, state(residual_[static_cast<size_t>(r)].begin() + at,
                           residual_[static_cast<size_t>(r)].begin() + at + pg.numel());
        for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t)
          for (int64_t j = 0; j < m.tensors(t).numel(); ++j) grad.push_back(testing::TestGradient(r, it, t, j));
        std::vector<std::byte> payload(static_cast<size_t>(c->payload_bytes()));
        if (!c->Encode(grad, state, static_cast<uint64_t>(it), payload).ok()) std::abort();
        std::copy(state.begin(), state.end(), residual_[static_cast<size_t>(r)].begin() + at);
        payloads.push_back(std::move(payload));
        if (r == 0) decoder = std::move(c);
      }
      std::vector<std::byte> input;
      if (decoder->layout().allreduce) {
        input = kernels::reference::SumFloats(payloads);
      } else {
        for (const auto& p : payloads) input.insert(input.end(), p.begin(), p.end());
      }
      Floats mean(static_cast<size_t>(pg.numel()));
      if (!decoder->Decode(input, mean, static_cast<uint64_t>(it)).ok()) std::abort();
      int64_t in_group = 0;
      for (int t = pg.first_tensor(); t <= pg.last_tensor(); ++t) {
        const int64_t n = m.tensors(t).numel();
        out.emplace_back(mean.begin() + in_group, mean.begin() + in_group + n);
        in_group += n;
      }
      at += pg.numel();
    }
    return out;
  }
  const Floats& residual(int r) const { return residual_[static_cast<size_t>(r)]; }

 private:
  std::unique_ptr<kernels::Compressor> Make(int k, int r) const {
    const pb::CompressorSpec& spec = plan_.compressor();
    kernels::CompressorConfig c;
    c.name = spec.name();
    c.memory = spec.memory();
    c.n = plan_.groups(k).numel();
    c.world_size = world_;
    c.ratio = spec.ratio();
    c.seed = testing::ExpectedGroupSeed(spec.seed(), k, r, FindCompressor(c.name)->collective == pb::ALLREDUCE);
    return kernels::MakeCompressor(c, kernels::Backend::kCpu).value();
  }

  pb::Plan plan_;
  int world_;
  std::vector<Floats> residual_;
};

constexpr int kWorld = 2;
constexpr int64_t kElements = 37 + 5 + 128 + 1 + 64 + 200;

// Two steps on topk at 0.25 in the planned groups, a switch to topk at 0.1 layer by layer (other
// groups, other k), a third step there: every rank's residual after the switch is its residual
// before, element by element, and the third step is what the second plan gives from it.
TEST(SeveralPlans, ResidualsSurviveASwitchElementByElement) {
  const pb::Model model = SmallModel();
  const pb::Plan a = MakePlan(model, testing::Planned(), "topk", kWorld, 0.25);
  const pb::Plan b = MakePlan(model, testing::LayerWise(model), "topk", kWorld, 0.1);
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, a, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  ResidualReference ref_a(a, kWorld, std::vector<Floats>(kWorld, Floats(kElements, 0.0f)));
  for (int it = 0; it < 2; ++it) {
    const auto want = ref_a.Step(it);
    Step(ranks, it);
    for (int r = 0; r < kWorld; ++r) ASSERT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "");
  }
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    auto before = s.ReadState();
    ASSERT_TRUE(before.ok()) << before.status().ToString();
    EXPECT_EQ(testing::FirstDifference(std::vector<Floats>{*before}, {ref_a.residual(r)}), "") << "rank " << r;
    auto added = s.AddPlan(b, "b.pb");
    ASSERT_TRUE(added.ok()) << added.status().ToString();
    EXPECT_EQ(*added, 1);
    ASSERT_TRUE(s.SwitchPlan(1).ok());
    EXPECT_EQ(s.active_plan(), 1);
    EXPECT_EQ(s.group_count(), model.tensors_size());
    auto after = s.ReadState();
    ASSERT_TRUE(after.ok());
    EXPECT_EQ(testing::FirstDifference(std::vector<Floats>{*after}, {*before}), "") << "rank " << r;
  });
  std::vector<Floats> carried;
  for (int r = 0; r < kWorld; ++r) carried.push_back(ref_a.residual(r));
  ResidualReference ref_b(b, kWorld, carried);
  const auto want = ref_b.Step(2);
  Step(ranks, 2);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "") << "rank " << r;
    auto state = ranks[static_cast<size_t>(r)].session->ReadState();
    ASSERT_TRUE(state.ok());
    EXPECT_EQ(testing::FirstDifference(std::vector<Floats>{*state}, {ref_b.residual(r)}), "") << "rank " << r;
  }
}

// After a switch to an fp32 plan the step is exactly the average; switching back keeps working.
TEST(SeveralPlans, SwitchingToFp32AndBackSynchronizes) {
  const pb::Model model = SmallModel();
  const pb::Plan a = MakePlan(model, testing::Planned(), "topk", kWorld);
  const pb::Plan fp32 = MakePlan(model, testing::OneGroup(model), "fp32", kWorld);
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, a, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  OnEveryRank(kWorld, [&](int r) {
    ASSERT_TRUE(ranks[static_cast<size_t>(r)].session->AddPlan(fp32).ok());
    ASSERT_TRUE(ranks[static_cast<size_t>(r)].session->SwitchPlan(1).ok());
  });
  EXPECT_EQ(ranks[0].session->plan_count(), 2);
  Step(ranks, 0);
  for (int r = 0; r < kWorld; ++r)
    for (int t = 0; t < model.tensors_size(); ++t)
      for (size_t j = 0; j < ranks[static_cast<size_t>(r)].grads[static_cast<size_t>(t)].size(); ++j)
        ASSERT_EQ(ranks[static_cast<size_t>(r)].grads[static_cast<size_t>(t)][j],
                  (testing::TestGradient(0, 0, t, static_cast<int64_t>(j)) +
                   testing::TestGradient(1, 0, t, static_cast<int64_t>(j))) /
                      2.0f);
  OnEveryRank(kWorld, [&](int r) { ASSERT_TRUE(ranks[static_cast<size_t>(r)].session->SwitchPlan(0).ok()); });
  Step(ranks, 1);
  EXPECT_EQ(ranks[0].session->iteration(), 2u);
}

// A ladder file (cupcake-plan search --ratios) is a session of one plan per rung: the fp32 rung
// active first and exact, then any rung by SwitchPlan, equal to that plan's reference from a
// zero residual (the fp32 rung keeps none). A job expecting another compressor is refused.
TEST(SeveralPlans, ALadderFileGivesOnePlanPerRung) {
  const pb::Model model = SmallModel();
  pb::Ladder ladder;
  ladder.set_format("cupcake.ladder.v1");
  const double ratios[] = {1, 0.25, 0.1};
  for (double ratio : ratios) {
    pb::Rung* rung = ladder.add_rungs();
    rung->set_ratio(ratio);
    *rung->mutable_plan() = MakePlan(model, testing::Planned(), ratio == 1 ? "fp32" : "topk", kWorld, ratio);
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("cupcake_ladder_" + std::to_string(::getpid()) + ".pb"))
                               .string();
  ASSERT_TRUE(WriteLadderFile(path, ladder).ok());
  comm::InProcessGroup group(kWorld);
  auto made = testing::CreateOnEveryRank(
      group, kWorld, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(path, std::move(c)); });
  std::vector<Rank> ranks(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(made[static_cast<size_t>(r)].ok()) << made[static_cast<size_t>(r)].status().ToString();
    ranks[static_cast<size_t>(r)].session = std::move(made[static_cast<size_t>(r)]).value();
    ranks[static_cast<size_t>(r)].grads = testing::Gradients(model, testing::Layout::kSeparate);
    ASSERT_TRUE(testing::RegisterAll(*ranks[static_cast<size_t>(r)].session, model, ranks[static_cast<size_t>(r)].grads)
                    .ok());
  }
  EXPECT_EQ(ranks[0].session->plan_count(), 3);
  EXPECT_EQ(ranks[0].session->active_plan(), 0);
  Step(ranks, 0);
  const auto dense = testing::Reference(ladder.rungs(0).plan(), kWorld).Step(0);
  for (int r = 0; r < kWorld; ++r)
    EXPECT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, dense), "") << "rank " << r;
  OnEveryRank(kWorld, [&](int r) { ASSERT_TRUE(ranks[static_cast<size_t>(r)].session->SwitchPlan(2).ok()); });
  Step(ranks, 1);
  const auto compressed = testing::Reference(ladder.rungs(2).plan(), kWorld).Step(1);
  for (int r = 0; r < kWorld; ++r)
    EXPECT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, compressed), "") << "rank " << r;
  EXPECT_NE(testing::FirstDifference(ranks[0].grads, testing::Reference(ladder.rungs(0).plan(), kWorld).Step(1)), "")
      << "the topk rung at 0.1 sends less than the dense average";

  comm::InProcessGroup other(kWorld);
  auto refused = testing::CreateOnEveryRank(other, kWorld, [&](int, std::unique_ptr<comm::Communicator> c) {
    SessionOptions options;
    options.compressor = "dgc";
    return Session::Create(path, std::move(c), options);
  });
  for (const auto& s : refused)
    EXPECT_EQ(s.status().message(), path + ": rungs[1].plan.compressor.name: does not match the job; got 'topk', "
                                           "expected 'dgc'");
  std::filesystem::remove(path);
}

// The averaged gradients of rank r's buffers, copied.
std::vector<Floats> Copied(const testing::Gradients& grads) {
  std::vector<Floats> out;
  for (std::span<float> t : grads) out.emplace_back(t.begin(), t.end());
  return out;
}

// A ladder of PowerSGD ranks (cupcake-plan search --ranks) over the shaped model: the fp32 rung,
// rank 2 in the planned groups and rank 1 batched in one group (other groups, other matrices).
// 1. The fp32 rung, then rank 2 from a zero memory: what the PowerSGD restatement gives (the
//    rung trains as PowerSGD does), bitwise equal on both ranks.
// 2. Switches to rank 1 and back to rank 2: each step after a switch is bitwise what a fresh
//    session of that rung's plan gives when WriteState hands it the memory read before the
//    switch (error feedback carried element by element, Q restarted from its seeded draw; rank
//    2's own Q from steps 1-2 is not reused), and the memory carries element by element.
TEST(SeveralPlans, PowerSgdRanksAsRungs) {
  const pb::Model model = testing::ShapedModel();
  pb::Ladder ladder;
  ladder.set_format("cupcake.ladder.v1");
  const pb::Plan plans[] = {MakePlan(model, testing::Planned(), "fp32", kWorld),
                            testing::PowerSgdPlan(model, testing::Planned(), kWorld, "powersgd", 2),
                            testing::PowerSgdPlan(model, testing::OneGroup(model), kWorld, "powersgd_batched", 1)};
  // Hand sizes (docs/MODEL.md, "PowerSGD"), of 534 floats: rank 2 sends t0 16x12 as 32 + 24,
  // t2 8x9 as 16 + 18, t5 20x10 as 40 + 20 and t1, t3, t4 whole (5 + 1 + 64): 220 -> 0.412;
  // batched rank 1: side ceil(sqrt(534)) = 24, 24 + 24 -> 0.0899.
  const double ratios[] = {1, 0.412, 0.0899};
  for (int i = 0; i < 3; ++i) {
    pb::Rung* rung = ladder.add_rungs();
    rung->set_ratio(ratios[i]);
    *rung->mutable_plan() = plans[i];
  }
  ASSERT_TRUE(ValidateLadder(ladder, "ranks.pb").ok()) << ValidateLadder(ladder, "ranks.pb").ToString();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("cupcake_rank_ladder_" + std::to_string(::getpid()) + ".pb")).string();
  ASSERT_TRUE(WriteLadderFile(path, ladder).ok());
  comm::InProcessGroup group(kWorld);
  auto made = testing::CreateOnEveryRank(
      group, kWorld, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(path, std::move(c)); });
  std::filesystem::remove(path);
  std::vector<Rank> ranks(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(made[static_cast<size_t>(r)].ok()) << made[static_cast<size_t>(r)].status().ToString();
    ranks[static_cast<size_t>(r)].session = std::move(made[static_cast<size_t>(r)]).value();
    ranks[static_cast<size_t>(r)].grads = testing::Gradients(model, testing::Layout::kSeparate);
    ASSERT_TRUE(
        testing::RegisterAll(*ranks[static_cast<size_t>(r)].session, model, ranks[static_cast<size_t>(r)].grads).ok());
  }
  ASSERT_EQ(ranks[0].session->plan_count(), 3);
  EXPECT_TRUE(ranks[0].session->KeepsState(CompressorState::kErrorFeedback));
  auto switch_to = [&](int index) {
    OnEveryRank(kWorld, [&](int r) { ASSERT_TRUE(ranks[static_cast<size_t>(r)].session->SwitchPlan(index).ok()); });
  };
  auto same_on_every_rank = [&](int it) {
    for (int r = 1; r < kWorld; ++r)
      EXPECT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, Copied(ranks[0].grads)), "")
          << "rank " << r << " step " << it;
  };
  auto states = [&] {
    std::vector<Floats> out;
    for (Rank& rank : ranks) out.push_back(rank.session->ReadState().value());
    return out;
  };

  // 1.
  Step(ranks, 0);
  switch_to(1);
  testing::PowerSgdReference rank2(plans[1], kWorld);
  for (int it = 1; it <= 2; ++it) {
    const auto want = rank2.Step(it);
    Step(ranks, it);
    same_on_every_rank(it);
    EXPECT_EQ(testing::FirstFarFrom(ranks[0].grads, want), "") << "step " << it;
  }

  // 2. Rung 2 (rank 1) at step 3, rung 1 (rank 2) at step 4.
  int it = 3;
  for (int rung : {2, 1}) {
    const std::vector<Floats> before = states();
    bool memory = false;
    for (float v : before[0]) memory = memory || v != 0.0f;
    EXPECT_TRUE(memory) << "PowerSGD's error feedback reads as zero before step " << it;
    switch_to(rung);
    EXPECT_EQ(states(), before) << "the memory did not carry to rung " << rung;
    comm::InProcessGroup fresh_group(kWorld);
    std::vector<Rank> fresh = MakeRanks(fresh_group, plans[rung], kWorld);
    ASSERT_EQ(fresh.size(), static_cast<size_t>(kWorld));
    for (int r = 0; r < kWorld; ++r)
      ASSERT_TRUE(fresh[static_cast<size_t>(r)].session->WriteState(before[static_cast<size_t>(r)]).ok());
    Step(ranks, it);
    Step(fresh, it);
    same_on_every_rank(it);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(
          testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, Copied(fresh[static_cast<size_t>(r)].grads)),
          "")
          << "rung " << rung << " rank " << r << " step " << it;
      EXPECT_EQ(ranks[static_cast<size_t>(r)].session->ReadState().value(),
                fresh[static_cast<size_t>(r)].session->ReadState().value())
          << "rung " << rung << " rank " << r;
    }
    ++it;
  }
}

TEST(SeveralPlans, SwitchInTheMiddleOfAStepIsRefused) {
  const pb::Model model = SmallModel();
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, MakePlan(model, testing::Planned(), "topk", kWorld), kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  OnEveryRank(kWorld, [&](int r) {
    ASSERT_TRUE(
        ranks[static_cast<size_t>(r)].session->AddPlan(MakePlan(model, testing::Planned(), "topk", kWorld, 0.1)).ok());
  });
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    testing::FillGradients(ranks[static_cast<size_t>(r)].grads, r, 0);
    ASSERT_TRUE(s.GradientReady(0).ok());
    Status switched = s.SwitchPlan(1);
    EXPECT_EQ(switched.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(switched.message(),
              "SwitchPlan: called in the middle of a step; tensor 't0' is already ready, expected a call between "
              "Synchronize() and the next GradientReady");
    EXPECT_EQ(s.ReadState().status().code(), StatusCode::kFailedPrecondition);
    for (int i = 1; i < model.tensors_size(); ++i) ASSERT_TRUE(s.GradientReady(i).ok());
    EXPECT_TRUE(s.Synchronize().ok());  // the step goes on with the plan it started on
    EXPECT_EQ(s.active_plan(), 0);
  });
}

TEST(SeveralPlans, PlanForAnotherModelIsRefusedOnEveryRank) {
  const pb::Model model = SmallModel();
  const pb::Model other = SmallModel("other", {37, 5, 128, 1, 64, 201});
  const pb::Plan plan = MakePlan(model, testing::Planned(), "topk", kWorld);
  const pb::Plan foreign = MakePlan(other, testing::Planned(), "topk", kWorld);
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, plan, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  OnEveryRank(kWorld, [&](int r) {
    auto added = ranks[static_cast<size_t>(r)].session->AddPlan(foreign, "other.pb");
    ASSERT_FALSE(added.ok());
    EXPECT_EQ(added.status().message(), "other.pb: model.fingerprint: plan for another model; got " +
                                            foreign.model().fingerprint() + " (model other), expected " +
                                            plan.model().fingerprint() + " (the session's model tiny)");
    EXPECT_EQ(ranks[static_cast<size_t>(r)].session->plan_count(), 1);
  });
}

// Switching goes through the plan agreement: ranks naming different plans all fail, and stay on
// the plan they ran.
TEST(SeveralPlans, RanksSwitchingToDifferentPlansAllFail) {
  const pb::Model model = SmallModel();
  const pb::Plan a = MakePlan(model, testing::Planned(), "topk", kWorld);
  const pb::Plan b = MakePlan(model, testing::Planned(), "topk", kWorld, 0.1);
  const pb::Plan c = MakePlan(model, testing::Planned(), "topk", kWorld, 0.05);
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, a, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    ASSERT_TRUE(s.AddPlan(b, "b.pb").ok());
    ASSERT_TRUE(s.AddPlan(c, "c.pb").ok());
    Status switched = s.SwitchPlan(r == 0 ? 1 : 2);
    EXPECT_EQ(switched.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(switched.message(), std::string(r == 0 ? "b.pb" : "c.pb") +
                                      ": the ranks run different plans; expected one plan on every rank:\n"
                                      "  rank 0: plan " +
                                      PlanFingerprint(b) + " (b.pb)\n  rank 1: plan " + PlanFingerprint(c) + " (c.pb)");
    EXPECT_EQ(s.active_plan(), 0);
  });
  Step(ranks, 0);
}

TEST(SeveralPlans, AddingDifferentPlansFailsEveryRank) {
  const pb::Model model = SmallModel();
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, MakePlan(model, testing::Planned(), "topk", kWorld), kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  OnEveryRank(kWorld, [&](int r) {
    const pb::Plan mine = MakePlan(model, testing::Planned(), "topk", kWorld, r == 0 ? 0.1 : 0.2);
    auto added = ranks[static_cast<size_t>(r)].session->AddPlan(mine, "p" + std::to_string(r) + ".pb");
    ASSERT_FALSE(added.ok());
    EXPECT_NE(added.status().message().find("the ranks run different plans"), std::string::npos);
    EXPECT_EQ(ranks[static_cast<size_t>(r)].session->plan_count(), 1);
  });
}

// Checkpoints: what WriteState writes ReadState reads, and the next step encodes from it (the
// reference started from the same residual); a vector of the wrong size is refused.
TEST(SessionState, WrittenResidualIsReadBackAndUsedByTheNextStep) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::Planned(), "topk", kWorld);
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, plan, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  std::vector<Floats> written(kWorld, Floats(kElements));
  for (int r = 0; r < kWorld; ++r)
    for (int64_t e = 0; e < kElements; ++e)
      written[static_cast<size_t>(r)][static_cast<size_t>(e)] = static_cast<float>((e * 5 + r) % 7 - 3);
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    ASSERT_TRUE(s.WriteState(written[static_cast<size_t>(r)]).ok());
    auto read = s.ReadState();
    ASSERT_TRUE(read.ok());
    EXPECT_EQ(*read, written[static_cast<size_t>(r)]);
    auto momentum = s.ReadState(CompressorState::kMomentum);  // topk keeps none: zeros
    ASSERT_TRUE(momentum.ok());
    EXPECT_EQ(*momentum, Floats(kElements, 0.0f));
    Floats into(kElements, 9.0f);  // read into the caller's buffer: the same values
    ASSERT_TRUE(s.ReadState(std::span<float>(into)).ok());
    EXPECT_EQ(into, written[static_cast<size_t>(r)]);
    Floats short_buffer(3);
    EXPECT_EQ(s.ReadState(std::span<float>(short_buffer)).message(),
              "ReadState: wrong size; got 3 floats, expected 435 (elements of model tiny)");
    Status wrong = s.WriteState(Floats(3));
    EXPECT_EQ(wrong.message(), "WriteState: wrong size; got 3 floats, expected 435 (elements of model tiny)");
    EXPECT_FALSE(s.KeepsState(CompressorState::kPowerSgdPadding));  // no PowerSGD group: nothing
    EXPECT_EQ(s.ReadState(CompressorState::kPowerSgdQ).value(), Floats());
  });
  ResidualReference reference(plan, kWorld, written);
  const auto want = reference.Step(0);
  Step(ranks, 0);
  for (int r = 0; r < kWorld; ++r)
    ASSERT_EQ(testing::FirstDifference(ranks[static_cast<size_t>(r)].grads, want), "") << "rank " << r;
}

// A plan whose middle group is sent uncompressed (fp32, no memory): ReadState gives the written
// residuals of the compressed groups' elements and zeros for that group's, also into a buffer
// that held other values.
TEST(SessionState, ElementsNoGroupKeepsReadAsZeros) {
  const pb::Model model = SmallModel();
  pb::Plan plan = MakePlan(model, testing::Planned(), "topk", kWorld);
  pb::Group* fp32 = plan.mutable_groups(1);  // tensor 2: elements 42..169
  fp32->mutable_options()->set_compress(false);
  fp32->mutable_options()->set_collective(pb::ALLREDUCE);
  fp32->set_payload_bytes(4 * fp32->numel());
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, plan, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    Floats written(kElements), want(kElements);
    for (int64_t e = 0; e < kElements; ++e) {
      written[static_cast<size_t>(e)] = static_cast<float>(e % 5 + r + 1);
      want[static_cast<size_t>(e)] = e >= 42 && e < 170 ? 0.0f : written[static_cast<size_t>(e)];
    }
    ASSERT_TRUE(s.WriteState(written).ok());
    Floats into(kElements, 9.0f);
    ASSERT_TRUE(s.ReadState(std::span<float>(into)).ok());
    EXPECT_EQ(into, want) << "rank " << r;
  });
}

// BeginStateRead: the reader gives the state of the call even while the next step runs, and
// that step cannot encode (so cannot finish) before the reader has copied its groups; the step
// then changes the state it read.
TEST(SessionState, DeferredReadGivesTheCallsStateAndHoldsBackTheNextStep) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::Planned(), "topk", kWorld);
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, plan, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  Step(ranks, 0);
  std::vector<Floats> want(kWorld), read(kWorld, Floats(kElements, 9.0f));
  std::vector<std::unique_ptr<StateReader>> readers(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    want[static_cast<size_t>(r)] = s.ReadState().value();
    auto reader = s.BeginStateRead({{CompressorState::kErrorFeedback, read[static_cast<size_t>(r)]}});
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    readers[static_cast<size_t>(r)] = std::move(reader).value();
  }
  ASSERT_NE(want[0], Floats(kElements, 0.0f));  // topk left residuals after step 0
  std::atomic<bool> stepped{false};
  std::thread next([&] {
    Step(ranks, 1);
    stepped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(stepped.load()) << "the next step finished before the reader copied the state";
  for (auto& reader : readers) EXPECT_TRUE(reader->Run().ok());
  next.join();
  EXPECT_TRUE(stepped.load());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(read[static_cast<size_t>(r)], want[static_cast<size_t>(r)]) << "rank " << r;
    EXPECT_NE(ranks[static_cast<size_t>(r)].session->ReadState().value(), want[static_cast<size_t>(r)]) << "rank " << r;
  }
  EXPECT_EQ(readers[0]->Run().message(), "StateReader::Run: called twice; expected one Run per BeginStateRead");
}

// While a read is pending WriteState waits; a reader destroyed unrun releases it and reads
// nothing. Targets that are not per element, or of the wrong size, are refused.
TEST(SessionState, PendingReadHoldsBackWriteStateUntilTheReaderGoes) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::Planned(), "topk", 1);
  comm::InProcessGroup group(1);
  std::vector<Rank> ranks = MakeRanks(group, plan, 1);
  ASSERT_EQ(ranks.size(), 1u);
  Session& s = *ranks[0].session;
  Floats into(kElements, 9.0f), written(kElements, 2.0f);
  auto reader = s.BeginStateRead({{CompressorState::kErrorFeedback, into}});
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::atomic<bool> wrote{false};
  std::thread writer([&] {
    EXPECT_TRUE(s.WriteState(written).ok());
    wrote = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(wrote.load()) << "WriteState did not wait for the pending read";
  reader->reset();
  writer.join();
  EXPECT_EQ(into, Floats(kElements, 9.0f));
  EXPECT_EQ(s.ReadState().value(), written);
  Floats short_buffer(3);
  EXPECT_EQ(s.BeginStateRead({{CompressorState::kErrorFeedback, short_buffer}}).status().message(),
            "BeginStateRead: wrong size; got 3 floats, expected 435 (elements of model tiny)");
  EXPECT_EQ(
      s.BeginStateRead({{CompressorState::kMomentum, into}, {CompressorState::kPowerSgdQ, into}}).status().message(),
      "BeginStateRead: targets[1].which: not per element; expected kErrorFeedback or kMomentum");
}

// PowerSGD's state (kernels/powersgd.h, the runner's own) is every plan's, in plan order, and
// holds what the per-element plane does not. A per-tensor plan (ShapedModel at rank 2): its
// memory is its 534 elements', all in kErrorFeedback, so no padding; Q 12 x 2 + 9 x 2 + 10 x 2 =
// 62 floats. A batched one added: its groups of 197, 72 and 265 elements padded to squares of
// 15^2, 9^2 and 17^2 floats, 28 + 9 + 24 = 61 of padding; Q 15 x 2 + 9 x 2 + 17 x 2 = 82. After
// two steps of the batched plan its Q (the allreduced sum / W) is bitwise the same on every rank,
// and so is its padding, not zero: the gradient adds nothing there, so each step subtracts the
// same approximation P Q^T on every rank (checkpoints keep both kShared). What WriteState writes
// ReadState reads; a vector of the wrong size is refused.
TEST(SessionState, PowerSgdStateIsEveryPlansAndItsQIsTheSameOnEveryRank) {
  const pb::Model model = testing::ShapedModel();
  const pb::Plan a = testing::PowerSgdPlan(model, testing::Planned(), kWorld, "powersgd");
  const pb::Plan b = testing::PowerSgdPlan(model, testing::Planned(), kWorld, "powersgd_batched");
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, a, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    EXPECT_FALSE(s.KeepsState(CompressorState::kPowerSgdPadding));  // per tensor: no padding
    EXPECT_EQ(s.ReadState(CompressorState::kPowerSgdPadding).value(), Floats());
    ASSERT_TRUE(s.AddPlan(b).ok());
    ASSERT_TRUE(s.SwitchPlan(1).ok());
  });
  Step(ranks, 0);
  Step(ranks, 1);
  std::vector<Floats> padding(kWorld), q(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    EXPECT_TRUE(s.KeepsState(CompressorState::kPowerSgdPadding));
    EXPECT_TRUE(s.KeepsState(CompressorState::kPowerSgdQ));
    EXPECT_TRUE(s.KeepsState(CompressorState::kErrorFeedback));  // e over the groups' elements, carried by switches
    EXPECT_NE(s.ReadState(CompressorState::kErrorFeedback).value(), Floats(534, 0.0f));
    padding[static_cast<size_t>(r)] = s.ReadState(CompressorState::kPowerSgdPadding).value();
    q[static_cast<size_t>(r)] = s.ReadState(CompressorState::kPowerSgdQ).value();
  });
  ASSERT_EQ(padding[0].size(), 61u);
  ASSERT_EQ(q[0].size(), 62u + 82u);
  EXPECT_EQ(q[0], q[1]);
  EXPECT_EQ(padding[0], padding[1]);
  EXPECT_NE(padding[0], Floats(61, 0.0f));
  EXPECT_NE(Floats(q[0].begin() + 62, q[0].end()), Floats(82, 0.0f));
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    Floats written(padding[static_cast<size_t>(r)].size());
    for (size_t i = 0; i < written.size(); ++i)
      written[i] = static_cast<float>((i * 5 + static_cast<size_t>(r)) % 7) - 3;
    ASSERT_TRUE(s.WriteState(written, CompressorState::kPowerSgdPadding).ok());
    EXPECT_EQ(s.ReadState(CompressorState::kPowerSgdPadding).value(), written);
    EXPECT_EQ(s.ReadState(CompressorState::kPowerSgdQ).value(), q[static_cast<size_t>(r)]);
    EXPECT_EQ(s.WriteState(Floats(3), CompressorState::kPowerSgdQ).message(),
              "WriteState: wrong size; got 3 floats, expected 144 (PowerSGD's state of model shaped)");
  });
}

// Momentum is per element too: dgc's u carries across a switch to dgc at another ratio and
// other groups, element by element, as the residual does.
TEST(SeveralPlans, MomentumCarriesAcrossASwitch) {
  const pb::Model model = SmallModel();
  const pb::Plan a = MakePlan(model, testing::Planned(), "dgc", kWorld, 0.25);
  const pb::Plan b = MakePlan(model, testing::LayerWise(model), "dgc", kWorld, 0.1);
  comm::InProcessGroup group(kWorld);
  std::vector<Rank> ranks = MakeRanks(group, a, kWorld);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kWorld));
  Step(ranks, 0);
  Step(ranks, 1);
  OnEveryRank(kWorld, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    auto momentum = s.ReadState(CompressorState::kMomentum);
    auto residual = s.ReadState(CompressorState::kErrorFeedback);
    ASSERT_TRUE(momentum.ok() && residual.ok());
    EXPECT_NE(*momentum, Floats(kElements, 0.0f));
    EXPECT_NE(*momentum, *residual);
    ASSERT_TRUE(s.AddPlan(b).ok());
    ASSERT_TRUE(s.SwitchPlan(1).ok());
    EXPECT_EQ(*s.ReadState(CompressorState::kMomentum), *momentum) << "rank " << r;
    EXPECT_EQ(*s.ReadState(CompressorState::kErrorFeedback), *residual) << "rank " << r;
  });
  Step(ranks, 2);
}

// Hierarchical groups keep state for this rank's shard of the node's sum: on 2 nodes of 2,
// local rank l holds elements l * shard .. (l + 1) * shard - 1 of each group (shards of 21,
// 64 and 133 for groups of 42, 128 and 265); the rest reads as zero and is not written.
TEST(SessionState, HierarchicalGroupsHoldTheirShardOnly) {
  constexpr int kRanks = 4;
  const pb::Model model = SmallModel();
  const pb::Plan plan = testing::WithScheme(MakePlan(model, testing::Planned(), "efsignsgd", kRanks), "hier", 2);
  comm::InProcessGroup group(kRanks);
  std::vector<Rank> ranks = MakeRanks(group, plan, kRanks);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(kRanks));
  const int64_t offsets[] = {0, 42, 170}, numels[] = {42, 128, 265}, shards[] = {21, 64, 133};
  OnEveryRank(kRanks, [&](int r) {
    Session& s = *ranks[static_cast<size_t>(r)].session;
    const Floats ones(kElements, 1.0f);
    ASSERT_TRUE(s.WriteState(ones).ok());
    auto read = s.ReadState();
    ASSERT_TRUE(read.ok());
    const int64_t local = r % 2;
    for (int k = 0; k < 3; ++k)
      for (int64_t e = 0; e < numels[k]; ++e) {
        const bool mine = e >= local * shards[k] && e < (local + 1) * shards[k];
        ASSERT_EQ((*read)[static_cast<size_t>(offsets[k] + e)], mine ? 1.0f : 0.0f)
            << "rank " << r << ", group " << k << ", element " << e;
      }
  });
}

}  // namespace
}  // namespace cupcake::runtime

// Ladder files: written and read back, a single plan read as a ladder of one rung, ReadPlanFile
// refusing a ladder by name, and each structural check's message.
#include "cupcake/proto/ladder_io.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <utility>
#include <vector>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/plan_io.h"
#include "tiny_plan.h"

namespace cupcake {
namespace {

// TinyPlan (topk at 0.01 on gpu) at another ratio, or as fp32 when ratio is 0.
pb::Plan TinyPlanAt(double ratio) {
  pb::Plan plan = TinyPlan();
  const bool dense = ratio == 0;
  const CompressorInfo& info = *FindCompressor(dense ? "fp32" : "topk");
  plan.mutable_compressor()->set_name(std::string(info.name));
  plan.mutable_compressor()->set_ratio(ratio);
  plan.mutable_compressor()->set_memory(dense ? "none" : "residual");
  for (pb::Group& g : *plan.mutable_groups()) {
    g.mutable_options()->set_collective(info.collective);
    g.set_payload_bytes(PayloadBytes(info, g.numel(), ratio));
  }
  return plan;
}

pb::Ladder TinyLadder() {
  pb::Ladder ladder;
  ladder.set_format("cupcake.ladder.v1");
  for (double ratio : {0.0, 0.1, 0.01}) {
    pb::Rung* r = ladder.add_rungs();
    r->set_ratio(ratio == 0 ? 1 : ratio);
    *r->mutable_plan() = TinyPlanAt(ratio);
  }
  return ladder;
}

// TinyPlan as a PowerSGD rung: fp32 at `rank`, both groups on the powersgd scheme, the tensors
// shaped fc.bias [10], fc.weight [10, 100], conv1.weight [5, 100].
pb::Plan TinyPowerSgdPlan(int rank) {
  pb::Plan plan = TinyPlanAt(0);
  pb::Model* m = plan.mutable_model()->mutable_model();
  const std::vector<std::vector<int64_t>> shapes = {{10}, {10, 100}, {5, 100}};
  for (int t = 0; t < 3; ++t)
    for (int64_t d : shapes[static_cast<size_t>(t)]) m->mutable_tensors(t)->add_shape(d);
  plan.mutable_model()->set_fingerprint(ModelFingerprint(*m));
  plan.mutable_compressor()->set_rank(rank);
  plan.set_devices_per_node(1);
  for (pb::Group& g : *plan.mutable_groups()) {
    const LowRankSizes sizes = PowerSgdGroupSizes(*m, g.first_tensor(), g.last_tensor(), rank, false);
    ApplyScheme(*FindScheme("powersgd"), *FindCompressor("fp32"), pb::GPU, 0, 0, {8, 1}, g, &sizes);
    for (pb::Step& st : *g.mutable_steps()) {
      st.set_start_us(g.comm_start_us());
      st.set_end_us(g.comm_start_us());
    }
  }
  return plan;
}

// The fp32 rung and PowerSGD rungs at `ranks` with the given ratios.
pb::Ladder TinyRankLadder(std::vector<std::pair<int, double>> ranks) {
  pb::Ladder ladder;
  ladder.set_format("cupcake.ladder.v1");
  pb::Rung* dense = ladder.add_rungs();
  dense->set_ratio(1);
  *dense->mutable_plan() = TinyPlanAt(0);
  *dense->mutable_plan()->mutable_model() = TinyPowerSgdPlan(1).model();
  for (auto [rank, ratio] : ranks) {
    pb::Rung* r = ladder.add_rungs();
    r->set_ratio(ratio);
    *r->mutable_plan() = TinyPowerSgdPlan(rank);
  }
  return ladder;
}

std::string Message(const pb::Ladder& ladder) {
  Status s = ValidateLadder(ladder, "l.pb");
  return s.ok() ? "OK" : s.message();
}

class LadderIoTest : public ::testing::Test {
 protected:
  LadderIoTest() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cupcake-ladder-io-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
  }
  ~LadderIoTest() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(LadderIoTest, WriteThenReadGivesTheSameLadderAndAPlanReadsAsOneRung) {
  const pb::Ladder ladder = TinyLadder();
  ASSERT_EQ(Message(ladder), "OK");
  const std::string path = dir_ + "/l.pb";
  ASSERT_TRUE(WriteLadderFile(path, ladder).ok());
  auto back = ReadPlansFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->single);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(ladder, back->ladder));

  const std::string plan_path = dir_ + "/p.pb";
  ASSERT_TRUE(WritePlanFile(plan_path, TinyPlanAt(0.01)).ok());
  auto single = ReadPlansFile(plan_path);
  ASSERT_TRUE(single.ok()) << single.status().ToString();
  EXPECT_TRUE(single->single);
  ASSERT_EQ(single->ladder.rungs_size(), 1);
  EXPECT_EQ(single->ladder.rungs(0).ratio(), 0.01);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(single->ladder.rungs(0).plan(), TinyPlanAt(0.01)));

  EXPECT_EQ(ReadPlanFile(path).status().message(),
            path +
                ": a ladder of plans (cupcake.ladder.v1); expected a single plan here (cupcake-plan show lists the "
                "rungs; simulate and trace take --rung RATIO)");
}

TEST_F(LadderIoTest, FindsARungByItsRatioOrNamesThemAll) {
  const pb::Ladder ladder = TinyLadder();
  auto rung = FindRung(ladder, 0.1, "l.pb");
  ASSERT_TRUE(rung.ok());
  EXPECT_EQ((*rung)->plan().compressor().ratio(), 0.1);
  EXPECT_EQ((*FindRung(ladder, 1, "l.pb"))->plan().compressor().name(), "fp32");
  EXPECT_EQ(FindRung(ladder, 0.05, "l.pb").status().message(),
            "l.pb: --rung: no rung of ratio 0.05; expected one of 1 (fp32), 0.1, 0.01");
}

TEST(ValidateLadder, NamesEachProblem) {
  pb::Ladder few = TinyLadder();
  few.mutable_rungs()->RemoveLast();
  few.mutable_rungs()->RemoveLast();
  EXPECT_EQ(Message(few), "l.pb: rungs: too few; got 1, expected the fp32 rung and at least one ratio");

  pb::Ladder format = TinyLadder();
  format.set_format("cupcake.ladder.v0");
  EXPECT_EQ(Message(format), "l.pb: format: unsupported; got \"cupcake.ladder.v0\", expected \"cupcake.ladder.v1\"");

  pb::Ladder invalid = TinyLadder();
  invalid.mutable_rungs(1)->mutable_plan()->set_world_size(0);
  EXPECT_EQ(Message(invalid), "l.pb: rungs[1].plan: world_size: out of range; got 0, expected 1 <= x <= 1048576");

  pb::Ladder bottom = TinyLadder();
  *bottom.mutable_rungs(0)->mutable_plan() = TinyPlanAt(0.5);
  bottom.mutable_rungs(0)->set_ratio(0.5);
  EXPECT_EQ(Message(bottom),
            "l.pb: rungs[0].plan.compressor.name: not the dense rung; got \"topk\", expected \"fp32\"\n"
            "l.pb: rungs[0].ratio: not the dense rung; got 0.5, expected 1");

  pb::Ladder order = TinyLadder();
  order.mutable_rungs(2)->set_ratio(0.2);
  order.mutable_rungs(2)->mutable_plan()->mutable_compressor()->set_ratio(0.2);
  for (pb::Group& g : *order.mutable_rungs(2)->mutable_plan()->mutable_groups())
    g.set_payload_bytes(PayloadBytes(*FindCompressor("topk"), g.numel(), 0.2));
  EXPECT_EQ(Message(order), "l.pb: rungs[2].ratio: not below the rung before; got 0.2, expected < 0.1");

  pb::Ladder mismatch = TinyLadder();
  pb::Plan& p = *mismatch.mutable_rungs(2)->mutable_plan();
  p.set_profile_fingerprint("fedcba9876543210");
  p.set_world_size(4);
  p.set_device(pb::CPU);
  for (pb::Group& g : *p.mutable_groups()) g.mutable_options()->set_device(pb::CPU);
  mismatch.mutable_rungs(2)->set_ratio(0.02);
  EXPECT_EQ(Message(mismatch),
            "l.pb: rungs[2].plan.profile_fingerprint: another profile; got fedcba9876543210, expected "
            "0123456789abcdef as in rungs[0]\n"
            "l.pb: rungs[2].plan.world_size: another world; got 4, expected 8 as in rungs[0]\n"
            "l.pb: rungs[2].plan.device: another device; got cpu, expected gpu as in rungs[0]\n"
            "l.pb: rungs[2].plan.compressor.ratio: not the rung's ratio; got 0.01, expected 0.02");

  pb::Ladder model = TinyLadder();
  pb::Model* m = model.mutable_rungs(1)->mutable_plan()->mutable_model()->mutable_model();
  m->mutable_tensors(0)->set_name("other");
  model.mutable_rungs(1)->mutable_plan()->mutable_model()->set_fingerprint(ModelFingerprint(*m));
  EXPECT_EQ(Message(model), "l.pb: rungs[1].plan.model.fingerprint: another model; got " + ModelFingerprint(*m) +
                                ", expected " + ModelFingerprint(TinyPlanAt(0).model().model()) + " as in rungs[0]");
}

// PowerSGD rungs' ratios by hand, of the 1510 dense floats (the rule: a d0 x c matrix at rank
// r = min(d0, c, rank) is compressed when (d0 + c) r 2 < d0 c, sending d0 r + c r floats):
//   rank 4: fc.bias 10 whole, fc.weight 40 + 400, conv1.weight whole (840 >= 500): 950 -> 0.629
//   rank 2: 10, 20 + 200, 10 + 200: 440 -> 0.291
TEST(ValidateLadder, PowerSgdRungsCarryTheShareOfTheBytesTheySend) {
  const pb::Ladder ladder = TinyRankLadder({{4, 0.629}, {2, 0.291}});
  EXPECT_EQ(Message(ladder), "OK");
  EXPECT_EQ(PowerSgdRungRatio(ladder.rungs(1).plan()), 0.629);
  EXPECT_EQ(SentBytes(ladder.rungs(2).plan()), 4 * 440);
  EXPECT_EQ(RungRatios(ladder), "1 (fp32), 0.629 (rank 4), 0.291 (rank 2)");
  EXPECT_EQ((*FindRung(ladder, 0.291, "l.pb"))->plan().compressor().rank(), 2);

  EXPECT_EQ(Message(TinyRankLadder({{4, 0.629}, {2, 0.3}})),
            "l.pb: rungs[2].ratio: not the share of the dense gradient's bytes the plan sends; got 0.3, expected "
            "0.291");
  EXPECT_EQ(Message(TinyRankLadder({{2, 0.291}, {4, 0.629}})),
            "l.pb: rungs[2].plan.compressor.rank: not below the rung before; got 4, expected < 2\n"
            "l.pb: rungs[2].ratio: not below the rung before; got 0.629, expected < 0.291");
  pb::Ladder mixed = TinyRankLadder({{4, 0.629}});
  pb::Rung* topk = mixed.add_rungs();
  topk->set_ratio(0.01);
  *topk->mutable_plan() = TinyPlanAt(0.01);
  *topk->mutable_plan()->mutable_model() = mixed.rungs(1).plan().model();
  EXPECT_EQ(Message(mixed),
            "l.pb: rungs[2].plan.compressor: not a PowerSGD rung; got \"topk\" at rank 0, expected fp32 with a "
            "PowerSGD rank as in rungs[1]");
}

TEST_F(LadderIoTest, RefusesATruncatedLadder) {
  const std::string path = dir_ + "/l.pb";
  const std::string bytes = SerializeDeterministic(TinyLadder());
  for (size_t cut : {bytes.size() / 2, bytes.size() - 1}) {
    auto parsed = ParsePlans(std::string_view(bytes).substr(0, cut), "l.pb");
    EXPECT_FALSE(parsed.ok()) << cut;
  }
}

}  // namespace
}  // namespace cupcake

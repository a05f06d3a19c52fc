#include "cupcake/planner/cost_model.h"

#include <optional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_problems.h"

namespace cupcake::planner {
namespace {

using testing::MakeCurve;
using ::testing::HasSubstr;

// Three tensors, constant curves, so every number below can be checked by hand.
pb::Profile HandProfile() {
  pb::Profile p;
  p.mutable_cluster()->set_name("hand");
  p.mutable_cluster()->set_nodes(2);
  p.mutable_cluster()->set_devices_per_node(2);
  pb::Curve ag = MakeCurve(pb::COMM, {{1, 100}});
  ag.set_comm_op(pb::ALLGATHER);
  ag.set_scope(pb::GLOBAL);
  *p.add_curves() = ag;
  pb::Curve ar = MakeCurve(pb::COMM, {{1, 50}});
  ar.set_comm_op(pb::ALLREDUCE);
  ar.set_scope(pb::GLOBAL);
  *p.add_curves() = ar;
  pb::Curve enc = MakeCurve(pb::ENCODE, {{1, 10}});
  enc.set_compressor("signsgd");
  enc.set_device(pb::GPU);
  *p.add_curves() = enc;
  pb::Curve dec = MakeCurve(pb::DECODE, {{1, 20}});
  dec.set_compressor("signsgd");
  dec.set_device(pb::GPU);
  *p.add_curves() = dec;
  pb::Curve pack = MakeCurve(pb::COPY, {{1, 1}});
  pack.set_copy_op(pb::PACK);
  pack.set_device(pb::GPU);
  *p.add_curves() = pack;
  return p;
}

pb::Model HandModel() {
  pb::Model m;
  m.set_name("hand");
  m.set_forward_us(1000);
  m.set_update_us(7);
  for (int i = 0; i < 3; ++i) {
    auto* t = m.add_tensors();
    t->set_name("t" + std::to_string(i));
    t->set_numel(100);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(100);
  }
  return m;
}

TEST(CostModel, LayerwiseTimelineByHand) {
  PlanRequest req;
  req.compressor = "signsgd";
  auto p = MakeProblem(HandModel(), HandProfile(), req);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->world_size, 4);
  Timeline t = Evaluate(*p, std::vector<int>{0, 1, 2});
  // C = 110, 220, 330; F = 210, 320, 430; D_0 = C_3 = 330: D = 350, 370, 450.
  ASSERT_EQ(t.groups.size(), 3u);
  EXPECT_DOUBLE_EQ(t.groups[0].encode_end_us, 110);
  EXPECT_DOUBLE_EQ(t.groups[1].encode_start_us, 210);
  EXPECT_DOUBLE_EQ(t.groups[2].encode_end_us, 330);
  EXPECT_DOUBLE_EQ(t.groups[0].comm_end_us, 210);
  EXPECT_DOUBLE_EQ(t.groups[1].comm_start_us, 220);
  EXPECT_DOUBLE_EQ(t.groups[2].comm_end_us, 430);
  EXPECT_DOUBLE_EQ(t.groups[0].decode_start_us, 330);
  EXPECT_DOUBLE_EQ(t.groups[1].decode_end_us, 370);
  EXPECT_DOUBLE_EQ(t.groups[2].decode_start_us, 430);
  EXPECT_DOUBLE_EQ(t.iteration_us, 1000 + 450 + 7);
}

// With a chained allgather curve of 170 us (spaced 100: chain_us 70), a collective that follows
// another rests until 70 us past its end: C = 110, 220, 330; F_1 = 110 + 100 = 210;
// F_2 = max(220, 210 + 70) + 100 = 380; F_3 = max(330, 380 + 70) + 100 = 550; D = 350, 400, 570.
// A chained curve below the spaced one adds nothing. A chained curve measured up to 2 bytes,
// 160 and 170 us there, adds its excess at its last point, 70 us, to the larger payloads, not
// what its slope of 10 us per byte extrapolates to.
TEST(CostModel, ChainedCollectivesRestAfterThePreviousOne) {
  PlanRequest req;
  req.compressor = "signsgd";
  for (const pb::Curve& points :
       {MakeCurve(pb::COMM, {{1, 170}}), MakeCurve(pb::COMM, {{1, 80}}), MakeCurve(pb::COMM, {{1, 160}, {2, 170}})}) {
    const double chained_us = points.points(points.points_size() - 1).us();
    SCOPED_TRACE(points.DebugString());
    pb::Profile profile = HandProfile();
    pb::Curve chained = points;
    chained.set_comm_op(pb::ALLGATHER);
    chained.set_scope(pb::GLOBAL);
    chained.set_chained(true);
    *profile.add_curves() = chained;
    auto p = MakeProblem(HandModel(), profile, req);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->comm_chained_key, "comm allgather global chained");
    Timeline t = Evaluate(*p, std::vector<int>{0, 1, 2});
    ASSERT_EQ(t.groups.size(), 3u);
    if (chained_us < 100) {
      EXPECT_DOUBLE_EQ(t.groups[2].comm_end_us, 430);  // as LayerwiseTimelineByHand
      EXPECT_DOUBLE_EQ(t.iteration_us, 1000 + 450 + 7);
      continue;
    }
    EXPECT_DOUBLE_EQ(t.groups[1].cost.chain_us, 70);
    EXPECT_DOUBLE_EQ(t.groups[0].comm_start_us, 110);
    EXPECT_DOUBLE_EQ(t.groups[0].comm_end_us, 210);
    EXPECT_DOUBLE_EQ(t.groups[1].comm_start_us, 220);  // issued when ready; its chained time follows
    EXPECT_DOUBLE_EQ(t.groups[1].comm_end_us, 380);
    EXPECT_DOUBLE_EQ(t.groups[2].comm_start_us, 380);
    EXPECT_DOUBLE_EQ(t.groups[2].comm_end_us, 550);
    EXPECT_DOUBLE_EQ(t.groups[2].decode_end_us, 570);
    EXPECT_DOUBLE_EQ(t.iteration_us, 1000 + 570 + 7);
    EXPECT_DOUBLE_EQ(testing::ReferenceIterationUs(*p, {0, 1, 2}), t.iteration_us);
    // One group: no collective before it, no rest.
    EXPECT_DOUBLE_EQ(Evaluate(*p, std::vector<int>{2}).groups[0].comm_end_us,
                     300 + 1 + 10 + 100);  // backward, pack, encode, allgather
  }
}

TEST(CostModel, FusedGroupPaysPackButUnpackCurveIsOptional) {
  PlanRequest req;
  req.compressor = "signsgd";
  auto p = MakeProblem(HandModel(), HandProfile(), req);
  ASSERT_TRUE(p.ok());
  GroupCost c = CostOfGroup(*p, 0, 2);
  EXPECT_DOUBLE_EQ(c.enc_us, 11);  // pack 1 + encode 10
  EXPECT_DOUBLE_EQ(c.com_us, 100);
  EXPECT_DOUBLE_EQ(c.dec_us, 20);  // no unpack curve: 0
  GroupCost single = CostOfGroup(*p, 1, 1);
  EXPECT_DOUBLE_EQ(single.enc_us, 10);
}

TEST(CostModel, Fp32HasNoEncodeOrDecode) {
  auto p = MakeProblem(HandModel(), HandProfile(), PlanRequest{});
  ASSERT_TRUE(p.ok());
  GroupCost c = CostOfGroup(*p, 0, 0);
  EXPECT_DOUBLE_EQ(c.enc_us, 0);
  EXPECT_DOUBLE_EQ(c.dec_us, 0);
  EXPECT_DOUBLE_EQ(c.com_us, 50);
}

TEST(CostModel, BucketsCloseWhenTheyReachTheCap) {
  auto p = MakeProblem(HandModel(), HandProfile(), PlanRequest{});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(BucketStrategy(*p, 800), (std::vector<int>{1, 2}));  // 400 + 400 reaches 800
  EXPECT_EQ(BucketStrategy(*p, 801), (std::vector<int>{2}));
  EXPECT_EQ(BucketStrategy(*p, 1), (std::vector<int>{0, 1, 2}));
}

// fp16 payloads are summed as halves: priced with the float16 allreduce curve when the profile
// has one (here 5x the float32 one, constant), else with the float32 curve; fp32 keeps its own.
TEST(MakeProblem, Fp16IsPricedWithTheFloat16AllreduceCurve) {
  pb::Profile profile = HandProfile();
  pb::Curve enc = MakeCurve(pb::ENCODE, {{1, 10}});
  enc.set_compressor("fp16");
  enc.set_device(pb::GPU);
  *profile.add_curves() = enc;
  pb::Curve dec = MakeCurve(pb::DECODE, {{1, 20}});
  dec.set_compressor("fp16");
  dec.set_device(pb::GPU);
  *profile.add_curves() = dec;
  PlanRequest fp16;
  fp16.compressor = "fp16";
  auto without = MakeProblem(HandModel(), profile, fp16);
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_EQ(without->comm.At(4096), 50);  // the float32 curve stands in
  pb::Curve half = MakeCurve(pb::COMM, {{1, 250}});
  half.set_comm_op(pb::ALLREDUCE);
  half.set_scope(pb::GLOBAL);
  half.set_dtype(pb::FLOAT16);
  *profile.add_curves() = half;
  auto with = MakeProblem(HandModel(), profile, fp16);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  EXPECT_EQ(with->comm.At(4096), 250);
  auto fp32 = MakeProblem(HandModel(), profile, PlanRequest{});
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ(fp32->comm.At(4096), 50);
}

TEST(MakeProblem, MissingCurveIsNamed) {
  PlanRequest req;
  req.compressor = "topk";
  auto p = MakeProblem(HandModel(), HandProfile(), req);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "profile hand: curve \"encode topk gpu\" not found; the profile has encode curves for: signsgd gpu");
}

TEST(MakeProblem, CpuDeviceNeedsCpuCurves) {
  PlanRequest req;
  req.compressor = "signsgd";
  req.device = pb::CPU;
  auto p = MakeProblem(HandModel(), HandProfile(), req);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("curve \"encode signsgd cpu\" not found"));
}

TEST(MakeProblem, RejectsEmptyModel) {
  pb::Model m;
  m.set_name("empty");
  auto p = MakeProblem(m, HandProfile(), PlanRequest{});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "model empty: tensors: empty; expected at least one tensor");
}

TEST(MakeProblem, RejectsUnknownCompressor) {
  PlanRequest req;
  req.compressor = "topq";
  auto p = MakeProblem(HandModel(), HandProfile(), req);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("--compressor: unknown compressor 'topq' (did you mean 'topk'?)"));
}

TEST(MakeProblem, RejectsRatioOutOfRange) {
  for (double r : {0.0, -0.5, 1.5}) {
    PlanRequest req;
    req.compressor = "topk";
    req.ratio = r;
    auto p = MakeProblem(HandModel(), HandProfile(), req);
    ASSERT_FALSE(p.ok());
    EXPECT_THAT(p.status().message(), HasSubstr("--ratio: ratio out of range"));
    EXPECT_THAT(p.status().message(), HasSubstr("expected 0 < ratio <= 1"));
  }
}

TEST(MakeProblem, RejectsNonFloat32Tensor) {
  pb::Model m = HandModel();
  m.mutable_tensors(1)->set_dtype(pb::FLOAT16);
  auto p = MakeProblem(m, HandProfile(), PlanRequest{});
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(),
            "model hand: tensors[1] (t1): dtype not supported; got float16, expected float32");
}

// Kernel curves of a ratio compressor are read at the plan's ratio: the recorded one, two
// neighbours interpolated linearly in the ratio, the nearest (with a note) outside them, and the
// unrecorded curve of an older profile only when no curve records a ratio.
TEST(FindKernelCurve, ReadsTheCurveAtThePlansRatio) {
  pb::Profile p;
  auto add = [&](std::string_view compressor, std::optional<double> ratio,
                 std::initializer_list<std::pair<int64_t, double>> points) {
    pb::Curve c = MakeCurve(pb::DECODE, points);
    c.set_compressor(std::string(compressor));
    c.set_device(pb::CPU);
    if (ratio) c.set_ratio(*ratio);
    *p.add_curves() = c;
  };
  add("topk", std::nullopt, {{100, 999}});
  add("topk", 0.01, {{100, 10}, {300, 30}});
  add("topk", 0.1, {{200, 100}});
  add("efsignsgd", std::nullopt, {{100, 7}});

  auto exact = FindKernelCurve(p, pb::DECODE, "topk", pb::CPU, 0.01);
  ASSERT_TRUE(exact);
  EXPECT_EQ(exact->key, "decode topk cpu ratio 0.01");
  EXPECT_DOUBLE_EQ(exact->curve.At(200), 20);
  EXPECT_FALSE(exact->ratio_note);

  // A quarter of the way from 0.01 to 0.1, at the union of both curves' sizes {100, 200, 300}:
  // 0.75 x (10, 20, 30) + 0.25 x (100, 100, 100).
  auto between = FindKernelCurve(p, pb::DECODE, "topk", pb::CPU, 0.0325);
  ASSERT_TRUE(between);
  EXPECT_EQ(between->key, "decode topk cpu ratio 0.01 + decode topk cpu ratio 0.1");
  EXPECT_DOUBLE_EQ(between->curve.At(100), 32.5);
  EXPECT_DOUBLE_EQ(between->curve.At(200), 40);
  EXPECT_DOUBLE_EQ(between->curve.At(300), 47.5);
  EXPECT_DOUBLE_EQ(between->curve.At(150), 36.25);
  EXPECT_FALSE(between->ratio_note);

  auto above = FindKernelCurve(p, pb::DECODE, "topk", pb::CPU, 0.5);
  ASSERT_TRUE(above);
  EXPECT_EQ(above->key, "decode topk cpu ratio 0.1");
  ASSERT_TRUE(above->ratio_note);
  EXPECT_EQ(above->ratio_note->curve(), "decode topk cpu ratio 0.1");
  EXPECT_EQ(above->ratio_note->unit(), "ratio");
  EXPECT_EQ(above->ratio_note->last_size(), 0.1);
  EXPECT_EQ(above->ratio_note->max_size(), 0.5);
  auto below = FindKernelCurve(p, pb::DECODE, "topk", pb::CPU, 0.001);
  ASSERT_TRUE(below);
  EXPECT_EQ(below->key, "decode topk cpu ratio 0.01");
  EXPECT_TRUE(below->ratio_note);

  pb::Profile old;
  *old.add_curves() = p.curves(0);
  *old.add_curves() = p.curves(3);
  auto legacy = FindKernelCurve(old, pb::DECODE, "topk", pb::CPU, 0.3);
  ASSERT_TRUE(legacy);
  EXPECT_EQ(legacy->key, "decode topk cpu");
  EXPECT_DOUBLE_EQ(legacy->curve.At(100), 999);
  EXPECT_FALSE(legacy->ratio_note);
  auto dense = FindKernelCurve(p, pb::DECODE, "efsignsgd", pb::CPU, 0.3);  // the ratio does not apply
  ASSERT_TRUE(dense);
  EXPECT_EQ(dense->key, "decode efsignsgd cpu");
  EXPECT_FALSE(FindKernelCurve(p, pb::ENCODE, "topk", pb::CPU, 0.01));
  EXPECT_FALSE(FindKernelCurve(p, pb::DECODE, "topk", pb::GPU, 0.01));

  // A plan at an unmeasured ratio carries the note; `search` and `show` print it.
  PlanRequest request;
  request.compressor = "topk";
  request.ratio = 0.5;
  request.device = pb::CPU;
  pb::Curve enc = MakeCurve(pb::ENCODE, {{1, 1}});
  enc.set_compressor("topk");
  enc.set_device(pb::CPU);
  enc.set_ratio(0.01);
  *p.add_curves() = enc;
  p.mutable_cluster()->set_name("ratios");
  p.mutable_cluster()->set_nodes(1);
  p.mutable_cluster()->set_devices_per_node(2);
  pb::Curve ag = MakeCurve(pb::COMM, {{1, 5}});
  ag.set_comm_op(pb::ALLGATHER);
  ag.set_scope(pb::GLOBAL);
  *p.add_curves() = ag;
  pb::Model m;
  m.set_name("m");
  pb::Tensor* t = m.add_tensors();
  t->set_name("w");
  t->set_numel(100);
  t->set_dtype(pb::FLOAT32);
  t->set_backward_us(1);
  auto problem = MakeProblem(m, p, request);
  ASSERT_TRUE(problem.ok()) << problem.status().ToString();
  EXPECT_EQ(problem->encode_key, "encode topk cpu ratio 0.01");
  EXPECT_EQ(problem->decode_key, "decode topk cpu ratio 0.1");
  ASSERT_EQ(problem->ratio_notes.size(), 2u);
  EXPECT_EQ(problem->ratio_notes[0].curve(), "encode topk cpu ratio 0.01");
  EXPECT_EQ(problem->ratio_notes[1].curve(), "decode topk cpu ratio 0.1");
}

// A collective of 10 us idle, 30 us beside busy cores, with the compute stream busy until 40.
TEST(CommEnd, ProgressesAtTheBusySpeedUntilTheComputeEnds) {
  EXPECT_DOUBLE_EQ(CommEnd(50, 10, 30, 40), 60);  // starts after: idle
  EXPECT_DOUBLE_EQ(CommEnd(40, 10, 30, 40), 50);
  EXPECT_DOUBLE_EQ(CommEnd(0, 10, 30, 40), 30);  // ends before: busy
  EXPECT_DOUBLE_EQ(CommEnd(10, 10, 30, 40), 40);
  EXPECT_DOUBLE_EQ(CommEnd(25, 10, 30, 40), 45);  // half done at 40, the other half in 5 us
  EXPECT_DOUBLE_EQ(CommEnd(5, 10, 10, 40), 15);  // busy = idle: no effect
  EXPECT_DOUBLE_EQ(CommEnd(5, 0, 0, 40), 5);
  double previous = 0;
  for (double start = 0; start <= 60; start += 0.5) {  // non-decreasing in the start
    const double end = CommEnd(start, 10, 30, 40);
    EXPECT_GE(end, previous) << start;
    EXPECT_GE(end, start + 10) << start;
    EXPECT_LE(end, start + 30) << start;
    previous = end;
  }
}

}  // namespace
}  // namespace cupcake::planner

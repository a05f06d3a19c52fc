// Plans record the curves they read beyond their last measured point by more than 2x
// (docs/MODEL.md, "Extrapolation"): hand-made curves, sizes worked out by hand.
#include <gtest/gtest.h>

#include "cupcake/planner/planner.h"
#include "test_problems.h"

namespace cupcake::planner {
namespace {

using testing::HandFusionInstance;
using testing::HandInstance;
using testing::MakeCommCurve;
using testing::MakeCurve;

// The hand instance (3 tensors of 100 float32 elements, 400 bytes each) with comm and pack
// curves measured only up to 400 bytes.
HandInstance ShortCurves() {
  HandInstance h = HandFusionInstance();
  h.profile.clear_curves();
  *h.profile.add_curves() = MakeCommCurve(pb::ALLREDUCE, pb::GLOBAL, {{100, 20}, {400, 24}});
  pb::Curve pack = MakeCurve(pb::COPY, {{100, 1}, {400, 1.5}});
  pack.set_copy_op(pb::PACK);
  pack.set_device(pb::GPU);
  *h.profile.add_curves() = pack;
  return h;
}

TEST(Extrapolation, ListsCurvesReadBeyondTwiceTheirLastPoint) {
  HandInstance h = ShortCurves();
  auto p = MakeProblem(h.model, h.profile, h.request);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // One group of 3 tensors: pack and allreduce read at 1200 bytes, 3x their last point (400).
  const std::vector<int> one_group{2};
  auto e = FindExtrapolations(*p, one_group);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].curve(), "copy pack gpu");
  EXPECT_EQ(e[0].last_size(), 400);
  EXPECT_EQ(e[0].max_size(), 1200);
  EXPECT_EQ(e[0].unit(), "bytes");
  EXPECT_EQ(e[1].curve(), "comm allreduce global");
  EXPECT_EQ(e[1].max_size(), 1200);
  // Groups {0,1} and {2}: 800 bytes at most, exactly 2x: not beyond it.
  const std::vector<int> two_groups{1, 2};
  EXPECT_TRUE(FindExtrapolations(*p, two_groups).empty());
  // Layer-wise: 400 bytes, the last point itself; unfused groups read no pack curve.
  const std::vector<int> layerwise{0, 1, 2};
  EXPECT_TRUE(FindExtrapolations(*p, layerwise).empty());
}

TEST(Extrapolation, EncodeAndDecodeCountElements) {
  HandInstance h = ShortCurves();
  for (pb::CurveKind kind : {pb::ENCODE, pb::DECODE}) {
    pb::Curve c = MakeCurve(kind, {{10, 1}, {100, 2}});
    c.set_compressor("efsignsgd");
    c.set_device(pb::CPU);
    *h.profile.add_curves() = c;
  }
  h.profile.mutable_curves(0)->set_comm_op(pb::ALLGATHER);  // efsignsgd gathers its payloads
  h.profile.mutable_curves(0)->mutable_points(1)->set_size(1 << 20);  // measured far enough
  h.request.compressor = "efsignsgd";
  h.request.device = pb::CPU;
  auto p = MakeProblem(h.model, h.profile, h.request);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::vector<int> one_group{2};
  auto e = FindExtrapolations(*p, one_group);  // no "copy pack cpu" curve: nothing to extrapolate
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].curve(), "encode efsignsgd cpu");
  EXPECT_EQ(e[0].last_size(), 100);
  EXPECT_EQ(e[0].max_size(), 300);
  EXPECT_EQ(e[0].unit(), "elements");
  EXPECT_EQ(e[1].curve(), "decode efsignsgd cpu");
}

TEST(Extrapolation, MakePlanRecordsThem) {
  HandInstance h = ShortCurves();
  // One tensor of 300 elements: every strategy is one group of 1200 bytes.
  h.model.mutable_tensors()->DeleteSubrange(1, 2);
  h.model.mutable_tensors(0)->set_numel(300);
  auto plan = MakePlan(h.model, h.profile, h.request, SearchOptions{});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->extrapolations_size(), 1);  // one tensor: nothing packed
  EXPECT_EQ(plan->extrapolations(0).curve(), "comm allreduce global");
  EXPECT_EQ(plan->extrapolations(0).last_size(), 400);
  EXPECT_EQ(plan->extrapolations(0).max_size(), 1200);
  EXPECT_EQ(plan->extrapolations(0).unit(), "bytes");
}

// A busy curve (docs/MODEL.md, "Busy cores") is read at the same payloads as its idle curve, so
// it is listed when it was measured less far: here up to 400 bytes, the idle one far enough.
TEST(Extrapolation, BusyCurvesToo) {
  HandInstance h = ShortCurves();
  h.profile.mutable_curves(0)->mutable_points(1)->set_size(1 << 20);
  pb::Curve busy = MakeCommCurve(pb::ALLREDUCE, pb::GLOBAL, {{100, 30}, {400, 36}});
  busy.set_busy(true);
  *h.profile.add_curves() = busy;
  auto p = MakeProblem(h.model, h.profile, h.request);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::vector<int> one_group{2};
  auto e = FindExtrapolations(*p, one_group);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].curve(), "copy pack gpu");
  EXPECT_EQ(e[1].curve(), "comm allreduce global busy");
  EXPECT_EQ(e[1].last_size(), 400);
  EXPECT_EQ(e[1].max_size(), 1200);
  EXPECT_EQ(e[1].unit(), "bytes");

  // The options plan lists it through its steps: one tensor of 300 elements (1200 bytes).
  h.model.mutable_tensors()->DeleteSubrange(1, 2);
  h.model.mutable_tensors(0)->set_numel(300);
  SearchOptions options;
  options.space = SearchSpace::kOptions;
  auto plan = MakePlan(h.model, h.profile, h.request, options);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->extrapolations_size(), 1);
  EXPECT_EQ(plan->extrapolations(0).curve(), "comm allreduce global busy");
  EXPECT_EQ(plan->extrapolations(0).last_size(), 400);
  EXPECT_EQ(plan->extrapolations(0).max_size(), 1200);
}

}  // namespace
}  // namespace cupcake::planner

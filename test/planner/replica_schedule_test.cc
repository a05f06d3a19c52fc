// The replica schedule (replica_schedule.h): idle gaps of hand-made timelines and the chunks
// that fit them, every expected value worked out by hand in the comments.
#include <gtest/gtest.h>

#include "cupcake/planner/replica_schedule.h"

namespace cupcake::planner {
namespace {

// A plan whose timeline is only what the schedule reads: forward_us, the groups' network blocks
// (times from the start of backward) and the iteration's end.
pb::Plan Timeline(double forward_us, const std::vector<std::pair<double, double>>& blocks, double iteration_us) {
  pb::Plan plan;
  plan.set_world_size(2);
  plan.mutable_model()->mutable_model()->set_forward_us(forward_us);
  for (const auto& [start, end] : blocks) {
    pb::Group* g = plan.add_groups();
    g->set_comm_start_us(start);
    g->set_comm_end_us(end);
  }
  plan.mutable_predicted()->set_iteration_us(iteration_us);
  return plan;
}

pb::Profile AllreduceProfile(const std::vector<std::pair<int64_t, double>>& points) {
  pb::Profile profile;
  profile.mutable_cluster()->set_name("hand");
  pb::Curve* c = profile.add_curves();
  c->set_kind(pb::COMM);
  c->set_comm_op(pb::ALLREDUCE);
  c->set_scope(pb::GLOBAL);
  for (const auto& [size, us] : points) {
    pb::Point* p = c->add_points();
    p->set_size(size);
    p->set_us(us);
  }
  return profile;
}

// Transfer at W = 2: (1024 B, 100 us) and (1049600 B, 1124 us), slope 1024 us / 2^20 B = 1/1024 us
// per byte, continued beyond the last point (dyadic numbers: the crossings below are exact).
Curve TwoPointTransfer() { return Curve({1024, 1'049'600}, {100, 1124}); }

TEST(ReplicaSchedule, GapsBetweenAndAroundTheCollectivesAndTheirChunks) {
  // forward 1000 us; blocks [2000, 2500] and [2600, 4000] from backward's start, so [3000, 3500]
  // and [3600, 5000] from forward's; the iteration ends at 6000.
  // Gaps: [0, 3000) before the first (3000 us), [3500, 3600) after group 0 (100 us),
  // [5000, 6000) after group 1 (1000 us); 4100 us idle.
  const pb::Plan plan = Timeline(1000, {{2000, 2500}, {2600, 4000}}, 6000);
  const ReplicaSchedule s = ScheduleReplica(plan, TwoPointTransfer(), 10'000'000);
  ASSERT_EQ(s.gaps.size(), 3u);
  EXPECT_EQ(s.gaps[0].start_us, 0);
  EXPECT_EQ(s.gaps[0].end_us, 3000);
  EXPECT_EQ(s.gaps[0].after_group, -1);
  EXPECT_EQ(s.gaps[1].start_us, 3500);
  EXPECT_EQ(s.gaps[1].end_us, 3600);
  EXPECT_EQ(s.gaps[1].after_group, 0);
  EXPECT_EQ(s.gaps[2].start_us, 5000);
  EXPECT_EQ(s.gaps[2].end_us, 6000);
  EXPECT_EQ(s.gaps[2].after_group, 1);
  EXPECT_EQ(s.idle_us, 4100);
  // 3000 us: beyond the last point, 100 + (x - 1024) / 1024 <= 3000, x <= 1024 + 2900 * 1024 = 2970624.
  EXPECT_EQ(s.gaps[0].chunk_bytes, 2'970'624);
  // 100 us: exactly the first point's time; the segment rises after it: 1024 bytes.
  EXPECT_EQ(s.gaps[1].chunk_bytes, 1'024);
  // 1000 us: 100 + (x - 1024) / 1024 <= 1000, x <= 1024 + 900 * 1024 = 922624.
  EXPECT_EQ(s.gaps[2].chunk_bytes, 922'624);
  // 2970624 + 1024 + 922624 = 3894272 per iteration; 1e7 / 3894272 = 2.57: 3 iterations.
  EXPECT_EQ(s.bytes_per_iteration, 3'894'272);
  EXPECT_EQ(s.iterations, 3);
  // The runtime's chunk (after Commit, before the first collective): 2970624; 1e7 / 2970624 = 3.37: 4.
  EXPECT_EQ(s.commit_chunk_bytes, 2'970'624);
  EXPECT_EQ(s.commit_iterations, 4);
}

TEST(ReplicaSchedule, ChunksNeverExceedTheState) {
  // One block [0, 500] right at backward's start after 2000 us of forward, iteration 3000 us:
  // gaps [0, 2000) and [2500, 3000). A 5000-byte state fits whole in both (100 + 3976/1024 us).
  const ReplicaSchedule s = ScheduleReplica(Timeline(2000, {{0, 500}}, 3000), TwoPointTransfer(), 5000);
  ASSERT_EQ(s.gaps.size(), 2u);
  EXPECT_EQ(s.gaps[0].chunk_bytes, 5000);
  EXPECT_EQ(s.gaps[1].chunk_bytes, 5000);
  EXPECT_EQ(s.iterations, 1);  // 5000 / 10000, rounded up
  EXPECT_EQ(s.commit_iterations, 1);
}

TEST(ReplicaSchedule, BackToBackCollectivesLeaveNoGapAndShortGapsNoChunk) {
  // No forward; blocks [0, 50], [50, 90]; iteration 150: one gap [90, 150) of 60 us, shorter than
  // the smallest transfer (100 us): no chunk fits, no replica ever completes, and nothing is sent
  // after Commit (the first block starts at the iteration's start).
  const ReplicaSchedule s = ScheduleReplica(Timeline(0, {{0, 50}, {50, 90}}, 150), TwoPointTransfer(), 1000);
  ASSERT_EQ(s.gaps.size(), 1u);
  EXPECT_EQ(s.gaps[0].after_group, 1);
  EXPECT_EQ(s.gaps[0].start_us, 90);
  EXPECT_EQ(s.gaps[0].chunk_bytes, 0);
  EXPECT_EQ(s.bytes_per_iteration, 0);
  EXPECT_EQ(s.iterations, 0);
  EXPECT_EQ(s.commit_chunk_bytes, 0);
  EXPECT_EQ(s.commit_iterations, 0);
}

TEST(ReplicaSchedule, LargestFitOnANonMonotoneCurve) {
  // (100, 50), (200, 500), (300, 40), then falling 4.6 us per byte, clamped at 0.
  const Curve c({100, 200, 300}, {50, 500, 40});
  // Cap 250: on [200, 250] the curve is 500 .. 270, over 60; on [100, 200] it crosses 60 at
  // 100 + (60 - 50) / 450 * 100 = 102.2: 102.
  EXPECT_EQ(LargestFit(c, 60, 250), 102);
  // Cap 1000: beyond 300 it falls below 60, so the cap itself fits.
  EXPECT_EQ(LargestFit(c, 60, 1000), 1000);
  // Budget 45: [100, 200] never (>= 50 there), [0, 100] is 50 too; past 300 the curve is 40
  // and falling: the cap.
  EXPECT_EQ(LargestFit(c, 45, 1000), 1000);
  // ... but with the cap at 290, on [200, 290] it is 500 .. 86: nothing fits; none below either.
  EXPECT_EQ(LargestFit(c, 45, 290), 0);
}

TEST(ReplicaSchedule, TransferCurveScalesTheAllreduceBytesPerRank) {
  const pb::Profile profile = AllreduceProfile({{1000, 100}, {1'000'000, 1100}});
  // W = 2: 2 (W - 1) / W = 1, the allreduce's own sizes.
  auto two = TransferCurve(profile, 2);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(two->sizes(), (std::vector<double>{1000, 1'000'000}));
  // W = 4: 2 * 3 / 4 = 1.5 link bytes per allreduce byte: (1500, 100), (1.5e6, 1100). A 100 us
  // gap fits 1500 bytes.
  auto four = TransferCurve(profile, 4);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(four->sizes(), (std::vector<double>{1500, 1'500'000}));
  EXPECT_EQ(LargestFit(*four, 100, 1'000'000), 1500);
}

TEST(ReplicaSchedule, TransferCurveErrorsNameTheProblem) {
  pb::Profile none;
  none.mutable_cluster()->set_name("empty");
  EXPECT_EQ(TransferCurve(none, 2).status().message(),
            "profile empty: curves: no \"comm allreduce global\" curve; expected one to price replica chunks");
  EXPECT_EQ(TransferCurve(AllreduceProfile({{1, 1}}), 1).status().message(),
            "replica schedule: world_size: no peer to send a replica to; got 1, expected >= 2");
}

}  // namespace
}  // namespace cupcake::planner

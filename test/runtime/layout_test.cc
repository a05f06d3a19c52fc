// The session's layout step (libruntime/src/layout.h) on its own: no communicator, no device.
// Expected values are worked out by hand from SmallModel's sizes (37, 5, 128, 1, 64, 200).
#include "layout.h"

#include <gtest/gtest.h>

#include "cupcake/proto/plan_io.h"
#include "runtime_test_util.h"

namespace cupcake::runtime::internal {
namespace {

using testing::MakePlan;
using testing::SmallModel;

LayoutContext HostContext(int world, int rank = 0) {
  LayoutContext c;
  c.origin = "plan.pb";
  c.world_size = world;
  c.rank = rank;
  return c;
}

TEST(PlanLayout, FlatTopkGroupsEncodeOnTheHostWithAResidualPerElement) {
  const pb::Plan plan = MakePlan(SmallModel(), testing::Planned(), "topk", 2);
  auto layout = PlanLayout(plan, HostContext(2));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  ASSERT_EQ(layout->groups.size(), 3u);
  EXPECT_EQ(layout->total_elements, 37 + 5 + 128 + 1 + 64 + 200);
  const int64_t numels[] = {42, 128, 265}, offsets[] = {0, 42, 170};
  for (int k = 0; k < 3; ++k) {
    const GroupLayout& g = layout->groups[static_cast<size_t>(k)];
    EXPECT_EQ(g.scheme, SchemeKind::kFlat);
    EXPECT_EQ(g.place, CodecPlace::kHost);
    EXPECT_FALSE(g.in_place);
    EXPECT_EQ(g.numel, numels[k]);
    EXPECT_EQ(g.offset, offsets[k]);
    EXPECT_EQ(g.state_floats(), numels[k]);  // residual: one float per element
    EXPECT_EQ(g.state_elements(), numels[k]);
    // k = floor(0.25 n) values and as many indices, 4 bytes each; allgather over 2 ranks.
    EXPECT_EQ(g.codec.payload_bytes, 8 * (numels[k] / 4));
    EXPECT_EQ(g.codec.decode_input_bytes, 2 * g.codec.payload_bytes);
    EXPECT_FALSE(g.codec.allreduce);
  }
  EXPECT_EQ(layout->tensors[4].group, 2);
  EXPECT_EQ(layout->tensors[4].offset, 37 + 5 + 128 + 1);
}

TEST(PlanLayout, Fp32GroupsWorkInPlaceWithNoStateOnTheHostAndDivideOnTheDevice) {
  pb::Plan plan = MakePlan(SmallModel(), testing::OneGroup(SmallModel()), "fp32", 3);
  auto host = PlanLayout(plan, HostContext(3));
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_TRUE(host->groups[0].in_place);
  EXPECT_FALSE(host->groups[0].has_compressor());
  EXPECT_EQ(host->groups[0].state_floats(), 0);
  EXPECT_EQ(host->groups[0].reduce_count, 435);
  plan.set_device(pb::GPU);
  LayoutContext device = HostContext(3);
  device.device_memory = true;
  auto on_device = PlanLayout(plan, device);
  ASSERT_TRUE(on_device.ok()) << on_device.status().ToString();
  EXPECT_EQ(on_device->groups[0].place, CodecPlace::kDevice);
  EXPECT_TRUE(on_device->groups[0].in_place);
  EXPECT_TRUE(on_device->groups[0].has_compressor());  // the divide by W as a kernel
}

TEST(PlanLayout, AGroupPlannedOnTheCpuOfAGpuPlanIsOffloadedAndNeverInPlace) {
  pb::Plan plan = testing::WithScheme(MakePlan(SmallModel(), testing::Planned(), "fp32", 2), "flat_fp32", 1);
  plan.set_device(pb::GPU);
  for (pb::Group& g : *plan.mutable_groups()) g.mutable_options()->set_device(pb::GPU);
  plan.mutable_groups(1)->mutable_options()->set_device(pb::CPU);
  LayoutContext c = HostContext(2);
  c.device_memory = true;
  auto layout = PlanLayout(plan, c);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->groups[0].place, CodecPlace::kDevice);
  EXPECT_TRUE(layout->groups[0].in_place);
  EXPECT_EQ(layout->groups[1].place, CodecPlace::kOffloaded);
  EXPECT_FALSE(layout->groups[1].in_place);
  EXPECT_TRUE(layout->groups[1].has_compressor());
  EXPECT_TRUE(layout->has_offloaded());
  // The same plan in a host session: offload is refused, naming the group.
  auto host = PlanLayout(plan, HostContext(2));
  ASSERT_FALSE(host.ok());
  EXPECT_NE(host.status().message().find("plan.pb: groups[1].options.device: offload to the CPU is not executed"),
            std::string::npos)
      << host.status().message();
}

TEST(PlanLayout, HierarchicalGroupsKeepStateForTheirShard) {
  const pb::Plan plan = testing::WithScheme(MakePlan(SmallModel(), testing::Planned(), "efsignsgd", 4), "hier", 2);
  auto layout = PlanLayout(plan, HostContext(4, 3));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->hierarchical_devices, 2);
  const GroupLayout& g = layout->groups[2];  // 265 elements: shards of 133 on 2 ranks per node
  EXPECT_EQ(g.scheme, SchemeKind::kHierarchical);
  EXPECT_EQ(g.shard, 133);
  EXPECT_TRUE(g.shard_codec);
  EXPECT_EQ(g.divisor, 2.0f);  // the codec's decode gives the mean over the 2 nodes
  EXPECT_EQ(g.config.world_size, 2);
  EXPECT_EQ(g.state_elements(), 133);
  EXPECT_EQ(g.state_floats(), 133);
  const pb::Plan fp32 = testing::WithScheme(MakePlan(SmallModel(), testing::Planned(), "fp32", 4), "hier_fp32", 2);
  auto exact = PlanLayout(fp32, HostContext(4));
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  EXPECT_FALSE(exact->groups[0].shard_codec);
  EXPECT_EQ(exact->groups[0].divisor, 4.0f);  // fp32 sums over every rank
  EXPECT_EQ(exact->groups[0].state_floats(), 0);
}

TEST(PlanLayout, ZenAndZenSparseGroups) {
  const pb::Plan zen = testing::WithScheme(MakePlan(SmallModel(), testing::Planned(), "topk", 2), "zen", 1);
  auto layout = PlanLayout(zen, HostContext(2));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  EXPECT_EQ(layout->groups[0].scheme, SchemeKind::kZen);
  EXPECT_EQ(layout->groups[0].zen_seed, static_cast<uint32_t>(testing::ExpectedGroupSeed(42, 0, 0, true)));
  EXPECT_EQ(layout->groups[1].zen_seed, static_cast<uint32_t>(testing::ExpectedGroupSeed(42, 1, 0, true)));
  const pb::Plan sparse =
      testing::WithScheme(MakePlan(testing::SparseModel(), testing::Planned(), "fp32", 2), "zen_sparse", 1);
  auto s = PlanLayout(sparse, HostContext(2));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->groups[1].scheme, SchemeKind::kZenSparse);
  EXPECT_EQ(s->groups[1].nonzero_capacity, 26);  // twice the 13 expected (0.1 x 128)
  EXPECT_EQ(s->groups[1].state_floats(), 0);
  LayoutContext device = HostContext(2);
  device.device_memory = true;
  pb::Plan gpu = sparse;
  gpu.set_device(pb::GPU);
  for (pb::Group& g : *gpu.mutable_groups()) g.mutable_options()->set_device(pb::GPU);
  auto refused = PlanLayout(gpu, device);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("'zen_sparse' runs on host memory only"), std::string::npos);
}

// PowerSGD groups: the codec's config from the embedded model (a tensor without a recorded
// shape as the vector {numel}), the plan's rank, one seed for every rank; no per-element state.
// The plan check wants a rank and the shapes' sizes; an offloaded powersgd group is refused.
TEST(PlanLayout, PowerSgdGroups) {
  const pb::Plan plan = testing::PowerSgdPlan(testing::ShapedModel(), testing::Planned(), 2, "powersgd", 3);
  ASSERT_TRUE(ValidatePlan(plan, "plan").ok()) << ValidatePlan(plan, "plan").ToString();
  auto layout = PlanLayout(plan, HostContext(2, 1));
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  const GroupLayout& g = layout->groups[2];  // tensors 3..5: [] (numel 1), [8, 8], [20, 10]
  EXPECT_EQ(g.scheme, SchemeKind::kPowerSgd);
  EXPECT_EQ(g.powersgd.shapes, (std::vector<std::vector<int64_t>>{{1}, {8, 8}, {20, 10}}));
  EXPECT_EQ(g.powersgd.rank, 3);
  EXPECT_FALSE(g.powersgd.batched);
  EXPECT_EQ(g.powersgd.world_size, 2);
  EXPECT_EQ(g.powersgd.seed, testing::ExpectedGroupSeed(42, 2, 0, true));
  EXPECT_EQ(g.state_floats(), 0);
  EXPECT_FALSE(g.has_compressor());

  pb::Plan no_rank = plan;
  no_rank.mutable_compressor()->set_rank(0);
  EXPECT_NE(ValidatePlan(no_rank, "plan.pb")
                .message()
                .find("plan.pb: groups[0].options.scheme: powersgd needs the plan's compressor.rank; got 0, expected "
                      "rank >= 1"),
            std::string::npos)
      << ValidatePlan(no_rank, "plan.pb").message();
  pb::Plan edited = plan;  // shapes edited after planning: P's size no longer matches
  edited.mutable_model()->mutable_model()->mutable_tensors(0)->clear_shape();
  EXPECT_NE(ValidatePlan(edited, "plan.pb").message().find("plan.pb: groups[0].steps[0].bytes: does not match the "
                                                           "scheme; got 212, expected 788 (powersgd step 0)"),
            std::string::npos)
      << ValidatePlan(edited, "plan.pb").message();

  pb::Plan offloaded = plan;
  offloaded.set_device(pb::GPU);
  LayoutContext device = HostContext(2);
  device.device_memory = true;
  auto refused = PlanLayout(offloaded, device);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("offload of a hierarchical, zen or powersgd group is not executed"),
            std::string::npos)
      << refused.status().message();
}

TEST(PlanLayout, ReportsEveryProblemTogetherOnePerLine) {
  pb::Plan plan = MakePlan(SmallModel(), testing::Planned(), "topk", 4);
  LayoutContext c = HostContext(2);
  c.compressor = "dgc";
  c.model_fingerprint = "ffff";
  auto layout = PlanLayout(plan, c);
  ASSERT_FALSE(layout.ok());
  const std::string fp = plan.model().fingerprint();
  EXPECT_EQ(layout.status().message(),
            "plan.pb: world_size: does not match the job; got 4, expected 2 (ranks in the communicator)\n"
            "plan.pb: compressor.name: does not match the job; got 'topk', expected 'dgc'\n"
            "plan.pb: model.fingerprint: plan for another model; got " +
                fp + " (model tiny), expected ffff (the job's model)");
}

TEST(PlaceBuffers, OnlyGroupsWhoseBuffersAreNotAdjacentAreFused) {
  const pb::Model model = SmallModel();
  const pb::Plan plan = MakePlan(model, testing::Planned(), "topk", 2);
  auto layout = PlanLayout(plan, HostContext(2));
  ASSERT_TRUE(layout.ok());
  testing::Gradients flat(model, testing::Layout::kFlat), separate(model, testing::Layout::kSeparate);
  std::vector<const float*> buffers;
  for (auto span : flat) buffers.push_back(span.data());
  PlaceBuffers(*layout, buffers);
  EXPECT_EQ(layout->fusion_bytes(), 0);
  buffers.clear();
  for (auto span : separate) buffers.push_back(span.data());
  PlaceBuffers(*layout, buffers);
  EXPECT_TRUE(layout->groups[0].fused);
  EXPECT_FALSE(layout->groups[1].fused);  // one tensor
  EXPECT_TRUE(layout->groups[2].fused);
  EXPECT_EQ(layout->fusion_bytes(), 4 * (42 + 265));
}

TEST(CheckSameModel, RefusesAPlanForAnotherModel) {
  auto first = PlanLayout(MakePlan(SmallModel(), testing::Planned(), "topk", 2), HostContext(2));
  auto same = PlanLayout(MakePlan(SmallModel(), testing::LayerWise(SmallModel()), "fp32", 2), HostContext(2));
  const pb::Model other_model = SmallModel("other", {37, 5, 128, 1, 64, 201});
  auto other = PlanLayout(MakePlan(other_model, testing::Planned(), "topk", 2), HostContext(2));
  ASSERT_TRUE(first.ok() && same.ok() && other.ok());
  EXPECT_TRUE(CheckSameModel(*first, *same, "b.pb").ok());
  Status s = CheckSameModel(*first, *other, "b.pb");
  EXPECT_EQ(s.message(), "b.pb: model.fingerprint: plan for another model; got " + other->model_fingerprint +
                             " (model other), expected " + first->model_fingerprint + " (the session's model tiny)");
}

}  // namespace
}  // namespace cupcake::runtime::internal

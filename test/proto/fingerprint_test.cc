#include "cupcake/proto/fingerprint.h"

#include <gtest/gtest.h>

namespace cupcake {
namespace {

pb::Model TwoTensors() {
  pb::Model m;
  m.set_name("m");
  for (const char* name : {"a", "b"}) {
    auto* t = m.add_tensors();
    t->set_name(name);
    t->set_numel(10);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(1);
  }
  return m;
}

TEST(ModelFingerprint, CoversNamesSizesDtypesAndOrderOnly) {
  pb::Model m = TwoTensors();
  const std::string fp = ModelFingerprint(m);
  EXPECT_EQ(fp.size(), 16u);
  pb::Model timing = m;
  timing.set_name("renamed");
  timing.mutable_tensors(0)->set_backward_us(99);
  EXPECT_EQ(ModelFingerprint(timing), fp);
  pb::Model swapped = m;
  swapped.mutable_tensors()->SwapElements(0, 1);
  EXPECT_NE(ModelFingerprint(swapped), fp);
  pb::Model bigger = m;
  bigger.mutable_tensors(1)->set_numel(11);
  EXPECT_NE(ModelFingerprint(bigger), fp);
  pb::Model half = m;
  half.mutable_tensors(1)->set_dtype(pb::FLOAT16);
  EXPECT_NE(ModelFingerprint(half), fp);
}

// The value plans and DBs carry: pinned, so a change to the hash (which would make every stored
// plan refuse its job) fails here. Worked out apart from the code, from docs/FORMATS.md's
// definition (64-bit FNV-1a over "cupcake.model", the count, then per tensor its name, numel
// and dtype; strings length-prefixed, integers 8 bytes little-endian), by a short Python script.
TEST(ModelFingerprint, GoldenValue) { EXPECT_EQ(ModelFingerprint(TwoTensors()), "e4aa961bfeb1be6e"); }

TEST(ProfileFingerprint, IgnoresCurveOrderAndMetadata) {
  pb::Profile p;
  p.mutable_cluster()->set_name("c");
  p.mutable_cluster()->set_nodes(2);
  for (auto op : {pb::ALLREDUCE, pb::ALLGATHER}) {
    auto* c = p.add_curves();
    c->set_kind(pb::COMM);
    c->set_comm_op(op);
    c->set_scope(pb::GLOBAL);
    auto* pt = c->add_points();
    pt->set_size(4);
    pt->set_us(op == pb::ALLREDUCE ? 1.0 : 2.0);
  }
  const std::string fp = ProfileFingerprint(p);
  pb::Profile reordered = p;
  reordered.mutable_curves()->SwapElements(0, 1);
  (*reordered.mutable_cluster()->mutable_meta())["date"] = "today";
  reordered.mutable_curves(0)->set_method("event");
  EXPECT_EQ(ProfileFingerprint(reordered), fp);
  pb::Profile changed = p;
  changed.mutable_curves(0)->mutable_points(0)->set_us(1.0000001);
  EXPECT_NE(ProfileFingerprint(changed), fp);
  pb::Profile nodes = p;
  nodes.mutable_cluster()->set_nodes(3);
  EXPECT_NE(ProfileFingerprint(nodes), fp);
}

// Two plans share a fingerprint exactly when every field agrees: a ratio, a seed, a group's
// bounds or a scheme change it; a copy and a round trip through the wire format do not.
TEST(PlanFingerprint, ChangesWithAnyFieldAndSurvivesARoundTrip) {
  pb::Plan plan;
  plan.set_format("cupcake.plan.v1");
  plan.set_world_size(4);
  plan.mutable_compressor()->set_name("topk");
  plan.mutable_compressor()->set_ratio(0.01);
  plan.mutable_compressor()->set_seed(42);
  pb::Group* g = plan.add_groups();
  g->set_first_tensor(0);
  g->set_last_tensor(3);
  const std::string fp = PlanFingerprint(plan);
  EXPECT_EQ(fp.size(), 16u);
  pb::Plan copy;
  ASSERT_TRUE(copy.ParseFromString(plan.SerializeAsString()));
  EXPECT_EQ(PlanFingerprint(copy), fp);
  pb::Plan ratio = plan;
  ratio.mutable_compressor()->set_ratio(0.1);
  pb::Plan seed = plan;
  seed.mutable_compressor()->set_seed(43);
  pb::Plan bounds = plan;
  bounds.mutable_groups(0)->set_last_tensor(2);
  pb::Plan scheme = plan;
  scheme.mutable_groups(0)->mutable_options()->set_scheme("zen");
  for (const pb::Plan* other : {&ratio, &seed, &bounds, &scheme}) EXPECT_NE(PlanFingerprint(*other), fp);
}

}  // namespace
}  // namespace cupcake

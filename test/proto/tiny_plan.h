// A small valid plan made by hand, shared by the plan and ladder file tests.
#pragma once

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/fingerprint.h"

namespace cupcake {

// A small valid plan made by hand: 3 tensors in 2 groups, topk on gpu.
inline pb::Plan TinyPlan() {
  pb::Plan plan;
  plan.set_format("cupcake.plan.v1");
  pb::Model* m = plan.mutable_model()->mutable_model();
  m->set_name("tiny");
  const char* names[] = {"fc.bias", "fc.weight", "conv1.weight"};
  const int64_t numel[] = {10, 1000, 500};
  for (int i = 0; i < 3; ++i) {
    pb::Tensor* t = m->add_tensors();
    t->set_name(names[i]);
    t->set_numel(numel[i]);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(10.0 * i);
  }
  plan.mutable_model()->set_fingerprint(ModelFingerprint(*m));
  plan.set_profile_fingerprint("0123456789abcdef");
  plan.set_profile_name("cluster");
  plan.set_world_size(8);
  plan.set_device(pb::GPU);
  plan.mutable_compressor()->set_name("topk");
  plan.mutable_compressor()->set_ratio(0.01);
  plan.mutable_compressor()->set_memory("residual");
  const int bounds[][2] = {{0, 1}, {2, 2}};
  double t = 0;
  for (const auto& b : bounds) {
    pb::Group* g = plan.add_groups();
    g->set_first_tensor(b[0]);
    g->set_last_tensor(b[1]);
    g->mutable_options()->set_compress(true);
    g->mutable_options()->set_device(pb::GPU);
    g->mutable_options()->set_collective(pb::ALLGATHER);
    int64_t n = 0;
    for (int i = b[0]; i <= b[1]; ++i) n += numel[i];
    g->set_numel(n);
    g->set_payload_bytes(PayloadBytes(*FindCompressor("topk"), n, 0.01));
    g->set_encode_start_us(t);
    g->set_encode_end_us(t + 1.5);
    g->set_comm_start_us(t + 1.5);
    g->set_comm_end_us(t + 20.25);
    g->set_decode_start_us(t + 40);
    g->set_decode_end_us(t + 41);
    t += 25;
  }
  plan.mutable_predicted()->set_iteration_us(123.5);
  pb::Baseline* b = plan.add_baselines();
  b->set_name("layerwise");
  b->set_groups(3);
  b->set_iteration_us(150);
  plan.mutable_search()->set_algorithm("branch_and_bound");
  plan.mutable_search()->set_nodes(7);
  plan.mutable_search()->set_optimal(true);
  return plan;
}

}  // namespace cupcake

// What both runtime benchmarks share: plans built in code for a model (a compressor and a
// grouping) or regrouped from a planner's plan, the clock, and the summary of per-iteration
// times.
#pragma once

#include <algorithm>
#include <chrono>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/planner.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/fingerprint.h"

namespace cupcake::bench {

// The steady clock in us.
inline double NowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using Groups = std::vector<std::pair<int, int>>;  // (first_tensor, last_tensor) per group

inline Groups LayerWise(const pb::Model& m) {
  Groups g;
  for (int i = 0; i < m.tensors_size(); ++i) g.emplace_back(i, i);
  return g;
}
inline Groups OneGroup(const pb::Model& m) { return {{0, m.tensors_size() - 1}}; }
// Fixed-size buckets as docs/MODEL.md's baseline: append tensors in order, close a bucket
// as soon as its uncompressed bytes reach `cap_bytes`.
inline Groups Buckets(const pb::Model& m, int64_t cap_bytes) {
  Groups g;
  int first = 0;
  int64_t bytes = 0;
  for (int i = 0; i < m.tensors_size(); ++i) {
    bytes += 4 * m.tensors(i).numel();
    if (bytes >= cap_bytes || i == m.tensors_size() - 1) {
      g.emplace_back(first, i);
      first = i + 1;
      bytes = 0;
    }
  }
  return g;
}

// `like` (its compressor, spec and first group's options) with other groups.
inline pb::Plan Regroup(const pb::Plan& like, const Groups& groups) {
  pb::Plan plan = like;
  plan.clear_groups();
  plan.clear_baselines();
  const pb::Model& m = like.model().model();
  const CompressorInfo* info = FindCompressor(like.compressor().name());
  const double ratio = planner::RequestOf(like).ratio;
  const pb::GroupOptions options = like.groups(0).options();
  for (auto [first, last] : groups) {
    pb::Group* g = plan.add_groups();
    g->set_first_tensor(first);
    g->set_last_tensor(last);
    int64_t n = 0;
    for (int i = first; i <= last; ++i) n += m.tensors(i).numel();
    g->set_numel(n);
    *g->mutable_options() = options;
    g->set_payload_bytes(PayloadBytes(*info, n, ratio));
    // An options plan's scheme (docs/MODEL.md, v2): its payload step and its steps.
    if (const SchemeInfo* s = FindScheme(options.scheme()); s != nullptr) {
      const SchemeStep& payload = s->steps[PayloadStep(*s)];
      g->set_payload_bytes(StepBytes(*s, payload, *info, n, ratio, {like.world_size(), like.devices_per_node()},
                                     like.compressor().zen_union()));
      for (int i = 0; i < s->step_count; ++i) {
        pb::Step* step = g->add_steps();
        step->set_op(StepOp(*s, s->steps[i], *info));
        step->set_scope(s->steps[i].scope);
      }
    }
  }
  return plan;
}

// A plan built in code (not predicted: the validator wants an iteration time > 0, so 1 us):
// `compressor` with its catalogue defaults (ratio 0.01, default memory, seed 42) over `groups`.
inline pb::Plan PlanFor(const pb::Model& model, int world, pb::Device device, const std::string& compressor,
                        const Groups& groups) {
  const CompressorInfo* info = FindCompressor(compressor);
  pb::Plan plan;
  plan.set_format(planner::kPlanFormat);
  *plan.mutable_model()->mutable_model() = model;
  plan.mutable_model()->set_fingerprint(ModelFingerprint(model));
  plan.set_profile_fingerprint("0000000000000000");
  plan.set_profile_name("bench");
  plan.set_world_size(world);
  plan.set_device(device);
  plan.mutable_compressor()->set_name(compressor);
  plan.mutable_compressor()->set_ratio(info->uses_ratio ? kDefaultRatio : 0);
  plan.mutable_compressor()->set_memory(std::string(info->default_memory));
  plan.mutable_compressor()->set_seed(42);
  pb::Group* g = plan.add_groups();
  g->mutable_options()->set_compress(compressor != "fp32");
  g->mutable_options()->set_device(device);
  g->mutable_options()->set_collective(info->collective);
  plan.mutable_predicted()->set_iteration_us(1);
  plan.mutable_search()->set_algorithm("bench");
  return Regroup(plan, groups);
}

struct Stats {
  double median_us = 0, mean_us = 0, min_us = 0;
};

inline Stats Summarize(std::vector<double> t) {
  Stats s;
  if (t.empty()) return s;
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  s.median_us = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  s.mean_us = std::accumulate(t.begin(), t.end(), 0.0) / static_cast<double>(n);
  s.min_us = t.front();
  return s;
}

}  // namespace cupcake::bench

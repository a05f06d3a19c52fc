// Views of a plan for people and tools: the Chrome trace of its predicted timeline and
// the diff of two plans. Pure functions over plans; no files.
#pragma once

#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"

namespace cupcake::planner {

// The predicted timeline as Chrome trace JSON (chrome://tracing, Perfetto): one track per
// resource (compute, network), one slice per forward pass, backward tensor, encode,
// collective, decode and update. Times in microseconds from the start of forward.
std::string ChromeTrace(const pb::Plan& plan);

struct PlanDiff {
  // One line per difference, in a stable order: what and how it changed.
  std::vector<std::string> changes;
  double time_change_pct = 0;  // (b - a) / a * 100 of predicted.iteration_us
  bool different = false;  // a structural change, or a time change beyond the tolerance
};

// Compares a and b: model, profile, world size, device, compressor, group boundaries (as
// tensor names) and options, and predicted iteration time (different beyond tolerance_pct).
PlanDiff DiffPlans(const pb::Plan& a, const pb::Plan& b, double tolerance_pct);

}  // namespace cupcake::planner

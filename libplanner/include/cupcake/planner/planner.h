// The planner's entry points: make a plan (search + baselines) and re-evaluate one.
// Pure: values in, values out; the same inputs give a byte-identical plan.
#pragma once

#include <string>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/cost_model.h"
#include "cupcake/planner/search.h"
#include "cupcake/proto/status.h"

namespace cupcake::planner {

inline constexpr char kPlanFormat[] = "cupcake.plan.v1";

// Searches `model` on `profile` and returns the plan with its predicted timeline, the
// baselines' predicted times and the search statistics.
StatusOr<pb::Plan> MakePlan(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                            const SearchOptions& options);

// The request a plan was made with (compressor, ratio, device, memory, seed).
PlanRequest RequestOf(const pb::Plan& plan);

// Re-evaluates `plan`'s groups on `profile` for `model` (which must be the plan's model:
// the error names the fingerprints that differ). Returns the predicted timeline.
StatusOr<Timeline> Simulate(const pb::Plan& plan, const pb::Model& model, const pb::Profile& profile);

}  // namespace cupcake::planner

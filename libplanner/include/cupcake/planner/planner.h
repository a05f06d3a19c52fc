// The planner's entry points: make a plan (search + baselines) and re-evaluate one.
// Pure: values in, values out; the same inputs give a byte-identical plan.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/cost_model.h"
#include "cupcake/planner/search.h"
#include "cupcake/proto/status.h"

namespace cupcake::planner {

inline constexpr char kPlanFormat[] = "cupcake.plan.v1";
// A plan records a curve it reads beyond its last measured point by more than this factor.
inline constexpr double kExtrapolationFactor = 2.0;

// Searches `model` on `profile` and returns the plan with its predicted timeline, the
// baselines' predicted times and the search statistics.
StatusOr<pb::Plan> MakePlan(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                            const SearchOptions& options);

// The curves `group_ends` (a strategy on `problem`) reads at more than kExtrapolationFactor
// times their last measured size, in the order pack, encode, comm, decode, unpack. MakePlan
// stores them in Plan.extrapolations.
std::vector<pb::Extrapolation> FindExtrapolations(const Problem& problem, std::span<const int> group_ends);

// The request a plan was made with (compressor, ratio, device, memory, seed).
PlanRequest RequestOf(const pb::Plan& plan);

// Re-evaluates `plan`'s groups on `profile` for `model` (which must be the plan's model:
// the error names the fingerprints that differ). Returns the predicted timeline.
StatusOr<Timeline> Simulate(const pb::Plan& plan, const pb::Model& model, const pb::Profile& profile);

}  // namespace cupcake::planner

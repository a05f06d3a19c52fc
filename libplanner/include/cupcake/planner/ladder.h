// A ladder of plans (docs/FORMATS.md): the plan of every compression ratio a controller may
// switch between during training, each searched on its own (the best grouping changes with the
// payload), and the dense fp32 plan as the bottom rung.
#pragma once

#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/planner.h"
#include "cupcake/proto/status.h"

namespace cupcake::planner {

// rungs[0]: MakePlan of `request` with compressor fp32 (its default memory); then one rung per
// ratio, in decreasing order: MakePlan of `request` at that ratio. Every rung on one device: the
// request's, or when it is unspecified the one the first compressed rung's search resolves. The compressor must keep a
// fraction of the elements (topk, randk, dgc); ratios in (0, 1), distinct, at least one.
// `request.ratio` is not used. Errors name the flag: `--ratios: ...`.
// The checks MakeLadder applies to its arguments (for the tools to tell a usage error early);
// sorts `ratios` in decreasing order.
Status CheckLadderRequest(const std::string& compressor, std::vector<double>& ratios);

StatusOr<pb::Ladder> MakeLadder(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                                std::vector<double> ratios, const SearchOptions& search);

}  // namespace cupcake::planner

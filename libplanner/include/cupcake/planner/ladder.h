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

// A ladder of PowerSGD ranks (`--ranks`): rungs[0] the plan of the same search without PowerSGD
// (`request` at rank 0, the powersgd schemes taken out of `request.schemes`; when those were all
// it named, the fusion option alone: the dense fp32 plan); then one rung per rank, in
// decreasing order: MakePlan of `request` at that rank (the options search chooses per rank the
// groups, which of them run PowerSGD and the scheme), its ratio PowerSgdRungRatio (the bytes it
// sends over the dense gradient's). `request` must be an fp32 request without `rank`,
// `search.space` options; ranks in [1, kMaxPowerSgdRank], distinct, at least one. A rank whose
// plan runs no PowerSGD group, or sends no fewer bytes than the next higher rank's, is an error
// naming it (FailedPrecondition). Errors name the flag: `--ranks: ...`.
// The checks MakeRankLadder applies to its arguments; sorts `ranks` in decreasing order.
Status CheckRankLadderRequest(const PlanRequest& request, SearchSpace space, std::vector<int>& ranks);

StatusOr<pb::Ladder> MakeRankLadder(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                                    std::vector<int> ranks, const SearchOptions& search);

}  // namespace cupcake::planner

#include "cupcake/planner/ladder.h"

#include <algorithm>
#include <functional>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/names.h"

namespace cupcake::planner {
namespace {}  // namespace

Status CheckLadderRequest(const std::string& compressor, std::vector<double>& ratios) {
  const CompressorInfo* info = FindCompressor(compressor);
  if (info == nullptr) return UnknownCompressorError("--compressor", compressor);
  if (!info->uses_ratio)
    return InvalidArgumentError("--ratios: " + compressor +
                                " keeps no fraction of the elements; expected topk, randk or dgc");
  if (ratios.empty()) return InvalidArgumentError("--ratios: empty; expected at least one ratio in (0, 1)");
  std::sort(ratios.begin(), ratios.end(), std::greater<>());
  for (size_t i = 0; i < ratios.size(); ++i) {
    if (!(ratios[i] > 0 && ratios[i] < 1))
      return InvalidArgumentError("--ratios: out of range; got " + FormatDouble(ratios[i]) +
                                  ", expected 0 < ratio < 1 (the fp32 rung is always added)");
    if (i > 0 && ratios[i] == ratios[i - 1])
      return InvalidArgumentError("--ratios: " + FormatDouble(ratios[i]) + " appears twice; expected distinct ratios");
  }
  return Status::Ok();
}

StatusOr<pb::Ladder> MakeLadder(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                                std::vector<double> ratios, const SearchOptions& search) {
  CUPCAKE_RETURN_IF_ERROR(CheckLadderRequest(request.compressor, ratios));
  // One device for every rung: the compressed rungs' (an unspecified device resolves by the
  // compressor's curves, which the fp32 rung does not read).
  std::vector<pb::Plan> compressed;
  PlanRequest at = request;
  for (double ratio : ratios) {
    at.ratio = ratio;
    CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, MakePlan(model, profile, at, search));
    at.device = plan.device();
    compressed.push_back(std::move(plan));
  }
  pb::Ladder ladder;
  ladder.set_format(std::string(kLadderFileFormat));
  PlanRequest dense = at;
  dense.compressor = "fp32";
  dense.memory.clear();
  dense.ratio = kDefaultRatio;
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan fp32, MakePlan(model, profile, dense, search));
  pb::Rung* bottom = ladder.add_rungs();
  bottom->set_ratio(1);
  *bottom->mutable_plan() = std::move(fp32);
  for (size_t i = 0; i < ratios.size(); ++i) {
    pb::Rung* rung = ladder.add_rungs();
    rung->set_ratio(ratios[i]);
    *rung->mutable_plan() = std::move(compressed[i]);
  }
  return ladder;
}

}  // namespace cupcake::planner

#include "cupcake/planner/ladder.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/names.h"

namespace cupcake::planner {
namespace {

// The ladder of `bottom` (the fp32 rung, ratio 1) and `rungs` (ratio, plan), in that order.
pb::Ladder Assemble(pb::Plan bottom, std::vector<std::pair<double, pb::Plan>> rungs) {
  pb::Ladder ladder;
  ladder.set_format(std::string(kLadderFileFormat));
  pb::Rung* dense = ladder.add_rungs();
  dense->set_ratio(1);
  *dense->mutable_plan() = std::move(bottom);
  for (auto& [ratio, plan] : rungs) {
    pb::Rung* rung = ladder.add_rungs();
    rung->set_ratio(ratio);
    *rung->mutable_plan() = std::move(plan);
  }
  return ladder;
}

bool RunsPowerSgd(const pb::Plan& plan) {
  return std::any_of(plan.groups().begin(), plan.groups().end(), [](const pb::Group& g) {
    const SchemeInfo* s = FindScheme(g.options().scheme());
    return s != nullptr && s->codec == Codec::kLowRank;
  });
}

}  // namespace

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
  PlanRequest dense = at;
  dense.compressor = "fp32";
  dense.memory.clear();
  dense.ratio = kDefaultRatio;
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan fp32, MakePlan(model, profile, dense, search));
  std::vector<std::pair<double, pb::Plan>> rungs;
  for (size_t i = 0; i < ratios.size(); ++i) rungs.emplace_back(ratios[i], std::move(compressed[i]));
  return Assemble(std::move(fp32), std::move(rungs));
}

Status CheckRankLadderRequest(const PlanRequest& request, SearchSpace space, std::vector<int>& ranks) {
  if (request.compressor != "fp32")
    return InvalidArgumentError(
        "--ranks: PowerSGD plans are fp32 plans whose groups may run PowerSGD; got --compressor " + request.compressor +
        ", expected --compressor fp32");
  if (space != SearchSpace::kOptions)
    return InvalidArgumentError(
        "--ranks: only --search-space options offers the powersgd schemes; expected "
        "--search-space options");
  if (request.rank != 0) return InvalidArgumentError("--ranks: give --rank (one plan) or --ranks (a ladder), not both");
  if (ranks.empty()) return InvalidArgumentError("--ranks: empty; expected at least one PowerSGD rank >= 1");
  std::sort(ranks.begin(), ranks.end(), std::greater<>());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 1 || ranks[i] > kMaxPowerSgdRank)
      return InvalidArgumentError("--ranks: out of range; got " + std::to_string(ranks[i]) +
                                  ", expected 1 <= rank <= " + std::to_string(kMaxPowerSgdRank) +
                                  " (the fp32 rung is always added)");
    if (i > 0 && ranks[i] == ranks[i - 1])
      return InvalidArgumentError("--ranks: " + std::to_string(ranks[i]) + " appears twice; expected distinct ranks");
  }
  return Status::Ok();
}

StatusOr<pb::Ladder> MakeRankLadder(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request,
                                    std::vector<int> ranks, const SearchOptions& search) {
  CUPCAKE_RETURN_IF_ERROR(CheckRankLadderRequest(request, search.space, ranks));
  std::vector<std::pair<double, pb::Plan>> rungs;
  PlanRequest at = request;
  for (int rank : ranks) {
    at.rank = rank;
    CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, MakePlan(model, profile, at, search));
    at.device = plan.device();
    const double ratio = PowerSgdRungRatio(plan);
    const std::string which = "--ranks: rank " + std::to_string(rank) + "'s plan";
    if (!RunsPowerSgd(plan))
      return FailedPreconditionError(which +
                                     " runs no group with PowerSGD: it does not pay on this profile; "
                                     "expected at least one powersgd group (leave the rank out)");
    if (!(ratio < 1))
      return FailedPreconditionError(which + " sends no fewer bytes than the dense gradient; got " +
                                     FormatDouble(ratio) + " of them, expected < 1 (leave the rank out)");
    if (!rungs.empty() && !(ratio < rungs.back().first))
      return FailedPreconditionError(which + " sends no fewer bytes than rank " +
                                     std::to_string(rungs.back().second.compressor().rank()) + "'s; got " +
                                     FormatDouble(ratio) + " of the dense bytes, expected < " +
                                     FormatDouble(rungs.back().first) + " (leave one of the ranks out)");
    rungs.emplace_back(ratio, std::move(plan));
  }
  // The fp32 rung: the same search without PowerSGD (with --schemes naming only PowerSGD's, the
  // fusion option alone: the dense plan).
  PlanRequest dense = at;
  dense.rank = 0;
  std::erase_if(dense.schemes, [](const std::string& name) {
    const SchemeInfo* s = FindScheme(name);
    return s != nullptr && s->codec == Codec::kLowRank;
  });
  if (dense.schemes.empty() && !request.schemes.empty()) dense.schemes = {"flat_fp32"};
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan fp32, MakePlan(model, profile, dense, search));
  return Assemble(std::move(fp32), std::move(rungs));
}

}  // namespace cupcake::planner

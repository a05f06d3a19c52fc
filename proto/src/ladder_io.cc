#include "cupcake/proto/ladder_io.h"

#include <google/protobuf/stubs/logging.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake {
namespace {

std::string Rung(int i) { return "rungs[" + std::to_string(i) + "]"; }

void Add(std::string& text, const std::string& origin, const std::string& field, const std::string& problem) {
  text += (text.empty() ? "" : "\n") + origin + ": " + field + ": " + problem;
}

// The problems of rung i > 0 against rung 0 (the model, profile, world and device) and against
// rung i - 1 (the compressor and the order of ratios).
void CheckAgainst(const pb::Ladder& ladder, int i, const std::string& origin, std::string& text) {
  const pb::Plan& first = ladder.rungs(0).plan();
  const pb::Rung& rung = ladder.rungs(i);
  const pb::Plan& plan = rung.plan();
  const std::string f = Rung(i);
  if (plan.model().fingerprint() != first.model().fingerprint())
    Add(text, origin, f + ".plan.model.fingerprint",
        "another model; got " + plan.model().fingerprint() + ", expected " + first.model().fingerprint() +
            " as in rungs[0]");
  if (plan.profile_fingerprint() != first.profile_fingerprint())
    Add(text, origin, f + ".plan.profile_fingerprint",
        "another profile; got " + plan.profile_fingerprint() + ", expected " + first.profile_fingerprint() +
            " as in rungs[0]");
  if (plan.world_size() != first.world_size())
    Add(text, origin, f + ".plan.world_size",
        "another world; got " + std::to_string(plan.world_size()) + ", expected " + std::to_string(first.world_size()) +
            " as in rungs[0]");
  if (plan.device() != first.device())
    Add(text, origin, f + ".plan.device",
        "another device; got " + std::string(Name(plan.device())) + ", expected " + std::string(Name(first.device())) +
            " as in rungs[0]");
  const std::string& name = plan.compressor().name();
  const bool by_rank = IsPowerSgdRung(ladder.rungs(1).plan());
  const CompressorInfo* info = FindCompressor(name);
  if (by_rank) {
    const int32_t rank = plan.compressor().rank();
    const int32_t above = ladder.rungs(i - 1).plan().compressor().rank();
    if (!IsPowerSgdRung(plan))
      Add(text, origin, f + ".plan.compressor",
          "not a PowerSGD rung; got \"" + name + "\" at rank " + std::to_string(rank) +
              ", expected fp32 with a PowerSGD rank as in rungs[1]");
    else if (i > 1 && !(rank < above))
      Add(text, origin, f + ".plan.compressor.rank",
          "not below the rung before; got " + std::to_string(rank) + ", expected < " + std::to_string(above));
  } else if (info == nullptr || !info->uses_ratio) {
    Add(text, origin, f + ".plan.compressor.name",
        "keeps no fraction of the elements; got \"" + name +
            "\", expected topk, randk or dgc, or fp32 with a PowerSGD rank");
  } else if (i > 1 && name != ladder.rungs(1).plan().compressor().name()) {
    Add(text, origin, f + ".plan.compressor.name",
        "another compressor; got \"" + name + "\", expected \"" + ladder.rungs(1).plan().compressor().name() +
            "\" as in rungs[1]");
  }
  const double previous = ladder.rungs(i - 1).ratio();
  if (!(rung.ratio() > 0 && rung.ratio() < 1))
    Add(text, origin, f + ".ratio", "out of range; got " + FormatDouble(rung.ratio()) + ", expected 0 < ratio < 1");
  else if (!(rung.ratio() < previous))
    Add(text, origin, f + ".ratio",
        "not below the rung before; got " + FormatDouble(rung.ratio()) + ", expected < " + FormatDouble(previous));
  if (by_rank) {
    if (IsPowerSgdRung(plan) && rung.ratio() != PowerSgdRungRatio(plan))
      Add(text, origin, f + ".ratio",
          "not the share of the dense gradient's bytes the plan sends; got " + FormatDouble(rung.ratio()) +
              ", expected " + FormatDouble(PowerSgdRungRatio(plan)));
  } else if (plan.compressor().ratio() != rung.ratio()) {
    Add(text, origin, f + ".plan.compressor.ratio",
        "not the rung's ratio; got " + FormatDouble(plan.compressor().ratio()) + ", expected " +
            FormatDouble(rung.ratio()));
  }
}

}  // namespace

bool IsPowerSgdRung(const pb::Plan& plan) { return plan.compressor().name() == "fp32" && plan.compressor().rank() > 0; }

int64_t SentBytes(const pb::Plan& plan) {
  int64_t bytes = 0;
  for (const pb::Group& g : plan.groups()) {
    const SchemeInfo* s = g.options().scheme().empty() ? nullptr : FindScheme(g.options().scheme());
    if (s == nullptr || s->codec != Codec::kLowRank) {
      bytes += g.payload_bytes();
      continue;
    }
    const LowRankSizes z = PowerSgdGroupSizes(plan.model().model(), g.first_tensor(), g.last_tensor(),
                                              plan.compressor().rank(), s->batched);
    bytes += 4 * (z.first_floats + z.second_floats);
  }
  return bytes;
}

double PowerSgdRungRatio(const pb::Plan& plan) {
  int64_t dense = 0;
  for (const pb::Tensor& t : plan.model().model().tensors()) dense += 4 * t.numel();
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", static_cast<double>(SentBytes(plan)) / static_cast<double>(dense));
  return std::strtod(text, nullptr);
}

Status ValidateLadder(const pb::Ladder& ladder, const std::string& origin) {
  std::string text;
  if (ladder.format() != kLadderFileFormat)
    Add(text, origin, "format",
        "unsupported; got \"" + ladder.format() + "\", expected \"" + std::string(kLadderFileFormat) + "\"");
  if (ladder.rungs_size() < 2)
    Add(text, origin, "rungs",
        "too few; got " + std::to_string(ladder.rungs_size()) + ", expected the fp32 rung and at least one ratio");
  for (int i = 0; i < ladder.rungs_size(); ++i) {
    if (Status s = ValidatePlan(ladder.rungs(i).plan(), origin + ": " + Rung(i) + ".plan"); !s.ok())
      text += (text.empty() ? "" : "\n") + s.message();
  }
  if (!text.empty()) return InvalidArgumentError(text);  // the rungs' own fields are needed below
  const pb::Rung& bottom = ladder.rungs(0);
  if (bottom.plan().compressor().name() != "fp32")
    Add(text, origin, "rungs[0].plan.compressor.name",
        "not the dense rung; got \"" + bottom.plan().compressor().name() + "\", expected \"fp32\"");
  if (bottom.plan().compressor().rank() != 0)
    Add(text, origin, "rungs[0].plan.compressor.rank",
        "not the dense rung; got " + std::to_string(bottom.plan().compressor().rank()) + ", expected 0 (no PowerSGD)");
  if (bottom.ratio() != 1)
    Add(text, origin, "rungs[0].ratio", "not the dense rung; got " + FormatDouble(bottom.ratio()) + ", expected 1");
  for (int i = 1; i < ladder.rungs_size(); ++i) CheckAgainst(ladder, i, origin, text);
  return text.empty() ? Status::Ok() : InvalidArgumentError(text);
}

StatusOr<Plans> ParsePlans(std::string_view bytes, const std::string& origin) {
  Plans plans;
  if (FileFormatOf(bytes) != kLadderFileFormat) {
    CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, ParsePlan(bytes, origin));
    pb::Rung* rung = plans.ladder.add_rungs();
    rung->set_ratio(plan.compressor().ratio() > 0 ? plan.compressor().ratio() : 1.0);
    *rung->mutable_plan() = std::move(plan);
    plans.single = true;
    return plans;
  }
  google::protobuf::LogSilencer silence_protobuf_log;
  if (!plans.ladder.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return DataLossError(origin + ": not a valid ladder: corrupt or truncated protobuf; got " +
                         std::to_string(bytes.size()) + " bytes, expected a " + std::string(kLadderFileFormat) +
                         " ladder");
  CUPCAKE_RETURN_IF_ERROR(ValidateLadder(plans.ladder, origin));
  return plans;
}

StatusOr<Plans> ReadPlansFile(const std::string& path) {
  CUPCAKE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return ParsePlans(bytes, path);
}

std::string RungRatios(const pb::Ladder& ladder) {
  std::string text;
  for (const pb::Rung& r : ladder.rungs())
    text += (text.empty() ? "" : ", ") + FormatDouble(r.ratio()) +
            (IsPowerSgdRung(r.plan())                 ? " (rank " + std::to_string(r.plan().compressor().rank()) + ")"
             : r.plan().compressor().name() == "fp32" ? " (fp32)"
                                                      : "");
  return text;
}

StatusOr<const pb::Rung*> FindRung(const pb::Ladder& ladder, double ratio, const std::string& origin) {
  for (const pb::Rung& r : ladder.rungs())
    if (std::abs(r.ratio() - ratio) <= 1e-9 * std::max(r.ratio(), ratio)) return &r;
  return NotFoundError(origin + ": --rung: no rung of ratio " + FormatDouble(ratio) + "; expected one of " +
                       RungRatios(ladder));
}

Status WriteLadderFile(const std::string& path, const pb::Ladder& ladder) {
  return WriteFileAtomic(path, SerializeDeterministic(ladder));
}

}  // namespace cupcake

// Ladder files (docs/FORMATS.md): one complete plan per compression ratio of one compressor (or
// per PowerSGD rank), rungs[0] the dense fp32 plan, for a controller that changes the ratio
// during training. Every
// reader of plan files that can use a ladder reads through ReadPlansFile, which takes a ladder
// or a single plan; ReadPlanFile refuses a ladder by name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake {

inline constexpr std::string_view kLadderFileFormat = "cupcake.ladder.v1";

// What a plan file holds: a ladder, or a single plan as a ladder of one rung (`single`).
struct Plans {
  pb::Ladder ladder;
  bool single = false;
};

// Reads a ladder or a single plan, validated (ValidateLadder, or ValidatePlan). Errors as
// ReadPlanFile's.
StatusOr<Plans> ReadPlansFile(const std::string& path);
StatusOr<Plans> ParsePlans(std::string_view bytes, const std::string& origin);

// The structural checks of a ladder: the format; at least two rungs; every rung's plan valid
// (its messages prefixed `<origin>: rungs[i].plan`); rungs[0] the fp32 plan at ratio 1; the
// others either one compressor that keeps a fraction of the elements, each plan at its rung's
// ratio, or PowerSGD rungs (IsPowerSgdRung) at strictly decreasing ranks, each rung's ratio its
// PowerSgdRungRatio; ratios in (0, 1) strictly decreasing; one model, profile, world size and
// device throughout.
Status ValidateLadder(const pb::Ladder& ladder, const std::string& origin);

// A PowerSGD rung: an fp32 plan with a PowerSGD rank (its options search offered the powersgd
// schemes; `cupcake-plan search --ranks`).
bool IsPowerSgdRung(const pb::Plan& plan);
// The bytes a plan's collectives carry per rank and step: each group's payload_bytes, and for a
// PowerSGD group both allreduces, 4 (p + u + q) (docs/MODEL.md, "PowerSGD").
int64_t SentBytes(const pb::Plan& plan);
// A PowerSGD rung's ratio, 1/CF: SentBytes over the dense gradient's 4 n bytes, rounded to 3
// significant digits (so that `--rung` and `use_ratio` can name it as `show` prints it).
double PowerSgdRungRatio(const pb::Plan& plan);

// The rung whose ratio equals `ratio` (to 1e-9 relative). NotFound naming the ladder's ratios.
StatusOr<const pb::Rung*> FindRung(const pb::Ladder& ladder, double ratio, const std::string& origin);

// "1 (fp32), 0.1, 0.01" or "1 (fp32), 0.08 (rank 4), 0.04 (rank 2)": the ladder's ratios as
// people read them.
std::string RungRatios(const pb::Ladder& ladder);

// Writes the ladder (deterministic serialization) to `path` atomically. Does not validate.
Status WriteLadderFile(const std::string& path, const pb::Ladder& ladder);

}  // namespace cupcake

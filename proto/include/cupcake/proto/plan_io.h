// Plan files (docs/FORMATS.md): the binary .pb the planner writes and the runtime loads, and its
// JSON and text views. Reading validates once, at the boundary: a file that parses is also
// checked for structure (groups cover the model's tensors contiguously, indices in range,
// the embedded model matches its fingerprint, the fields every plan carries are present), so
// a truncated or corrupt file is an error, never a plan with missing parts. Every problem
// found is reported, one per line, shaped `<file>: <field>: <problem>; got <x>, expected <y>`.
//
// Pure functions; files are written atomically (WriteFileAtomic).
#pragma once

#include <string>
#include <string_view>

#include <google/protobuf/message_lite.h>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake {

// The `format` every plan carries (the planner's kPlanFormat).
inline constexpr std::string_view kPlanFileFormat = "cupcake.plan.v1";

// Reads and validates `path`. NotFound for a missing file; DataLoss for an empty, corrupt or
// truncated one; InvalidArgument for a plan that parses but is structurally invalid.
StatusOr<pb::Plan> ReadPlanFile(const std::string& path);

// ReadPlanFile on bytes already read; `origin` prefixes the messages. A ladder
// (cupcake.ladder.v1) is refused by name: ReadPlansFile (ladder_io.h) takes either.
StatusOr<pb::Plan> ParsePlan(std::string_view bytes, const std::string& origin);

// The structural checks ParsePlan applies, for plans made in code.
Status ValidatePlan(const pb::Plan& plan, const std::string& origin);

// Deterministic serialization: the same plan (or ladder) gives the same bytes.
std::string SerializePlan(const pb::Plan& plan);
std::string SerializeDeterministic(const google::protobuf::MessageLite& message);

// The `format` field of a plan or ladder file's bytes (field 1 of both); empty when the bytes
// do not parse as protobuf or carry none.
std::string FileFormatOf(std::string_view bytes);

// Writes SerializePlan(plan) to `path` atomically. Does not validate.
Status WritePlanFile(const std::string& path, const pb::Plan& plan);

// The plan as pretty-printed JSON with the proto field names as written in cupcake.proto and
// every field printed, defaults included (proto3 JSON mapping: 64-bit integers are strings).
std::string PlanToJson(const pb::Plan& plan);

// The plan in protobuf text format, for reading the raw content.
std::string PlanToTextProto(const pb::Plan& plan);

}  // namespace cupcake

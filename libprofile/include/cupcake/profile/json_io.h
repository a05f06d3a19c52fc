// JSON interchange of models (cupcake.model.v1, docs/FORMATS.md) and profiles
// (cupcake.profile.v1, docs/FORMATS.md), and the validation every import goes through.
//
// Parsing validates once, at the boundary, and reports every problem it finds, one per line,
// each shaped `<origin>: <field path>: <problem>; got <value>, expected <constraint>`.
// Writing is deterministic: keys in the order docs/FORMATS.md shows, numbers printed so they read
// back exactly (doubles shortest-round-trip, sizes as integers), pretty-printed.
#pragma once

#include <string>
#include <string_view>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

inline constexpr std::string_view kModelFormat = "cupcake.model.v1";
inline constexpr std::string_view kProfileFormat = "cupcake.profile.v1";

enum class JsonFormat { kModel, kProfile };

// Reads only the document's "format" (the whole text must still be valid JSON).
// `origin` is the file name used as the message prefix.
StatusOr<JsonFormat> DetectJsonFormat(std::string_view json, const std::string& origin);

StatusOr<pb::Model> ParseModelJson(std::string_view json, const std::string& origin);
StatusOr<pb::Profile> ParseProfileJson(std::string_view json, const std::string& origin);

std::string ModelToJson(const pb::Model& model);
std::string ProfileToJson(const pb::Profile& profile);

// The semantic checks ParseModelJson and ParseProfileJson apply, for protos made in code
// (the store runs them on every import). Messages are prefixed by `origin`.
Status ValidateModel(const pb::Model& model, const std::string& origin);
Status ValidateProfile(const pb::Profile& profile, const std::string& origin);
// A curve's key (kind and its op/scope/compressor/device) and metadata, without its points.
Status ValidateCurveKey(const pb::Curve& curve, const std::string& origin);

}  // namespace cupcake::profile

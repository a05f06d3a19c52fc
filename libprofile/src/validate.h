// Internal: the checks behind ValidateModel/ValidateProfile, adding to a shared Problems so
// the JSON parser reports structural and semantic problems together.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "problems.h"

namespace cupcake::profile::internal {

void CheckModel(const pb::Model& model, const std::string& path, Problems& p);
void CheckCurveKey(const pb::Curve& curve, const std::string& path, Problems& p);
void CheckPoint(int64_t size, double us, const std::string& path, Problems& p);
void CheckCurve(const pb::Curve& curve, const std::string& path, Problems& p);
void CheckProfile(const pb::Profile& profile, const std::string& path, Problems& p);

// Views of a names.h list such as DTypeNames(); `joined` must outlive them.
std::vector<std::string_view> SplitNames(const std::string& joined);
std::string Quote(std::string_view s);
const std::vector<std::string_view>& MethodNames();

}  // namespace cupcake::profile::internal

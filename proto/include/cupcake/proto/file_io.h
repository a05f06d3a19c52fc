// Whole-file reads and atomic writes (write a temporary beside the target, then rename), so
// an interrupted write never leaves a half-written file.
#pragma once

#include <string>
#include <string_view>

#include "cupcake/proto/status.h"

namespace cupcake {

// Reads the whole file; NotFound when it does not exist, naming the path.
StatusOr<std::string> ReadFile(const std::string& path);

// Writes `contents` to `path` through `path.tmp.<pid>` and rename(2). "-" writes to stdout.
Status WriteFileAtomic(const std::string& path, std::string_view contents);

}  // namespace cupcake

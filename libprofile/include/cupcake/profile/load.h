// Loading a profile or a model from whatever file the user names.
#pragma once

#include <string>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

// An SQLite profile DB (recognized by its header magic, whatever its extension) through
// ProfileStore, opened without creating; otherwise a cupcake.profile.v1 JSON file, read once
// (a pipe works). A file that is neither is refused naming both formats.
StatusOr<pb::Profile> LoadProfileFile(const std::string& path);

// A cupcake.model.v1 JSON file. An SQLite file is refused with a hint to export the model.
StatusOr<pb::Model> LoadModelFile(const std::string& path);

// Whether `path` is a regular file that starts with SQLite's header magic ("SQLite format
// 3\0"); false when it cannot be read, and for pipes and devices (those are read once, as JSON).
bool IsSqliteFile(const std::string& path);

}  // namespace cupcake::profile

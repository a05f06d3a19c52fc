// Loading a profile or a model from whatever file the user names.
#pragma once

#include <string>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

// An SQLite profile DB (recognized by its header magic, whatever its extension) through
// ProfileStore, opened without creating; otherwise a cupcake.profile.v1 JSON file.
StatusOr<pb::Profile> LoadProfileFile(const std::string& path);

// A cupcake.model.v1 JSON file. An SQLite file is refused with a hint to export the model.
StatusOr<pb::Model> LoadModelFile(const std::string& path);

// Whether the file starts with SQLite's header magic ("SQLite format 3\0"); false when it
// cannot be read.
bool IsSqliteFile(const std::string& path);

}  // namespace cupcake::profile

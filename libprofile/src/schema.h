// Internal: the profile DB's schema, its version (PRAGMA user_version) and the migrations that
// bring an older DB up to date. docs/FORMATS.md describes the tables.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "cupcake/proto/status.h"

namespace cupcake::profile::internal {

// PRAGMA application_id of a cupcake profile: "CUPC".
inline constexpr int32_t kApplicationId = 0x43555043;

struct Migration {
  int to_version;  // user_version after this step
  std::string_view sql;  // run inside the migration's transaction
};

// The steps from an empty DB (version 0) to the current schema, in order.
std::span<const Migration> Migrations();
// The current schema version: the last migration's.
int SchemaVersion();

// Runs, in one transaction, every migration whose to_version exceeds the DB's user_version,
// then sets user_version and application_id. A failure leaves the DB as it was.
Status Migrate(sqlite3* db, const std::string& path, std::span<const Migration> migrations);

// PRAGMA user_version / application_id.
StatusOr<int64_t> PragmaInt(sqlite3* db, const std::string& path, std::string_view pragma);

}  // namespace cupcake::profile::internal

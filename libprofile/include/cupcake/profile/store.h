// The SQLite profile store (docs/FORMATS.md): one DB file holds one cluster's profile (cluster
// facts, cost curves) and the models measured on it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

struct sqlite3;

namespace cupcake::profile {

// ProfileStore: an open profile DB.
//
// Ownership: owns its sqlite3 connection (closed by the destructor); move-only.
// Thread-safety: one ProfileStore must be used by one thread at a time. Several ProfileStores
// (in threads or processes) may open the same file: the DB runs in WAL mode, so readers see
// the last committed state while a writer writes, and a writer waits up to the busy timeout
// (Open's `busy_timeout_ms`, default kBusyTimeoutMs) for another writer before failing with
// Unavailable, naming the DB and the timeout, having written nothing.
// Durability: every mutating call is one transaction; a failed or interrupted call (error,
// crash, kill) leaves the DB as it was before the call.
// Validation: imports validate their input (ValidateProfile/ValidateModel); Load validates
// what it reads and reports a DB edited into an invalid state as DataLoss.
class ProfileStore {
 public:
  static constexpr int kBusyTimeoutMs = 10000;

  // Opens `path`; with `create`, a missing file becomes an empty profile DB (made as
  // OpenOrCreate makes one). Refuses files that are not SQLite, SQLite DBs that are not cupcake
  // profiles, DBs with a newer schema version (FailedPrecondition) and corrupt or truncated DBs
  // (DataLoss). Migrates an older schema.
  // `busy_timeout_ms` (>= 0): how long a write waits for another writer's lock.
  static StatusOr<ProfileStore> Open(const std::string& path, bool create, int busy_timeout_ms = kBusyTimeoutMs);

  // Opens `path` for a caller that only reads it (planning, simulating, exporting): opening
  // writes nothing, not even to migrate it (an older schema is migrated in a copy in memory, which
  // the store then reads) or to switch its journal mode. Refuses what Open refuses.
  static StatusOr<ProfileStore> OpenForReading(const std::string& path, int busy_timeout_ms = kBusyTimeoutMs);

  // Opens `path` and runs `write` on it; a missing `path` is created atomically: `write` fills
  // a fresh DB under a private temporary name beside `path`, which is linked into place only
  // when `write` succeeded and no other process created `path` meanwhile (if one did, `write`
  // runs on that DB instead, waiting for its lock as usual). So a failed `write` leaves no new
  // file behind, concurrent creators never see a half-made DB, and no file this process did
  // not create is ever removed, but for the temporaries of creations that died (unlocked, over a
  // minute old), which the next OpenOrCreate of `path` removes. Returns the store open on `path`.
  using Writer = std::function<Status(ProfileStore&)>;
  static StatusOr<ProfileStore> OpenOrCreate(const std::string& path, int busy_timeout_ms, const Writer& write);

  ProfileStore(ProfileStore&& other) noexcept;
  ProfileStore& operator=(ProfileStore&& other) noexcept;
  ProfileStore(const ProfileStore&) = delete;
  ProfileStore& operator=(const ProfileStore&) = delete;
  ~ProfileStore();

  const std::string& path() const { return path_; }
  // The schema version this build writes (PRAGMA user_version).
  static int SchemaVersion();

  // Imports a profile (cluster, curves, embedded models).
  // - Empty DB: stores it.
  // - The DB holds another cluster (other name): AlreadyExists, unless `replace`, which drops
  //   everything the DB holds (cluster, curves, models) first.
  // - Same cluster: its facts (nodes, devices_per_node, device, interconnect, network) must
  //   agree unless `replace`; source and meta are updated. Without `replace`, a curve or model
  //   the DB already has is AlreadyExists and new ones are appended; with `replace`, the DB's
  //   curves become exactly the imported ones and same-named models are replaced.
  Status ImportProfile(const pb::Profile& profile, bool replace);
  // Adds a measured model. FailedPrecondition when the DB holds no profile yet; AlreadyExists
  // when a model of that name is present, unless `replace` (it then keeps its position).
  Status ImportModel(const pb::Model& model, bool replace);

  // The profile: cluster, curves in import order, models in import order.
  // FailedPrecondition when the DB holds no profile yet.
  StatusOr<pb::Profile> Load() const;
  // NotFound names the DB and lists its models.
  StatusOr<pb::Model> LoadModel(const std::string& name) const;
  StatusOr<std::vector<std::string>> ModelNames() const;
  // The cluster, or nullopt for a DB that holds no profile yet.
  StatusOr<std::optional<pb::Cluster>> LoadCluster() const;

  // For the profiler, which commits each point as it is measured. In one transaction: creates
  // the curve of `key_and_metadata`'s key (kind, op/scope or compressor/device) when missing,
  // updates its metadata (method, warmup, iters, wrong) where given, and adds the point; its
  // points are ignored. AlreadyExists when the curve has a point at `size`, unless `replace`,
  // which overwrites it; FailedPrecondition when the DB holds no profile (cluster) yet.
  Status AddPoint(const pb::Curve& key_and_metadata, int64_t size, double us, bool replace = false);
  // Sets entries of the cluster's meta (others keep their values), in one transaction.
  // FailedPrecondition when the DB holds no profile (cluster) yet.
  Status SetClusterMeta(const std::map<std::string, std::string>& entries);
  // Updates the metadata (method, warmup, iters, wrong) of an existing curve where given, in
  // one transaction. NotFound when the DB has no such curve.
  Status UpdateCurveMetadata(const pb::Curve& key_and_metadata);
  // The sizes the curve of `key`'s key has, ascending; empty when the curve is missing.
  StatusOr<std::vector<int64_t>> PointSizes(const pb::Curve& key) const;

 private:
  ProfileStore(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  // Opens an existing file, or creates `path` in place when `create_in_place` (for private
  // temporaries only); `reading`: as OpenForReading.
  static StatusOr<ProfileStore> OpenFile(const std::string& path, bool create_in_place, int busy_timeout_ms,
                                         bool reading = false);
  // Makes `path` with `write` through a private temporary and link(2); AlreadyExists when
  // another process created `path` first (nothing of ours is left then).
  static Status CreateAtomically(const std::string& path, int busy_timeout_ms, const Writer& write);

  sqlite3* db_ = nullptr;
  std::string path_;
  int busy_timeout_ms_ = kBusyTimeoutMs;
};

}  // namespace cupcake::profile

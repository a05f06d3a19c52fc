// Where the profiler puts what it measures (a fake at every hardware seam, docs/ARCHITECTURE.md): the
// SQLite store, or memory for tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

class ProfileStore;

// ProfileSink: receives measured points one at a time, each committed before the call returns,
// so an interrupted sweep loses nothing that finished. Not thread-safe.
class ProfileSink {
 public:
  virtual ~ProfileSink() = default;
  // The sizes already measured for the curve of `key`'s key, ascending (empty if none).
  virtual StatusOr<std::vector<int64_t>> PointSizes(const pb::Curve& key) = 0;
  // Adds a point, creating the curve and setting its metadata (method, warmup, iters, wrong)
  // where given. With `replace`, a point present at `size` is overwritten; without, it is
  // AlreadyExists.
  virtual Status AddPoint(const pb::Curve& key_and_metadata, int64_t size, double us, bool replace) = 0;
  // Sets the metadata of an existing curve; NotFound when the curve has no points yet.
  virtual Status UpdateCurveMetadata(const pb::Curve& key_and_metadata) = 0;
};

// Writes through to a ProfileStore (which it does not own).
class StoreSink final : public ProfileSink {
 public:
  explicit StoreSink(ProfileStore& store) : store_(store) {}
  StatusOr<std::vector<int64_t>> PointSizes(const pb::Curve& key) override;
  Status AddPoint(const pb::Curve& key_and_metadata, int64_t size, double us, bool replace) override;
  Status UpdateCurveMetadata(const pb::Curve& key_and_metadata) override;

 private:
  ProfileStore& store_;
};

// Keeps curves in memory, keyed by CurveKey. `fail_after` (>= 0) makes the AddPoint call after
// that many successful ones fail with Unavailable, to test interrupted sweeps.
class MemorySink final : public ProfileSink {
 public:
  StatusOr<std::vector<int64_t>> PointSizes(const pb::Curve& key) override;
  Status AddPoint(const pb::Curve& key_and_metadata, int64_t size, double us, bool replace) override;
  Status UpdateCurveMetadata(const pb::Curve& key_and_metadata) override;

  // The curves, with points sorted by size.
  std::vector<pb::Curve> Curves() const;
  int64_t added() const { return added_; }
  int64_t fail_after = -1;

 private:
  std::map<std::string, pb::Curve> curves_;
  int64_t added_ = 0;
};

}  // namespace cupcake::profile

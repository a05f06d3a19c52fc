// A profile DB locked by another writer: the store waits for the lock timeout, then the
// commands fail with a message naming the DB and the timeout, and nothing is half-written.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <sstream>

#include "commands.h"
#include "cupcake/profile/json_io.h"
#include "cupcake/profile/store.h"
#include "test_files.h"

namespace cupcake::profile_cli {
namespace {

// Another connection (as another process would) holding a write transaction with an
// uncommitted change in it.
class OtherWriter {
 public:
  explicit OtherWriter(const std::string& db) {
    EXPECT_EQ(sqlite3_open(db.c_str(), &db_), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE; UPDATE points SET us = us + 1000;", nullptr, nullptr, nullptr),
              SQLITE_OK)
        << sqlite3_errmsg(db_);
  }
  ~OtherWriter() {
    sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
  }

 private:
  sqlite3* db_ = nullptr;
};

KernelsOptions Tiny(const std::string& db) {
  KernelsOptions o;
  o.db = db;
  o.min_elements = 256;
  o.max_elements = 512;
  o.warmup = 0;
  o.iters = 1;
  o.compressors = {"fp32"};
  o.world_size = 2;
  return o;
}

std::string Snapshot(const std::string& db) {
  auto store = profile::ProfileStore::Open(db, false);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return "";
  auto p = store->Load();
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? p->DebugString() : "";
}

std::string Locked(const std::string& db, const std::string& secs) {
  return db + ": locked by another writer; waited " + secs +
         " s (the lock timeout) and gave up, writing nothing; expected the other writer to finish sooner (retry, "
         "or allow a longer lock timeout)";
}

TEST(LockedDb, KernelsWaitsThenFailsNamingTheDbAndTheTimeout) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  std::ostringstream out;
  ASSERT_TRUE(RunKernels(Tiny(db), out).ok());
  const std::string before = Snapshot(db);
  {
    OtherWriter other(db);
    KernelsOptions o = Tiny(db);
    o.force = true;
    o.lock_timeout_s = 0.2;
    EXPECT_EQ(RunKernels(o, out).message(), Locked(db, "0.2"));
  }
  EXPECT_EQ(Snapshot(db), before);
}

TEST(LockedDb, StoreWritesFailWholeAndReadsGoOn) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  std::ostringstream out;
  ASSERT_TRUE(RunKernels(Tiny(db), out).ok());
  const std::string before = Snapshot(db);
  {
    OtherWriter other(db);
    auto store = profile::ProfileStore::Open(db, false, /*busy_timeout_ms=*/50);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    pb::Curve key;
    key.set_kind(pb::COPY);
    key.set_copy_op(pb::PACK);
    key.set_device(pb::CPU);
    Status s = store->AddPoint(key, 1 << 20, 5.0);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), Locked(db, "0.05"));
    // A reader sees the last committed state meanwhile (WAL).
    auto sizes = store->PointSizes(key);
    ASSERT_TRUE(sizes.ok()) << sizes.status().ToString();
    EXPECT_EQ(*sizes, (std::vector<int64_t>{1024, 2048}));
    EXPECT_EQ(Snapshot(db), before);
  }
  EXPECT_EQ(Snapshot(db), before);
}

TEST(LockedDb, ImportKeepsTheDbAndSaysWhy) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  std::ostringstream out;
  ASSERT_TRUE(RunKernels(Tiny(db), out).ok());
  const std::string before = Snapshot(db);
  auto exported = profile::ProfileStore::Open(db, false)->Load();
  ASSERT_TRUE(exported.ok());
  const std::string json = dir.File("p.json");
  ASSERT_TRUE(WriteFileAtomic(json, profile::ProfileToJson(*exported)).ok());
  {
    OtherWriter other(db);
    ImportOptions o{db, json, /*replace=*/true};
    o.lock_timeout_s = 0;
    EXPECT_EQ(RunImport(o, out).message(), Locked(db, "0"));
  }
  EXPECT_EQ(Snapshot(db), before);
}

TEST(LockedDb, LockTimeoutIsChecked) {
  testing::TempDir dir;
  std::ostringstream out;
  KernelsOptions o = Tiny(dir.File("p.db"));
  o.lock_timeout_s = -1;
  EXPECT_EQ(RunKernels(o, out).message(), "--lock-timeout: out of range; got -1, expected 0 <= seconds <= 86400");
  std::ostringstream sout, serr;
  tools::Invocation inv{"cupcake-profile", "kernels", {"--db", dir.File("q.db"), "--lock-timeout", "1e9"}, sout, serr};
  EXPECT_EQ(KernelsMain(inv), tools::kExitUsage);
  EXPECT_NE(serr.str().find("--lock-timeout: out of range; got 1e+09, expected 0 <= seconds <= 86400"),
            std::string::npos)
      << serr.str();
}

}  // namespace
}  // namespace cupcake::profile_cli

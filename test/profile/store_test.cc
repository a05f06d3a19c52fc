#include "cupcake/profile/store.h"

#include <google/protobuf/util/message_differencer.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "cupcake/profile/json_io.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/names.h"
#include "schema.h"
#include "test_files.h"

namespace cupcake::profile {
namespace {

using google::protobuf::util::MessageDifferencer;
using testing::ReadExample;
using testing::TempDir;

pb::Profile ExampleProfile() {
  auto p = ParseProfileJson(ReadExample("profiles/v100-8x8-pcie-25g.json"), "v100.json");
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return *p;
}

pb::Model ExampleModel(const std::string& name) {
  auto m = ParseModelJson(ReadExample("models/" + name + ".json"), name);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

pb::Profile SmallProfile(const std::string& cluster) {
  auto p = ParseProfileJson(R"({"format": "cupcake.profile.v1",
      "cluster": {"name": ")" + cluster +
                                R"(", "nodes": 2, "devices_per_node": 4, "meta": {"k": "v"}},
      "curves": [{"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, 10], [1024, 20.5]]}]})",
                            "small.json");
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return *p;
}

// Runs SQL on the file through a separate raw connection.
void RawExec(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

std::string RawQuery(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  std::string out;
  while (sqlite3_step(st) == SQLITE_ROW) {
    for (int c = 0; c < sqlite3_column_count(st); ++c) {
      const unsigned char* t = sqlite3_column_text(st, c);
      out += (c ? "|" : "") + std::string(t ? reinterpret_cast<const char*>(t) : "NULL");
    }
    out += "\n";
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class ProfileStoreTest : public ::testing::Test {
 protected:
  ProfileStore OpenStore(bool create = true) {
    auto s = ProfileStore::Open(db_, create);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s).value();
  }
  std::string OpenError(bool create = false) {
    auto s = ProfileStore::Open(db_, create);
    EXPECT_FALSE(s.ok());
    return s.ok() ? "" : s.status().message();
  }
  pb::Profile Load(const ProfileStore& s) {
    auto p = s.Load();
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? *p : pb::Profile();
  }
  // Makes db_ an empty DB of an older schema: the first `version` migration steps.
  void MakeDbAtVersion(int version) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(db_.c_str(), &db), SQLITE_OK);
    ASSERT_TRUE(internal::Migrate(db, db_, internal::Migrations().first(version)).ok());
    sqlite3_close(db);
  }

  TempDir dir_;
  std::string db_ = dir_.File("p.db");
};

TEST_F(ProfileStoreTest, JsonToDbToJsonIsIdentical) {
  pb::Profile profile = ExampleProfile();
  *profile.add_models() = ExampleModel("resnet50");
  *profile.add_models() = ExampleModel("ncf");
  {
    ProfileStore store = OpenStore();
    ASSERT_TRUE(store.ImportProfile(profile, false).ok());
  }
  ProfileStore store = OpenStore(false);  // reopened: it was written to the file
  pb::Profile loaded = Load(store);
  EXPECT_TRUE(MessageDifferencer::Equals(loaded, profile));
  EXPECT_EQ(ProfileToJson(loaded), ProfileToJson(profile));
}

TEST_F(ProfileStoreTest, SqliteShowsReadableNamesAndTheSchemaVersion) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(ExampleProfile(), false).ok());
  ASSERT_TRUE(store.ImportModel(ExampleModel("vgg16"), false).ok());
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "7\n");
  EXPECT_EQ(ProfileStore::SchemaVersion(), 7);
  EXPECT_EQ(RawQuery(db_, "PRAGMA application_id"), std::to_string(internal::kApplicationId) + "\n");
  EXPECT_EQ(RawQuery(db_, "PRAGMA journal_mode"), "wal\n");
  EXPECT_EQ(RawQuery(db_, "SELECT kind, op, scope, compressor, device FROM curves ORDER BY position LIMIT 1"),
            "comm|allreduce|global||\n");
  EXPECT_EQ(RawQuery(db_,
                     "SELECT kind, compressor, device, size, us FROM curve_points "
                     "WHERE kind = 'encode' AND compressor = 'topk' AND device = 'gpu' AND size = 1"),
            "encode|topk|gpu|1|356.0\n");
  EXPECT_EQ(RawQuery(db_,
                     "SELECT t.name, t.numel, t.dtype FROM tensors t JOIN models m ON m.id = t.model_id "
                     "WHERE m.name = 'vgg16' AND t.position = 0"),
            "classifier.6.bias|1000|float32\n");
}

TEST_F(ProfileStoreTest, RefusesAnotherClusterUnlessReplace) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  ASSERT_TRUE(store.ImportModel(ExampleModel("ncf"), false).ok());
  Status s = store.ImportProfile(SmallProfile("b"), false);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), db_ +
                             ": cluster.name: the DB holds another cluster's profile; got \"b\", expected \"a\" "
                             "(one DB holds one profile; replace not requested)");
  EXPECT_EQ(Load(store).cluster().name(), "a");

  ASSERT_TRUE(store.ImportProfile(SmallProfile("b"), true).ok());
  pb::Profile loaded = Load(store);
  EXPECT_TRUE(MessageDifferencer::Equals(loaded, SmallProfile("b")));  // ncf was a's: dropped
}

TEST_F(ProfileStoreTest, SameClusterMergesNewCurvesAndRefusesPresentOnes) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  pb::Profile before = Load(store);

  Status again = store.ImportProfile(SmallProfile("a"), false);
  EXPECT_EQ(again.message(), db_ +
                                 ": curves: already present; got \"comm allreduce global\", expected a curve the "
                                 "DB does not hold (replace not requested)");

  pb::Profile other_facts = SmallProfile("a");
  other_facts.mutable_cluster()->set_nodes(3);
  EXPECT_EQ(store.ImportProfile(other_facts, false).message(),
            db_ + ": cluster.nodes: differs from the DB's; got 3, expected 2 (replace not requested)");
  EXPECT_TRUE(MessageDifferencer::Equals(Load(store), before));

  pb::Profile more = SmallProfile("a");
  more.mutable_curves(0)->set_scope(pb::INTRA);
  ASSERT_TRUE(store.ImportProfile(more, false).ok());
  pb::Profile merged = Load(store);
  ASSERT_EQ(merged.curves_size(), 2);
  EXPECT_EQ(merged.curves(0).scope(), pb::GLOBAL);
  EXPECT_EQ(merged.curves(1).scope(), pb::INTRA);

  // With replace, the DB's curves become exactly the imported ones.
  ASSERT_TRUE(store.ImportProfile(more, true).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(Load(store), more));
}

// The profiler records what it measured after a sweep (comm.load) into the cluster's meta: the
// entries given are set, the others keep their values; a DB without a profile refuses.
TEST_F(ProfileStoreTest, SetClusterMetaSetsEntriesAndKeepsTheOthers) {
  ProfileStore store = OpenStore();
  EXPECT_EQ(store.SetClusterMeta({{"comm.load", "x"}}).code(), StatusCode::kFailedPrecondition);
  pb::Profile profile = SmallProfile("a");
  (*profile.mutable_cluster()->mutable_meta())["comm.date"] = "d";
  (*profile.mutable_cluster()->mutable_meta())["comm.load"] = "old";
  ASSERT_TRUE(store.ImportProfile(profile, false).ok());
  ASSERT_TRUE(store.SetClusterMeta({{"comm.load", "other work 0.10 of 2 cores"}, {"kernels.load", "k"}}).ok());
  ProfileStore reopened = OpenStore(false);
  const pb::Profile loaded = Load(reopened);
  const auto& meta = loaded.cluster().meta();
  EXPECT_EQ(meta.size(), profile.cluster().meta().size() + 1);  // kernels.load added
  EXPECT_EQ(meta.at("comm.date"), "d");
  EXPECT_EQ(meta.at("comm.load"), "other work 0.10 of 2 cores");
  EXPECT_EQ(meta.at("kernels.load"), "k");
}

TEST_F(ProfileStoreTest, ModelsNeedAProfileAndAreNotSilentlyReplaced) {
  ProfileStore store = OpenStore();
  Status s = store.ImportModel(ExampleModel("ncf"), false);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), db_ +
                             ": holds no profile yet; got model \"ncf\", expected a cupcake.profile.v1 import "
                             "first (a model belongs to a cluster)");
  EXPECT_EQ(store.Load().status().message(),
            db_ + ": holds no profile yet; expected a cupcake.profile.v1 import first");

  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  ASSERT_TRUE(store.ImportModel(ExampleModel("ncf"), false).ok());
  ASSERT_TRUE(store.ImportModel(ExampleModel("vgg16"), false).ok());
  pb::Model changed = ExampleModel("ncf");
  changed.mutable_tensors(0)->set_backward_us(99);
  changed.set_forward_us(7);
  s = store.ImportModel(changed, false);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), db_ +
                             ": models: already present; got \"ncf\", expected a model the DB does not hold "
                             "(replace not requested)");
  ASSERT_TRUE(store.ImportModel(changed, true).ok());
  auto names = store.ModelNames();
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, (std::vector<std::string>{"ncf", "vgg16"}));  // kept its position
  auto loaded = store.LoadModel("ncf");
  ASSERT_TRUE(loaded.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(*loaded, changed));
}

TEST_F(ProfileStoreTest, LoadModelNotFoundListsTheModels) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  EXPECT_EQ(store.LoadModel("ncf").status().message(),
            db_ + ": models: no such model; got \"ncf\", expected one of (none: the DB holds no models)");
  ASSERT_TRUE(store.ImportModel(ExampleModel("resnet50"), false).ok());
  ASSERT_TRUE(store.ImportModel(ExampleModel("vgg16"), false).ok());
  Status s = store.LoadModel("resnet5").status();
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.message(), db_ +
                             ": models: no such model; got \"resnet5\" (did you mean 'resnet50'?), expected one "
                             "of resnet50, vgg16");
}

TEST_F(ProfileStoreTest, FailedImportLeavesThePreviousState) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  ASSERT_TRUE(store.ImportModel(ExampleModel("ncf"), false).ok());
  pb::Profile before = Load(store);
  // A new curve (written first), then a model the DB has: the whole import rolls back.
  pb::Profile p = SmallProfile("a");
  p.mutable_curves(0)->set_comm_op(pb::ALLGATHER);
  *p.add_models() = ExampleModel("ncf");
  EXPECT_EQ(store.ImportProfile(p, false).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(MessageDifferencer::Equals(Load(store), before));
  // An invalid profile never reaches the DB.
  p.mutable_curves(0)->mutable_points(0)->set_us(-1);
  EXPECT_EQ(store.ImportProfile(p, true).message(),
            "profile \"a\": curves[0].points[0].us: must not be negative; got -1, expected >= 0");
  EXPECT_TRUE(MessageDifferencer::Equals(Load(store), before));
}

TEST_F(ProfileStoreTest, KilledWriterLeavesThePreviousState) {
  {
    ProfileStore store = OpenStore();
    ASSERT_TRUE(store.ImportProfile(ExampleProfile(), false).ok());
  }
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A writer that dies mid-transaction, after deleting and rewriting rows.
    sqlite3* db = nullptr;
    sqlite3_open(db_.c_str(), &db);
    sqlite3_exec(db, "BEGIN IMMEDIATE; DELETE FROM points; UPDATE cluster SET nodes = 99;", nullptr, nullptr, nullptr);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ProfileStore store = OpenStore(false);
  EXPECT_TRUE(MessageDifferencer::Equals(Load(store), ExampleProfile()));
}

TEST_F(ProfileStoreTest, ReaderSeesTheLastCommitWhileAWriterWrites) {
  ProfileStore reader = OpenStore();
  ASSERT_TRUE(reader.ImportProfile(SmallProfile("a"), false).ok());
  sqlite3* writer = nullptr;
  ASSERT_EQ(sqlite3_open(db_.c_str(), &writer), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(writer, "BEGIN IMMEDIATE; UPDATE cluster SET nodes = 5;", nullptr, nullptr, nullptr),
            SQLITE_OK);
  EXPECT_EQ(Load(reader).cluster().nodes(), 2);  // not blocked, not dirty
  ASSERT_EQ(sqlite3_exec(writer, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(writer);
  EXPECT_EQ(Load(reader).cluster().nodes(), 5);
}

TEST_F(ProfileStoreTest, AddPointCommitsEachPointAndSkipsNone) {
  ProfileStore store = OpenStore();
  pb::Curve key;
  key.set_kind(pb::ENCODE);
  key.set_compressor("topk");
  key.set_device(pb::GPU);
  EXPECT_EQ(store.AddPoint(key, 4, 1.0).message(),
            db_ + ": holds no profile yet; expected a cupcake.profile.v1 import first");
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());

  auto sizes = store.PointSizes(key);
  ASSERT_TRUE(sizes.ok());
  EXPECT_TRUE(sizes->empty());
  key.set_method("event");
  key.set_iters(20);
  ASSERT_TRUE(store.AddPoint(key, 1024, 30.25).ok());
  key.clear_method();
  key.set_wrong(1);
  ASSERT_TRUE(store.AddPoint(key, 16, 3.5).ok());
  // Another store on the same file (as another process would) sees the committed points.
  ProfileStore other = OpenStore(false);
  sizes = other.PointSizes(key);
  ASSERT_TRUE(sizes.ok());
  EXPECT_EQ(*sizes, (std::vector<int64_t>{16, 1024}));

  Status dup = store.AddPoint(key, 16, 4.0);
  EXPECT_EQ(dup.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(dup.message(), db_ +
                               ": curve \"encode topk gpu\": point already present; got size 16 again, expected a "
                               "size not measured yet");

  pb::Profile loaded = Load(other);
  ASSERT_EQ(loaded.curves_size(), 2);
  const pb::Curve& c = loaded.curves(1);
  EXPECT_EQ(c.method(), "event");  // kept: the second call gave none
  EXPECT_EQ(c.iters(), 20);
  EXPECT_EQ(c.wrong(), 1);
  ASSERT_EQ(c.points_size(), 2);
  EXPECT_EQ(c.points(0).size(), 16);
  EXPECT_EQ(c.points(0).us(), 3.5);
  EXPECT_EQ(c.points(1).us(), 30.25);

  pb::Curve bad;
  bad.set_kind(pb::ENCODE);
  bad.set_compressor("topkk");
  EXPECT_EQ(store.AddPoint(bad, -1, 1.0).message(),
            db_ +
                ": AddPoint: compressor: unknown compressor; got \"topkk\" (did you mean 'topk'?), expected one of "
                "fp32, fp16, topk, randk, dgc, qsgd, signsgd, efsignsgd, signum, terngrad, onebit, zen, nonzero or powersgd\n" +
                db_ + ": AddPoint: device: missing; expected one of gpu, cpu\n" + db_ +
                ": AddPoint: point.size: must be positive; got -1, expected > 0");
}

TEST_F(ProfileStoreTest, RefusesFilesThatAreNotCupcakeProfiles) {
  EXPECT_EQ(OpenError(), db_ + ": no such profile DB");
  { std::ofstream(db_) << ReadExample("models/ncf.json"); }
  EXPECT_EQ(OpenError(), db_ +
                             ": not a cupcake profile DB; got a file starting with '{. \"format\":', expected an "
                             "SQLite database (a JSON file? import it with cupcake-profile import)");
  std::filesystem::remove(db_);
  RawExec(db_, "CREATE TABLE notes (text TEXT)");
  EXPECT_EQ(OpenError(true), db_ +
                                 ": not a cupcake profile DB; got an SQLite DB with application_id 0x00000000 and "
                                 "1 schema objects, expected application_id 0x43555043");
}

TEST_F(ProfileStoreTest, RefusesANewerSchema) {
  { ProfileStore store = OpenStore(); }
  RawExec(db_, "PRAGMA user_version = 9");
  Status s = ProfileStore::Open(db_, false).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), db_ +
                             ": schema version too new; got 9, expected <= 7 (written by a newer cupcake; use that "
                             "one)");
}

TEST_F(ProfileStoreTest, RefusesATruncatedDb) {
  {
    ProfileStore store = OpenStore();
    ASSERT_TRUE(store.ImportProfile(ExampleProfile(), false).ok());
  }
  auto size = std::filesystem::file_size(db_);
  ASSERT_GT(size, 8192u);
  std::filesystem::resize_file(db_, size / 2);
  Status s = ProfileStore::Open(db_, false).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), db_ + ": truncated or damaged SQLite file; got " + std::to_string(size / 2) +
                             " bytes, expected whole pages of 4096 bytes, at least " + std::to_string(size));

  // One byte short: SQLite alone would read the last page short and return changed values.
  std::filesystem::resize_file(db_, size);
  std::filesystem::resize_file(db_, size - 1);
  EXPECT_EQ(OpenError(), db_ + ": truncated or damaged SQLite file; got " + std::to_string(size - 1) +
                             " bytes, expected whole pages of 4096 bytes, at least " + std::to_string(size));

  std::filesystem::resize_file(db_, 40);
  EXPECT_EQ(OpenError(), db_ + ": truncated SQLite file; got 40 bytes, expected at least a 100-byte header");
}

TEST_F(ProfileStoreTest, MigratesStepByStepInOneTransaction) {
  {
    ProfileStore store = OpenStore();
    ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(db_.c_str(), &db), SQLITE_OK);
  // The DB is at version 7: step 7 is skipped, 8 and 9 run in one transaction.
  const internal::Migration failing[] = {
      {7, "CREATE TABLE x (a)"}, {8, "ALTER TABLE models ADD COLUMN note TEXT"}, {9, "THIS IS NOT SQL"}};
  Status s = internal::Migrate(db, db_, failing);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.message().starts_with(db_ + ": migration to schema version 9 failed: ")) << s.message();
  EXPECT_EQ(*internal::PragmaInt(db, db_, "user_version"), 7);  // step 8 rolled back too
  const internal::Migration next[] = {{7, "CREATE TABLE x (a)"}, {8, "ALTER TABLE models ADD COLUMN note TEXT"}};
  ASSERT_TRUE(internal::Migrate(db, db_, next).ok());
  EXPECT_EQ(*internal::PragmaInt(db, db_, "user_version"), 8);
  sqlite3_close(db);
  EXPECT_EQ(RawQuery(db_, "SELECT count(*) FROM pragma_table_info('models') WHERE name = 'note'"), "1\n");
  EXPECT_EQ(RawQuery(db_, "SELECT count(*) FROM sqlite_schema WHERE name = 'x'"), "0\n");  // step 1 was done
}

// A version 1 DB (before comm curves had a dtype) opens migrated: every curve and point kept,
// each comm curve a float32 one; then a float16 curve of the same collective can join it.
TEST_F(ProfileStoreTest, MigratesAVersion1DbKeepingEveryPoint) {
  ASSERT_NO_FATAL_FAILURE(MakeDbAtVersion(1));
  RawExec(db_,
          "INSERT INTO cluster (id, name, nodes, devices_per_node) VALUES (1, 'old', 2, 4);"
          "INSERT INTO curves (id, position, kind, op, scope) VALUES (7, 0, 'comm', 'allreduce', 'global');"
          "INSERT INTO points (curve_id, size, us) VALUES (7, 4, 10.0), (7, 1024, 20.5);");
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "1\n");
  ProfileStore store = OpenStore(false);
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "7\n");
  EXPECT_EQ(RawQuery(db_, "SELECT kind, op, scope, dtype, size, us FROM curve_points"),
            "comm|allreduce|global||4|10.0\ncomm|allreduce|global||1024|20.5\n");
  pb::Curve half;
  half.set_kind(pb::COMM);
  half.set_comm_op(pb::ALLREDUCE);
  half.set_scope(pb::GLOBAL);
  half.set_dtype(pb::FLOAT16);
  ASSERT_TRUE(store.AddPoint(half, 1024, 12.0).ok());
  pb::Profile loaded = Load(store);
  ASSERT_EQ(loaded.curves_size(), 2);
  EXPECT_EQ(CurveKey(loaded.curves(0)), "comm allreduce global");
  EXPECT_EQ(loaded.curves(0).points_size(), 2);
  EXPECT_EQ(CurveKey(loaded.curves(1)), "comm allreduce global float16");
}

// A version 2 DB (before kernel curves had a ratio) opens migrated: its topk curve keeps every
// point and reads without a ratio; curves of the same compressor at recorded ratios join it.
TEST_F(ProfileStoreTest, MigratesAVersion2DbKeepingEveryPoint) {
  ASSERT_NO_FATAL_FAILURE(MakeDbAtVersion(2));
  RawExec(db_,
          "INSERT INTO cluster (id, name, nodes, devices_per_node) VALUES (1, 'old', 2, 1);"
          "INSERT INTO curves (id, position, kind, compressor, device) VALUES (3, 0, 'decode', 'topk', 'cpu');"
          "INSERT INTO points (curve_id, size, us) VALUES (3, 1024, 5.5), (3, 4096, 9.0);");
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "2\n");
  ProfileStore store = OpenStore(false);
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "7\n");
  EXPECT_EQ(RawQuery(db_, "SELECT kind, compressor, device, ratio, size, us FROM curve_points"),
            "decode|topk|cpu|0.0|1024|5.5\ndecode|topk|cpu|0.0|4096|9.0\n");
  pb::Curve tenth;
  tenth.set_kind(pb::DECODE);
  tenth.set_compressor("topk");
  tenth.set_device(pb::CPU);
  tenth.set_ratio(0.001);
  ASSERT_TRUE(store.AddPoint(tenth, 1024, 1.25).ok());
  pb::Curve zen = tenth;
  zen.set_compressor("zen");
  ASSERT_TRUE(store.AddPoint(zen, 1024, 2.0).ok());
  pb::Curve busy;  // and, from version 4, comm curves measured beside busy cores
  busy.set_kind(pb::COMM);
  busy.set_comm_op(pb::ALLREDUCE);
  busy.set_scope(pb::GLOBAL);
  busy.set_busy(true);
  ASSERT_TRUE(store.AddPoint(busy, 64, 3.0).ok());
  pb::Profile loaded = Load(store);
  ASSERT_EQ(loaded.curves_size(), 4);
  EXPECT_EQ(CurveKey(loaded.curves(3)), "comm allreduce global busy");
  EXPECT_FALSE(loaded.curves(0).has_ratio());
  EXPECT_EQ(CurveKey(loaded.curves(0)), "decode topk cpu");
  EXPECT_EQ(loaded.curves(0).points_size(), 2);
  EXPECT_EQ(CurveKey(loaded.curves(1)), "decode topk cpu ratio 0.001");
  EXPECT_EQ(loaded.curves(1).ratio(), 0.001);
  EXPECT_EQ(CurveKey(loaded.curves(2)), "decode zen cpu ratio 0.001");
  // From version 5, tensors record their gradient's density (naturally sparse gradients); a
  // model without one keeps none.
  pb::Model m;
  m.set_name("embed");
  for (const char* name : {"table", "bias"}) {
    pb::Tensor* t = m.add_tensors();
    t->set_name(name);
    t->set_numel(100);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(1);
  }
  m.mutable_tensors(0)->set_density(0.015625);
  ASSERT_TRUE(store.ImportModel(m, false).ok());
  EXPECT_EQ(RawQuery(db_, "SELECT name, density FROM tensors ORDER BY position"), "table|0.015625\nbias|NULL\n");
  auto back = store.LoadModel("embed");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(MessageDifferencer::Equals(*back, m));
  EXPECT_FALSE(back->tensors(1).has_density());
}

// A version 6 DB (before comm curves recorded chained calls) opens migrated: its spaced and busy
// curves keep every point and stay spaced; a chained curve of the same collective joins them,
// reads back as its own curve, and a point added again to it replaces only its own.
TEST_F(ProfileStoreTest, MigratesAVersion6DbAndKeepsChainedCurvesApart) {
  ASSERT_NO_FATAL_FAILURE(MakeDbAtVersion(6));
  RawExec(db_,
          "INSERT INTO cluster (id, name, nodes, devices_per_node) VALUES (1, 'old', 4, 1);"
          "INSERT INTO curves (id, position, kind, op, scope, busy) VALUES (1, 0, 'comm', 'allreduce', 'global', 0), "
          "(2, 1, 'comm', 'allreduce', 'global', 1);"
          "INSERT INTO points (curve_id, size, us) VALUES (1, 1024, 10.0), (1, 4096, 20.0), (2, 1024, 30.0);");
  ProfileStore store = OpenStore(false);
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "7\n");
  EXPECT_EQ(RawQuery(db_, "SELECT busy, chained, size, us FROM curve_points"),
            "0|0|1024|10.0\n0|0|4096|20.0\n1|0|1024|30.0\n");
  pb::Curve chained;
  chained.set_kind(pb::COMM);
  chained.set_comm_op(pb::ALLREDUCE);
  chained.set_scope(pb::GLOBAL);
  chained.set_chained(true);
  ASSERT_TRUE(store.AddPoint(chained, 1024, 15.0).ok());
  ASSERT_TRUE(store.AddPoint(chained, 1024, 16.0, /*force=*/true).ok());
  pb::Profile loaded = Load(store);
  ASSERT_EQ(loaded.curves_size(), 3);
  EXPECT_EQ(CurveKey(loaded.curves(0)), "comm allreduce global");
  EXPECT_EQ(CurveKey(loaded.curves(1)), "comm allreduce global busy");
  EXPECT_EQ(CurveKey(loaded.curves(2)), "comm allreduce global chained");
  EXPECT_TRUE(loaded.curves(2).chained());
  ASSERT_EQ(loaded.curves(2).points_size(), 1);
  EXPECT_EQ(loaded.curves(2).points(0).us(), 16.0);
  EXPECT_EQ(loaded.curves(0).points(0).us(), 10.0);
  RawExec(db_, "UPDATE curves SET chained = 2 WHERE id = 1");
  auto bad = store.Load();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("curves[0].chained"), std::string::npos) << bad.status().message();
}

// A version 5 DB (before tensors had a shape) opens migrated: its tensors load without one
// (PowerSGD then treats them as vectors); a model with shapes stores them as "d0,d1,..." and
// reads them back; a malformed shape text is named.
TEST_F(ProfileStoreTest, MigratesAVersion5DbAndStoresShapes) {
  ASSERT_NO_FATAL_FAILURE(MakeDbAtVersion(5));
  RawExec(db_,
          "INSERT INTO cluster (id, name, nodes, devices_per_node) VALUES (1, 'old', 2, 1);"
          "INSERT INTO models (id, position, name) VALUES (1, 0, 'old');"
          "INSERT INTO tensors (model_id, position, name, numel, dtype, backward_us) "
          "VALUES (1, 0, 'w', 12, 'float32', 1.5);");
  ProfileStore store = OpenStore(false);
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "7\n");
  auto old = store.LoadModel("old");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->tensors(0).numel(), 12);
  EXPECT_TRUE(old->tensors(0).shape().empty());

  pb::Model m;
  m.set_name("conv");
  for (const char* name : {"weight", "bias"}) {
    pb::Tensor* t = m.add_tensors();
    t->set_name(name);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(1);
  }
  m.mutable_tensors(0)->set_numel(64 * 3 * 7 * 7);
  for (int64_t d : {64, 3, 7, 7}) m.mutable_tensors(0)->add_shape(d);
  m.mutable_tensors(1)->set_numel(64);
  Status imported = store.ImportModel(m, false);
  ASSERT_TRUE(imported.ok()) << imported.ToString();
  EXPECT_EQ(RawQuery(db_, "SELECT t.name, t.shape FROM tensors t JOIN models m ON t.model_id = m.id "
                          "WHERE m.name = 'conv' ORDER BY t.position"),
            "weight|64,3,7,7\nbias|NULL\n");
  auto back = store.LoadModel("conv");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(MessageDifferencer::Equals(*back, m));

  RawExec(db_, "UPDATE tensors SET shape = '64,,7' WHERE name = 'weight'");
  auto bad = store.LoadModel("conv");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), db_ + ": model \"conv\".tensors[0].shape: malformed; got \"64,,7\", expected "
                                         "dimensions joined by commas, such as '64,3,7,7'");
}

// Planners and exports read a DB without writing it: an older schema is migrated in a copy in
// memory (the file keeps its bytes and version), and a DB in another journal mode stays in it;
// Open (the writers') migrates the file.
TEST_F(ProfileStoreTest, ReadingWritesNothing) {
  ASSERT_NO_FATAL_FAILURE(MakeDbAtVersion(2));
  RawExec(db_,
          "PRAGMA journal_mode = DELETE;"
          "INSERT INTO cluster (id, name, nodes, devices_per_node) VALUES (1, 'old', 2, 1);"
          "INSERT INTO curves (id, position, kind, compressor, device) VALUES (3, 0, 'decode', 'topk', 'cpu');"
          "INSERT INTO points (curve_id, size, us) VALUES (3, 1024, 5.5), (3, 4096, 9.0);");
  const std::string before = ReadBytes(db_);
  for (int round = 0; round < 2; ++round) {  // the store, then LoadProfileFile
    if (round == 0) {
      auto store = ProfileStore::OpenForReading(db_);
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      pb::Profile loaded = Load(*store);
      ASSERT_EQ(loaded.curves_size(), 1);
      EXPECT_EQ(CurveKey(loaded.curves(0)), "decode topk cpu");
      EXPECT_EQ(loaded.curves(0).points_size(), 2);
    } else {
      auto loaded = LoadProfileFile(db_);
      ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
      EXPECT_EQ(loaded->cluster().name(), "old");
    }
    EXPECT_EQ(ReadBytes(db_), before) << "round " << round;
  }
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "2\n");
  EXPECT_EQ(RawQuery(db_, "PRAGMA journal_mode"), "delete\n");
  EXPECT_FALSE(std::filesystem::exists(db_ + "-wal"));
  OpenStore(false);
  EXPECT_EQ(RawQuery(db_, "PRAGMA user_version"), "7\n");
  EXPECT_EQ(RawQuery(db_, "PRAGMA journal_mode"), "wal\n");
}

TEST_F(ProfileStoreTest, LoadReportsADbEditedIntoAnInvalidState) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  RawExec(db_, "UPDATE curves SET op = 'allgaher'; UPDATE points SET us = -3 WHERE size = 4");
  Status s = store.Load().status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), db_ +
                             ": curves[0].op: unknown name in the DB; got \"allgaher\", expected one of allreduce, "
                             "allgather, reduce_scatter, alltoall, broadcast\n" +
                             db_ + ": curves[0].points[0].us: must not be negative; got -3, expected >= 0");
}

// Regression (data loss): several processes importing into the same new DB at once. Before,
// a failing import's clean-up removed the file another process had just created.
TEST_F(ProfileStoreTest, ConcurrentImportsIntoANewDbKeepTheDb) {
  constexpr int kProcesses = 6;
  const pb::Profile profile = SmallProfile("a");
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Exit 0: imported; 3: the curve was already present (another process won); else 1.
      auto store =
          ProfileStore::OpenOrCreate(db_, 10000, [&](ProfileStore& s) { return s.ImportProfile(profile, false); });
      ::_exit(store.ok() ? 0 : store.status().code() == StatusCode::kAlreadyExists ? 3 : 1);
    }
    children.push_back(pid);
  }
  int imported = 0, refused = 0;
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 0) ++imported;
    if (WEXITSTATUS(status) == 3) ++refused;
  }
  EXPECT_EQ(imported, 1);
  EXPECT_EQ(refused, kProcesses - 1);
  ProfileStore store = OpenStore(false);
  EXPECT_TRUE(MessageDifferencer::Equals(Load(store), profile));
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir_.path())) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  // No temporaries left; the WAL files belong to the open store.
  EXPECT_EQ(names, (std::vector<std::string>{"p.db", "p.db-shm", "p.db-wal"}));
}

TEST_F(ProfileStoreTest, AFailedWriteIntoANewDbLeavesNoFile) {
  pb::Model model = ExampleModel("resnet50");
  auto store = ProfileStore::OpenOrCreate(db_, 1000, [&](ProfileStore& s) { return s.ImportModel(model, false); });
  ASSERT_FALSE(store.ok());
  // The message names the DB the user asked for, not the temporary.
  EXPECT_EQ(store.status().message(), db_ +
                                          ": holds no profile yet; got model \"resnet50\", expected a "
                                          "cupcake.profile.v1 import first (a model belongs to a cluster)");
  EXPECT_TRUE(std::filesystem::is_empty(dir_.path()));
}

// Regression: an index that lost its entries (the quick check on open does not compare indexes
// with their tables) hid a curve from the import's lookup, so importing the profile again added
// every curve twice and reported success; the next read refused the DB. Now the import checks
// the tables it wrote before committing and writes nothing.
TEST_F(ProfileStoreTest, AnImportIntoADbWithADamagedIndexFailsAndWritesNothing) {
  const pb::Profile profile = SmallProfile("a");
  ASSERT_TRUE(OpenStore().ImportProfile(profile, false).ok());
  // The curves' unique key index swapped with an empty twin's: each page still used once.
  std::string sql = RawQuery(db_, "SELECT sql FROM sqlite_schema WHERE name = 'curves'");
  sql.replace(sql.find("\"curves\""), 8, "shadow");
  RawExec(db_, sql);
  const std::string ours = RawQuery(db_, "SELECT rootpage FROM sqlite_schema WHERE name = 'sqlite_autoindex_curves_2'");
  const std::string twin = RawQuery(db_, "SELECT rootpage FROM sqlite_schema WHERE name = 'sqlite_autoindex_shadow_2'");
  RawExec(db_, "PRAGMA writable_schema = ON; UPDATE sqlite_schema SET rootpage = " + twin +
                   " WHERE name = 'sqlite_autoindex_curves_2'; UPDATE sqlite_schema SET rootpage = " + ours +
                   " WHERE name = 'sqlite_autoindex_shadow_2'; PRAGMA writable_schema = OFF;");
  const std::string curves = RawQuery(db_, "SELECT count(*) FROM curves");
  ProfileStore store = OpenStore();  // the quick check on open passes
  Status s = store.ImportProfile(profile, false);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(s.message().starts_with(db_ + ": corrupt DB (found before committing; nothing written): row 1 missing "
                                            "from index sqlite_autoindex_curves_2"))
      << s.message();
  EXPECT_EQ(RawQuery(db_, "SELECT count(*) FROM curves"), curves);
}

// A creation killed mid-way (SIGKILL) leaves its <db>.new-XXXXXX temporary; the next
// OpenOrCreate removes it with its side files, but not one a live creator holds (locked) nor
// one made in the last minute (its creator may not have locked it yet).
TEST_F(ProfileStoreTest, TheNextRunRemovesTemporariesOfCreationsThatDied) {
  auto make = [&](const std::string& name, bool old) {
    const std::string path = db_ + ".new-" + name;
    std::ofstream(path) << "partial";
    if (old) {
      const timespec times[2] = {{::time(nullptr) - 120, 0}, {::time(nullptr) - 120, 0}};
      EXPECT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
    }
    return path;
  };
  const std::string dead = make("AAAAAA", true), dead_wal = dead + "-wal";
  std::ofstream(dead_wal) << "wal";
  const std::string alive = make("BBBBBB", true), fresh = make("CCCCCC", false);
  const int held = ::open(alive.c_str(), O_RDONLY);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  auto store =
      ProfileStore::OpenOrCreate(db_, 1000, [&](ProfileStore& s) { return s.ImportProfile(SmallProfile("a"), false); });
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_FALSE(std::filesystem::exists(dead_wal));
  EXPECT_TRUE(std::filesystem::exists(alive));
  EXPECT_TRUE(std::filesystem::exists(fresh));
  ::close(held);
}

TEST_F(ProfileStoreTest, RefusesInvalidUtf8OnImportAndInTheDb) {
  pb::Profile bad = SmallProfile("a");
  bad.mutable_cluster()->set_name("bad\xffname");
  ProfileStore store = OpenStore();
  Status s = store.ImportProfile(bad, false);
  EXPECT_EQ(s.message(),
            "profile \"bad\\xffname\": cluster.name: not valid UTF-8; got \"bad\\xffname\", expected "
            "UTF-8 text");
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  RawExec(db_, "UPDATE cluster SET name = CAST(X'62616466ff' AS TEXT)");
  s = store.Load().status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), db_ + ": cluster.name: not valid UTF-8 in the DB; got \"badf\\xff\", expected UTF-8 text");
}

// Regression: SQLite keeps what it is given whatever the column's type, and the reads used to
// turn it into 0 or a truncated integer silently.
TEST_F(ProfileStoreTest, RefusesValuesOfTheWrongTypeInTheDb) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  RawExec(db_,
          "UPDATE cluster SET nodes = 'abc'; UPDATE points SET us = 'NaN' WHERE size = 4; "
          "UPDATE points SET size = 1.5 WHERE size = 1024; UPDATE curves SET warmup = X'00'");
  Status s = store.Load().status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), db_ + ": cluster.nodes: wrong type in the DB; got text 'abc', expected an integer");
  RawExec(db_, "UPDATE cluster SET nodes = 2");
  s = store.Load().status();
  EXPECT_EQ(s.message(),
            db_ + ": curves[0].warmup: wrong type in the DB; got a blob of 1 bytes, expected an integer\n" + db_ +
                ": curves[0].points[0].size: wrong type in the DB; got real 1.5, expected an "
                "integer\n" +
                db_ + ": curves[0].points[1].us: wrong type in the DB; got text 'NaN', expected a number");
}

TEST_F(ProfileStoreTest, RefusesAWorldBeyondItsBoundsInTheDb) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  RawExec(db_, "UPDATE cluster SET nodes = 2147483648, devices_per_node = 2147483648");
  Status s = store.Load().status();
  EXPECT_EQ(s.message(),
            db_ + ": cluster.nodes: out of range in the DB; got 2147483648, expected 0 <= x <= 2147483647\n" + db_ +
                ": cluster.devices_per_node: out of range in the DB; got 2147483648, expected 0 <= "
                "x <= 2147483647");
  RawExec(db_, "UPDATE cluster SET nodes = 65536, devices_per_node = 65536");
  s = store.Load().status();
  EXPECT_EQ(s.message(), db_ +
                             ": cluster: world too large; got 65536 nodes x 65536 devices = 4294967296 ranks, "
                             "expected at most 1048576");
}

TEST_F(ProfileStoreTest, RefusesAModelWithATensorRowMissing) {
  ProfileStore store = OpenStore();
  ASSERT_TRUE(store.ImportProfile(SmallProfile("a"), false).ok());
  ASSERT_TRUE(store.ImportModel(ExampleModel("resnet50"), false).ok());
  RawExec(db_, "DELETE FROM tensors WHERE position = 7");
  Status s = store.LoadModel("resnet50").status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), db_ +
                             ": model \"resnet50\".tensors[7].position: not contiguous in the DB; got 8, expected 7 "
                             "(a tensor row is missing)");
}

TEST_F(ProfileStoreTest, RefusesADirectoryAndAnEmptyPath) {
  std::filesystem::create_directory(db_);
  EXPECT_EQ(OpenError(true), db_ + ": is a directory; expected an SQLite profile DB");
  auto s = ProfileStore::Open("", true);
  EXPECT_EQ(s.status().message(), "profile DB path: empty; expected a file name");
}

}  // namespace
}  // namespace cupcake::profile

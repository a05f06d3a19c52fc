// libFuzzer target: the SQLite profile loader, on a DB built from the input. The first byte
// picks how: even, the rest of the input is the DB file itself; odd, the rest is a list of
// edits (table, column, row, typed value; or a row deletion) applied through SQLite to a small
// valid profile DB, which reaches the values of the wrong type, out of range or not UTF-8 that
// a hand-edited DB holds. Any DB gives a valid profile or a Status; a profile it accepts
// survives JSON write + read.
#include <google/protobuf/util/message_differencer.h>
#include <sqlite3.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "cupcake/profile/json_io.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/file_io.h"
#include "fuzz_check.h"

namespace {

using namespace cupcake;

constexpr char kSeedProfile[] = R"({"format": "cupcake.profile.v1",
  "cluster": {"name": "c", "nodes": 2, "devices_per_node": 4, "device": "d", "meta": {"k": "v", "hosts": "a,b"}},
  "curves": [{"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, 10], [1024, 20.5]], "iters": 5},
             {"kind": "encode", "compressor": "topk", "device": "cpu", "points": [[1, 2], [4096, 30]]},
             {"kind": "copy", "op": "pack", "device": "gpu", "points": [[8, 1]], "method": "event"}],
  "models": [{"name": "m", "source": "s", "forward_us": 3, "tensors": [
    {"name": "a", "numel": 10, "dtype": "float32", "backward_us": 1},
    {"name": "b", "numel": 20, "dtype": "float16", "backward_us": 2},
    {"name": "c", "numel": 30, "dtype": "bfloat16", "backward_us": 0}]}]})";

struct Table {
  const char* name;
  const char* key;  // selects a row: "rowid" or the WITHOUT ROWID table's primary key
  std::array<const char*, 10> columns;
};
constexpr Table kTables[] = {
    {"cluster", "rowid", {"name", "nodes", "devices_per_node", "device", "interconnect", "network", "source"}},
    {"cluster_meta", "rowid", {"key", "value"}},
    {"curves", "rowid", {"position", "kind", "op", "scope", "compressor", "device", "method", "warmup", "iters", "wrong"}},
    {"points", "curve_id, size", {"curve_id", "size", "us"}},
    {"models", "rowid", {"position", "name", "source", "forward_us", "update_us"}},
    {"tensors", "model_id, position", {"model_id", "position", "name", "numel", "dtype", "backward_us"}},
};

struct Files {
  std::string dir, db, seed;
};

const Files& Paths() {
  static const Files files = [] {
    // Memory-backed where there is one: every input is a file.
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm"
                                                                                  : std::filesystem::temp_directory_path();
    std::string tmpl = (base / "cupcake-fuzz-XXXXXX").string();
    Files f;
    const char* made_dir = ::mkdtemp(tmpl.data());
    CUPCAKE_FUZZ_CHECK(made_dir != nullptr, tmpl + ": mkdtemp failed");
    f.dir = made_dir;
    // libFuzzer ends with exit(): the directory goes then, not left in /dev/shm run after run.
    static const std::string dir = f.dir;
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    });
    f.db = f.dir + "/fuzz.db";
    const std::string seed_db = f.dir + "/seed.db";
    auto profile = profile::ParseProfileJson(kSeedProfile, "seed.json");
    CUPCAKE_FUZZ_CHECK(profile.ok(), profile.status().message());
    {
      auto made = profile::ProfileStore::OpenOrCreate(seed_db, 1000, [&](profile::ProfileStore& s) {
        return s.ImportProfile(*profile, false);
      });
      CUPCAKE_FUZZ_CHECK(made.ok(), made.status().message());
    }  // closed: the WAL is folded into the file
    f.seed = ReadFile(seed_db).value();
    return f;
  }();
  return files;
}

// Plain write: no fsync, which would bound the fuzzer at a hundred inputs a second.
void WriteDb(const std::string& path, std::string_view bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  CUPCAKE_FUZZ_CHECK(f != nullptr, path);
  CUPCAKE_FUZZ_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size(), path);
  std::fclose(f);
}

void RemoveDb(const std::string& db) {
  for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((db + suffix).c_str());
}

// Applies the edits of `in` (a 5-byte header, then the value's bytes; at most kMaxEdits, so
// one input stays fast) to the DB at `path`.
constexpr int kMaxEdits = 16;

void ApplyEdits(const std::string& path, const uint8_t* in, size_t size) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    sqlite3_close(db);
    return;
  }
  size_t at = 0;
  for (int edit = 0; edit < kMaxEdits && at + 4 <= size; ++edit) {
    const Table& t = kTables[in[at] % std::size(kTables)];
    size_t ncols = 0;
    while (ncols < t.columns.size() && t.columns[ncols] != nullptr) ++ncols;
    const char* column = t.columns[in[at + 1] % ncols];
    const int row = in[at + 2] % 8;
    const int kind = in[at + 3] % 6;  // integer, real, text, blob, NULL, delete the row
    at += 4;
    const size_t len = at < size ? std::min<size_t>(in[at], size - at - 1) : 0;
    const uint8_t* value = in + at + 1;
    at += 1 + len;
    std::string sql = kind == 5 ? std::string("DELETE FROM ") + t.name
                                : std::string("UPDATE ") + t.name + " SET " + column + " = ?1";
    sql += std::string(" WHERE (") + t.key + ") IN (SELECT " + t.key + " FROM " + t.name + " LIMIT 1 OFFSET ?2)";
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &st, nullptr) != SQLITE_OK) {
      sqlite3_finalize(st);
      continue;
    }
    int64_t i = 0;
    double d = 0;
    std::memcpy(&i, value, std::min<size_t>(len, 8));
    std::memcpy(&d, value, std::min<size_t>(len, 8));
    if (kind == 0) sqlite3_bind_int64(st, 1, len <= 2 ? static_cast<int8_t>(i) : i);  // small values often
    if (kind == 1) sqlite3_bind_double(st, 1, d);
    if (kind == 2) sqlite3_bind_text(st, 1, reinterpret_cast<const char*>(value), static_cast<int>(len), SQLITE_TRANSIENT);
    if (kind == 3) sqlite3_bind_blob(st, 1, value, static_cast<int>(len), SQLITE_TRANSIENT);
    if (kind == 4) sqlite3_bind_null(st, 1);
    sqlite3_bind_int(st, 2, row);
    sqlite3_step(st);  // constraint failures are fine: the DB stays as it was
    sqlite3_finalize(st);
  }
  sqlite3_close(db);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Files& f = Paths();
  RemoveDb(f.db);
  if (data[0] % 2 == 0) {
    WriteDb(f.db, std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  } else {
    WriteDb(f.db, f.seed);
    ApplyEdits(f.db, data + 1, size - 1);
  }
  auto store = profile::ProfileStore::Open(f.db, false, 0);
  if (!store.ok()) return 0;
  auto names = store->ModelNames();
  if (names.ok())
    for (const std::string& name : *names) (void)store->LoadModel(name);
  auto loaded = store->Load();
  if (!loaded.ok()) return 0;
  CUPCAKE_FUZZ_CHECK(profile::ValidateProfile(*loaded, "fuzz").ok(), "loaded an invalid profile");
  auto again = profile::ParseProfileJson(profile::ProfileToJson(*loaded), "again.json");
  CUPCAKE_FUZZ_CHECK(again.ok(), again.status().message());
  CUPCAKE_FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(*again, *loaded), "round trip changed it");
  return 0;
}

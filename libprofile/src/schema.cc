#include "schema.h"

#include <array>

#include "sqlite.h"

namespace cupcake::profile::internal {
namespace {

// Version 1. Names are stored as text (the names of names.h and catalogue.h) so `sqlite3`
// shows them; key columns that do not apply to a kind hold '' so UNIQUE sees one key.
constexpr std::string_view kSchemaV1 = R"sql(
CREATE TABLE cluster (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  name TEXT NOT NULL,
  nodes INTEGER NOT NULL,
  devices_per_node INTEGER NOT NULL,
  device TEXT,
  interconnect TEXT,
  network TEXT,
  source TEXT
);
CREATE TABLE cluster_meta (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE curves (
  id INTEGER PRIMARY KEY,
  position INTEGER NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  op TEXT NOT NULL DEFAULT '',
  scope TEXT NOT NULL DEFAULT '',
  compressor TEXT NOT NULL DEFAULT '',
  device TEXT NOT NULL DEFAULT '',
  method TEXT,
  warmup INTEGER,
  iters INTEGER,
  wrong INTEGER,
  UNIQUE (kind, op, scope, compressor, device)
);
CREATE TABLE points (
  curve_id INTEGER NOT NULL REFERENCES curves(id) ON DELETE CASCADE,
  size INTEGER NOT NULL,
  us REAL NOT NULL,
  PRIMARY KEY (curve_id, size)
) WITHOUT ROWID;
CREATE TABLE models (
  id INTEGER PRIMARY KEY,
  position INTEGER NOT NULL UNIQUE,
  name TEXT NOT NULL UNIQUE,
  source TEXT,
  forward_us REAL,
  update_us REAL
);
CREATE TABLE tensors (
  model_id INTEGER NOT NULL REFERENCES models(id) ON DELETE CASCADE,
  position INTEGER NOT NULL,
  name TEXT NOT NULL,
  numel INTEGER NOT NULL,
  dtype TEXT NOT NULL,
  backward_us REAL NOT NULL,
  PRIMARY KEY (model_id, position)
) WITHOUT ROWID;
CREATE VIEW curve_points AS
  SELECT c.kind, c.op, c.scope, c.compressor, c.device, p.size, p.us
  FROM curves c JOIN points p ON p.curve_id = c.id
  ORDER BY c.position, p.size;
)sql";

// Version 2: comm curves carry the element type of their reduction (`dtype`: '' is float32,
// as every version 1 curve; 'float16', 'bfloat16'), so fp16 sums are priced with their own
// curve. SQLite cannot change a UNIQUE constraint in place: the table is rebuilt (with foreign
// keys off, so that dropping the old table does not cascade to the points; Migrate does that).
constexpr std::string_view kSchemaV2 = R"sql(
DROP VIEW curve_points;
CREATE TABLE curves_v2 (
  id INTEGER PRIMARY KEY,
  position INTEGER NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  op TEXT NOT NULL DEFAULT '',
  scope TEXT NOT NULL DEFAULT '',
  compressor TEXT NOT NULL DEFAULT '',
  device TEXT NOT NULL DEFAULT '',
  dtype TEXT NOT NULL DEFAULT '',
  method TEXT,
  warmup INTEGER,
  iters INTEGER,
  wrong INTEGER,
  UNIQUE (kind, op, scope, compressor, device, dtype)
);
INSERT INTO curves_v2 (id, position, kind, op, scope, compressor, device, method, warmup, iters, wrong)
  SELECT id, position, kind, op, scope, compressor, device, method, warmup, iters, wrong FROM curves;
DROP TABLE curves;
ALTER TABLE curves_v2 RENAME TO curves;
CREATE VIEW curve_points AS
  SELECT c.kind, c.op, c.scope, c.compressor, c.device, c.dtype, p.size, p.us
  FROM curves c JOIN points p ON p.curve_id = c.id
  ORDER BY c.position, p.size;
)sql";

// Version 3: encode and decode curves of ratio compressors (topk, randk, dgc) and Zen's curves
// carry the ratio they were measured at (`ratio`: 0 where not recorded, every version 2 curve),
// so one profile holds a compressor's curves at several ratios. The table is rebuilt as for v2.
constexpr std::string_view kSchemaV3 = R"sql(
DROP VIEW curve_points;
CREATE TABLE curves_v3 (
  id INTEGER PRIMARY KEY,
  position INTEGER NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  op TEXT NOT NULL DEFAULT '',
  scope TEXT NOT NULL DEFAULT '',
  compressor TEXT NOT NULL DEFAULT '',
  device TEXT NOT NULL DEFAULT '',
  dtype TEXT NOT NULL DEFAULT '',
  ratio REAL NOT NULL DEFAULT 0,
  method TEXT,
  warmup INTEGER,
  iters INTEGER,
  wrong INTEGER,
  UNIQUE (kind, op, scope, compressor, device, dtype, ratio)
);
INSERT INTO curves_v3 (id, position, kind, op, scope, compressor, device, dtype, method, warmup, iters, wrong)
  SELECT id, position, kind, op, scope, compressor, device, dtype, method, warmup, iters, wrong FROM curves;
DROP TABLE curves;
ALTER TABLE curves_v3 RENAME TO curves;
CREATE VIEW curve_points AS
  SELECT c.kind, c.op, c.scope, c.compressor, c.device, c.dtype, c.ratio, p.size, p.us
  FROM curves c JOIN points p ON p.curve_id = c.id
  ORDER BY c.position, p.size;
)sql";

// Version 4: comm curves record whether they were measured with busy cores (`busy`: 0 or 1; 0
// for every version 3 curve), so a profile holds both of a collective's curves.
constexpr std::string_view kSchemaV4 = R"sql(
DROP VIEW curve_points;
CREATE TABLE curves_v4 (
  id INTEGER PRIMARY KEY,
  position INTEGER NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  op TEXT NOT NULL DEFAULT '',
  scope TEXT NOT NULL DEFAULT '',
  compressor TEXT NOT NULL DEFAULT '',
  device TEXT NOT NULL DEFAULT '',
  dtype TEXT NOT NULL DEFAULT '',
  ratio REAL NOT NULL DEFAULT 0,
  busy INTEGER NOT NULL DEFAULT 0,
  method TEXT,
  warmup INTEGER,
  iters INTEGER,
  wrong INTEGER,
  UNIQUE (kind, op, scope, compressor, device, dtype, ratio, busy)
);
INSERT INTO curves_v4 (id, position, kind, op, scope, compressor, device, dtype, ratio, method, warmup, iters, wrong)
  SELECT id, position, kind, op, scope, compressor, device, dtype, ratio, method, warmup, iters, wrong FROM curves;
DROP TABLE curves;
ALTER TABLE curves_v4 RENAME TO curves;
CREATE VIEW curve_points AS
  SELECT c.kind, c.op, c.scope, c.compressor, c.device, c.dtype, c.ratio, c.busy, p.size, p.us
  FROM curves c JOIN points p ON p.curve_id = c.id
  ORDER BY c.position, p.size;
)sql";

// Version 5: tensors record the share of their gradient's elements that are non-zero
// (`density`, NULL where not recorded: every version 4 tensor), for naturally sparse gradients.
constexpr std::string_view kSchemaV5 = R"sql(
ALTER TABLE tensors ADD COLUMN density REAL;
)sql";

// Version 6: tensors record their shape (`shape`, the dimensions as decimal integers joined by
// commas, "64,3,7,7"; NULL where not recorded: every version 5 tensor), for PowerSGD's matrices.
constexpr std::string_view kSchemaV6 = R"sql(
ALTER TABLE tensors ADD COLUMN shape TEXT;
)sql";

// Version 7: comm curves record whether they were measured on chained calls (`chained`: 0 or 1;
// 0 for every version 6 curve), so a profile holds a collective's spaced and chained curves.
constexpr std::string_view kSchemaV7 = R"sql(
DROP VIEW curve_points;
CREATE TABLE curves_v7 (
  id INTEGER PRIMARY KEY,
  position INTEGER NOT NULL UNIQUE,
  kind TEXT NOT NULL,
  op TEXT NOT NULL DEFAULT '',
  scope TEXT NOT NULL DEFAULT '',
  compressor TEXT NOT NULL DEFAULT '',
  device TEXT NOT NULL DEFAULT '',
  dtype TEXT NOT NULL DEFAULT '',
  ratio REAL NOT NULL DEFAULT 0,
  busy INTEGER NOT NULL DEFAULT 0,
  chained INTEGER NOT NULL DEFAULT 0,
  method TEXT,
  warmup INTEGER,
  iters INTEGER,
  wrong INTEGER,
  UNIQUE (kind, op, scope, compressor, device, dtype, ratio, busy, chained)
);
INSERT INTO curves_v7 (id, position, kind, op, scope, compressor, device, dtype, ratio, busy, method, warmup, iters,
                       wrong)
  SELECT id, position, kind, op, scope, compressor, device, dtype, ratio, busy, method, warmup, iters, wrong
  FROM curves;
DROP TABLE curves;
ALTER TABLE curves_v7 RENAME TO curves;
CREATE VIEW curve_points AS
  SELECT c.kind, c.op, c.scope, c.compressor, c.device, c.dtype, c.ratio, c.busy, c.chained, p.size, p.us
  FROM curves c JOIN points p ON p.curve_id = c.id
  ORDER BY c.position, p.size;
)sql";

constexpr std::array<Migration, 7> kMigrations{
    {{1, kSchemaV1}, {2, kSchemaV2}, {3, kSchemaV3}, {4, kSchemaV4}, {5, kSchemaV5}, {6, kSchemaV6}, {7, kSchemaV7}}};

}  // namespace

std::span<const Migration> Migrations() { return kMigrations; }
int SchemaVersion() { return kMigrations.back().to_version; }

StatusOr<int64_t> PragmaInt(sqlite3* db, const std::string& path, std::string_view pragma) {
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare("PRAGMA " + std::string(pragma)));
  CUPCAKE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return InternalError(path + ": PRAGMA " + std::string(pragma) + " returned no row");
  return st.Int(0);
}

Status Migrate(sqlite3* db, const std::string& path, std::span<const Migration> migrations) {
  // Foreign keys off around the transaction (the pragma is a no-op inside one): a step that
  // rebuilds a table drops the old one, which must not cascade to the rows that refer to it.
  CUPCAKE_RETURN_IF_ERROR(Exec(db, path, "PRAGMA foreign_keys = OFF"));
  struct KeysBackOn {
    sqlite3* db;
    ~KeysBackOn() { sqlite3_exec(db, "PRAGMA foreign_keys = ON", nullptr, nullptr, nullptr); }
  } keys_back_on{db};
  Transaction tx(db, path);
  CUPCAKE_RETURN_IF_ERROR(tx.Begin());
  CUPCAKE_ASSIGN_OR_RETURN(int64_t version, PragmaInt(db, path, "user_version"));
  for (const Migration& m : migrations) {
    if (m.to_version <= version) continue;
    Status s = Exec(db, path, m.sql);
    if (!s.ok())
      return Status(s.code(),
                    path + ": migration to schema version " + std::to_string(m.to_version) + " failed: " + s.message());
    CUPCAKE_RETURN_IF_ERROR(Exec(db, path, "PRAGMA user_version = " + std::to_string(m.to_version)));
    version = m.to_version;
  }
  CUPCAKE_RETURN_IF_ERROR(Exec(db, path, "PRAGMA application_id = " + std::to_string(kApplicationId)));
  Statement check(db, path);  // every row still refers to a row that exists
  CUPCAKE_RETURN_IF_ERROR(check.Prepare("PRAGMA foreign_key_check"));
  CUPCAKE_ASSIGN_OR_RETURN(bool dangling, check.Step());
  if (dangling)
    return DataLossError(path + ": migration to schema version " + std::to_string(version) +
                         " left rows referring to missing rows (table " + check.Text(0) + "); nothing was changed");
  return tx.Commit();
}

}  // namespace cupcake::profile::internal

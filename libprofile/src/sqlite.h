// Internal: a thin RAII layer over the SQLite C API. Every SQLite result code becomes a Status
// through one function, SqliteStatus, carrying the DB path, the call and SQLite's message.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cupcake/proto/status.h"
#include "problems.h"

namespace cupcake::profile::internal {

// Maps an SQLite result code: BUSY/LOCKED/FULL (disk full) -> Unavailable, CORRUPT/NOTADB -> DataLoss,
// READONLY/CANTOPEN/PERM -> FailedPrecondition, constraint -> AlreadyExists, else Internal.
Status SqliteStatus(int rc, sqlite3* db, const std::string& path, std::string_view what);

#define CUPCAKE_SQLITE_RETURN_IF_ERROR(rc_expr, db, path, what)                                                   \
  do {                                                                                                            \
    int cupcake_sqlite_rc_ = (rc_expr);                                                                           \
    if (cupcake_sqlite_rc_ != SQLITE_OK && cupcake_sqlite_rc_ != SQLITE_DONE && cupcake_sqlite_rc_ != SQLITE_ROW) \
      return ::cupcake::profile::internal::SqliteStatus(cupcake_sqlite_rc_, db, path, what);                      \
  } while (0)

// A prepared statement; finalized on destruction.
class Statement {
 public:
  Statement(sqlite3* db, const std::string& path) : db_(db), path_(path) {}
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Status Prepare(std::string_view sql);
  Statement& Bind(int i, int64_t v);
  Statement& Bind(int i, double v);
  Statement& Bind(int i, std::string_view v);
  Statement& BindNull(int i);
  // Binds the optional value or NULL.
  Statement& BindOpt(int i, bool has, std::string_view v) { return has ? Bind(i, v) : BindNull(i); }
  Statement& BindOpt(int i, bool has, double v) { return has ? Bind(i, v) : BindNull(i); }
  Statement& BindOptInt(int i, bool has, int64_t v) { return has ? Bind(i, v) : BindNull(i); }
  // true: a row is ready; false: done.
  StatusOr<bool> Step();
  // Steps to completion, for statements without rows.
  Status Run();
  Status Reset();

  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string Text(int col) const;
  int ColumnType(int col) const { return sqlite3_column_type(stmt_, col); }

 private:
  sqlite3* db_;
  std::string path_;
  std::string sql_;
  sqlite3_stmt* stmt_ = nullptr;
  int bind_rc_ = SQLITE_OK;
};

// Strict reads of the current row's column `col`: the value must have the SQLite type the
// schema declares (SQLite keeps 'abc' or 1.5 in an INTEGER column as they are, and
// sqlite3_column_int64 would silently read 0 or 1), an integer must lie in [min, max], a real
// must be a number, text must be UTF-8. Otherwise a problem is added at `field` and a neutral
// value (0, "") returned, so one pass over a DB reports every bad value.
int64_t ReadInt(const Statement& st, int col, int64_t min, int64_t max, Problems& p, const std::string& field);
double ReadReal(const Statement& st, int col, Problems& p, const std::string& field);
std::string ReadText(const Statement& st, int col, Problems& p, const std::string& field);

// Runs SQL without results (several statements allowed).
Status Exec(sqlite3* db, const std::string& path, std::string_view sql);

// One BEGIN IMMEDIATE .. COMMIT; rolls back on destruction unless committed.
class Transaction {
 public:
  Transaction(sqlite3* db, const std::string& path) : db_(db), path_(path) {}
  ~Transaction();
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  Status Begin();
  Status Commit();

 private:
  sqlite3* db_;
  std::string path_;
  bool open_ = false;
};

}  // namespace cupcake::profile::internal

#include "sqlite.h"

#include <cerrno>

#include "cupcake/proto/names.h"
#include "validate.h"

namespace cupcake::profile::internal {

Status SqliteStatus(int rc, sqlite3* db, const std::string& path, std::string_view what) {
  std::string message =
      path + ": " + std::string(what) + ": " + (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  // A write the file system refused for want of space surfaces as SQLITE_FULL or, from some
  // calls (a journal or WAL write, a sync), as SQLITE_IOERR with the OS's ENOSPC: both are a
  // full disk to the user.
  if ((rc & 0xff) == SQLITE_IOERR && db != nullptr && sqlite3_system_errno(db) == ENOSPC) rc = SQLITE_FULL;
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return UnavailableError(message + " (another process holds the DB)");
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return DataLossError(path + ": corrupt or truncated DB (" + std::string(what) +
                           "): " + (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM: return FailedPreconditionError(message);
    case SQLITE_CONSTRAINT: return AlreadyExistsError(message);
    case SQLITE_FULL:
      return UnavailableError(path + ": disk full (" + std::string(what) +
                              "); this write was rolled back, what was committed before it is kept");
    default: return InternalError(message);
  }
}

Status Statement::Prepare(std::string_view sql) {
  sql_ = std::string(sql);
  sqlite3_finalize(stmt_);
  stmt_ = nullptr;
  int rc = sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt_, nullptr);
  CUPCAKE_SQLITE_RETURN_IF_ERROR(rc, db_, path_, "prepare");
  return Status::Ok();
}

Statement& Statement::Bind(int i, int64_t v) {
  int rc = sqlite3_bind_int64(stmt_, i, v);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Statement& Statement::Bind(int i, double v) {
  int rc = sqlite3_bind_double(stmt_, i, v);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Statement& Statement::Bind(int i, std::string_view v) {
  int rc = sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

Statement& Statement::BindNull(int i) {
  int rc = sqlite3_bind_null(stmt_, i);
  if (bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  return *this;
}

StatusOr<bool> Statement::Step() {
  CUPCAKE_SQLITE_RETURN_IF_ERROR(bind_rc_, db_, path_, "bind");
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return SqliteStatus(rc, db_, path_, "step");
}

Status Statement::Run() {
  while (true) {
    CUPCAKE_ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return Status::Ok();
  }
}

Status Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_rc_ = SQLITE_OK;
  return Status::Ok();
}

std::string Statement::Text(int col) const {
  const unsigned char* p = sqlite3_column_text(stmt_, col);
  if (p == nullptr) return "";
  return std::string(reinterpret_cast<const char*>(p), static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
}

namespace {

// The stored value for a message: "text 'abc'", "real 1.5", "a blob of 3 bytes", "NULL".
std::string Stored(const Statement& st, int col) {
  switch (st.ColumnType(col)) {
    case SQLITE_INTEGER: return "integer " + std::to_string(st.Int(col));
    case SQLITE_FLOAT: return "real " + FormatDouble(st.Real(col));
    case SQLITE_TEXT: {
      std::string t = st.Text(col);
      if (t.size() > 40) t = t.substr(0, 37) + "...";
      return "text '" + EscapeBytes(t) + "'";
    }
    case SQLITE_BLOB: return "a blob of " + std::to_string(st.Text(col).size()) + " bytes";
    default: return "NULL";
  }
}

void WrongType(const Statement& st, int col, Problems& p, const std::string& field, std::string_view expected) {
  p.Add(field, "wrong type in the DB; got " + Stored(st, col) + ", expected " + std::string(expected));
}

}  // namespace

int64_t ReadInt(const Statement& st, int col, int64_t min, int64_t max, Problems& p, const std::string& field) {
  if (st.ColumnType(col) != SQLITE_INTEGER) {
    WrongType(st, col, p, field, "an integer");
    return 0;
  }
  int64_t v = st.Int(col);
  if (v < min || v > max) {
    p.Add(field, "out of range in the DB; got " + std::to_string(v) + ", expected " + std::to_string(min) +
                     " <= x <= " + std::to_string(max));
    return 0;
  }
  return v;
}

double ReadReal(const Statement& st, int col, Problems& p, const std::string& field) {
  // A REAL column hands integral values back as REAL; INTEGER is accepted for hand-made DBs.
  if (st.ColumnType(col) != SQLITE_FLOAT && st.ColumnType(col) != SQLITE_INTEGER) {
    WrongType(st, col, p, field, "a number");
    return 0;
  }
  return st.Real(col);
}

std::string ReadText(const Statement& st, int col, Problems& p, const std::string& field) {
  if (st.ColumnType(col) != SQLITE_TEXT) {
    WrongType(st, col, p, field, "text");
    return "";
  }
  std::string t = st.Text(col);
  if (!IsValidUtf8(t)) {
    p.Add(field, "not valid UTF-8 in the DB; got \"" + EscapeBytes(t) + "\", expected UTF-8 text");
    return "";
  }
  return t;
}

Status Exec(sqlite3* db, const std::string& path, std::string_view sql) {
  char* err = nullptr;
  int rc = sqlite3_exec(db, std::string(sql).c_str(), nullptr, nullptr, &err);
  sqlite3_free(err);
  CUPCAKE_SQLITE_RETURN_IF_ERROR(rc, db, path, "exec");
  return Status::Ok();
}

Transaction::~Transaction() {
  if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

Status Transaction::Begin() {
  CUPCAKE_RETURN_IF_ERROR(Exec(db_, path_, "BEGIN IMMEDIATE"));
  open_ = true;
  return Status::Ok();
}

Status Transaction::Commit() {
  CUPCAKE_RETURN_IF_ERROR(Exec(db_, path_, "COMMIT"));
  open_ = false;
  return Status::Ok();
}

}  // namespace cupcake::profile::internal

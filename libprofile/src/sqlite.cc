#include "sqlite.h"

namespace cupcake::profile::internal {

Status SqliteStatus(int rc, sqlite3* db, const std::string& path, std::string_view what) {
  std::string message = path + ": " + std::string(what) + ": " +
                        (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return UnavailableError(message + " (another process holds the DB)");
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return DataLossError(path + ": corrupt or truncated DB (" + std::string(what) + "): " +
                           (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc)));
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM: return FailedPreconditionError(message);
    case SQLITE_CONSTRAINT: return AlreadyExistsError(message);
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

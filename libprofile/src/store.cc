#include "cupcake/profile/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <limits>
#include <map>

#include "cupcake/profile/json_io.h"
#include "cupcake/proto/limits.h"
#include "cupcake/proto/names.h"
#include "problems.h"
#include "schema.h"
#include "sqlite.h"
#include "validate.h"

namespace cupcake::profile {
namespace {

using internal::Quote;
using internal::Statement;
using internal::Transaction;

// A creation's temporary `<db>.new-XXXXXX` (and SQLite's side files of it) is locked (flock) by
// its creator for its whole life; one that is unlocked and older than this was left by a
// creator that died (SIGKILL), and the next OpenOrCreate of the DB removes it. The age keeps a
// creation that has made its file but not yet locked it safe.
constexpr int kStaleTemporaryAgeS = 60;

// Removes the temporaries of creations of `path` that died: unlocked and older than
// kStaleTemporaryAgeS. Best effort: what cannot be inspected is left alone.
void RemoveStaleTemporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path db(path);
  const std::string prefix = db.filename().string() + ".new-";
  std::error_code ec;
  const fs::path dir = db.has_parent_path() ? db.parent_path() : fs::path(".");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix) || name.size() != prefix.size() + 6) continue;  // the main file only
    const std::string tmp = it->path().string();
    struct stat info;
    if (::stat(tmp.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || ::time(nullptr) - info.st_mtime < kStaleTemporaryAgeS)
      continue;
    const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0)
      for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((tmp + suffix).c_str());
    ::close(fd);
  }
}

// Before an import commits: the touched tables and their indexes agree (PRAGMA
// integrity_check, which unlike the quick check on open compares each index with its table). A
// damaged index can hide a row from the lookups an import makes, so the import would add a
// duplicate and report success; instead it fails and nothing is written (the transaction rolls
// back). Imports only: the profiler's per-point writes stay cheap.
Status CheckWrittenTables(sqlite3* db, const std::string& path, std::initializer_list<const char*> tables) {
  std::string problems;
  for (const char* table : tables) {
    Statement check(db, path);
    CUPCAKE_RETURN_IF_ERROR(check.Prepare(std::string("PRAGMA integrity_check(") + table + ")"));
    for (int rows = 0; rows < 5;) {
      CUPCAKE_ASSIGN_OR_RETURN(bool more, check.Step());
      if (!more) break;
      const std::string line = check.Text(0);
      if (line == "ok") break;
      problems += (problems.empty() ? "" : "; ") + line;
      ++rows;
    }
  }
  if (problems.empty()) return Status::Ok();
  return DataLossError(path + ": corrupt DB (found before committing; nothing written): " + problems +
                       "; expected tables that agree with their indexes (restore the DB, or import into a new one)");
}

// `path` as the path of an SQLite URI: the characters a URI gives meaning to escaped.
std::string UriPath(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == '%' || c == '?' || c == '#') {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

constexpr char kSqliteMagic[16] = {'S', 'Q', 'L', 'i', 't', 'e', ' ', 'f', 'o', 'r', 'm', 'a', 't', ' ', '3', '\0'};

// The text columns of a curve's key; '' where a column does not apply to the kind.
struct KeyColumns {
  std::string kind, op, scope, compressor, device, dtype;
  double ratio = 0.0;  // 0: not recorded
  int64_t busy = 0;
  int64_t chained = 0;
};

KeyColumns Key(const pb::Curve& c) {
  KeyColumns k;
  k.kind = std::string(Name(c.kind()));
  switch (c.kind()) {
    case pb::COMM:
      k.op = std::string(Name(c.comm_op()));
      k.scope = std::string(Name(c.scope()));
      if (c.dtype() != pb::DTYPE_UNSPECIFIED) k.dtype = std::string(Name(c.dtype()));
      k.busy = c.busy() ? 1 : 0;
      k.chained = c.chained() ? 1 : 0;
      break;
    case pb::ENCODE:
    case pb::DECODE:
      k.compressor = c.compressor();
      k.device = std::string(Name(c.device()));
      k.ratio = c.has_ratio() ? c.ratio() : 0.0;
      break;
    case pb::COPY:
      k.op = std::string(Name(c.copy_op()));
      k.device = std::string(Name(c.device()));
      break;
    default: break;
  }
  return k;
}

std::string Printable(const char* data, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && out.size() < 12; ++i) {
    unsigned char ch = static_cast<unsigned char>(data[i]);
    if (ch >= 0x20 && ch < 0x7f)
      out += static_cast<char>(ch);
    else
      out += '.';
  }
  return "'" + out + "'";
}

// Looks at the file before SQLite does, for messages SQLite cannot give.
Status CheckHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return FailedPreconditionError(path + ": cannot open: " + std::strerror(errno));
  char head[100];
  in.read(head, sizeof head);
  size_t n = static_cast<size_t>(in.gcount());
  if (n == 0) return Status::Ok();  // an empty file: SQLite treats it as an empty DB
  if (n < sizeof kSqliteMagic || std::memcmp(head, kSqliteMagic, sizeof kSqliteMagic) != 0) {
    std::string hint = head[0] == '{' ? " (a JSON file? import it with cupcake-profile import)" : "";
    return InvalidArgumentError(path + ": not a cupcake profile DB; got a file starting with " + Printable(head, n) +
                                ", expected an SQLite database" + hint);
  }
  if (n < sizeof head)
    return DataLossError(path + ": truncated SQLite file; got " + std::to_string(n) +
                         " bytes, expected at least a 100-byte header");
  // The file is whole pages, at least as many as the header counts (sqlite.org/fileformat.html
  // 1.3: page size at offset 16, page count at 28, valid when offset 92 equals offset 24).
  auto u32 = [&head](int at) {
    const auto* b = reinterpret_cast<const unsigned char*>(head + at);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  };
  const uint32_t raw_page = u32(16) >> 16;
  const int64_t page = raw_page == 1 ? 65536 : raw_page;
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  const int64_t counted = u32(92) == u32(24) ? int64_t{u32(28)} * page : 0;
  if (page < 512 || size % page != 0 || size < counted)
    return DataLossError(path + ": truncated or damaged SQLite file; got " + std::to_string(size) +
                         " bytes, expected whole pages of " + std::to_string(page) + " bytes" +
                         (counted > 0 ? ", at least " + std::to_string(counted) : std::string()));
  return Status::Ok();
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

std::string Hex(int64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%08llx", static_cast<unsigned long long>(static_cast<uint32_t>(v)));
  return buf;
}

StatusOr<int64_t> QueryInt(sqlite3* db, const std::string& path, std::string_view sql) {
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare(sql));
  CUPCAKE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row || st.IsNull(0)) return int64_t{0};
  return st.Int(0);
}

// The id of the curve with `c`'s key, or nullopt.
StatusOr<std::optional<int64_t>> FindCurve(sqlite3* db, const std::string& path, const pb::Curve& c) {
  KeyColumns k = Key(c);
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(
      st.Prepare("SELECT id FROM curves WHERE kind = ?1 AND op = ?2 AND scope = ?3 AND compressor = ?4 AND device = ?5 "
                 "AND dtype = ?6 AND ratio = ?7 AND busy = ?8 AND chained = ?9"));
  st.Bind(1, k.kind).Bind(2, k.op).Bind(3, k.scope).Bind(4, k.compressor).Bind(5, k.device).Bind(6, k.dtype);
  st.Bind(7, k.ratio).Bind(8, k.busy).Bind(9, k.chained);
  CUPCAKE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return std::optional<int64_t>();
  return std::optional<int64_t>(st.Int(0));
}

StatusOr<int64_t> InsertCurve(sqlite3* db, const std::string& path, const pb::Curve& c) {
  KeyColumns k = Key(c);
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare(
      "INSERT INTO curves (position, kind, op, scope, compressor, device, method, warmup, iters, wrong, dtype, ratio, "
      "busy, chained) VALUES ((SELECT COALESCE(MAX(position), -1) + 1 FROM curves), ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, "
      "?9, ?10, ?11, ?12, ?13)"));
  st.Bind(1, k.kind).Bind(2, k.op).Bind(3, k.scope).Bind(4, k.compressor).Bind(5, k.device);
  st.BindOpt(6, c.has_method(), c.method());
  st.BindOptInt(7, c.has_warmup(), c.warmup()).BindOptInt(8, c.has_iters(), c.iters());
  st.BindOptInt(9, c.has_wrong(), c.wrong()).Bind(10, k.dtype).Bind(11, k.ratio).Bind(12, k.busy).Bind(13, k.chained);
  CUPCAKE_RETURN_IF_ERROR(st.Run());
  return static_cast<int64_t>(sqlite3_last_insert_rowid(db));
}

Status InsertPoints(sqlite3* db, const std::string& path, int64_t curve_id, const pb::Curve& c) {
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare("INSERT INTO points (curve_id, size, us) VALUES (?1, ?2, ?3)"));
  for (const pb::Point& p : c.points()) {
    CUPCAKE_RETURN_IF_ERROR(st.Reset());
    st.Bind(1, curve_id).Bind(2, static_cast<int64_t>(p.size())).Bind(3, p.us());
    CUPCAKE_RETURN_IF_ERROR(st.Run());
  }
  return Status::Ok();
}

Status WriteClusterMeta(sqlite3* db, const std::string& path, const std::map<std::string, std::string>& entries) {
  Statement meta(db, path);
  CUPCAKE_RETURN_IF_ERROR(meta.Prepare("INSERT OR REPLACE INTO cluster_meta (key, value) VALUES (?1, ?2)"));
  for (const auto& [k, v] : entries) {
    CUPCAKE_RETURN_IF_ERROR(meta.Reset());
    meta.Bind(1, k).Bind(2, v);
    CUPCAKE_RETURN_IF_ERROR(meta.Run());
  }
  return Status::Ok();
}

Status WriteCluster(sqlite3* db, const std::string& path, const pb::Cluster& c, bool clear_meta) {
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare(
      "INSERT OR REPLACE INTO cluster (id, name, nodes, devices_per_node, device, interconnect, network, source) "
      "VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
  st.Bind(1, c.name()).Bind(2, static_cast<int64_t>(c.nodes())).Bind(3, static_cast<int64_t>(c.devices_per_node()));
  st.BindOpt(4, c.has_device(), c.device()).BindOpt(5, c.has_interconnect(), c.interconnect());
  st.BindOpt(6, c.has_network(), c.network()).BindOpt(7, c.has_source(), c.source());
  CUPCAKE_RETURN_IF_ERROR(st.Run());
  if (clear_meta) CUPCAKE_RETURN_IF_ERROR(internal::Exec(db, path, "DELETE FROM cluster_meta"));
  return WriteClusterMeta(db, path, std::map<std::string, std::string>(c.meta().begin(), c.meta().end()));
}

StatusOr<std::optional<pb::Cluster>> ReadCluster(sqlite3* db, const std::string& path) {
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare(
      "SELECT name, nodes, devices_per_node, device, interconnect, network, source FROM cluster WHERE id = 1"));
  CUPCAKE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return std::optional<pb::Cluster>();
  internal::Problems problems(path);
  const int64_t kInt32Max = std::numeric_limits<int32_t>::max();
  pb::Cluster c;
  c.set_name(internal::ReadText(st, 0, problems, "cluster.name"));
  c.set_nodes(static_cast<int32_t>(internal::ReadInt(st, 1, 0, kInt32Max, problems, "cluster.nodes")));
  c.set_devices_per_node(
      static_cast<int32_t>(internal::ReadInt(st, 2, 0, kInt32Max, problems, "cluster.devices_per_node")));
  if (!st.IsNull(3)) c.set_device(internal::ReadText(st, 3, problems, "cluster.device"));
  if (!st.IsNull(4)) c.set_interconnect(internal::ReadText(st, 4, problems, "cluster.interconnect"));
  if (!st.IsNull(5)) c.set_network(internal::ReadText(st, 5, problems, "cluster.network"));
  if (!st.IsNull(6)) c.set_source(internal::ReadText(st, 6, problems, "cluster.source"));
  Statement meta(db, path);
  CUPCAKE_RETURN_IF_ERROR(meta.Prepare("SELECT key, value FROM cluster_meta ORDER BY key"));
  for (size_t i = 0;; ++i) {
    CUPCAKE_ASSIGN_OR_RETURN(bool more, meta.Step());
    if (!more) break;
    const std::string where = internal::Index("cluster.meta", i);
    std::string key = internal::ReadText(meta, 0, problems, where + ".key");
    (*c.mutable_meta())[key] = internal::ReadText(meta, 1, problems, where + ".value");
  }
  pb::Profile only_cluster;  // the cluster's own checks (bounds, UTF-8), as for an import
  *only_cluster.mutable_cluster() = c;
  internal::CheckProfile(only_cluster, "", problems);
  CUPCAKE_RETURN_IF_ERROR(problems.ToStatus(StatusCode::kDataLoss));
  return std::optional<pb::Cluster>(std::move(c));
}

// Cluster facts that must agree for a merge; "" when they do.
std::string ClusterDifference(const pb::Cluster& db, const pb::Cluster& in) {
  auto opt = [](bool has, const std::string& v) { return has ? Quote(v) : std::string("none"); };
  if (db.nodes() != in.nodes())
    return "cluster.nodes: differs from the DB's; got " + std::to_string(in.nodes()) + ", expected " +
           std::to_string(db.nodes());
  if (db.devices_per_node() != in.devices_per_node())
    return "cluster.devices_per_node: differs from the DB's; got " + std::to_string(in.devices_per_node()) +
           ", expected " + std::to_string(db.devices_per_node());
  if (db.has_device() != in.has_device() || db.device() != in.device())
    return "cluster.device: differs from the DB's; got " + opt(in.has_device(), in.device()) + ", expected " +
           opt(db.has_device(), db.device());
  if (db.has_interconnect() != in.has_interconnect() || db.interconnect() != in.interconnect())
    return "cluster.interconnect: differs from the DB's; got " + opt(in.has_interconnect(), in.interconnect()) +
           ", expected " + opt(db.has_interconnect(), db.interconnect());
  if (db.has_network() != in.has_network() || db.network() != in.network())
    return "cluster.network: differs from the DB's; got " + opt(in.has_network(), in.network()) + ", expected " +
           opt(db.has_network(), db.network());
  return "";
}

StatusOr<std::optional<int64_t>> FindModel(sqlite3* db, const std::string& path, const std::string& name) {
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare("SELECT id FROM models WHERE name = ?1"));
  st.Bind(1, name);
  CUPCAKE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return std::optional<int64_t>();
  return std::optional<int64_t>(st.Int(0));
}

// A tensor's shape in its DB column: the dimensions joined by commas, "64,3,7,7".
std::string ShapeText(const pb::Tensor& t) {
  std::string s;
  for (int i = 0; i < t.shape_size(); ++i) s += (i ? "," : "") + std::to_string(t.shape(i));
  return s;
}

// ShapeText's inverse into t; a problem at `where` when `text` is not such a list (the
// dimensions' range and product are the model validation's).
void ParseShapeText(const std::string& text, const std::string& where, internal::Problems& problems, pb::Tensor& t) {
  std::vector<int64_t> dims;
  size_t at = 0;
  while (true) {
    int64_t d = 0;
    const auto [next, ec] = std::from_chars(text.data() + at, text.data() + text.size(), d);
    at = static_cast<size_t>(next - text.data());
    if (ec != std::errc() || (at < text.size() && text[at] != ',')) {
      problems.Add(where, "malformed; got " + Quote(text) + ", expected dimensions joined by commas, such as '64,3,7,7'");
      return;
    }
    dims.push_back(d);
    if (at++ == text.size()) break;
  }
  for (int64_t d : dims) t.add_shape(d);
}

Status WriteModel(sqlite3* db, const std::string& path, const pb::Model& m, bool replace) {
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<int64_t> id, FindModel(db, path, m.name()));
  if (id && !replace)
    return AlreadyExistsError(path + ": models: already present; got " + Quote(m.name()) +
                              ", expected a model the DB does not hold (replace not requested)");
  Statement st(db, path);
  if (id) {
    CUPCAKE_RETURN_IF_ERROR(st.Prepare("UPDATE models SET source = ?2, forward_us = ?3, update_us = ?4 WHERE id = ?1"));
    st.Bind(1, *id);
    Statement del(db, path);
    CUPCAKE_RETURN_IF_ERROR(del.Prepare("DELETE FROM tensors WHERE model_id = ?1"));
    del.Bind(1, *id);
    CUPCAKE_RETURN_IF_ERROR(del.Run());
  } else {
    CUPCAKE_RETURN_IF_ERROR(
        st.Prepare("INSERT INTO models (position, name, source, forward_us, update_us) "
                   "VALUES ((SELECT COALESCE(MAX(position), -1) + 1 FROM models), ?1, ?2, ?3, ?4)"));
    st.Bind(1, m.name());
  }
  st.BindOpt(2, m.has_source(), m.source()).BindOpt(3, m.has_forward_us(), m.forward_us());
  st.BindOpt(4, m.has_update_us(), m.update_us());
  CUPCAKE_RETURN_IF_ERROR(st.Run());
  int64_t model_id = id ? *id : static_cast<int64_t>(sqlite3_last_insert_rowid(db));

  Statement t(db, path);
  CUPCAKE_RETURN_IF_ERROR(
      t.Prepare("INSERT INTO tensors (model_id, position, name, numel, dtype, backward_us, density, shape) "
                "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));
  for (int i = 0; i < m.tensors_size(); ++i) {
    const pb::Tensor& tensor = m.tensors(i);
    CUPCAKE_RETURN_IF_ERROR(t.Reset());
    t.Bind(1, model_id).Bind(2, static_cast<int64_t>(i)).Bind(3, tensor.name());
    t.Bind(4, static_cast<int64_t>(tensor.numel())).Bind(5, Name(tensor.dtype())).Bind(6, tensor.backward_us());
    t.BindOpt(7, tensor.has_density(), tensor.density());
    t.BindOpt(8, !tensor.shape().empty(), ShapeText(tensor));
    CUPCAKE_RETURN_IF_ERROR(t.Run());
  }
  return Status::Ok();
}

StatusOr<pb::Model> ReadModel(sqlite3* db, const std::string& path, int64_t id, internal::Problems& problems,
                              const std::string& where) {
  pb::Model m;
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare("SELECT name, source, forward_us, update_us FROM models WHERE id = ?1"));
  st.Bind(1, id);
  CUPCAKE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return InternalError(path + ": model row " + std::to_string(id) + " vanished");
  m.set_name(internal::ReadText(st, 0, problems, internal::Join(where, "name")));
  if (!st.IsNull(1)) m.set_source(internal::ReadText(st, 1, problems, internal::Join(where, "source")));
  if (!st.IsNull(2)) m.set_forward_us(internal::ReadReal(st, 2, problems, internal::Join(where, "forward_us")));
  if (!st.IsNull(3)) m.set_update_us(internal::ReadReal(st, 3, problems, internal::Join(where, "update_us")));
  Statement t(db, path);
  CUPCAKE_RETURN_IF_ERROR(
      t.Prepare("SELECT position, name, numel, dtype, backward_us, density, shape FROM tensors WHERE model_id = ?1 "
                "ORDER BY position"));
  t.Bind(1, id);
  const std::string tensors = internal::Join(where, "tensors");
  bool gap_reported = false;
  while (true) {
    CUPCAKE_ASSIGN_OR_RETURN(bool more, t.Step());
    if (!more) break;
    const int64_t i = m.tensors_size();
    const std::string tp = internal::Index(tensors, static_cast<size_t>(i));
    // Positions are the gradient-ready order: 0, 1, 2, ... with none missing.
    const int64_t position =
        internal::ReadInt(t, 0, 0, std::numeric_limits<int64_t>::max(), problems, tp + ".position");
    if (position != i && !gap_reported) {
      gap_reported = true;
      problems.Add(tp + ".position", "not contiguous in the DB; got " + std::to_string(position) + ", expected " +
                                         std::to_string(i) + " (a tensor row is missing)");
    }
    pb::Tensor* tensor = m.add_tensors();
    tensor->set_name(internal::ReadText(t, 1, problems, tp + ".name"));
    tensor->set_numel(internal::ReadInt(t, 2, 1, kMaxNumel, problems, tp + ".numel"));
    std::string dtype = internal::ReadText(t, 3, problems, tp + ".dtype");
    if (auto d = ParseDType(dtype))
      tensor->set_dtype(*d);
    else
      problems.Add(tp + ".dtype", "unknown dtype; got " + Quote(dtype) + ", expected one of " + DTypeNames());
    tensor->set_backward_us(internal::ReadReal(t, 4, problems, tp + ".backward_us"));
    if (!t.IsNull(5)) tensor->set_density(internal::ReadReal(t, 5, problems, tp + ".density"));
    if (!t.IsNull(6)) ParseShapeText(internal::ReadText(t, 6, problems, tp + ".shape"), tp + ".shape", problems, *tensor);
  }
  return m;
}

Status NoProfileYet(const std::string& path) {
  return FailedPreconditionError(path + ": holds no profile yet; expected a cupcake.profile.v1 import first");
}

// Begins a write transaction; when another writer holds the DB past the busy timeout, says so
// with the DB and the timeout (nothing has been written by then).
Status BeginWrite(Transaction& tx, const std::string& path, int busy_timeout_ms) {
  Status s = tx.Begin();
  if (s.code() != StatusCode::kUnavailable) return s;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", busy_timeout_ms / 1000.0);
  return UnavailableError(path + ": locked by another writer; waited " + secs +
                          " s (the lock timeout) and gave up, writing nothing; expected the other writer to "
                          "finish sooner (retry, or allow a longer lock timeout)");
}

}  // namespace

ProfileStore::ProfileStore(ProfileStore&& other) noexcept
    : db_(other.db_), path_(std::move(other.path_)), busy_timeout_ms_(other.busy_timeout_ms_) {
  other.db_ = nullptr;
}

ProfileStore& ProfileStore::operator=(ProfileStore&& other) noexcept {
  if (this != &other) {
    if (db_ != nullptr) sqlite3_close_v2(db_);
    db_ = other.db_;
    path_ = std::move(other.path_);
    busy_timeout_ms_ = other.busy_timeout_ms_;
    other.db_ = nullptr;
  }
  return *this;
}

ProfileStore::~ProfileStore() {
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

int ProfileStore::SchemaVersion() { return internal::SchemaVersion(); }

StatusOr<ProfileStore> ProfileStore::Open(const std::string& path, bool create, int busy_timeout_ms) {
  if (create) return OpenOrCreate(path, busy_timeout_ms, [](ProfileStore&) { return Status::Ok(); });
  return OpenFile(path, /*create_in_place=*/false, busy_timeout_ms);
}

StatusOr<ProfileStore> ProfileStore::OpenForReading(const std::string& path, int busy_timeout_ms) {
  return OpenFile(path, /*create_in_place=*/false, busy_timeout_ms, /*reading=*/true);
}

StatusOr<ProfileStore> ProfileStore::OpenOrCreate(const std::string& path, int busy_timeout_ms, const Writer& write) {
  RemoveStaleTemporaries(path);
  // Twice at most: when another process creates `path` between our look and our link, the
  // second round finds it.
  for (int round = 0; round < 2; ++round) {
    auto store = OpenFile(path, /*create_in_place=*/false, busy_timeout_ms);
    if (store.ok()) {
      CUPCAKE_RETURN_IF_ERROR(write(*store));
      return store;
    }
    if (store.status().code() != StatusCode::kNotFound) return store.status();
    Status created = CreateAtomically(path, busy_timeout_ms, write);
    if (created.ok()) return OpenFile(path, /*create_in_place=*/false, busy_timeout_ms);
    if (created.code() != StatusCode::kAlreadyExists) return created;
  }
  return UnavailableError(path +
                          ": appeared and vanished while it was being created; expected it to stay "
                          "(another process removing it?)");
}

Status ProfileStore::CreateAtomically(const std::string& path, int busy_timeout_ms, const Writer& write) {
  std::string tmp = path + ".new-XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0) return FailedPreconditionError(path + ": cannot create: " + std::strerror(errno));
  // Held until the temporary is gone: the lock tells a later run that its creator is alive.
  struct Locked {
    int fd;
    ~Locked() { ::close(fd); }
  } locked{fd};
  (void)::flock(fd, LOCK_EX);
  // mkstemp makes the file 0600; a DB gets the mode any new file gets (0666 less the umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  (void)::fchmod(fd, 0666 & ~mask);
  auto remove_tmp = [&tmp] {
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((tmp + suffix).c_str());
  };
  Status filled = [&] {
    CUPCAKE_ASSIGN_OR_RETURN(ProfileStore store, OpenFile(tmp, /*create_in_place=*/true, busy_timeout_ms));
    CUPCAKE_RETURN_IF_ERROR(write(store));
    // The WAL into the file, checked: closing the store checkpoints too, but cannot report a
    // failure (a full disk), and a file left short would be linked into place.
    return internal::Exec(store.db_, tmp, "PRAGMA wal_checkpoint(TRUNCATE)");
  }();  // the store is closed here: its (now empty) WAL is removed
  if (filled.ok()) filled = CheckHeader(tmp);  // whole pages, as the header says
  if (!filled.ok()) {
    remove_tmp();
    return Status(filled.code(), ReplaceAll(filled.message(), tmp, path));
  }
  int rc = ::link(tmp.c_str(), path.c_str());  // fails when `path` exists: never replaces it
  int err = errno;
  remove_tmp();
  if (rc == 0) return Status::Ok();
  if (err == EEXIST) return AlreadyExistsError(path + ": created by another process meanwhile");
  return FailedPreconditionError(path + ": cannot create: link: " + std::strerror(err));
}

StatusOr<ProfileStore> ProfileStore::OpenFile(const std::string& path, bool create_in_place, int busy_timeout_ms,
                                              bool reading) {
  if (busy_timeout_ms < 0)
    return InvalidArgumentError(path + ": busy timeout out of range; got " + std::to_string(busy_timeout_ms) +
                                " ms, expected >= 0");
  if (path.empty()) return InvalidArgumentError("profile DB path: empty; expected a file name");
  struct stat info;
  bool exists = ::stat(path.c_str(), &info) == 0;
  if (!exists) return NotFoundError(path + ": no such profile DB");
  if (S_ISDIR(info.st_mode)) return InvalidArgumentError(path + ": is a directory; expected an SQLite profile DB");
  if (!S_ISREG(info.st_mode))
    return InvalidArgumentError(path +
                                ": not a regular file; expected an SQLite profile DB (SQLite cannot use a "
                                "pipe or device)");
  CUPCAKE_RETURN_IF_ERROR(CheckHeader(path));
  const bool create = create_in_place && info.st_size == 0;

  sqlite3* raw = nullptr;
  // Read-write even to read: SQLite then removes the WAL's side files when the store closes. On
  // read-only media a DB in WAL mode cannot be opened that way (nor read-only: SQLite must
  // create its -shm file), and nothing can change it there: it is opened immutable.
  struct statvfs media;
  const bool read_only_media = ::statvfs(path.c_str(), &media) == 0 && (media.f_flag & ST_RDONLY) != 0;
  if (read_only_media && !reading)
    return FailedPreconditionError(path + ": on a read-only file system; expected a DB that can be written (read it "
                                          "with inspect, export or cupcake-plan; write a copy elsewhere)");
  int rc = read_only_media ? sqlite3_open_v2(("file:" + UriPath(path) + "?immutable=1").c_str(), &raw,
                                             SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nullptr)
                           : sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr);
  ProfileStore store(raw, path);  // owns the handle from here, even on error
  store.busy_timeout_ms_ = busy_timeout_ms;
  CUPCAKE_SQLITE_RETURN_IF_ERROR(rc, raw, path, "open");
  sqlite3_busy_timeout(raw, busy_timeout_ms);
  CUPCAKE_RETURN_IF_ERROR(internal::Exec(raw, path, "PRAGMA foreign_keys = ON"));

  CUPCAKE_ASSIGN_OR_RETURN(int64_t app_id, internal::PragmaInt(raw, path, "application_id"));
  CUPCAKE_ASSIGN_OR_RETURN(int64_t version, internal::PragmaInt(raw, path, "user_version"));
  CUPCAKE_ASSIGN_OR_RETURN(int64_t objects, QueryInt(raw, path, "SELECT count(*) FROM sqlite_schema"));
  if (app_id != internal::kApplicationId) {
    bool empty = app_id == 0 && version == 0 && objects == 0;
    if (!empty)
      return InvalidArgumentError(path + ": not a cupcake profile DB; got an SQLite DB with application_id " +
                                  Hex(app_id) + " and " + std::to_string(objects) +
                                  " schema objects, expected application_id " + Hex(internal::kApplicationId));
    if (!create)
      return InvalidArgumentError(path +
                                  ": not a cupcake profile DB; got an empty SQLite DB, expected one written by "
                                  "cupcake-profile import");
  }
  if (version > internal::SchemaVersion())
    return FailedPreconditionError(path + ": schema version too new; got " + std::to_string(version) +
                                   ", expected <= " + std::to_string(internal::SchemaVersion()) +
                                   " (written by a newer cupcake; use that one)");
  bool read_only = sqlite3_db_readonly(raw, "main") == 1;
  if (!read_only && !reading) {
    CUPCAKE_RETURN_IF_ERROR(internal::Exec(raw, path, "PRAGMA journal_mode = WAL"));
    CUPCAKE_RETURN_IF_ERROR(internal::Exec(raw, path, "PRAGMA synchronous = FULL"));
  }
  if (version < internal::SchemaVersion() && reading) {
    // Read the file once into memory and migrate that copy: the file stays as it was.
    sqlite3* copy = nullptr;
    rc = sqlite3_open_v2(":memory:", &copy, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
    ProfileStore in_memory(copy, path);
    CUPCAKE_SQLITE_RETURN_IF_ERROR(rc, copy, path, "open a copy in memory");
    sqlite3_backup* backup = sqlite3_backup_init(copy, "main", raw, "main");
    if (backup == nullptr) return internal::SqliteStatus(sqlite3_errcode(copy), copy, path, "copy into memory");
    rc = sqlite3_backup_step(backup, -1);
    const int finished = sqlite3_backup_finish(backup);
    CUPCAKE_SQLITE_RETURN_IF_ERROR(rc == SQLITE_DONE ? finished : rc, raw, path, "copy into memory");
    CUPCAKE_RETURN_IF_ERROR(internal::Exec(copy, path, "PRAGMA foreign_keys = ON"));
    in_memory.busy_timeout_ms_ = busy_timeout_ms;
    store = std::move(in_memory);  // closes the file
    raw = copy;
    read_only = false;
  }
  if (version < internal::SchemaVersion()) {
    if (read_only)
      return FailedPreconditionError(path + ": schema version " + std::to_string(version) +
                                     " needs a migration, but the file is read-only");
    CUPCAKE_RETURN_IF_ERROR(internal::Migrate(raw, path, internal::Migrations()));
  }

  Statement check(raw, path);
  CUPCAKE_RETURN_IF_ERROR(check.Prepare("PRAGMA quick_check(5)"));
  std::string result;
  while (true) {
    auto more = check.Step();
    if (!more.ok()) return DataLossError(path + ": corrupt or truncated DB: " + more.status().message());
    if (!*more) break;
    result += (result.empty() ? "" : "; ") + check.Text(0);
  }
  if (result != "ok") return DataLossError(path + ": corrupt or truncated DB: " + result);
  return store;
}

StatusOr<std::optional<pb::Cluster>> ProfileStore::LoadCluster() const { return ReadCluster(db_, path_); }

Status ProfileStore::ImportProfile(const pb::Profile& profile, bool replace) {
  CUPCAKE_RETURN_IF_ERROR(ValidateProfile(profile, "profile " + Quote(EscapeBytes(profile.cluster().name()))));
  Transaction tx(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(BeginWrite(tx, path_, busy_timeout_ms_));
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> existing, ReadCluster(db_, path_));
  const pb::Cluster& in = profile.cluster();
  if (existing && existing->name() != in.name()) {
    if (!replace)
      return AlreadyExistsError(path_ + ": cluster.name: the DB holds another cluster's profile; got " +
                                Quote(in.name()) + ", expected " + Quote(existing->name()) +
                                " (one DB holds one profile; replace not requested)");
    CUPCAKE_RETURN_IF_ERROR(internal::Exec(db_, path_,
                                           "DELETE FROM points; DELETE FROM curves; DELETE FROM tensors; "
                                           "DELETE FROM models; DELETE FROM cluster_meta; DELETE FROM cluster;"));
    existing.reset();
  }
  if (existing && !replace) {
    std::string diff = ClusterDifference(*existing, in);
    if (!diff.empty()) return AlreadyExistsError(path_ + ": " + diff + " (replace not requested)");
  }
  if (existing && replace)
    CUPCAKE_RETURN_IF_ERROR(internal::Exec(db_, path_, "DELETE FROM points; DELETE FROM curves;"));
  CUPCAKE_RETURN_IF_ERROR(WriteCluster(db_, path_, in, replace));

  for (const pb::Curve& c : profile.curves()) {
    CUPCAKE_ASSIGN_OR_RETURN(std::optional<int64_t> id, FindCurve(db_, path_, c));
    if (id)
      return AlreadyExistsError(path_ + ": curves: already present; got " + Quote(CurveKey(c)) +
                                ", expected a curve the DB does not hold (replace not requested)");
    CUPCAKE_ASSIGN_OR_RETURN(int64_t new_id, InsertCurve(db_, path_, c));
    CUPCAKE_RETURN_IF_ERROR(InsertPoints(db_, path_, new_id, c));
  }
  for (const pb::Model& m : profile.models()) CUPCAKE_RETURN_IF_ERROR(WriteModel(db_, path_, m, replace));
  CUPCAKE_RETURN_IF_ERROR(CheckWrittenTables(db_, path_, {"cluster", "cluster_meta", "curves", "points", "models",
                                                          "tensors"}));
  return tx.Commit();
}

Status ProfileStore::ImportModel(const pb::Model& model, bool replace) {
  CUPCAKE_RETURN_IF_ERROR(ValidateModel(model, "model " + Quote(EscapeBytes(model.name()))));
  Transaction tx(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(BeginWrite(tx, path_, busy_timeout_ms_));
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> cluster, ReadCluster(db_, path_));
  if (!cluster)
    return FailedPreconditionError(path_ + ": holds no profile yet; got model " + Quote(model.name()) +
                                   ", expected a cupcake.profile.v1 import first (a model belongs to a cluster)");
  CUPCAKE_RETURN_IF_ERROR(WriteModel(db_, path_, model, replace));
  CUPCAKE_RETURN_IF_ERROR(CheckWrittenTables(db_, path_, {"models", "tensors"}));
  return tx.Commit();
}

StatusOr<pb::Profile> ProfileStore::Load() const {
  // One read transaction, so the profile is one consistent snapshot under a concurrent writer.
  CUPCAKE_RETURN_IF_ERROR(internal::Exec(db_, path_, "BEGIN"));
  struct EndRead {
    sqlite3* db;
    ~EndRead() { sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr); }
  } end_read{db_};

  pb::Profile profile;
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> cluster, ReadCluster(db_, path_));
  if (!cluster) return NoProfileYet(path_);
  *profile.mutable_cluster() = std::move(*cluster);

  internal::Problems problems(path_);
  Statement curves(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(
      curves.Prepare("SELECT id, kind, op, scope, compressor, device, method, warmup, iters, wrong, dtype, ratio, "
                     "busy, chained FROM curves ORDER BY position"));
  Statement points(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(points.Prepare("SELECT size, us FROM points WHERE curve_id = ?1 ORDER BY size"));
  while (true) {
    CUPCAKE_ASSIGN_OR_RETURN(bool more, curves.Step());
    if (!more) break;
    const std::string where = internal::Index("curves", static_cast<size_t>(profile.curves_size()));
    pb::Curve* c = profile.add_curves();
    auto bad = [&](std::string_view column, const std::string& value, const std::string& names) {
      problems.Add(internal::Join(where, column),
                   "unknown name in the DB; got " + Quote(value) + ", expected one of " + names);
    };
    std::string kind = internal::ReadText(curves, 1, problems, internal::Join(where, "kind"));
    std::string op = internal::ReadText(curves, 2, problems, internal::Join(where, "op"));
    std::string scope = internal::ReadText(curves, 3, problems, internal::Join(where, "scope"));
    std::string device = internal::ReadText(curves, 5, problems, internal::Join(where, "device"));
    if (auto k = ParseCurveKind(kind))
      c->set_kind(*k);
    else
      bad("kind", kind, CurveKindNames());
    if (c->kind() == pb::COMM) {
      if (auto o = ParseCommOp(op))
        c->set_comm_op(*o);
      else
        bad("op", op, CommOpNames());
      if (auto s = ParseScope(scope))
        c->set_scope(*s);
      else
        bad("scope", scope, ScopeNames());
      const std::string dtype = internal::ReadText(curves, 10, problems, internal::Join(where, "dtype"));
      if (auto d = ParseDType(dtype))
        c->set_dtype(*d);
      else if (!dtype.empty())
        bad("dtype", dtype, DTypeNames());
      c->set_busy(internal::ReadInt(curves, 12, 0, 1, problems, internal::Join(where, "busy")) == 1);
      c->set_chained(internal::ReadInt(curves, 13, 0, 1, problems, internal::Join(where, "chained")) == 1);
    } else if (c->kind() == pb::COPY) {
      if (auto o = ParseCopyOp(op))
        c->set_copy_op(*o);
      else
        bad("op", op, CopyOpNames());
    }
    if (c->kind() == pb::ENCODE || c->kind() == pb::DECODE) {
      c->set_compressor(internal::ReadText(curves, 4, problems, internal::Join(where, "compressor")));
      // 0 is "not recorded"; a recorded ratio's range is checked with the curve's key.
      if (const double ratio = internal::ReadReal(curves, 11, problems, internal::Join(where, "ratio")); ratio != 0.0)
        c->set_ratio(ratio);
    }
    if (c->kind() == pb::ENCODE || c->kind() == pb::DECODE || c->kind() == pb::COPY) {
      if (auto d = ParseDevice(device))
        c->set_device(*d);
      else
        bad("device", device, DeviceNames());
    }
    const int64_t kInt32Max = std::numeric_limits<int32_t>::max();
    auto count = [&](int col, std::string_view name) {
      return static_cast<int32_t>(internal::ReadInt(curves, col, 0, kInt32Max, problems, internal::Join(where, name)));
    };
    if (!curves.IsNull(6)) c->set_method(internal::ReadText(curves, 6, problems, internal::Join(where, "method")));
    if (!curves.IsNull(7)) c->set_warmup(count(7, "warmup"));
    if (!curves.IsNull(8)) c->set_iters(count(8, "iters"));
    if (!curves.IsNull(9)) c->set_wrong(count(9, "wrong"));
    CUPCAKE_RETURN_IF_ERROR(points.Reset());
    points.Bind(1, curves.Int(0));
    while (true) {
      CUPCAKE_ASSIGN_OR_RETURN(bool p, points.Step());
      if (!p) break;
      const std::string pp = internal::Index(internal::Join(where, "points"), static_cast<size_t>(c->points_size()));
      pb::Point* point = c->add_points();
      point->set_size(internal::ReadInt(points, 0, 1, kMaxCurveSize, problems, pp + ".size"));
      point->set_us(internal::ReadReal(points, 1, problems, pp + ".us"));
    }
  }

  Statement models(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(models.Prepare("SELECT id FROM models ORDER BY position"));
  while (true) {
    CUPCAKE_ASSIGN_OR_RETURN(bool more, models.Step());
    if (!more) break;
    const std::string where = internal::Index("models", static_cast<size_t>(profile.models_size()));
    CUPCAKE_ASSIGN_OR_RETURN(*profile.add_models(), ReadModel(db_, path_, models.Int(0), problems, where));
  }
  internal::CheckProfile(profile, "", problems);
  CUPCAKE_RETURN_IF_ERROR(problems.ToStatus(StatusCode::kDataLoss));
  return profile;
}

StatusOr<std::vector<std::string>> ProfileStore::ModelNames() const {
  Statement st(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare("SELECT name FROM models ORDER BY position"));
  std::vector<std::string> names;
  while (true) {
    CUPCAKE_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    names.push_back(st.Text(0));
  }
  return names;
}

StatusOr<pb::Model> ProfileStore::LoadModel(const std::string& name) const {
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<int64_t> id, FindModel(db_, path_, name));
  if (!id) {
    CUPCAKE_ASSIGN_OR_RETURN(std::vector<std::string> names, ModelNames());
    std::vector<std::string_view> views(names.begin(), names.end());
    return NotFoundError(path_ + ": models: no such model; got " + Quote(name) + DidYouMean(name, views) +
                         ", expected one of " +
                         (names.empty() ? "(none: the DB holds no models)" : internal::JoinNames(views)));
  }
  internal::Problems problems(path_);
  CUPCAKE_ASSIGN_OR_RETURN(pb::Model model, ReadModel(db_, path_, *id, problems, "model " + Quote(name)));
  internal::CheckModel(model, "model " + Quote(name), problems);
  CUPCAKE_RETURN_IF_ERROR(problems.ToStatus(StatusCode::kDataLoss));
  return model;
}

namespace {

Status UpdateMetadata(sqlite3* db, const std::string& path, int64_t curve_id, const pb::Curve& c) {
  Statement st(db, path);
  CUPCAKE_RETURN_IF_ERROR(
      st.Prepare("UPDATE curves SET method = COALESCE(?2, method), warmup = COALESCE(?3, warmup), "
                 "iters = COALESCE(?4, iters), wrong = COALESCE(?5, wrong) WHERE id = ?1"));
  st.Bind(1, curve_id).BindOpt(2, c.has_method(), c.method()).BindOptInt(3, c.has_warmup(), c.warmup());
  st.BindOptInt(4, c.has_iters(), c.iters()).BindOptInt(5, c.has_wrong(), c.wrong());
  return st.Run();
}

}  // namespace

Status ProfileStore::AddPoint(const pb::Curve& key_and_metadata, int64_t size, double us, bool replace) {
  const pb::Curve& c = key_and_metadata;
  {
    internal::Problems problems(path_ + ": AddPoint");
    internal::CheckCurveKey(c, "", problems);
    internal::CheckPoint(size, us, "point", problems);
    CUPCAKE_RETURN_IF_ERROR(problems.ToStatus());
  }
  Transaction tx(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(BeginWrite(tx, path_, busy_timeout_ms_));
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> cluster, ReadCluster(db_, path_));
  if (!cluster) return NoProfileYet(path_);
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<int64_t> id, FindCurve(db_, path_, c));
  int64_t curve_id = 0;
  if (id) {
    curve_id = *id;
    CUPCAKE_RETURN_IF_ERROR(UpdateMetadata(db_, path_, curve_id, c));
  } else {
    CUPCAKE_ASSIGN_OR_RETURN(curve_id, InsertCurve(db_, path_, c));
  }
  Statement exists(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(exists.Prepare("SELECT 1 FROM points WHERE curve_id = ?1 AND size = ?2"));
  exists.Bind(1, curve_id).Bind(2, size);
  CUPCAKE_ASSIGN_OR_RETURN(bool present, exists.Step());
  if (present && !replace)
    return AlreadyExistsError(path_ + ": curve " + Quote(CurveKey(c)) + ": point already present; got size " +
                              std::to_string(size) + " again, expected a size not measured yet");
  Statement write(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(write.Prepare(present ? "UPDATE points SET us = ?3 WHERE curve_id = ?1 AND size = ?2"
                                                : "INSERT INTO points (curve_id, size, us) VALUES (?1, ?2, ?3)"));
  write.Bind(1, curve_id).Bind(2, size).Bind(3, us);
  CUPCAKE_RETURN_IF_ERROR(write.Run());
  return tx.Commit();
}

Status ProfileStore::SetClusterMeta(const std::map<std::string, std::string>& entries) {
  Transaction tx(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(BeginWrite(tx, path_, busy_timeout_ms_));
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> cluster, ReadCluster(db_, path_));
  if (!cluster) return NoProfileYet(path_);
  CUPCAKE_RETURN_IF_ERROR(WriteClusterMeta(db_, path_, entries));
  return tx.Commit();
}

Status ProfileStore::UpdateCurveMetadata(const pb::Curve& key_and_metadata) {
  const pb::Curve& c = key_and_metadata;
  {
    internal::Problems problems(path_ + ": UpdateCurveMetadata");
    internal::CheckCurveKey(c, "", problems);
    CUPCAKE_RETURN_IF_ERROR(problems.ToStatus());
  }
  Transaction tx(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(BeginWrite(tx, path_, busy_timeout_ms_));
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<int64_t> id, FindCurve(db_, path_, c));
  if (!id) return NotFoundError(path_ + ": curve " + Quote(CurveKey(c)) + ": not in the DB");
  CUPCAKE_RETURN_IF_ERROR(UpdateMetadata(db_, path_, *id, c));
  return tx.Commit();
}

StatusOr<std::vector<int64_t>> ProfileStore::PointSizes(const pb::Curve& key) const {
  std::vector<int64_t> sizes;
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<int64_t> id, FindCurve(db_, path_, key));
  if (!id) return sizes;
  Statement st(db_, path_);
  CUPCAKE_RETURN_IF_ERROR(st.Prepare("SELECT size FROM points WHERE curve_id = ?1 ORDER BY size"));
  st.Bind(1, *id);
  while (true) {
    CUPCAKE_ASSIGN_OR_RETURN(bool more, st.Step());
    if (!more) break;
    sizes.push_back(st.Int(0));
  }
  return sizes;
}

}  // namespace cupcake::profile

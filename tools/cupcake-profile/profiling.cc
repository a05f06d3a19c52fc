#include "profiling.h"

#include "cupcake/tools/cli.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <tuple>
#include <utility>

#include "cupcake/comm/gloo.h"
#include "cupcake/comm/store.h"
#include "cupcake/proto/host_load.h"
#include "cupcake/proto/names.h"

namespace cupcake::profile_cli {
namespace {

double NowS() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string Seconds(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  else
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::ostream& err, std::string label)
    : err_(err), label_(std::move(label)), start_s_(NowS()) {}

void ProgressBar::Update(int64_t done, int64_t total) {
  constexpr int kWidth = 30;
  const double elapsed = NowS() - start_s_;
  const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int filled = static_cast<int>(std::lround(frac * kWidth));
  std::string eta = done > 0 && done < total ? Seconds(elapsed / frac - elapsed) : "-";
  err_ << "\r" << label_ << " [" << std::string(static_cast<size_t>(filled), '#')
       << std::string(static_cast<size_t>(kWidth - filled), '.') << "] " << done << "/" << total << " points, elapsed "
       << Seconds(elapsed) << ", eta " << eta << "   " << std::flush;
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (drawn_) err_ << "\n" << std::flush;
  drawn_ = false;
}

StatusOr<int> LockTimeoutMs(double seconds) {
  if (!(seconds >= 0 && seconds <= 86400)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", seconds);
    return InvalidArgumentError(std::string("--lock-timeout: out of range; got ") + got +
                                ", expected 0 <= seconds <= 86400");
  }
  return static_cast<int>(std::lround(seconds * 1000));
}

bool StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

StatusOr<int64_t> LargestModelSize(const std::string& db, bool bytes, std::string_view flag) {
  const std::string what = std::string(flag) + " auto";
  auto store = profile::ProfileStore::Open(db, /*create=*/false);
  if (!store.ok()) return Status(store.status().code(), what + ": " + store.status().message());
  CUPCAKE_ASSIGN_OR_RETURN(std::vector<std::string> names, store->ModelNames());
  if (names.empty())
    return FailedPreconditionError(what + ": " + db +
                                   " holds no model; expected one (cupcake-profile import MODEL.json, "
                                   "or compute), or a size such as " +
                                   std::string(flag) + " 16777216");
  int64_t largest = 1;
  for (const std::string& name : names) {
    CUPCAKE_ASSIGN_OR_RETURN(pb::Model m, store->LoadModel(name));
    int64_t total = 0;  // bounded: at most 2^40 elements of at most 8 bytes
    for (const pb::Tensor& t : m.tensors()) total += t.numel() * (bytes ? DTypeBytes(t.dtype()) : 1);
    largest = std::max(largest, total);
  }
  return std::min<int64_t>(static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(largest))), int64_t{1} << 30);
}

StatusOr<std::optional<int64_t>> ParseSizeOrAuto(std::string_view flag, const std::string& text) {
  if (text == "auto") return std::optional<int64_t>();
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size())
    return InvalidArgumentError(std::string(flag) + ": not a size; got '" + text +
                                "', expected a power of two in bytes or elements, or auto");
  return std::optional<int64_t>(v);
}

std::string UtcNow() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

// This machine's busy CPU seconds over every core since boot (/proc/stat's first line: user,
// nice, system, idle, iowait, irq, softirq, steal; ticks of sysconf(_SC_CLK_TCK)).
std::optional<double> MachineBusyS() {
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return std::nullopt;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice, &system, &idle, &iowait,
                            &irq, &softirq, &steal);
  std::fclose(f);
  const long tick = sysconf(_SC_CLK_TCK);
  if (n < 3 || tick <= 0) return std::nullopt;
  return static_cast<double>(user + nice + system + (n >= 8 ? steal : 0)) / static_cast<double>(tick);
}

double OwnS() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return s(u.ru_utime) + s(u.ru_stime);
}

CpuSample SampleNow() {
  CpuSample s;
  const std::optional<double> busy = MachineBusyS();
  std::FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r");
  const bool id = f != nullptr && std::fgets(s.machine, sizeof s.machine, f) != nullptr;
  if (f != nullptr) std::fclose(f);
  s.busy_s = busy.value_or(0);
  s.own_s = OwnS();
  s.wall_s = NowS();
  s.cores = static_cast<int32_t>(sysconf(_SC_NPROCESSORS_ONLN));
  s.pid = static_cast<int32_t>(getpid());
  s.valid = busy.has_value() && id && s.cores >= 1 ? 1 : 0;
  return s;
}

}  // namespace

CpuMeter::CpuMeter() : start_(SampleNow()) {}

CpuSample CpuMeter::Take() const {
  CpuSample s = SampleNow();
  s.valid = s.valid && start_.valid && std::string_view(s.machine) == start_.machine;
  s.busy_s -= start_.busy_s;
  s.own_s -= start_.own_s;
  s.wall_s -= start_.wall_s;
  return s;
}

double OtherWorkCores(const std::vector<CpuSample>& samples) {
  struct Machine {
    double busy_s = 0, wall_s = 0;
    std::map<int32_t, double> own_s;  // per process
  };
  std::map<std::string, Machine> machines;
  for (const CpuSample& s : samples) {
    Machine& m = machines[std::string(s.machine, strnlen(s.machine, sizeof s.machine))];
    m.busy_s = std::max(m.busy_s, s.busy_s);
    m.wall_s = std::max(m.wall_s, s.wall_s);
    m.own_s[s.pid] = std::max(m.own_s[s.pid], s.own_s);
  }
  double cores = 0;
  for (const auto& [id, m] : machines) {
    double own_s = 0;
    for (const auto& [pid, s] : m.own_s) own_s += s;
    if (m.wall_s > 0) cores = std::max(cores, (m.busy_s - own_s) / m.wall_s);
  }
  return cores;
}

StatusOr<std::optional<HostLoad>> MeasureOtherWork(const CpuMeter& meter, comm::Communicator* world) {
  const CpuSample mine = meter.Take();
  std::vector<CpuSample> all(world != nullptr ? static_cast<size_t>(world->size()) : 1, mine);
  if (world != nullptr) CUPCAKE_RETURN_IF_ERROR(world->Allgather(&mine, all.data(), sizeof(CpuSample)));
  int cores = 0;
  for (const CpuSample& s : all) {
    if (!s.valid) return std::optional<HostLoad>();
    cores = std::max(cores, static_cast<int>(s.cores));
  }
  return std::optional<HostLoad>(HostLoad{OtherWorkCores(all), cores});
}

Status RecordOtherWork(profile::ProfileStore& store, std::string_view key, const std::optional<HostLoad>& load) {
  if (!load) return Status::Ok();
  return store.SetClusterMeta({{std::string(key), FormatHostLoad(*load)}});
}

StatusOr<int64_t> LargestModelSizeFromRoot(comm::Communicator* world, const std::string& db, bool bytes,
                                           std::string_view flag) {
  if (world == nullptr) return LargestModelSize(db, bytes, flag);
  int64_t size = 0;
  Status found;
  if (world->rank() == 0) {
    auto largest = LargestModelSize(db, bytes, flag);
    if (largest.ok())
      size = *largest;
    else
      found = largest.status();
  }
  CUPCAKE_RETURN_IF_ERROR(ShareRootStatus(*world, found));
  CUPCAKE_RETURN_IF_ERROR(world->Broadcast(&size, sizeof size, 0));
  return size;
}

namespace {

// An integer environment variable set by the launcher; nullopt when unset or not an integer.
std::optional<int> EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || n < 0 || n > INT32_MAX) return std::nullopt;
  return static_cast<int>(n);
}

// torchrun's RANK and WORLD_SIZE (0 <= RANK < WORLD_SIZE); nullopt when either is missing or
// out of range.
std::optional<std::pair<int, int>> TorchrunRankSize() {
  const std::optional<int> r = EnvInt("RANK"), n = EnvInt("WORLD_SIZE");
  if (!r || !n || *n < 1 || *r >= *n) return std::nullopt;
  return std::make_pair(*r, *n);
}

// --backend gloo: the world is a gloo communicator whose ranks meet in the file store --store.
// Its rank and size come from the MPI world under mpirun, else from torchrun's RANK and
// WORLD_SIZE. The keys of one launch live under a prefix of their own: under mpirun rank 0's
// host, process id and clock broadcast over MPI; under torchrun TORCHELASTIC_RUN_ID and
// MASTER_PORT (two torchrun jobs sharing both and the directory at once would collide).
StatusOr<std::unique_ptr<comm::Communicator>> GlooWorld(comm::Communicator* mpi_world, const std::string& dir) {
  if (dir.empty())
    return InvalidArgumentError("--store: missing; expected a directory the ranks share (--backend gloo)");
  int rank = 0, size = 1;
  std::string launch;
  if (mpi_world != nullptr) {
    rank = mpi_world->rank();
    size = mpi_world->size();
    char token[128] = {};
    if (rank == 0)
      std::snprintf(token, sizeof token, "mpi-%s-%d-%lld", mpi_world->host().c_str(), static_cast<int>(::getpid()),
                    static_cast<long long>(std::chrono::system_clock::now().time_since_epoch().count()));
    CUPCAKE_RETURN_IF_ERROR(mpi_world->Broadcast(token, sizeof token, 0));
    launch = token;
  } else {
    const std::optional<std::pair<int, int>> torchrun = TorchrunRankSize();
    if (!torchrun)
      return FailedPreconditionError(
          "--backend gloo: RANK and WORLD_SIZE: missing or out of range; expected a launch by torchrun (0 <= RANK < "
          "WORLD_SIZE) or by mpirun");
    std::tie(rank, size) = *torchrun;
    const char* run = std::getenv("TORCHELASTIC_RUN_ID");
    const char* port = std::getenv("MASTER_PORT");
    launch = std::string("torchrun-") + (run != nullptr ? run : "") + "-" + (port != nullptr ? port : "");
  }
  CUPCAKE_ASSIGN_OR_RETURN(std::shared_ptr<comm::KeyValueStore> store, comm::MakeFileStore(dir));
  auto made = comm::MakeGlooCommunicator(comm::PrefixStore(store, launch + "/"), rank, size);
  if (!made.ok()) return made.status().WithPrefix("--backend gloo");
  return made;
}

}  // namespace

bool UnderMpiLauncher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

int LaunchRank(comm::Communicator* mpi_world) {
  if (mpi_world != nullptr) return mpi_world->rank();
  if (UnderMpiLauncher()) return 0;  // MPI did not start: every rank says why
  const std::optional<std::pair<int, int>> torchrun = TorchrunRankSize();
  return torchrun ? torchrun->first : 0;
}

std::optional<int> OpenJobWorld(tools::Invocation& inv, comm::Communicator* mpi_world, const std::string& mpi_problem,
                                const std::string& backend, const std::string& store_dir, JobWorld& out) {
  if (!mpi_problem.empty()) {
    inv.rank = 0;  // no world: each rank reports for itself
    return tools::Finish(inv, FailedPreconditionError(inv.command + ": " + mpi_problem));
  }
  if (backend != "gloo") {
    if (!store_dir.empty())
      return tools::UsageError(inv, "--store: only with --backend gloo; got --backend " + backend);
    // Under torchrun with no MPI launcher each worker would be a world of one: every one would
    // sweep alone and write the DB.
    const std::optional<std::pair<int, int>> torchrun = TorchrunRankSize();
    if (mpi_world == nullptr && torchrun && torchrun->second > 1)
      return tools::UsageError(inv, "--backend " + backend + ": no MPI launcher, but torchrun's WORLD_SIZE is " +
                                        std::to_string(torchrun->second) +
                                        "; expected --backend gloo --store DIR under torchrun, or a launch by mpirun");
    out.world = mpi_world;
  } else {
    auto made = GlooWorld(mpi_world, store_dir);
    if (!made.ok())
      return made.status().code() == StatusCode::kInvalidArgument ? tools::UsageError(inv, made.status().message())
                                                                  : tools::Finish(inv, made.status());
    out.gloo = std::move(made).value();
    out.world = out.gloo.get();
  }
  inv.rank = out.world != nullptr ? out.world->rank() : 0;
  return std::nullopt;
}

int FinishJob(tools::Invocation& inv, const comm::Communicator* world, Status status) {
  if (world != nullptr && world->rank() != 0 && status.PrintedBy(world->rank())) {
    const std::string where = "rank " + std::to_string(world->rank()) + " on " + world->host();
    if (status.message().find(where) == std::string::npos) status = status.WithPrefix(where);
  }
  return tools::Finish(inv, status);
}

}  // namespace cupcake::profile_cli

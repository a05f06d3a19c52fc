// What the profiling commands (kernels, comm) share: the progress bar, the cluster record in
// the DB, the run's meta.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/proto/host_load.h"
#include "cupcake/profile/profile_run.h"
#include "cupcake/profile/store.h"
#include "cupcake/profile/sweep.h"
#include "cupcake/tools/cli.h"

namespace cupcake::profile_cli {

// Draws "label [#####.....] done/total points, elapsed 3s, eta 5s" on one line of `err`,
// redrawn in place; Finish() ends the line. Meant for a terminal only.
class ProgressBar {
 public:
  ProgressBar(std::ostream& err, std::string label);
  void Update(int64_t done, int64_t total);
  void Finish();
  profile::ProgressFn Fn() {
    return [this](int64_t d, int64_t t) { Update(d, t); };
  }

 private:
  std::ostream& err_;
  std::string label_;
  double start_s_;
  bool drawn_ = false;
};

// --lock-timeout SECONDS as the store's busy timeout in ms: 0 <= seconds <= 86400.
StatusOr<int> LockTimeoutMs(double seconds);
// The help text of --lock-timeout, shared by the commands that write a DB.
inline constexpr const char* kLockTimeoutHelp =
    "seconds to wait for another process writing the DB before giving up (default 10)";

// Whether stderr is a terminal (progress bars are drawn only then).
bool StderrIsTerminal();

// The UTC time now, "2024-05-01T12:34:56Z".
std::string UtcNow();

// CPU time while a sweep runs, for the other work a profile records (FormatHostLoad), from
// construction to Take(): this machine's busy time (/proc/stat, every core: user, nice, system
// and steal; irq and softirq are left out, since the sweep's own network traffic is counted
// there) and this process's own time (getrusage, every thread). `machine` tells machines apart:
// the kernel's boot id, which the testbed's network namespaces of one host share.
struct CpuSample {
  char machine[40] = {};
  double busy_s = 0, own_s = 0, wall_s = 0;
  int32_t valid = 0;  // 0: this process could not measure (no /proc/stat or boot id)
  int32_t cores = 0;  // online
  int32_t pid = 0;  // ranks in one process (threads) count its own time once
};
class CpuMeter {
 public:
  CpuMeter();
  CpuSample Take() const;

 private:
  CpuSample start_;
};
// The other work, in cores, on the busiest machine: per machine, its busy time (the most any of
// its ranks saw) less the own time of all its processes, over the wall time (the longest); at
// least 0. Samples must be valid.
double OtherWorkCores(const std::vector<CpuSample>& samples);
// Collective over `world` (null: this process alone): the other work since `meter` started as
// the profile records it (the busiest machine's cores), or nullopt where some rank could not
// measure.
StatusOr<std::optional<HostLoad>> MeasureOtherWork(const CpuMeter& meter, comm::Communicator* world);
// Rank 0, after its sweep: sets `key` = FormatHostLoad(load) in the DB's cluster meta; nothing
// for nullopt.
Status RecordOtherWork(profile::ProfileStore& store, std::string_view key, const std::optional<HostLoad>& load);

// `--max-bytes auto` / `--max-elements auto`: the largest model the DB holds, as the size of one
// group of all its gradients (bytes, or elements), rounded up to a power of two, so that a plan
// of any grouping reads the curves within their measured points. `flag` names the flag in
// errors (no DB, no model). At most 2^30, the sweeps' limit.
StatusOr<int64_t> LargestModelSize(const std::string& db, bool bytes, std::string_view flag);
// The same read by rank 0 of `world` alone and sent to every rank (collective; a failure reported
// by rank 0, the others' statuses empty); with `world` null, LargestModelSize.
StatusOr<int64_t> LargestModelSizeFromRoot(comm::Communicator* world, const std::string& db, bool bytes,
                                           std::string_view flag);
// A size flag's text: "auto", or a whole number. nullopt for "auto".
StatusOr<std::optional<int64_t>> ParseSizeOrAuto(std::string_view flag, const std::string& text);

// The DB's cluster record and rank 0's result shared by all ranks: libprofile's
// (cupcake/profile/profile_run.h), shared by the kernels and comm commands.
using profile::EnsureCluster;
using profile::ShareRootStatus;

// How comm and kernels find the job's ranks (one code path for both, docs/PROFILER.md):
//   --backend mpi (comm: also nccl): main's MPI world under an MPI launcher, else none;
//   --backend gloo --store DIR: a gloo world whose ranks meet in the file store DIR, their
//   rank and size from MPI under mpirun, else from torchrun's RANK and WORLD_SIZE.
struct JobWorld {
  comm::Communicator* world = nullptr;  // nullptr: no launcher (one process)
  std::unique_ptr<comm::Communicator> gloo;  // owns `world` under --backend gloo
};
inline constexpr const char* kStoreHelp = "--backend gloo: a directory the ranks share, where they meet";
// Makes `out` for `backend` (already checked to be one the command knows) and `store_dir`
// (--store), from main's MPI world `mpi_world` (nullptr when not under an MPI launcher) and
// `mpi_problem` (why MPI did not start there). Returns nullopt to go on, or the exit code after
// printing why not: 2 for --store without --backend gloo, --backend gloo without --store, and
// another backend under torchrun with several workers and no MPI launcher (each would be a
// world of one); 1 when MPI did not start or the gloo ranks did not meet.
std::optional<int> OpenJobWorld(tools::Invocation& inv, comm::Communicator* mpi_world, const std::string& mpi_problem,
                                const std::string& backend, const std::string& store_dir, JobWorld& out);
// This process's rank before the world is made (tools::Invocation::rank, so that usage errors
// are printed once per job): main's MPI world's, else torchrun's RANK, else 0.
int LaunchRank(comm::Communicator* mpi_world);
// The exit code of a command run by `world`'s ranks (nullptr: one process), tools::Finish's:
// a failure this rank prints, when it is not rank 0, is prefixed "rank R on HOST".
int FinishJob(tools::Invocation& inv, const comm::Communicator* world, Status status);

}  // namespace cupcake::profile_cli

// What the profiling commands (kernels, comm) share: the progress bar, the cluster record in
// the DB, the run's meta.
#pragma once

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "cupcake/comm/communicator.h"
#include "cupcake/profile/profile_run.h"
#include "cupcake/profile/store.h"
#include "cupcake/profile/sweep.h"

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
// Adds `key` = this host's load now (FormatHostLoad: the 1-minute load average and the cores
// online) to `meta`, the record that lets plans say a profile was measured busy (BusyNote);
// nothing when the system does not report a load.
void AddHostLoad(std::string_view key, std::map<std::string, std::string>& meta);

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

// Commands run by several ranks (comm, kernels under mpirun):
// A failure rank 0 reports for everyone: other ranks exit 1 without repeating it.
inline Status Quiet(const Status& s, int rank) { return rank == 0 ? s : Status(s.code(), ""); }

}  // namespace cupcake::profile_cli

// cupcake-profile's subcommands. Each is a `Status RunX(const XOptions&, std::ostream& out)`
// (callable from tests) plus an `int XMain(tools::Invocation&)` that parses its flags.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/status.h"
#include "cupcake/tools/cli.h"

namespace cupcake {
class ActivitySource;
}  // namespace cupcake
namespace cupcake::comm {
class Communicator;
}  // namespace cupcake::comm
namespace cupcake::profile {
class KernelDevice;
}  // namespace cupcake::profile

namespace cupcake::profile_cli {

inline const tools::ToolInfo kTool{"cupcake-profile",
                                   "Measures and stores a cluster's cost curves and models in an SQLite profile."};

// The commands; `world` is MPI_COMM_WORLD when main initialized MPI (comm or kernels under
// mpirun), else nullptr, and `mpi_problem` says why it is missing when MPI failed to start.
std::vector<tools::Command> Commands(comm::Communicator* world = nullptr, std::string mpi_problem = "");

// Every member of an XOptions struct has a default member initializer, so a caller may set only
// some of them (`ExportOptions{.db = db, .model = name}`) without -Wmissing-field-initializers.

// import --db DB FILE.json [--replace]
struct ImportOptions {
  std::string db{};
  std::string file{};
  bool replace = false;
  double lock_timeout_s = 10;  // --lock-timeout: wait this long for another writer
};
// Imports a cupcake.profile.v1 (with its models) or cupcake.model.v1 file, told apart by
// "format"; creates the DB when missing (and removes it again when the import fails).
Status RunImport(const ImportOptions& options, std::ostream& out);
int ImportMain(tools::Invocation& inv);

// compute --db DB [--iterations N] [--model-file F] [--replace] -- TRAINING COMMAND...
// The environment variables that tell a training job to record (read by the job's main, not by
// the runtime): where to write the model, and how many iterations to record.
inline constexpr std::string_view kRecordEnv = "CUPCAKE_RECORD";
inline constexpr std::string_view kRecordIterationsEnv = "CUPCAKE_RECORD_ITERATIONS";
struct ComputeOptions {
  std::string db{};
  std::vector<std::string> command{};  // the training command and its arguments
  int iterations = 20;
  std::string model_file{};  // empty: a temporary file, removed afterwards
  bool replace = false;
  double lock_timeout_s = 10;
};
// Runs the training command with CUPCAKE_RECORD=<model file> and CUPCAKE_RECORD_ITERATIONS=N
// added to its environment, waits for it, and imports the model it wrote (as `import` does).
// Refuses, before running anything, a DB that holds no profile. Fails, naming the command, when
// it exits non-zero or by a signal, or writes no model.
Status RunCompute(const ComputeOptions& options, std::ostream& out);
int ComputeMain(tools::Invocation& inv);

// export --db DB [--model NAME] [-o FILE]
struct ExportOptions {
  std::string db{};
  std::string model{};  // empty: the whole profile
  std::string output = "-";  // "-": `out`
};
Status RunExport(const ExportOptions& options, std::ostream& out);
int ExportMain(tools::Invocation& inv);

// inspect --db DB [--format text|json] [--plot FILE.svg]
struct InspectOptions {
  std::string db{};  // a profile DB, or a profile JSON file
  tools::OutputFormat format = tools::OutputFormat::kText;
  std::string plot{};  // non-empty: write the curves as an SVG or PNG (by its ending) there, atomically,
                       // instead of the summary
  std::string png_converter = "rsvg-convert";  // renders the SVG to PNG: `converter -o OUT.png IN.svg`
};
Status RunInspect(const InspectOptions& options, std::ostream& out);
int InspectMain(tools::Invocation& inv);

// kernels --db DB [--device cpu|gpu] [--quick] [--force] [--world-size W] ...
struct KernelsOptions {
  std::string db{};
  std::string device = "cpu";
  bool quick = false;
  bool force = false;
  int world_size = 0;  // 0: the DB's cluster's, else 1
  int64_t min_elements = 1024;
  int64_t max_elements = int64_t{1} << 22;
  bool max_elements_auto = false;  // the largest model in the DB (LargestModelSize)
  int step = 1;  // every step-th power of two (--quick: 2)
  int warmup = 2;
  int iters = 10;
  // --cache: cold (the caches emptied before every call: a cpu flushes the call's buffers, a gpu
  // evicts its L2; profile::KernelSweepOptions::cold) or warm; empty: cold wherever the device can
  // empty its caches (a gpu; a cpu with a cache flush), else warm.
  std::string cache{};
  std::vector<std::string> compressors{};  // empty: all
  std::vector<double> ratios = {kDefaultRatio};  // topk, randk, dgc, zen: a curve per ratio
  int rank = 4;  // powersgd: the rank its curves are measured at
  std::string cluster{};  // name of a new DB's cluster
  std::string command{};  // recorded in the cluster's meta
  std::ostream* progress = nullptr;  // a progress bar there when set (a terminal)
  double lock_timeout_s = 10;  // --lock-timeout: wait this long for another writer
  std::string
      kernel_db{};  // --device gpu: the DB of kernel-only (CUPTI) curves; empty: <db>.kernel.db; "none": not measured
  // The job's ranks when started with several (main's MPI world, or the gloo world of
  // --backend gloo): they sweep in step (profile::SweepKernels' peers), rank 0 writes the DB and
  // prints. Not owned.
  comm::Communicator* peers = nullptr;
  // Tests: --device gpu sweeps these (fakes) instead of opening CUDA and CUPTI. Not owned.
  profile::KernelDevice* device_for_test = nullptr;
  ActivitySource* activity_for_test = nullptr;
};
// Sweeps encode and decode of the compressors and the pack/unpack copies (docs/FORMATS.md) into
// the DB, point by point; points present are skipped unless --force. --device gpu times with
// CUDA events into the DB (method "event") and, with CUPTI, kernel-only time into the kernel DB
// (method "kernel"), and adds the d2h/h2d copies; it fails before touching a DB when this
// build has no CUDA or the machine no device. With `peers` (several ranks under mpirun, or
// under torchrun with --backend gloo; cpu only) every rank runs it: each point is timed by all
// ranks at once, the slowest rank's median stored by rank 0 (docs/PROFILER.md); a failure every
// rank finds alike is returned by every rank, reported by rank 0 (Status::reporter).
Status RunKernels(const KernelsOptions& options, std::ostream& out);
int KernelsMain(tools::Invocation& inv, comm::Communicator* world = nullptr, const std::string& mpi_problem = "");

// comm --db DB [--quick] [--force] [--min-bytes B] [--max-bytes B] ... (under mpirun)
struct CommOptions {
  std::string db{};
  bool quick = false;
  bool force = false;
  int64_t min_bytes = 4;
  int64_t max_bytes = int64_t{1} << 24;
  bool max_bytes_auto = false;  // the largest model in the DB, by rank 0 (LargestModelSize)
  int step = 1;  // every step-th power of two (--quick: 2)
  int warmup = 5;
  int iters = 20;
  int rounds = 1;  // passes over all the points (CommSweepOptions::rounds)
  bool busy = false;  // each rank keeps a core busy beside the collectives (CommSweepOptions::busy)
  bool chained = false;  // calls back to back (CommSweepOptions::chained)
  std::vector<std::string> ops{};  // empty: all five
  std::string backend = "mpi";  // mpi, gloo (host memory) or nccl (GPU memory, one GPU per rank)
  std::string cluster{};
  std::string command{};  // recorded in the cluster's meta
  std::ostream* progress = nullptr;  // rank 0's progress bar there when set
  double lock_timeout_s = 10;  // --lock-timeout: rank 0 waits this long for another writer
};
// Collective over `world`: checks that every rank has the same options, then sweeps the
// collectives (libprofile's SweepComm); rank 0 writes the DB and prints the table. A failure
// every rank finds alike (flags, rank 0's DB) is returned by every rank, reported by rank 0
// (Status::reporter).
Status RunComm(comm::Communicator& world, const CommOptions& options, std::ostream& out);
int CommMain(tools::Invocation& inv, comm::Communicator* world, const std::string& mpi_problem);
// Whether an MPI launcher started this process (its environment variables are set).
bool UnderMpiLauncher();

}  // namespace cupcake::profile_cli

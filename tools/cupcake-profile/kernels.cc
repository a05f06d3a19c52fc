#include <algorithm>
#include <charconv>
#include <chrono>
#include <memory>
#include <optional>
#include <sstream>

#include "commands.h"
#include "cupcake/profile/activity.h"
#include "cupcake/profile/clock.h"
#include "cupcake/profile/kernel_sweep.h"
#include "cupcake/profile/profile_run.h"
#include "cupcake/proto/host_load.h"
#include "cupcake/proto/names.h"
#include "profiling.h"

namespace cupcake::profile_cli {
namespace po = boost::program_options;

namespace {

// The kernel-only DB beside `db`: p.db -> p.kernel.db, p -> p.kernel.db.
std::string DefaultKernelDb(const std::string& db) {
  const std::string ext = ".db";
  if (db.size() > ext.size() && db.compare(db.size() - ext.size(), ext.size(), ext) == 0)
    return db.substr(0, db.size() - ext.size()) + ".kernel.db";
  return db + ".kernel.db";
}

// The flags as sweep options (every rank alike, so every rank fails alike); the world size is
// set later, from the DB.
StatusOr<profile::KernelSweepOptions> SweepOptionsOf(const KernelsOptions& options, pb::Device device,
                                                     int64_t max_elements) {
  profile::KernelSweepOptions sweep;
  sweep.device = device;
  CUPCAKE_ASSIGN_OR_RETURN(
      sweep.elements, profile::PowerOfTwoSizes("--min-elements", options.min_elements, "--max-elements", max_elements,
                                               int64_t{1} << 30, options.step));
  sweep.warmup = options.warmup;
  sweep.iters = options.iters;
  sweep.force = options.force;
  if (options.cache.empty()) {
    // Cold wherever the device can empty its caches: a job's encode finds its group in memory.
    sweep.cold = device != pb::CPU || profile::CacheFlushSupported();
  } else if (options.cache == "cold" || options.cache == "warm") {
    sweep.cold = options.cache == "cold";
    if (sweep.cold && device == pb::CPU && !profile::CacheFlushSupported())
      return InvalidArgumentError("--cache: cold needs a cache flush, which this CPU architecture lacks here (x86-64 "
                                  "and AArch64 have it); expected --cache warm");
  } else {
    return InvalidArgumentError("--cache: unknown; got '" + options.cache + "', expected cold or warm");
  }
  sweep.compressors = options.compressors;
  sweep.rank = options.rank;
  sweep.ratios = options.ratios;
  std::sort(sweep.ratios.begin(), sweep.ratios.end());
  sweep.ratios.erase(std::unique(sweep.ratios.begin(), sweep.ratios.end()), sweep.ratios.end());
  if (sweep.ratios.empty()) return InvalidArgumentError("--ratios: empty; got no ratio, expected at least one");
  for (double r : sweep.ratios) CUPCAKE_RETURN_IF_ERROR(ValidateRatio("--ratios", r));
  if (options.warmup < 0)
    return InvalidArgumentError("--warmup: out of range; got " + std::to_string(options.warmup) + ", expected >= 0");
  if (options.iters < 1)
    return InvalidArgumentError("--iters: out of range; got " + std::to_string(options.iters) + ", expected >= 1");
  if (options.world_size < 0 || options.world_size > 65536)
    return InvalidArgumentError("--world-size: out of range; got " + std::to_string(options.world_size) +
                                ", expected 1 <= W <= 65536");
  return sweep;
}

// --device gpu: the device and CUPTI, opened before any DB is touched, so a machine without a
// GPU fails cleanly. CUPTI's process state lives here, for this command's run.
struct GpuWiring {
  std::unique_ptr<profile::KernelDevice> device_owned;
  std::unique_ptr<profile::ActivitySource> cupti_owned;
  profile::KernelDevice* device = nullptr;
  profile::ActivitySource* cupti = nullptr;
  std::string kernel_db;  // where the kernel-only curves go, when cupti is set
  std::string no_kernel_time;  // why they are not measured, otherwise
};

StatusOr<GpuWiring> OpenGpu(const KernelsOptions& options) {
  GpuWiring w;
  w.device = options.device_for_test;
  if (w.device == nullptr) {
    auto opened = profile::OpenCudaKernelDevice(0);
    if (!opened.ok()) return Status(opened.status().code(), "kernels: --device gpu: " + opened.status().message());
    w.device_owned = std::move(opened).value();
    w.device = w.device_owned.get();
  }
  if (options.kernel_db == "none") {
    w.no_kernel_time = "--kernel-db none";
  } else if (options.activity_for_test != nullptr) {
    w.cupti = options.activity_for_test;
  } else {
    auto source = profile::OpenCuptiActivitySource();
    if (source.ok()) {
      w.cupti_owned = std::move(source).value();
      w.cupti = w.cupti_owned.get();
    } else {
      w.no_kernel_time = source.status().message();
    }
  }
  if (w.cupti != nullptr) w.kernel_db = options.kernel_db.empty() ? DefaultKernelDb(options.db) : options.kernel_db;
  return w;
}

void PrintResult(const KernelsOptions& options, const profile::KernelSweepOptions& sweep, const GpuWiring& gpu,
                 const profile::ProfileKernelsResult& result, double seconds, std::ostream& out) {
  const profile::KernelSweepReport& report = result.report;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", seconds);
  const comm::Communicator* peers = options.peers;
  out << "kernels: " << options.device << (gpu.device ? " (" + gpu.device->Describe() + ")" : "")
      << ", W=" << result.world_size << ", " << sweep.elements.size() << " sizes ("
      << tools::HumanCount(sweep.elements.front()) << " .. " << tools::HumanCount(sweep.elements.back())
      << " elements), warmup " << sweep.warmup << ", iters " << sweep.iters << ", " << (sweep.cold ? "cold" : "warm")
      << " caches"
      << (peers != nullptr ? ", " + std::to_string(peers->size()) + " ranks in step (the slowest rank's median)" : "")
      << ": measured " << report.event.measured << " points, skipped " << report.event.skipped << " already in "
      << options.db << (report.event.skipped > 0 ? " (--force re-measures them)" : "") << ", in " << secs << " s\n";
  if (result.assumed_world)
    out << "kernels: W=1: " << options.db << " has no cluster (no comm profile) and no --world-size was given, so "
        << "decode was timed for 1 rank's payloads; run comm first or give --world-size W\n";
  if (gpu.device == nullptr) return;
  if (!result.kernel_only) {
    out << "kernel-only (CUPTI): not measured: " << gpu.no_kernel_time << "\n";
    return;
  }
  out << "kernel-only (CUPTI): measured " << report.kernel.measured << " points, skipped " << report.kernel.skipped
      << " already in " << gpu.kernel_db << "\n";
  if (!report.activity_error.empty())
    out << "kernel-only (CUPTI): stopped after an error, event points went on: " << report.activity_error << "\n";
  for (const std::string& p : report.kernel_problems) out << "kernel-only (CUPTI): " << p << "\n";
}

}  // namespace

// The flags are checked here; the run itself (rank 0's DB, the broadcasts, the kernel-only DB,
// the sweep) is libprofile's ProfileKernels.
Status RunKernels(const KernelsOptions& options, std::ostream& out) {
  comm::Communicator* peers = options.peers;
  const int rank = peers != nullptr ? peers->rank() : 0;
  auto device = ParseDevice(options.device);
  if (!device)
    return Quiet(InvalidArgumentError("--device: unknown device; got '" + options.device + "', expected cpu or gpu"));
  if (peers != nullptr && *device != pb::CPU)
    return Quiet(InvalidArgumentError("--device: " + options.device + " under a launcher with " +
                                      std::to_string(peers->size()) +
                                      " ranks; expected cpu (ranks sweep in step on the host; a GPU is swept by "
                                      "one process)"));
  // --max-elements auto: rank 0 reads the DB's largest model, every rank learns the size.
  int64_t max_elements = options.max_elements;
  if (options.max_elements_auto) {
    CUPCAKE_ASSIGN_OR_RETURN(max_elements,
                             LargestModelSizeFromRoot(peers, options.db, /*bytes=*/false, "--max-elements"));
  }
  profile::ProfileKernelsOptions run;
  auto sweep = SweepOptionsOf(options, *device, max_elements);
  if (!sweep.ok()) return Quiet(sweep.status());
  run.sweep = std::move(sweep).value();
  auto lock = LockTimeoutMs(options.lock_timeout_s);
  if (!lock.ok()) return Quiet(lock.status());
  run.lock_timeout_ms = *lock;
  GpuWiring gpu;
  if (*device == pb::GPU) {
    CUPCAKE_ASSIGN_OR_RETURN(gpu, OpenGpu(options));
  }

  run.db = options.db;
  run.kernel_db = gpu.kernel_db;
  run.cluster = options.cluster;
  run.world_size = options.world_size;
  run.meta = {{"kernels.command", options.command},
              {"kernels.date", UtcNow()},
              {"kernels.device", options.device},
              {"kernels.cache", run.sweep.cold ? "cold" : "warm"}};
  profile::SteadyClock clock;
  std::optional<ProgressBar> bar;
  if (options.progress) bar.emplace(*options.progress, "kernels");
  const auto t0 = std::chrono::steady_clock::now();
  const CpuMeter cpu;
  auto result =
      profile::ProfileKernels(run, gpu.device, gpu.cupti, clock, bar ? bar->Fn() : profile::ProgressFn(), peers);
  if (bar) bar->Finish();
  if (!result.ok()) return result.status();
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<HostLoad> other, MeasureOtherWork(cpu, peers));
  if (rank != 0) return Status::Ok();
  {
    CUPCAKE_ASSIGN_OR_RETURN(profile::ProfileStore store, profile::ProfileStore::Open(run.db, /*create=*/false, *lock));
    if (Status s = RecordOtherWork(store, kKernelsLoadKey, other); !s.ok()) return s.WithPrefix("kernels: cluster meta");
  }
  PrintResult(options, run.sweep, gpu, *result,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), out);
  return Status::Ok();
}

int KernelsMain(tools::Invocation& inv, comm::Communicator* world, const std::string& mpi_problem) {
  KernelsOptions options;
  std::string max_elements;
  std::string compressors;
  std::string ratios;
  std::string backend, store_dir;
  po::options_description flags("options");
  flags.add_options()("db", po::value(&options.db)->required(), "the profile DB (created when missing)")(
      "device", po::value(&options.device)->default_value("cpu"), "cpu or gpu")(
      "quick", po::bool_switch(&options.quick), "few sizes, few iterations (seconds)")(
      "force", po::bool_switch(&options.force), "re-measure points the DB already has")(
      "world-size", po::value(&options.world_size)->default_value(0),
      "W for decode (default: the DB's cluster, else 1)")("min-elements", po::value(&options.min_elements),
                                                          "smallest group, a power of two (default 1024)")(
      "max-elements", po::value(&max_elements),
      "largest group, a power of two, or auto: the largest model in the DB (default 4Mi; --quick 1Mi)")(
      "lock-timeout", po::value(&options.lock_timeout_s)->default_value(10), kLockTimeoutHelp)(
      "warmup", po::value(&options.warmup), "untimed calls per point (default 2; --quick 1)")(
      "iters", po::value(&options.iters), "timed calls per point, the median is stored (default 10; --quick 5)")(
      "cache", po::value(&options.cache),
      "cold (default): empty the caches before each call, as a job finds them (cpu: flush the call's "
      "buffers; gpu: evict the L2); warm: each call finds what the previous one left")(
      "compressors", po::value(&compressors),
      "comma-separated names, zen for Zen's steps, nonzero for the zen_sparse scheme's scan (cpu) and powersgd for "
      "PowerSGD's steps (default: all; zen when W >= 2; nonzero and powersgd only when named)")(
      "rank", po::value(&options.rank)->default_value(4), "powersgd: the rank its curves are measured at")(
      "ratios", po::value(&ratios),
      "comma-separated ratios at which topk, randk, dgc, zen and nonzero are measured, a curve each (default 0.01)")(
      "cluster", po::value(&options.cluster), "the cluster's name when the DB is new (default: local)")(
      "kernel-db", po::value(&options.kernel_db),
      "--device gpu: DB for the kernel-only (CUPTI) curves (default: DB with .kernel.db; none: skip)")(
      "backend", po::value(&backend)->default_value("mpi"),
      "how the ranks of a launch sweep in step: mpi (under mpirun; default) or gloo (under torchrun or mpirun, "
      "with --store)")("store", po::value(&store_dir), kStoreHelp);
  po::variables_map vm;
  if (auto code =
          tools::ParseFlags(inv, flags, {}, "--db DB [--device cpu|gpu] [--quick] [--force] [--world-size W]", vm))
    return *code;
  if (!max_elements.empty()) {
    auto size = ParseSizeOrAuto("--max-elements", max_elements);
    if (!size.ok()) return tools::UsageError(inv, size.status().message());
    if (*size) options.max_elements = **size;
    options.max_elements_auto = !*size;
  }
  if (options.quick) {
    if (max_elements.empty()) options.max_elements = int64_t{1} << 20;
    if (!vm.count("warmup")) options.warmup = 1;
    if (!vm.count("iters")) options.iters = 5;
    options.step = 2;
  }
  std::stringstream ss(compressors);
  for (std::string name; std::getline(ss, name, ',');)
    if (!name.empty()) options.compressors.push_back(name);
  if (vm.count("ratios")) {
    options.ratios.clear();
    std::stringstream rs(ratios);
    for (std::string item; std::getline(rs, item, ',');) {
      double r = 0;
      const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), r);
      if (item.empty() || ec != std::errc() || end != item.data() + item.size())
        return tools::UsageError(inv, "--ratios: not a number; got '" + item + "', expected ratios such as 0.001,0.01");
      options.ratios.push_back(r);
    }
  }
  if (backend != "mpi" && backend != "gloo")
    return tools::UsageError(inv, "--backend: unknown backend; got '" + backend + "', expected mpi or gloo");
  JobWorld job;
  if (auto code = OpenJobWorld(inv, world, mpi_problem, backend, store_dir, job)) return *code;
  if (job.world != nullptr && job.world->size() > 1) options.peers = job.world;
  options.command = inv.tool + " " + inv.command;
  for (const auto& a : inv.args) options.command += " " + a;
  if (inv.rank == 0 && StderrIsTerminal()) options.progress = &inv.err;
  const Status status = RunKernels(options, inv.out);
  // A bad flag value (every rank finds it alike, or rank 0 in the DB) is a usage error.
  if (!status.ok() && status.code() == StatusCode::kInvalidArgument && status.message().rfind("--", 0) == 0)
    return tools::UsageError(inv, status.message());
  return FinishJob(inv, options.peers, status);
}

}  // namespace cupcake::profile_cli

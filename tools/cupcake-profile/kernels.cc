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
#include "cupcake/profile/sink.h"
#include "cupcake/profile/store.h"
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
  sweep.compressors = options.compressors;
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

}  // namespace

Status RunKernels(const KernelsOptions& options, std::ostream& out) {
  comm::Communicator* peers = options.peers;
  const int rank = peers != nullptr ? peers->rank() : 0;
  auto device = ParseDevice(options.device);
  if (!device)
    return Quiet(InvalidArgumentError("--device: unknown device; got '" + options.device + "', expected cpu or gpu"),
                 rank);
  if (peers != nullptr && *device != pb::CPU)
    return Quiet(InvalidArgumentError("--device: " + options.device + " under an MPI launcher with " +
                                      std::to_string(peers->size()) +
                                      " ranks; expected cpu (ranks sweep in step on the host; a GPU is swept by "
                                      "one process)"),
                 rank);
  // --max-elements auto: rank 0 reads the DB's largest model, every rank learns the size.
  int64_t max_elements = options.max_elements;
  if (options.max_elements_auto) {
    CUPCAKE_ASSIGN_OR_RETURN(max_elements,
                             LargestModelSizeFromRoot(peers, options.db, /*bytes=*/false, "--max-elements"));
  }
  auto made = SweepOptionsOf(options, *device, max_elements);
  if (!made.ok()) return Quiet(made.status(), rank);
  profile::KernelSweepOptions sweep = std::move(made).value();
  auto lock = LockTimeoutMs(options.lock_timeout_s);
  if (!lock.ok()) return Quiet(lock.status(), rank);
  const int lock_ms = *lock;

  // --device gpu: the device (and CUPTI) before any DB is touched, so a machine without a GPU
  // fails cleanly. CUPTI's process state lives here, for this command's run.
  std::unique_ptr<profile::KernelDevice> gpu_owned;
  std::unique_ptr<profile::ActivitySource> cupti_owned;
  profile::KernelDevice* gpu = options.device_for_test;
  profile::ActivitySource* cupti = nullptr;
  std::string kernel_db, no_kernel_time;
  if (*device == pb::GPU) {
    if (gpu == nullptr) {
      auto opened = profile::OpenCudaKernelDevice(0);
      if (!opened.ok()) return Status(opened.status().code(), "kernels: --device gpu: " + opened.status().message());
      gpu_owned = std::move(opened).value();
      gpu = gpu_owned.get();
    }
    if (options.kernel_db == "none") {
      no_kernel_time = "--kernel-db none";
    } else if (options.activity_for_test != nullptr) {
      cupti = options.activity_for_test;
    } else {
      auto source = profile::OpenCuptiActivitySource();
      if (source.ok()) {
        cupti_owned = std::move(source).value();
        cupti = cupti_owned.get();
      } else {
        no_kernel_time = source.status().message();
      }
    }
    if (cupti != nullptr) kernel_db = options.kernel_db.empty() ? DefaultKernelDb(options.db) : options.kernel_db;
  } else {
    gpu = nullptr;
  }

  std::map<std::string, std::string> meta{
      {"kernels.command", options.command}, {"kernels.date", UtcNow()}, {"kernels.device", options.device}};
  if (gpu) meta["kernels.gpu"] = gpu->Describe();
  if (peers != nullptr) meta["kernels.ranks"] = std::to_string(peers->size()) + " in step, the slowest rank's median";
  // The world size: the DB's cluster's, else --world-size, else 1. A new DB is made with its
  // cluster in one step, so a failure leaves no DB behind.
  pb::Cluster cluster;
  bool assumed_world = false;  // no cluster in the DB and no --world-size: W = 1
  auto prepare = [&](profile::ProfileStore& store) -> Status {
    CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> existing, store.LoadCluster());
    int nodes = 1, per_node = options.world_size > 0 ? options.world_size : 1;
    if (existing && options.world_size != 0 && existing->nodes() * existing->devices_per_node() != options.world_size)
      return InvalidArgumentError(options.db + ": --world-size: disagrees with the DB's cluster '" + existing->name() +
                                  "'; got " + std::to_string(options.world_size) + ", expected " +
                                  std::to_string(existing->nodes() * existing->devices_per_node()) + " (" +
                                  tools::CountOf(existing->nodes(), "node") + " x " +
                                  tools::CountOf(existing->devices_per_node(), "device") + ")");
    if (existing) {
      nodes = existing->nodes();
      per_node = existing->devices_per_node();
    }
    assumed_world = !existing && options.world_size == 0;
    CUPCAKE_ASSIGN_OR_RETURN(cluster, EnsureCluster(store, options.cluster, nodes, per_node, meta, "--world-size"));
    return Status::Ok();
  };
  // Rank 0 alone opens the DB; everyone learns whether that worked, and the world size.
  std::optional<profile::ProfileStore> store;
  Status opened;
  if (rank == 0) {
    auto made_store = profile::ProfileStore::OpenOrCreate(options.db, lock_ms, prepare);
    if (made_store.ok())
      store.emplace(std::move(made_store).value());
    else
      opened = made_store.status();
  }
  CUPCAKE_RETURN_IF_ERROR(peers != nullptr ? ShareRootStatus(*peers, opened) : opened);
  sweep.world_size = cluster.nodes() * cluster.devices_per_node();
  if (peers != nullptr) {
    CUPCAKE_RETURN_IF_ERROR(peers->Broadcast(&sweep.world_size, sizeof sweep.world_size, 0));
    // Every rank finds the same bad options: rank 0 alone reports them.
    if (Status v = profile::ValidateKernelSweepOptions(sweep, /*zen_device=*/true); !v.ok())
      return Quiet(v.WithPrefix("kernels"), rank);
  }
  // The kernel-only curves: a profile of the same cluster in their own DB (a profile holds one
  // curve per key, and the planner reads the event time from the main DB).
  std::optional<profile::ProfileStore> kernel_store;
  std::optional<profile::StoreSink> kernel_sink;
  if (cupti) {
    std::map<std::string, std::string> kernel_meta = meta;
    kernel_meta["kernels.kernel_time"] = "CUPTI activity records (kernel, memcpy, memset), union of intervals per call";
    auto same_cluster = [&](profile::ProfileStore& ks) {
      return EnsureCluster(ks, cluster.name(), cluster.nodes(), cluster.devices_per_node(), kernel_meta, "--world-size")
          .status()
          .WithPrefix(kernel_db);
    };
    CUPCAKE_ASSIGN_OR_RETURN(profile::ProfileStore ks,
                             profile::ProfileStore::OpenOrCreate(kernel_db, lock_ms, same_cluster));
    kernel_store.emplace(std::move(ks));
    kernel_sink.emplace(*kernel_store);
  }

  // The other ranks' points are copies of rank 0's: kept in memory, dropped.
  std::optional<profile::StoreSink> store_sink;
  profile::MemorySink copies;
  if (store) store_sink.emplace(*store);
  profile::ProfileSink& sink = store_sink ? static_cast<profile::ProfileSink&>(*store_sink) : copies;
  profile::SteadyClock clock;
  std::optional<ProgressBar> bar;
  if (options.progress) bar.emplace(*options.progress, "kernels");
  const auto t0 = std::chrono::steady_clock::now();
  profile::KernelSweepReport report;
  if (gpu) {
    auto r = profile::SweepKernelsOnDevice(sweep, *gpu, cupti, sink, kernel_sink ? &*kernel_sink : nullptr,
                                           bar ? bar->Fn() : profile::ProgressFn());
    if (bar) bar->Finish();
    if (!r.ok()) return r.status().WithPrefix("kernels");
    report = std::move(r).value();
  } else {
    auto r = profile::SweepKernels(sweep, clock, sink, bar ? bar->Fn() : profile::ProgressFn(), peers);
    if (bar) bar->Finish();
    if (!r.ok()) return r.status().WithPrefix("kernels");
    report.event = std::move(r).value();
  }
  if (rank != 0) return Status::Ok();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", s);
  out << "kernels: " << options.device << (gpu ? " (" + gpu->Describe() + ")" : "") << ", W=" << sweep.world_size
      << ", " << sweep.elements.size() << " sizes (" << tools::HumanCount(sweep.elements.front()) << " .. "
      << tools::HumanCount(sweep.elements.back()) << " elements), warmup " << sweep.warmup << ", iters " << sweep.iters
      << (peers != nullptr ? ", " + std::to_string(peers->size()) + " ranks in step (the slowest rank's median)" : "")
      << ": measured " << report.event.measured << " points, skipped " << report.event.skipped << " already in "
      << options.db << (report.event.skipped > 0 ? " (--force re-measures them)" : "") << ", in " << secs << " s\n";
  if (assumed_world)
    out << "kernels: W=1: " << options.db << " has no cluster (no comm profile) and no --world-size was given, so "
        << "decode was timed for 1 rank's payloads; run comm first or give --world-size W\n";
  if (gpu && kernel_sink) {
    out << "kernel-only (CUPTI): measured " << report.kernel.measured << " points, skipped " << report.kernel.skipped
        << " already in " << kernel_db << "\n";
    if (!report.activity_error.empty())
      out << "kernel-only (CUPTI): stopped after an error, event points went on: " << report.activity_error << "\n";
    for (const std::string& p : report.kernel_problems) out << "kernel-only (CUPTI): " << p << "\n";
  } else if (gpu) {
    out << "kernel-only (CUPTI): not measured: " << no_kernel_time << "\n";
  }
  return Status::Ok();
}

int KernelsMain(tools::Invocation& inv, comm::Communicator* world, const std::string& mpi_problem) {
  KernelsOptions options;
  std::string max_elements;
  std::string compressors;
  std::string ratios;
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
      "compressors", po::value(&compressors),
      "comma-separated names, zen for Zen's steps and nonzero for the zen_sparse scheme's scan (cpu) (default: all; "
      "zen when W >= 2; nonzero only when named)")(
      "ratios", po::value(&ratios),
      "comma-separated ratios at which topk, randk, dgc, zen and nonzero are measured, a curve each (default 0.01)")(
      "cluster", po::value(&options.cluster), "the cluster's name when the DB is new (default: local)")(
      "kernel-db", po::value(&options.kernel_db),
      "--device gpu: DB for the kernel-only (CUPTI) curves (default: DB with .kernel.db; none: skip)");
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
  if (!mpi_problem.empty()) return tools::Finish(inv, FailedPreconditionError("kernels: " + mpi_problem));
  if (world != nullptr && world->size() > 1) options.peers = world;
  const int rank = options.peers != nullptr ? world->rank() : 0;
  options.command = inv.tool + " " + inv.command;
  for (const auto& a : inv.args) options.command += " " + a;
  if (rank == 0 && StderrIsTerminal()) options.progress = &inv.err;
  Status status = RunKernels(options, inv.out);
  if (!status.ok() && status.message().empty()) return tools::kExitFailure;  // rank 0 says why
  if (!status.ok() && rank != 0) status = status.WithPrefix("rank " + std::to_string(rank) + " on " + world->host());
  if (!status.ok() && status.code() == StatusCode::kInvalidArgument && status.message().rfind("--", 0) == 0)
    return tools::UsageError(inv, status.message());
  return tools::Finish(inv, status);
}

}  // namespace cupcake::profile_cli

#include <cstdio>
#include <optional>
#include <sstream>

#include "commands.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/profile/clock.h"
#include "cupcake/profile/comm_sweep.h"
#include "cupcake/profile/sink.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/host_load.h"
#include "cupcake/proto/names.h"
#include "profiling.h"

namespace cupcake::profile_cli {
namespace po = boost::program_options;
namespace {

// The DB's comm curves must come from one backend: a DB measured with MPI is not resumed with
// NCCL (its points would be skipped as present) unless --force re-measures them.
Status SameBackend(profile::ProfileStore& store, const std::string& backend, bool force) {
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> cluster, store.LoadCluster());
  if (!cluster || force) return Status::Ok();
  std::string had;
  if (auto it = cluster->meta().find("comm.backend"); it != cluster->meta().end()) {
    had = it->second;
  } else if (auto lib = cluster->meta().find("comm.library"); lib != cluster->meta().end()) {
    had = lib->second.find("NCCL") != std::string::npos ? "nccl" : "mpi";  // DBs from before comm.backend
  }
  if (had.empty() || had == backend) return Status::Ok();
  return FailedPreconditionError(store.path() + ": --backend: the DB's comm curves were measured with " + had +
                                 " (cluster meta comm.backend); got " + backend +
                                 ", expected the same (or another DB, or --force to re-measure)");
}

// comm with no world to run on.
constexpr const char* kNoLauncher =
    "not started by an MPI launcher (none of OMPI_COMM_WORLD_SIZE, PMI_RANK, PMIX_RANK is set); run it under "
    "mpirun, one rank per device, e.g. `mpirun -np 4 cupcake-profile comm --db DB --quick` (as root add "
    "--allow-run-as-root; more ranks than cores need --oversubscribe), or under torchrun with --backend gloo "
    "--store DIR";

// Step 1: every rank runs with the same flags, before anything is validated or written.
Status AgreeOnFlags(comm::Communicator& world, const CommOptions& options) {
  std::string ops;
  for (const auto& o : options.ops) ops += (ops.empty() ? "" : ",") + o;
  return profile::AgreeOnConfiguration(
      world, {{"--db", options.db},
              {"--quick", options.quick ? "true" : "false"},
              {"--force", options.force ? "true" : "false"},
              {"--min-bytes", std::to_string(options.min_bytes)},
              {"--max-bytes", options.max_bytes_auto ? "auto" : std::to_string(options.max_bytes)},
              {"--warmup", std::to_string(options.warmup)},
              {"--iters", std::to_string(options.iters)},
              {"--rounds", std::to_string(options.rounds)},
              {"--busy", options.busy ? "true" : "false"},
              {"--chained", options.chained ? "true" : "false"},
              {"--ops", ops},
              {"--backend", options.backend},
              {"--cluster", options.cluster},
              {"--lock-timeout", std::to_string(options.lock_timeout_s)}});
}

// Step 2: the flags as sweep options (every rank alike, so every rank fails alike).
StatusOr<profile::CommSweepOptions> SweepOptions(const CommOptions& options, int64_t max_bytes) {
  profile::CommSweepOptions sweep;
  if (options.min_bytes < 4)
    return InvalidArgumentError("--min-bytes: out of range; got " + std::to_string(options.min_bytes) +
                                ", expected a power of two >= 4 (one float)");
  CUPCAKE_ASSIGN_OR_RETURN(sweep.sizes, profile::PowerOfTwoSizes("--min-bytes", options.min_bytes, "--max-bytes",
                                                                 max_bytes, int64_t{1} << 30, options.step));
  for (const std::string& name : options.ops) {
    auto op = ParseCommOp(name);
    if (!op) return InvalidArgumentError("--ops: unknown collective; got '" + name + "', expected " + CommOpNames());
    sweep.ops.push_back(*op);
  }
  if (options.backend != "mpi" && options.backend != "nccl" && options.backend != "gloo")
    return InvalidArgumentError("--backend: unknown backend; got '" + options.backend +
                                "', expected mpi, nccl or gloo");
  if (options.warmup < 0)
    return InvalidArgumentError("--warmup: out of range; got " + std::to_string(options.warmup) + ", expected >= 0");
  if (options.iters < 1)
    return InvalidArgumentError("--iters: out of range; got " + std::to_string(options.iters) + ", expected >= 1");
  if (options.rounds < 1)
    return InvalidArgumentError("--rounds: out of range; got " + std::to_string(options.rounds) + ", expected >= 1");
  sweep.warmup = options.warmup;
  sweep.iters = options.iters;
  sweep.rounds = options.rounds;
  sweep.force = options.force;
  sweep.busy = options.busy;
  sweep.chained = options.chained;
  if (options.busy && options.chained)
    return InvalidArgumentError("--busy, --chained: both given; expected at most one (one condition per run)");
  return sweep;
}

// Step 5 (rank 0): opens the DB, a new one made with the cluster in it, and records the cluster.
StatusOr<profile::ProfileStore> OpenDbWithCluster(const CommOptions& options, int lock_ms,
                                                  const profile::Topology& topo, int world_size,
                                                  const std::string& library) {
  std::string hosts;
  for (const auto& h : topo.hosts) hosts += (hosts.empty() ? "" : ",") + h;
  std::map<std::string, std::string> meta{{"world_size", std::to_string(world_size)},
                                          {"hosts", hosts},
                                          {"comm.library", library},
                                          {"comm.backend", options.backend},
                                          {"comm.command", options.command},
                                          {"comm.date", UtcNow()}};
  return profile::ProfileStore::OpenOrCreate(options.db, lock_ms, [&](profile::ProfileStore& s) {
    return EnsureCluster(s, options.cluster, static_cast<int>(topo.hosts.size()), topo.ranks_per_host, meta,
                         "mpirun -np")
        .status();
  });
}

// Step 7: points with wrong results (the report is every rank's; rank 0 prints it).
Status WrongPoints(const profile::SweepReport& report) {
  return DataLossError("comm: " + std::to_string(report.wrong) +
                       " points had wrong results and were not stored (see WRONG above; their curves' `wrong` "
                       "counts them)");
}

// Step 7 (rank 0): the table of what was measured.
void PrintReport(const profile::SweepReport& report, const CommOptions& options, const profile::CommSweepOptions& sweep,
                 int world_size, int nodes, const std::string& library, std::ostream& out) {
  out << "comm: " << world_size << " ranks on " << nodes << (nodes == 1 ? " host" : " hosts") << " (" << library
      << "), warmup " << sweep.warmup << ", iters " << sweep.iters
      << (sweep.rounds > 1 ? " in each of " + std::to_string(sweep.rounds) + " rounds" : "")
      << ", time = the slowest rank's median\n";
  out << "  collective          scope       size         us   wrong\n";
  for (const auto& p : report.points) {
    std::istringstream key(p.curve);  // "comm <op> <scope> [<dtype>]"
    std::string kind, op, scope, dtype;
    key >> kind >> op >> scope >> dtype;
    if (!dtype.empty()) op += " " + dtype;
    char line[160];
    std::snprintf(line, sizeof line, "  %-19s %-7s %10s %10.1f %7d%s\n", op.c_str(), scope.c_str(),
                  tools::HumanBytes(p.size).c_str(), p.us, p.wrong, p.wrong > 0 ? "  WRONG, not stored" : "");
    out << line;
  }
  out << "comm: measured " << report.measured << " points, skipped " << report.skipped << " already in " << options.db
      << (report.skipped > 0 ? " (--force re-measures them)" : "") << "\n";
}

}  // namespace

Status RunComm(comm::Communicator& world, const CommOptions& options, std::ostream& out) {
  const int rank = world.rank();
  CUPCAKE_RETURN_IF_ERROR(Quiet(AgreeOnFlags(world, options)));
  // --max-bytes auto: rank 0 reads the DB's largest model, every rank learns the size.
  int64_t max_bytes = options.max_bytes;
  if (options.max_bytes_auto) {
    CUPCAKE_ASSIGN_OR_RETURN(max_bytes, LargestModelSizeFromRoot(&world, options.db, /*bytes=*/true, "--max-bytes"));
  }
  auto sweep = SweepOptions(options, max_bytes);
  if (!sweep.ok()) return Quiet(sweep.status());
  auto lock_ms = LockTimeoutMs(options.lock_timeout_s);
  if (!lock_ms.ok()) return Quiet(lock_ms.status());
  CUPCAKE_ASSIGN_OR_RETURN(profile::Topology topo, profile::DiscoverTopology(world));
  if (topo.ranks_per_host == 0)
    return Quiet(
        FailedPreconditionError("comm: hosts run different numbers of ranks; expected the same number on "
                                "every host (docs/FORMATS.md: nodes x devices_per_node)"));
  const int nodes = static_cast<int>(topo.hosts.size());

  // 3. Rank 0 checks an existing DB: it must be a profile DB measured with this backend.
  Status setup;
  if (rank == 0) {
    auto existing = profile::ProfileStore::Open(options.db, /*create=*/false, *lock_ms);
    if (existing.ok())
      setup = SameBackend(*existing, options.backend, options.force);
    else if (existing.status().code() != StatusCode::kNotFound)
      setup = existing.status();
  }
  CUPCAKE_RETURN_IF_ERROR(ShareRootStatus(world, setup));

  // 4. NCCL: without a GPU it fails here, before a DB is created. One GPU per rank, the host's
  // local_rank-th; the sweep's own exchanges stay on MPI.
  std::unique_ptr<comm::Communicator> nccl;
  if (options.backend == "nccl") {
    auto made = comm::MakeNcclCommunicator(&world, topo.local_rank);
    if (!made.ok()) return made.status().WithPrefix("--backend nccl");
    nccl = std::move(made).value();
    sweep->data = nccl.get();
  }
  const std::string library = (nccl ? *nccl : world).library();

  // 5. Rank 0 opens the DB; everyone learns whether that worked.
  std::optional<profile::ProfileStore> store;
  if (rank == 0) {
    auto opened = OpenDbWithCluster(options, *lock_ms, topo, world.size(), library);
    if (opened.ok())
      store.emplace(std::move(opened).value());
    else
      setup = opened.status();
  }
  CUPCAKE_RETURN_IF_ERROR(ShareRootStatus(world, setup));

  // 6. Sweep; rank 0 commits each point as it is measured.
  std::optional<profile::StoreSink> sink;
  if (store) sink.emplace(*store);
  profile::SteadyClock clock;
  std::optional<ProgressBar> bar;
  if (rank == 0 && options.progress) bar.emplace(*options.progress, "comm");
  const CpuMeter cpu;
  auto report =
      profile::SweepComm(world, *sweep, clock, sink ? &*sink : nullptr, bar ? bar->Fn() : profile::ProgressFn());
  if (bar) bar->Finish();
  if (!report.ok()) return report.status().WithPrefix("comm");
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<HostLoad> other, MeasureOtherWork(cpu, &world));
  if (rank != 0) return report->wrong > 0 ? Quiet(WrongPoints(*report)) : Status::Ok();
  if (Status s = RecordOtherWork(*store, kCommLoadKey, other); !s.ok()) return s.WithPrefix("comm: cluster meta");

  // 7. Report.
  PrintReport(*report, options, *sweep, world.size(), nodes, library, out);
  if (report->wrong > 0) return Quiet(WrongPoints(*report));
  return Status::Ok();
}

int CommMain(tools::Invocation& inv, comm::Communicator* world, const std::string& mpi_problem) {
  CommOptions options;
  std::string ops, max_bytes, store_dir;
  po::options_description flags("options");
  flags.add_options()("db", po::value(&options.db)->required(),
                      "the profile DB, written by rank 0 (created when missing)")(
      "quick", po::bool_switch(&options.quick), "few sizes, few iterations (seconds)")(
      "force", po::bool_switch(&options.force), "re-measure points the DB already has")(
      "min-bytes", po::value(&options.min_bytes),
      "smallest send buffer per rank, a power of two >= 4 (default 4; --quick 1 KiB)")(
      "max-bytes", po::value(&max_bytes),
      "largest send buffer per rank, a power of two, or auto: the largest model in the DB (default 16 MiB; --quick 1 "
      "MiB)")("warmup", po::value(&options.warmup), "untimed iterations per point (default 5; --quick 2)")(
      "iters", po::value(&options.iters), "timed iterations per point and round (default 20; --quick 5)")(
      "rounds", po::value(&options.rounds),
      "passes over all the points, a point's time the median of its calls in all rounds (default 1)")(
      "busy", po::bool_switch(&options.busy),
      "each rank runs a compute thread beside the collectives: the busy curves of a CPU job (docs/MODEL.md)")(
      "chained", po::bool_switch(&options.chained),
      "time calls issued back to back: the chained curves of collectives that queue on the network "
      "(docs/MODEL.md)")(
      "ops", po::value(&ops),
      "comma-separated collectives (default: allreduce,allgather,reduce_scatter,alltoall,broadcast)")(
      "backend", po::value(&options.backend),
      "mpi: MPI on host memory (default); nccl: NCCL on GPU memory, one GPU per rank; gloo: gloo on host memory "
      "(the collectives of a job under torchrun), under torchrun or mpirun, with --store")(
      "store", po::value(&store_dir), kStoreHelp)("cluster", po::value(&options.cluster),
                                                  "the cluster's name when the DB is new (default: local)")(
      "lock-timeout", po::value(&options.lock_timeout_s)->default_value(10), kLockTimeoutHelp);
  po::variables_map vm;
  if (auto code = tools::ParseFlags(inv, flags, {},
                                    "--db DB [--quick] [--force] [--min-bytes B] [--max-bytes B] (under mpirun)", vm))
    return *code;
  if (!max_bytes.empty()) {
    auto size = ParseSizeOrAuto("--max-bytes", max_bytes);
    if (!size.ok()) return tools::UsageError(inv, size.status().message());
    if (*size) options.max_bytes = **size;
    options.max_bytes_auto = !*size;
  }
  if (options.quick) {
    if (!vm.count("min-bytes")) options.min_bytes = 1024;
    if (max_bytes.empty()) options.max_bytes = int64_t{1} << 20;
    if (!vm.count("warmup")) options.warmup = 2;
    if (!vm.count("iters")) options.iters = 5;
    options.step = 2;
  }
  std::stringstream ss(ops);
  for (std::string name; std::getline(ss, name, ',');)
    if (!name.empty()) options.ops.push_back(name);
  JobWorld job;
  if (auto code = OpenJobWorld(inv, world, mpi_problem, options.backend, store_dir, job)) return *code;
  world = job.world;
  if (world == nullptr) return tools::UsageError(inv, kNoLauncher);
  options.command = inv.tool + " " + inv.command;
  for (const auto& a : inv.args) options.command += " " + a;
  if (world->rank() == 0 && StderrIsTerminal()) options.progress = &inv.err;
  return FinishJob(inv, world, RunComm(*world, options, inv.out));
}

}  // namespace cupcake::profile_cli

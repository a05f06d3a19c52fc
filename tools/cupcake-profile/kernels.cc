#include <chrono>
#include <sstream>

#include "commands.h"
#include "cupcake/profile/clock.h"
#include "cupcake/profile/kernel_sweep.h"
#include "cupcake/profile/sink.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/names.h"
#include "profiling.h"

namespace cupcake::profile_cli {
namespace po = boost::program_options;

Status RunKernels(const KernelsOptions& options, std::ostream& out) {
  auto device = ParseDevice(options.device);
  if (!device) return InvalidArgumentError("--device: unknown device; got '" + options.device + "', expected cpu or gpu");
  profile::KernelSweepOptions sweep;
  sweep.device = *device;
  CUPCAKE_ASSIGN_OR_RETURN(sweep.elements, profile::PowerOfTwoSizes("--min-elements", options.min_elements,
                                                                    "--max-elements", options.max_elements,
                                                                    int64_t{1} << 30, options.step));
  sweep.warmup = options.warmup;
  sweep.iters = options.iters;
  sweep.force = options.force;
  sweep.compressors = options.compressors;
  if (options.warmup < 0) return InvalidArgumentError("--warmup: out of range; got " + std::to_string(options.warmup) + ", expected >= 0");
  if (options.iters < 1) return InvalidArgumentError("--iters: out of range; got " + std::to_string(options.iters) + ", expected >= 1");
  if (options.world_size < 0 || options.world_size > 65536)
    return InvalidArgumentError("--world-size: out of range; got " + std::to_string(options.world_size) +
                                ", expected 1 <= W <= 65536");

  CUPCAKE_ASSIGN_OR_RETURN(int lock_ms, LockTimeoutMs(options.lock_timeout_s));
  CUPCAKE_ASSIGN_OR_RETURN(profile::ProfileStore store, profile::ProfileStore::Open(options.db, /*create=*/true, lock_ms));
  // The world size: the DB's cluster's, else --world-size, else 1.
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> existing, store.LoadCluster());
  int nodes = 1, per_node = options.world_size > 0 ? options.world_size : 1;
  if (existing && options.world_size == 0) {
    nodes = existing->nodes();
    per_node = existing->devices_per_node();
  } else if (existing && existing->nodes() * existing->devices_per_node() != options.world_size) {
    return InvalidArgumentError(options.db + ": --world-size: disagrees with the DB's cluster '" + existing->name() +
                                "'; got " + std::to_string(options.world_size) + ", expected " +
                                std::to_string(existing->nodes() * existing->devices_per_node()) + " (" +
                                std::to_string(existing->nodes()) + " nodes x " +
                                std::to_string(existing->devices_per_node()) + " devices)");
  } else if (existing) {
    nodes = existing->nodes();
    per_node = existing->devices_per_node();
  }
  sweep.world_size = nodes * per_node;
  std::map<std::string, std::string> meta{{"kernels.command", options.command},
                                          {"kernels.date", UtcNow()},
                                          {"kernels.device", options.device}};
  CUPCAKE_ASSIGN_OR_RETURN(pb::Cluster cluster,
                           EnsureCluster(store, options.cluster, nodes, per_node, meta, "--world-size"));

  profile::StoreSink sink(store);
  profile::SteadyClock clock;
  std::optional<ProgressBar> bar;
  if (options.progress) bar.emplace(*options.progress, "kernels");
  const auto t0 = std::chrono::steady_clock::now();
  auto report = profile::SweepKernels(sweep, clock, sink, bar ? bar->Fn() : profile::ProgressFn());
  if (bar) bar->Finish();
  if (!report.ok()) return report.status().WithPrefix("kernels");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", s);
  out << "kernels: " << options.device << ", W=" << sweep.world_size << ", " << sweep.elements.size()
      << " sizes (" << tools::HumanCount(sweep.elements.front()) << " .. " << tools::HumanCount(sweep.elements.back())
      << " elements), warmup " << sweep.warmup << ", iters " << sweep.iters << ": measured " << report->measured
      << " points, skipped " << report->skipped << " already in " << options.db
      << (report->skipped > 0 ? " (--force re-measures them)" : "") << ", in " << secs << " s\n";
  return Status::Ok();
}

int KernelsMain(tools::Invocation& inv) {
  KernelsOptions options;
  std::string compressors;
  po::options_description flags("options");
  flags.add_options()
      ("db", po::value(&options.db)->required(), "the profile DB (created when missing)")
      ("device", po::value(&options.device)->default_value("cpu"), "cpu or gpu")
      ("quick", po::bool_switch(&options.quick), "few sizes, few iterations (seconds)")
      ("force", po::bool_switch(&options.force), "re-measure points the DB already has")
      ("world-size", po::value(&options.world_size)->default_value(0), "W for decode (default: the DB's cluster, else 1)")
      ("min-elements", po::value(&options.min_elements), "smallest group, a power of two (default 1024)")
      ("max-elements", po::value(&options.max_elements), "largest group, a power of two (default 4Mi; --quick 1Mi)")
      ("lock-timeout", po::value(&options.lock_timeout_s)->default_value(10), kLockTimeoutHelp)
      ("warmup", po::value(&options.warmup), "untimed calls per point (default 2; --quick 1)")
      ("iters", po::value(&options.iters), "timed calls per point, the median is stored (default 10; --quick 5)")
      ("compressors", po::value(&compressors), "comma-separated names (default: all)")
      ("cluster", po::value(&options.cluster), "the cluster's name when the DB is new (default: local)");
  po::variables_map vm;
  if (auto code = tools::ParseFlags(inv, flags, {}, "--db DB [--device cpu|gpu] [--quick] [--force] [--world-size W]", vm))
    return *code;
  if (options.quick) {
    if (!vm.count("max-elements")) options.max_elements = int64_t{1} << 20;
    if (!vm.count("warmup")) options.warmup = 1;
    if (!vm.count("iters")) options.iters = 5;
    options.step = 2;
  }
  std::stringstream ss(compressors);
  for (std::string name; std::getline(ss, name, ',');)
    if (!name.empty()) options.compressors.push_back(name);
  options.command = inv.tool + " " + inv.command;
  for (const auto& a : inv.args) options.command += " " + a;
  if (StderrIsTerminal()) options.progress = &inv.err;
  Status status = RunKernels(options, inv.out);
  if (!status.ok() && status.code() == StatusCode::kInvalidArgument &&
      status.message().rfind("--", 0) == 0)
    return tools::UsageError(inv, status.message());
  return tools::Finish(inv, status);
}

}  // namespace cupcake::profile_cli

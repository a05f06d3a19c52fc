#include "cupcake/profile/profile_run.h"

#include <optional>
#include <utility>

#include "cupcake/profile/sink.h"

namespace cupcake::profile {
namespace {

// "1 node", "2 devices".
std::string CountOf(int64_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

// What rank 0's DB says about the world, known to every rank after OpenMainStore.
struct MainStore {
  std::optional<ProfileStore> store;  // rank 0 only
  pb::Cluster cluster;  // rank 0 only
  int world_size = 1;
  bool assumed_world = false;
};

// ProfileKernels' step 1: rank 0 opens (or creates) the DB with its cluster; every rank learns
// whether that worked and the world size. A new DB is made with its cluster in one step, so a
// failure leaves no DB behind.
StatusOr<MainStore> OpenMainStore(const ProfileKernelsOptions& options, const std::map<std::string, std::string>& meta,
                                  comm::Communicator* peers) {
  const int rank = peers != nullptr ? peers->rank() : 0;
  MainStore main;
  auto prepare = [&](ProfileStore& store) -> Status {
    CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> existing, store.LoadCluster());
    int nodes = 1, per_node = options.world_size > 0 ? options.world_size : 1;
    if (existing && options.world_size != 0 && existing->nodes() * existing->devices_per_node() != options.world_size)
      return InvalidArgumentError(options.db + ": --world-size: disagrees with the DB's cluster '" + existing->name() +
                                  "'; got " + std::to_string(options.world_size) + ", expected " +
                                  std::to_string(existing->nodes() * existing->devices_per_node()) + " (" +
                                  CountOf(existing->nodes(), "node") + " x " +
                                  CountOf(existing->devices_per_node(), "device") + ")");
    if (existing) {
      nodes = existing->nodes();
      per_node = existing->devices_per_node();
    }
    main.assumed_world = !existing && options.world_size == 0;
    CUPCAKE_ASSIGN_OR_RETURN(main.cluster,
                             EnsureCluster(store, options.cluster, nodes, per_node, meta, "--world-size"));
    return Status::Ok();
  };
  Status opened;
  if (rank == 0) {
    auto made = ProfileStore::OpenOrCreate(options.db, options.lock_timeout_ms, prepare);
    if (made.ok())
      main.store.emplace(std::move(made).value());
    else
      opened = made.status();
  }
  CUPCAKE_RETURN_IF_ERROR(peers != nullptr ? ShareRootStatus(*peers, opened) : opened);
  main.world_size = main.cluster.nodes() * main.cluster.devices_per_node();
  if (peers != nullptr) {
    CUPCAKE_RETURN_IF_ERROR(peers->Broadcast(&main.world_size, sizeof main.world_size, 0));
    int assumed = main.assumed_world ? 1 : 0;
    CUPCAKE_RETURN_IF_ERROR(peers->Broadcast(&assumed, sizeof assumed, 0));
    main.assumed_world = assumed != 0;
  }
  return main;
}

// ProfileKernels' step 3: the kernel-only curves, a profile of the same cluster in their own DB
// (a profile holds one curve per key, and the planner reads the event time from the main DB).
StatusOr<ProfileStore> OpenKernelStore(const ProfileKernelsOptions& options, const pb::Cluster& cluster,
                                       std::map<std::string, std::string> meta) {
  meta["kernels.kernel_time"] = "CUPTI activity records (kernel, memcpy, memset), union of intervals per call";
  auto same_cluster = [&](ProfileStore& ks) {
    return EnsureCluster(ks, cluster.name(), cluster.nodes(), cluster.devices_per_node(), meta, "--world-size")
        .status()
        .WithPrefix(options.kernel_db);
  };
  return ProfileStore::OpenOrCreate(options.kernel_db, options.lock_timeout_ms, same_cluster);
}

}  // namespace

StatusOr<pb::Cluster> EnsureCluster(ProfileStore& store, const std::string& name, int nodes, int devices_per_node,
                                    const std::map<std::string, std::string>& meta, const std::string& flag_hint) {
  CUPCAKE_ASSIGN_OR_RETURN(std::optional<pb::Cluster> existing, store.LoadCluster());
  pb::Cluster cluster;
  if (existing) {
    cluster = *existing;
    if (!name.empty() && name != cluster.name())
      return InvalidArgumentError(store.path() + ": --cluster: the DB holds another cluster; got '" + name +
                                  "', expected '" + cluster.name() + "' (or another DB)");
    if (cluster.nodes() != nodes || cluster.devices_per_node() != devices_per_node)
      return InvalidArgumentError(
          store.path() + ": " + flag_hint + ": disagrees with the DB's cluster '" + cluster.name() + "'; got " +
          CountOf(nodes, "node") + " x " + CountOf(devices_per_node, "device") + ", expected " +
          CountOf(cluster.nodes(), "node") + " x " + CountOf(cluster.devices_per_node(), "device"));
  } else {
    cluster.set_name(name.empty() ? "local" : name);
    cluster.set_nodes(nodes);
    cluster.set_devices_per_node(devices_per_node);
    cluster.set_source("measured by cupcake-profile");
  }
  for (const auto& [k, v] : meta) (*cluster.mutable_meta())[k] = v;
  pb::Profile p;
  *p.mutable_cluster() = cluster;
  CUPCAKE_RETURN_IF_ERROR(store.ImportProfile(p, /*replace=*/false));
  return cluster;
}

Status ShareRootStatus(comm::Communicator& world, const Status& root_status) {
  // The code (0: OK), then the message's length and bytes.
  int64_t head[2] = {static_cast<int64_t>(root_status.code()), static_cast<int64_t>(root_status.message().size())};
  CUPCAKE_RETURN_IF_ERROR(world.Broadcast(head, sizeof head, 0));
  if (head[0] == 0) return Status::Ok();
  std::string message = root_status.message();
  message.resize(static_cast<size_t>(head[1]));
  if (head[1] > 0) CUPCAKE_RETURN_IF_ERROR(world.Broadcast(message.data(), head[1], 0));
  return Quiet(Status(static_cast<StatusCode>(head[0]), std::move(message)));
}

StatusOr<ProfileKernelsResult> ProfileKernels(const ProfileKernelsOptions& options, KernelDevice* device,
                                              ActivitySource* activity, Clock& clock, const ProgressFn& progress,
                                              comm::Communicator* peers) {
  std::map<std::string, std::string> meta = options.meta;
  if (device != nullptr) meta["kernels.gpu"] = device->Describe();
  if (peers != nullptr) meta["kernels.ranks"] = std::to_string(peers->size()) + " in step, the slowest rank's median";

  CUPCAKE_ASSIGN_OR_RETURN(MainStore main, OpenMainStore(options, meta, peers));
  KernelSweepOptions sweep = options.sweep;
  sweep.world_size = main.world_size;
  // Every rank finds the same bad options; rank 0 alone reports them (step 2).
  if (peers != nullptr) {
    if (Status v = ValidateKernelSweepOptions(sweep, /*zen_device=*/true); !v.ok())
      return Quiet(v.WithPrefix("kernels"));
  }
  std::optional<ProfileStore> kernel_store;
  std::optional<StoreSink> kernel_sink;
  if (activity != nullptr) {
    CUPCAKE_ASSIGN_OR_RETURN(ProfileStore ks, OpenKernelStore(options, main.cluster, meta));
    kernel_store.emplace(std::move(ks));
    kernel_sink.emplace(*kernel_store);
  }

  // The sweep (step 4); the other ranks' points are copies of rank 0's: kept in memory, dropped.
  std::optional<StoreSink> store_sink;
  MemorySink copies;
  if (main.store) store_sink.emplace(*main.store);
  ProfileSink& sink = store_sink ? static_cast<ProfileSink&>(*store_sink) : copies;
  ProfileKernelsResult result;
  result.world_size = main.world_size;
  result.assumed_world = main.assumed_world;
  result.kernel_only = kernel_sink.has_value();
  if (device != nullptr) {
    auto r = SweepKernelsOnDevice(sweep, *device, activity, sink, kernel_sink ? &*kernel_sink : nullptr, progress);
    if (!r.ok()) return r.status().WithPrefix("kernels");
    result.report = std::move(r).value();
  } else {
    auto r = SweepKernels(sweep, clock, sink, progress, peers);
    if (!r.ok()) return r.status().WithPrefix("kernels");
    result.report.event = std::move(r).value();
  }
  return result;
}

}  // namespace cupcake::profile

// What a profiling run does around its sweep, so that a tool is option parsing, wiring and
// printing only: the cluster record a DB holds, rank 0's outcome shared by every rank, and the
// whole kernels run (ProfileKernels): rank 0's store, the broadcasts that keep the ranks in step,
// and the kernel-only (CUPTI) DB beside the main one.
#pragma once

#include <map>
#include <string>

#include "cupcake/comm/communicator.h"
#include "cupcake/cupcake.pb.h"
#include "cupcake/profile/activity.h"
#include "cupcake/profile/clock.h"
#include "cupcake/profile/kernel_sweep.h"
#include "cupcake/profile/store.h"
#include "cupcake/profile/sweep.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

// The cluster the DB holds, creating it when the DB holds none: `name` (empty: "local"),
// `nodes` x `devices_per_node`. The DB's cluster must have the same shape; `meta` entries are
// merged into its meta. Errors name `flag_hint` (e.g. "--world-size") for a shape mismatch and
// --cluster for another name.
StatusOr<pb::Cluster> EnsureCluster(ProfileStore& store, const std::string& name, int nodes, int devices_per_node,
                                    const std::map<std::string, std::string>& meta, const std::string& flag_hint);

// Rank 0's result, known to all ranks (collective over `world`): Ok everywhere, or rank 0's
// status (code and message) on every rank, reported by rank 0 (Quiet: Status::reporter).
Status ShareRootStatus(comm::Communicator& world, const Status& root_status);

// A kernels run: what to sweep and where the points go.
struct ProfileKernelsOptions {
  std::string db;  // the profile DB, created (with its cluster) when missing
  // The DB of the kernel-only curves; used when ProfileKernels gets an activity source (a GPU
  // sweep with CUPTI), made with the main DB's cluster when missing.
  std::string kernel_db;
  std::string cluster;  // the cluster's name when the DB is new (empty: "local")
  int world_size = 0;  // W for decode: 0: the DB's cluster's, else 1; else it must match the DB
  int lock_timeout_ms = ProfileStore::kBusyTimeoutMs;  // how long the stores wait for another writer
  // Merged into the cluster's meta (both DBs), with kernels.gpu (the device's Describe()) and
  // kernels.ranks (with peers) added here.
  std::map<std::string, std::string> meta;
  // The sweep; its world_size is set from the DB. device gpu needs a KernelDevice.
  KernelSweepOptions sweep;
};

// What a kernels run did.
struct ProfileKernelsResult {
  KernelSweepReport report;  // CPU sweeps fill report.event only
  int world_size = 1;  // the W decode was timed for
  bool assumed_world = false;  // the DB had no cluster and no world_size was given: W = 1
  bool kernel_only = false;  // kernel-only points went to options.kernel_db
};

// The kernels run: 1. rank 0 alone opens (or creates) the DB and records the cluster (named,
// shaped by options.world_size or the DB's own cluster); every rank learns whether that worked
// and the world size (broadcasts over `peers`); 2. with peers, every rank checks the sweep
// options alike; 3. with `activity`, the kernel-only DB is opened with the same cluster;
// 4. the sweep: on `device` (device gpu; SweepKernelsOnDevice, event time to the DB, kernel-only
// time to the kernel DB) or on the host (SweepKernels, in step with `peers`); the other ranks'
// points are copies of rank 0's, kept in memory and dropped.
// `peers` (optional, host sweeps only): the ranks of one job; collective, every rank calls it with
// the same options. A failure every rank finds alike (the DB did not open, bad sweep options) is
// reported by rank 0 (Quiet): every rank returns it, the others do not print it.
// Errors: the stores' (naming the DB); bad sweep options and sweep failures prefixed "kernels: ".
StatusOr<ProfileKernelsResult> ProfileKernels(const ProfileKernelsOptions& options, KernelDevice* device,
                                              ActivitySource* activity, Clock& clock,
                                              const ProgressFn& progress = nullptr,
                                              comm::Communicator* peers = nullptr);

}  // namespace cupcake::profile

// Gemini's traffic schedule for checkpoint replicas (docs/CHECKPOINT.md; Wang et al., SOSP'23,
// "Gemini: Fast Failure Recovery in Distributed Training with In-Memory Checkpoints", section 5):
// the per-iteration intervals in which a plan's predicted timeline leaves the network idle, and
// the largest replica chunk whose predicted transfer time fits each of them.
//
// Pure: values in, values out. It reads the plan's timeline as stored (docs/MODEL.md): forward
// [0, forward_us), then the groups' network blocks [forward_us + comm_start_us, forward_us +
// comm_end_us] in group order, which never overlap (one network, groups in order), and the
// iteration's end at predicted.iteration_us. Everything else is idle network.
#pragma once

#include <cstdint>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/curve.h"
#include "cupcake/proto/status.h"

namespace cupcake::planner {

// One interval of an iteration in which no collective of the plan runs.
struct IdleGap {
  double start_us = 0;  // from the start of forward
  double end_us = 0;
  // The group whose network block it follows; -1: before the first (forward and early backward).
  int after_group = -1;
  // The largest chunk, in bytes, whose predicted transfer time is <= end_us - start_us (at most
  // the state's size); 0 when not even the smallest transfer fits.
  int64_t chunk_bytes = 0;
};

struct ReplicaSchedule {
  int64_t state_bytes = 0;  // what one replica holds
  std::vector<IdleGap> gaps;  // in iteration order; gaps of zero length are left out
  double idle_us = 0;  // the gaps' total length per iteration
  // Every gap used: the bytes per iteration and the iterations one replica takes,
  // ceil(state_bytes / bytes_per_iteration); 0 iterations when no gap fits a transfer.
  int64_t bytes_per_iteration = 0;
  int64_t iterations = 0;
  // What the runtime sends (Checkpointer, CheckpointOptions::replica_chunk_bytes): one chunk per
  // iteration, starting at Commit, which is the iteration's end, so in the gap before the next
  // iteration's first collective (gaps[0] when it has after_group -1, else nothing).
  int64_t commit_chunk_bytes = 0;
  int64_t commit_iterations = 0;
};

// The largest integer size x in [0, cap] with curve.At(x) <= budget_us (curves may be
// non-monotone: the largest such x, not the first crossing); 0 when none is.
int64_t LargestFit(const Curve& curve, double budget_us, int64_t cap);

// The predicted time of a point-to-point transfer of x bytes between two ranks, from the
// profile's `comm allreduce global` (float32) curve of `world_size` ranks: a ring allreduce of s
// bytes puts 2 (W - 1) / W s bytes per rank on its link, so the transfer of x bytes is priced as
// the allreduce of s = x W / (2 (W - 1)) bytes. Its reduction and 2 (W - 1) latencies make this
// an upper bound of a transfer's time, so chunks err small. The points' sizes are scaled by
// 2 (W - 1) / W (1 at W = 2). NotFound naming the curve when the profile lacks it;
// InvalidArgument for world_size < 2 (no peer).
StatusOr<Curve> TransferCurve(const pb::Profile& profile, int world_size);

// The schedule for a replica of `state_bytes` (> 0) on `plan`'s timeline, each chunk priced by
// `transfer` (TransferCurve).
ReplicaSchedule ScheduleReplica(const pb::Plan& plan, const Curve& transfer, int64_t state_bytes);

}  // namespace cupcake::planner

// The comm sweep: the collectives over message sizes, measured as nccl-tests do it,
// with a correctness check of every result, each point committed by rank 0 as measured.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/topology.h"
#include "cupcake/cupcake.pb.h"
#include "cupcake/profile/clock.h"
#include "cupcake/profile/sink.h"
#include "cupcake/profile/sweep.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

// Where the ranks run (libcomm's; the sweeps use it).
using comm::DiscoverTopology;
using comm::Topology;

// Ranks must run with the same configuration: rank 0's (flag, value) list is compared with
// every rank's. Collective. A mismatch is FailedPrecondition on every rank, naming each flag
// that differs: `--max-bytes: ranks disagree; got 4096 on rank 2, expected 1048576 as on rank 0`.
Status AgreeOnConfiguration(comm::Communicator& world, const std::vector<std::pair<std::string, std::string>>& flags);

struct CommSweepOptions {
  std::vector<int64_t> sizes;  // bytes of each rank's send buffer, ascending, >= 4
  std::vector<pb::CommOp> ops;  // empty: all five
  int warmup = 5;
  int iters = 20;
  // Passes over all the points, each with `warmup` + `iters` calls per point: a transient on the
  // network or the machine (it lasts seconds) then lands in one pass of a point, not in all of
  // its calls.
  int rounds = 1;
  bool force = false;  // re-measure points the sink has
  // Every rank runs a thread of floating-point work through the sweep, and the curves are marked
  // busy: collectives as they run beside a CPU job's backward (docs/MODEL.md, "Busy cores").
  bool busy = false;
  // Every point is timed on calls back to back, each started as soon as the one before it ended,
  // and the curves are marked chained: collectives as they run when groups queue on the network
  // (docs/MODEL.md, "Chained collectives"). Not with busy.
  bool chained = false;
  // Whose collectives are measured: nullptr for `world` itself, or a communicator over the same
  // ranks in the same order (NCCL on GPU memory), while `world` (MPI on host memory) makes the
  // sweep's own exchanges: barriers, the slowest median, the wrong counts. Not owned.
  comm::Communicator* data = nullptr;
};

// Sweeps scope global over `world`, then, when the ranks span several hosts with the same
// number of ranks each, intra (the ranks of each host, all hosts at once) and inter (one rank
// per host). Per point:
//   1. Fill the send buffer with small integers that depend on rank and index, so every
//      expected result is exact in float; clear the receive buffer (buffers in the data
//      communicator's memory, filled untimed). Allreduce runs in place, as the runtime runs it.
//   2. Barrier, time one call to its completion (Synchronize) with `clock`; `warmup`
//      untimed then `iters` timed calls.
//   3. Check every call's result against the formula of the collective; an iteration is
//      wrong when any rank's result is (allreduce MAX over ranks).
//   4. Steps 1-3 run once per round (`rounds` passes over all the points, in order). The
//      point's time is the slowest rank's median over its timed calls of all rounds (allreduce
//      MAX of the medians).
//   5. No wrong iteration: rank 0 commits the point after its last pass (method wall, warmup,
//      iters = timed calls of all rounds, and the
//      curve's wrong count so far). Otherwise the point is not stored, counted in
//      SweepReport::wrong and in the curve's `wrong`, and the sweep goes on.
// Sizes are those of each rank's send buffer (docs/FORMATS.md); reduce_scatter and alltoall
// round down to a multiple of 4 x size() bytes (sizes that round to 0 are left out).
// Points rank 0's sink has are skipped unless `force` (rank 0 decides and broadcasts).
// `sink` and `progress` are used on rank 0 only (pass nullptr elsewhere). Collective.
StatusOr<SweepReport> SweepComm(comm::Communicator& world, const CommSweepOptions& options, Clock& clock,
                                ProfileSink* sink, const ProgressFn& progress = nullptr);

}  // namespace cupcake::profile

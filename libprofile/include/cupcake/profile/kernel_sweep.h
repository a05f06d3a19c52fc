// The kernels sweep (issue 5): encode and decode of every compressor over element counts, and
// the pack/unpack copies, on one device, each point committed to a ProfileSink as measured.
#pragma once

#include <cstdint>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/profile/clock.h"
#include "cupcake/profile/sink.h"
#include "cupcake/profile/sweep.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

struct KernelSweepOptions {
  pb::Device device = pb::CPU;
  std::vector<int64_t> elements;   // group sizes n (elements), ascending; copies use 4n bytes
  std::vector<std::string> compressors;  // empty: every compressor of the catalogue
  int world_size = 1;   // W: decode of allgather compressors sums W payloads
  double ratio = 0.01;  // topk, randk, dgc
  int warmup = 2;
  int iters = 10;
  bool force = false;   // re-measure points the sink has
};

// Sweeps, in order, for each compressor: encode over `elements`, then decode; then copy pack
// and unpack over 4n bytes. A point is timed as the median of `iters` calls after `warmup`
// untimed ones, each call bracketed by `clock` (method "wall" on the CPU). Points the sink has
// are skipped unless `force`. The first error (a sink refusing a point, a compressor failing)
// stops the sweep; what was committed before stays.
// Errors: InvalidArgument for bad options (naming the field), FailedPrecondition for a device
// this build or machine cannot run (GPU sweeps are not implemented yet).
StatusOr<SweepReport> SweepKernels(const KernelSweepOptions& options, Clock& clock, ProfileSink& sink,
                                   const ProgressFn& progress = nullptr);

}  // namespace cupcake::profile

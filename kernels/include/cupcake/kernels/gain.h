// GraVAC's gain sums (docs/ADAPTIVE.md) on GPU memory: per group, over x = g + e (e: the
// group's error-feedback memory, or none), ||x||^2 and the energy a ratio-selecting compressor
// keeps at two k's. The host probe (libruntime's GainProbe) computes the same sums on host
// memory; this one keeps them on the device, so a probed step adds no host synchronization.
//
// The sums, as the host probe's: `min` is the sum of the k_min largest squares and `cand` of the
// k_c largest (magnitude selection: topk, and dgc's approximation; each square a float, summed
// in double), or of the squares of x at randk's indices RandkIndex(seed, iteration, n, j) for
// j < k_min (j < k_c; squares in double). Only the order of the double additions differs from
// the host's. A group whose ||x||^2 is not finite (a NaN or infinity in x, or a float square
// past float's range) adds nothing and is counted in `skipped`.
#pragma once

#include <cstdint>
#include <memory>

#include "cupcake/proto/status.h"

namespace cupcake::kernels {

struct GainTotals {
  double input = 0;  // sum ||x||^2
  double min = 0;  // the energy kept at k_min
  double cand = 0;  // at k_c
  int64_t skipped = 0;  // groups left out
};

// Ownership: owns its device workspace and totals (about 85 KiB). Thread-safety: one thread at a
// time; the calls queue work on the given stream (a cudaStream_t, nullptr = the default stream)
// and allocate nothing. One workspace: work queued on two streams must not overlap.
class DeviceGain {
 public:
  virtual ~DeviceGain() = default;
  // Adds one group's sums to the totals: g and e (nullptr: no memory) are n floats of device
  // memory; 1 <= k_c <= k_min <= n, else InvalidArgument.
  virtual Status AddLargest(const float* g, const float* e, int64_t n, int64_t k_min, int64_t k_c, void* stream) = 0;
  virtual Status AddRandom(const float* g, const float* e, int64_t n, int64_t k_min, int64_t k_c, uint64_t seed,
                           uint64_t iteration, void* stream) = 0;
  // The totals once the work queued on `stream` is done (waits for it); Take zeroes them.
  virtual StatusOr<GainTotals> Read(void* stream) = 0;
  virtual StatusOr<GainTotals> Take(void* stream) = 0;
  // Replaces the totals (a restored window), ordered on `stream`.
  virtual Status Write(const GainTotals& totals, void* stream) = 0;
};

// The CUDA implementation, or the error of a build or machine without CUDA.
StatusOr<std::unique_ptr<DeviceGain>> MakeDeviceGain();

}  // namespace cupcake::kernels

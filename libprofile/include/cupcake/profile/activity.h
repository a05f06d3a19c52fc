// Kernel activity records (CUPTI's, or replayed ones) for kernel-only GPU timings, handed to a
// sweep in its constructor as kineto does, so the sweep's use of them is tested on the CPU
// (STYLE.md: a fake at every hardware seam). The CUPTI implementation lives in the backends
// library (libprofile/src/cuda/), made by OpenCuptiActivitySource.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake::profile {

// One kernel execution as the device recorded it (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL; the
// CUPTI source also reports memcpy and memset records this way, named "memcpy HtoD", "memset").
struct KernelActivity {
  std::string name;
  uint64_t start_ns = 0;  // device timestamps
  uint64_t end_ns = 0;
  uint32_t correlation_id = 0;  // the launch it belongs to
};

// ActivitySource: collects kernel records between Start() and Flush(). Errors are returned,
// and a sweep records them rather than dying (kineto). Not thread-safe.
class ActivitySource {
 public:
  virtual ~ActivitySource() = default;
  virtual Status Start() = 0;
  // The records since Start(), in completion order; stops collecting.
  virtual StatusOr<std::vector<KernelActivity>> Flush() = 0;
};

// Replays synthetic records: each Flush() returns the next batch given to it (empty when none
// are left). `start_error`, when set, is what Start() returns.
class FakeActivitySource final : public ActivitySource {
 public:
  explicit FakeActivitySource(std::vector<std::vector<KernelActivity>> batches) : batches_(std::move(batches)) {}
  Status Start() override;
  StatusOr<std::vector<KernelActivity>> Flush() override;
  Status start_error;
  int started() const { return started_; }

 private:
  std::vector<std::vector<KernelActivity>> batches_;
  size_t next_ = 0;
  int started_ = 0;
  bool running_ = false;
};

// Kernel-only time of one timed call, in us: the length of the union of the records' [start,
// end) intervals (kernels that overlap count once; gaps between kernels, launch overhead, do not
// count). InvalidArgument for a record that ends before it starts, naming it.
StatusOr<double> KernelBusyUs(const std::vector<KernelActivity>& records);

// The CUPTI activity source (from the backends library, cupcake_profile_backends): Start()
// enables CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, MEMCPY and MEMSET; Flush() flushes CUPTI's
// buffers (cuptiActivityFlushAll), disables the kinds and returns the records, failing when
// CUPTI dropped any or delivered one incomplete. CUPTI's buffer callbacks are process-wide, so
// at most one source exists at a time (a second is FailedPrecondition); make it where the
// sweep is wired (the command) and pass it down. Errors name the CUPTI call and carry
// cuptiGetResultString. FailedPrecondition when this build has no CUPTI.
StatusOr<std::unique_ptr<ActivitySource>> OpenCuptiActivitySource();
// Whether this build has CUPTI.
bool BuiltWithCupti();

}  // namespace cupcake::profile

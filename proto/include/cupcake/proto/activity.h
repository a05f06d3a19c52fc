// Device activity records (CUPTI's, or replayed ones) for kernel-only GPU timings, handed to
// whoever measures in its constructor as kineto does, so the measuring code is tested on the
// CPU (a fake at every hardware seam, docs/ARCHITECTURE.md). Users: the profiler's kernel sweep and the
// runtime's record mode. The CUPTI implementation is cupcake::kernels' (kernels/cupti/, made by
// kernels::OpenCuptiActivitySource); this interface has no dependency, like the Clock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cupcake/proto/status.h"

namespace cupcake {

// One kernel execution as the device recorded it (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL; the
// CUPTI source also reports memcpy and memset records this way, named "memcpy HtoD", "memset").
struct KernelActivity {
  std::string name;
  uint64_t start_ns = 0;  // device timestamps
  uint64_t end_ns = 0;
  uint32_t correlation_id = 0;  // the launch it belongs to
  // The mark (ActivitySource::SetMark) current on the launching thread when it was launched;
  // 0: none was.
  uint64_t mark = 0;
};

// ActivitySource: collects records between Start() and Flush(). Errors are returned, and the
// caller decides whether they are fatal (a sweep records them, kineto-style). Not thread-safe,
// except that the work of any thread is recorded.
class ActivitySource {
 public:
  virtual ~ActivitySource() = default;
  virtual Status Start() = 0;
  // Waits for the device's queued work, then returns the records since Start(), in
  // completion order; stops collecting.
  virtual StatusOr<std::vector<KernelActivity>> Flush() = 0;
  // Tags what the calling thread launches from now on with `mark` (>= 1), until the next
  // SetMark or ClearMark on that thread (CUPTI: external correlation ids). Sources opened
  // without marks fail with FailedPrecondition.
  virtual Status SetMark(uint64_t mark) = 0;
  virtual Status ClearMark() = 0;
};

// Replays synthetic records: each Flush() returns the next batch given to it (empty when none
// are left). `start_error` / `flush_error`, when set, are what Start() / Flush() return.
// SetMark and ClearMark append to marks() (ClearMark as 0).
class FakeActivitySource final : public ActivitySource {
 public:
  explicit FakeActivitySource(std::vector<std::vector<KernelActivity>> batches) : batches_(std::move(batches)) {}
  Status Start() override;
  StatusOr<std::vector<KernelActivity>> Flush() override;
  Status SetMark(uint64_t mark) override;
  Status ClearMark() override;
  Status start_error;
  Status flush_error;
  int started() const { return started_; }
  const std::vector<uint64_t>& marks() const { return marks_; }

 private:
  std::vector<std::vector<KernelActivity>> batches_;
  size_t next_ = 0;
  int started_ = 0;
  bool running_ = false;
  std::vector<uint64_t> marks_;
};

// Kernel-only time, in us: the length of the union of the records' [start, end) intervals
// (kernels that overlap count once; gaps between kernels, launch overhead, do not count).
// InvalidArgument for a record that ends before it starts, naming it.
StatusOr<double> KernelBusyUs(const std::vector<KernelActivity>& records);

}  // namespace cupcake

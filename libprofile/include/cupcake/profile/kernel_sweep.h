// The kernels sweep: encode and decode of every compressor over element counts, and
// the copies (pack/unpack; on a GPU also d2h/h2d), on one device, each point committed to a
// ProfileSink as measured.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/cupcake.pb.h"
#include "cupcake/profile/activity.h"
#include "cupcake/profile/clock.h"
#include "cupcake/profile/sink.h"
#include "cupcake/profile/sweep.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

struct KernelSweepOptions {
  pb::Device device = pb::CPU;
  std::vector<int64_t> elements;  // group sizes n (elements), ascending; copies use 4n bytes
  // Compressors and "zen" (Zen's steps around its exchanges, on the cpu or a CUDA device, W >=
  // 2), "nonzero" (zen_sparse's scan) and "powersgd" (PowerSGD's steps at `rank`); empty: every
  // compressor of the catalogue, and zen where it applies.
  std::vector<std::string> compressors;
  // powersgd: the rank its curves are measured at (docs/MODEL.md, "PowerSGD"), 1 <= rank <= 2^16.
  int rank = 4;
  int world_size = 1;  // W: decode of allgather compressors sums W payloads; Zen's W ranks
  // topk, randk, dgc and zen: one curve per ratio, recorded in it (ascending, each in (0, 1]).
  std::vector<double> ratios = {kDefaultRatio};
  int warmup = 2;
  int iters = 10;
  bool force = false;  // re-measure points the sink has
  // Cold caches: before every call, warm-up or timed, the caches are emptied of what the
  // previous call left (untimed), so that the call reads its buffers from memory, as a job's
  // encode does: there a group's gradient and its error-feedback state were last touched long
  // before, behind the rest of the model's data (docs/PROFILER.md, "Cold caches"). On the host
  // the buffers the call reads and writes are flushed from every cache level; on a device its
  // L2 is evicted (KernelDevice::EvictCaches). false: each call finds what the previous one left
  // in cache, which times groups that fit the last-level cache (a GPU's L2) faster than a job
  // runs them.
  bool cold = false;
};

// Whether this machine's CPU can flush a line from its caches (x86-64, AArch64), as cold
// sweeps do.
bool CacheFlushSupported();

// Sweeps, in order, for each compressor (and ratio): encode over `elements`, then decode; for
// powersgd, its encode (P = M Q and the rest before the first allreduce) and decode on one
// floor(sqrt(n)) x floor(n / floor(sqrt(n))) matrix, each point at the step's multiply-adds plus
// the matrix's elements (LowRankSizes::work, what the planner reads the curves at); for
// zen, its work before the partitions are gathered ("encode zen") and after ("decode zen") as
// rank 0 of W ranks whose topk payloads of n elements select indices independently; then copy
// pack and unpack over 4n bytes. A point is timed as the median of `iters` calls after `warmup`
// untimed ones, each call bracketed by `clock` (method "wall" on the CPU; `cold` above). Points the sink has
// are skipped unless `force`. The first error (a sink refusing a point, a compressor failing)
// stops the sweep; what was committed before stays.
// Errors: InvalidArgument for bad options (naming the field) and for device gpu (a GPU sweep
// runs through SweepKernelsOnDevice).
// `peers` (optional): the ranks of one job that sweep together, each on its own buffers with
// the same options, so that each point is timed as a job's ranks run it, beside one another
// (sharing the host's cores and memory bandwidth). Every point starts after a barrier, and
// its time is the slowest rank's median (an allreduce); rank 0's sink decides which points
// are measured (a broadcast), so the others' sinks only receive copies. Collective: every
// rank must call it; a rank that fails leaves the others waiting (under mpirun its exit
// ends the job).
StatusOr<SweepReport> SweepKernels(const KernelSweepOptions& options, Clock& clock, ProfileSink& sink,
                                   const ProgressFn& progress = nullptr, comm::Communicator* peers = nullptr);

// The option checks both sweeps run before anything else: InvalidArgument naming every bad
// field, one per line. `zen_device`: whether the device runs Zen's steps (the CPU, a CUDA
// device). Under mpirun every rank finds the same problems before any collective, so one rank
// may report them for all.
Status ValidateKernelSweepOptions(const KernelSweepOptions& options, bool zen_device);

// KernelDevice: the hardware seam of a GPU sweep (a fake at every hardware seam, docs/ARCHITECTURE.md): one
// stream, event timing around launches on it, pinned host memory and asynchronous copies.
// The CUDA implementation (OpenCudaKernelDevice) owns its stream and events; the fake runs the
// compressors on the CPU backend with host memory and scripted elapsed times. Not thread-safe.
class KernelDevice {
 public:
  virtual ~KernelDevice() = default;
  // Whether compressors and buffers live on CUDA (kernels::Backend::kCuda: device memory);
  // false for fakes (kCpu: host memory).
  virtual bool cuda() const = 0;
  // What the device is, for the DB's meta ("NVIDIA H100 80GB HBM3 (sm_90), driver 13000").
  virtual std::string Describe() const = 0;
  // The stream every launch and copy of the sweep goes to (a cudaStream_t for CUDA).
  virtual void* stream() = 0;
  // Records the start event on stream().
  virtual Status BeginTimed() = 0;
  // Records the stop event on stream(), waits for it and returns the time between the two
  // events in us: what the launches in between cost the stream, launch gaps included.
  virtual StatusOr<double> EndTimed() = 0;
  // Waits for everything queued on stream().
  virtual Status Synchronize() = 0;
  // Queues on stream() what evicts the device's caches (CUDA: a write over twice the L2's size
  // to a scratch buffer, allocated on the first call), so that the next launch on stream()
  // reads its buffers from device memory. Cold sweeps call it outside every timed window.
  virtual Status EvictCaches() = 0;
  // Page-locked host memory (h2d, d2h copies); FreePinned takes what AllocatePinned gave.
  virtual StatusOr<void*> AllocatePinned(int64_t size_bytes) = 0;
  virtual void FreePinned(void* ptr) = 0;
  // Copies size_bytes from src to dst on stream(), asynchronously; either side may be device
  // memory or pinned host memory (the direction follows from the pointers).
  virtual Status CopyAsync(void* dst, const void* src, int64_t size_bytes) = 0;
};

// A fake device: host memory, CPU compressors, copies by memcpy, and EndTimed() returning the
// scripted `elapsed_us` in turn (cycling). Counts what the sweep asked of it.
class FakeKernelDevice final : public KernelDevice {
 public:
  explicit FakeKernelDevice(std::vector<double> elapsed_us = {1.0}) : elapsed_us_(std::move(elapsed_us)) {}
  bool cuda() const override { return false; }
  std::string Describe() const override { return "fake device"; }
  void* stream() override { return nullptr; }
  Status BeginTimed() override;
  StatusOr<double> EndTimed() override;
  Status Synchronize() override;
  StatusOr<void*> AllocatePinned(int64_t size_bytes) override;
  void FreePinned(void* ptr) override;
  Status CopyAsync(void* dst, const void* src, int64_t size_bytes) override;
  // Counts, and refuses (FailedPrecondition) between BeginTimed() and EndTimed().
  Status EvictCaches() override;

  int64_t timed() const { return timed_; }  // BeginTimed/EndTimed pairs
  int64_t synchronized() const { return synchronized_; }
  int64_t copies() const { return copies_; }
  int64_t evictions() const { return evictions_; }
  // The calls in order, one letter each: B BeginTimed, T EndTimed, S Synchronize, C CopyAsync,
  // E EvictCaches; a test may append its own letters (an activity window's Start and Flush).
  std::string calls;
  int64_t pinned_live() const { return pinned_live_; }  // pinned buffers not freed
  Status end_error;  // when set, what EndTimed() returns

 private:
  std::vector<double> elapsed_us_;
  bool open_ = false;
  int64_t timed_ = 0, synchronized_ = 0, copies_ = 0, pinned_live_ = 0, evictions_ = 0;
};

// What a GPU sweep measured: the event-timed points (stored in `sink`, the curves the planner
// reads) and the kernel-only points (stored in `kernel_sink`), each with its own counts.
struct KernelSweepReport {
  SweepReport event;
  SweepReport kernel;
  // Why kernel-only time stopped being measured (the activity source failed: kineto's rule, an
  // error while profiling is recorded, not fatal); empty when it never failed. Event points go on.
  std::string activity_error;
  // Kernel-only points that were not stored, one line each: a timed call for which the source
  // delivered no kernel, copy or memset record.
  std::vector<std::string> kernel_problems;
};

// The GPU sweep (device gpu). For each compressor (kernels::MakeCompressor on CUDA, or on the
// CPU for a fake device): encode over `elements`, then decode (of W payloads for allgather
// compressors, encoded beforehand on the device); then device copies pack and unpack (device to
// device) and h2d, d2h (pinned host memory), over 4n bytes. For each point:
//   1. `warmup` untimed calls, then `iters` calls each between BeginTimed() and EndTimed();
//      the median goes to `sink` with method "event" (the time a group really costs the stream);
//      when `cold`, each call (warm-up or timed) follows EvictCaches() and Synchronize(), both
//      before BeginTimed(), so neither the eviction nor the launches queued behind it are timed;
//   2. with an activity source and a kernel sink: `iters` more calls, each between
//      activity->Start() and activity->Flush() after Synchronize(); the median of KernelBusyUs
//      (the union of the call's kernel, memcpy and memset intervals) goes to `kernel_sink` with
//      method "kernel" (same curve key: kernel-only time lives in its own sink because a
//      profile holds one curve per key, and the planner must read the event time); when
//      `cold`, each call follows EvictCaches() and Synchronize() before activity->Start(), so
//      the eviction's memset has completed before collection starts and is not in the sum.
// Each measurement is skipped when its sink has the point, unless `force`. The first error of
// the device, a compressor or a sink stops the sweep (what was committed stays); an error of the
// activity source is recorded in activity_error and ends kernel-only measurement only.
// Errors: InvalidArgument for bad options and for a device other than gpu.
StatusOr<KernelSweepReport> SweepKernelsOnDevice(const KernelSweepOptions& options, KernelDevice& device,
                                                 ActivitySource* activity, ProfileSink& sink, ProfileSink* kernel_sink,
                                                 const ProgressFn& progress = nullptr);

// The CUDA device `ordinal` with a new stream and a pair of events, from the backends library
// (cupcake_profile_backends). FailedPrecondition when this build has no CUDA ("this build has no
// CUDA; ...") or the machine has no device ("no CUDA device found; got ...").
StatusOr<std::unique_ptr<KernelDevice>> OpenCudaKernelDevice(int ordinal = 0);
// Whether this build has CUDA (the backends library's view).
bool BuiltWithCuda();

}  // namespace cupcake::profile

// Engine: schedules the groups' runners over one kind of memory. The host engine (host
// memory) encodes and decodes on the caller's thread and runs the collectives on a
// communication thread, in group order; the device engine (GPU memory) queues them on CUDA
// streams behind events, captures them into CUDA graphs, and runs offloaded groups' codecs on a
// CPU worker. Both report a missing gradient or peer after the timeout the same way.
// Ownership: an engine steps groups it does not own (its PlanSlot's) over the session's
// tensors; the device engine owns the DeviceStreams. Thread-safety: GroupReady, Synchronize
// and EndStep from the job's thread, one at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cupcake/kernels/fusion.h"
#include "cupcake/proto/clock.h"
#include "cupcake/runtime/session.h"
#include "runner.h"

namespace cupcake::runtime::internal {

struct Tensor {
  std::string name;
  int64_t numel = 0;
  std::span<float> buffer;  // registered
  bool ready = false;  // this step; caller's thread only
};

enum class Stage { kIdle, kEncoded, kExchanged };

// One group of a plan at run time: its layout, runner and where its floats are.
struct Group {
  const GroupLayout* layout = nullptr;
  std::unique_ptr<SchemeRunner> runner;
  // The registered buffer itself when the group's buffers are adjacent, else `fusion`, which
  // `table` packs from and unpacks into the tensors. Set once every gradient is registered.
  float* data = nullptr;
  kernels::Buffer fusion;
  std::unique_ptr<kernels::FusionTable> table;
  GroupTimeline times;  // record_timeline: comm_* by the communication thread
  int pending = 0;  // tensors not yet ready this step; caller's thread only
  Stage stage = Stage::kIdle;  // guarded by the engine's mutex

  Work work() const { return {data, layout->numel, table.get()}; }
};

// What an engine reads: the session's tensors, its plan's groups, the communicators, the clock
// and the options. Owned by the PlanSlot; `iteration` points to the session's counter.
struct StepState {
  std::vector<Tensor>* tensors = nullptr;
  std::vector<Group>* groups = nullptr;
  StepContext context;  // iteration filled per call from `iteration`
  const uint64_t* iteration = nullptr;
  GainProbe* const* gain = nullptr;  // the session's probe while it adapts, else null
  Clock* clock = nullptr;
  double timeout_us = 0;
  bool record_timeline = false;
  bool device_graphs = true;
  void* job_stream = nullptr;
  // The session's hook (Session::SetAfterCollective; empty: none) and this plan's index, which
  // the host engine's communication thread passes it after each group's collective.
  const Session::AfterCollective* after_collective = nullptr;
  int plan = 0;

  StepContext Context() const {
    StepContext c = context;
    c.iteration = *iteration;
    c.gain = gain != nullptr ? *gain : nullptr;
    return c;
  }
  int group_count() const { return static_cast<int>(groups->size()); }
  Group& group(int k) const { return (*groups)[static_cast<size_t>(k)]; }
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Group k's last tensor became ready: encode it and start its collective when its turn comes.
  virtual Status GroupReady(int k) = 0;
  // Every group decoded into the registered buffers (or an error: the session fails).
  virtual Status Synchronize() = 0;
  // After a successful Synchronize: every group waits for its tensors again.
  virtual void EndStep() = 0;
  // Ok when `p` may be registered: device memory for the device engine; anything on the host.
  virtual Status CheckDeviceMemory(const void* p) const = 0;
};

// Starts the communication thread.
std::unique_ptr<Engine> MakeHostEngine(StepState state);
// Event and graph numbering in device_engine.cc; starts the CPU worker when a group is offloaded.
std::unique_ptr<Engine> MakeDeviceEngine(StepState state, std::unique_ptr<DeviceStreams> device);
// The events and graphs MakeDeviceStreams must provide for `groups` groups.
int DeviceEventCount(int groups);
int DeviceGraphCount(int groups);
int DeviceHopEvent(int groups);

// DeadlineExceeded naming the missing tensors, or, when this rank has them all, group `group`
// whose collective did not finish.
Status StepTimeout(const StepState& state, int group);
// "groups[k] allreduce" (or allgather, zen).
std::string CollectiveName(const StepState& state, int k);
std::string Quoted(const std::string& s);

}  // namespace cupcake::runtime::internal

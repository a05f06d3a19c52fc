// PlanSlot: one plan of a session, ready to run: its layout, its groups (runners, fusion
// buffers), the communicators its hierarchical groups split off and its engine. A session
// holds one per plan (Create's and AddPlan's) and steps the active one.
// Ownership: owns all of that; not the tensors, the communicator or the clock.
// Thread-safety: the job's thread, between steps (the engine's threads only touch the groups).
#pragma once

#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "engine.h"
#include "layout.h"

namespace cupcake::runtime::internal {

// Which state of a group's compressor: per element (kernels/compressor.h), the error-feedback
// memory (residual e, dgc's accumulator v, PowerSGD's e over the group's elements) or the
// momentum (dgc's u, signum's m); per PowerSGD group (kernels/powersgd.h), the rest of its
// error-feedback memory (a batched group's padding: its padded square after the group's n
// floats; none per tensor) or its Q.
enum class StatePlane { kErrorFeedback, kMomentum, kPowerSgdPadding, kPowerSgdQ };
bool PerElement(StatePlane plane);

class PlanSlot {
 public:
  struct Options {
    Clock* clock = nullptr;
    double timeout_us = 0;
    bool record_timeline = false;
    bool device_graphs = true;
    void* job_stream = nullptr;
    GainProbe* const* gain = nullptr;  // StepState::gain
    const Session::AfterCollective* after_collective = nullptr;  // StepState::after_collective
    int plan = 0;  // this plan's index in the session
  };
  // Allocates every group's buffers and starts the engine. Collective when some group is
  // hierarchical (the node communicators are split off `comm`).
  static StatusOr<std::unique_ptr<PlanSlot>> Create(SessionLayout layout, const Options& options,
                                                    comm::Communicator& comm, std::vector<Tensor>* tensors,
                                                    const uint64_t* iteration);
  ~PlanSlot();

  // Once every gradient is registered: fusion buffers where the buffers are not adjacent.
  Status AttachBuffers();
  const SessionLayout& layout() const { return layout_; }
  std::vector<Group>& groups() { return groups_; }
  const std::vector<Group>& groups() const { return groups_; }
  Engine& engine() { return *engine_; }

  // The state `plane`, StateFloats(plane) floats. Per element in model element order (one float
  // per model element; 0 where a group has none, or, in hierarchical groups, outside this
  // rank's shard; Write ignores those elements); PowerSGD's, its groups' parts in group order.
  // Host or device memory; not during a step.
  Status ReadState(StatePlane plane, std::span<float> out) const;
  Status WriteState(StatePlane plane, std::span<const float> in);
  // ReadState in parts: groups [first, last)'s floats of `plane` into `out` (ReadState's size and
  // layout), the ranges of `out` they wrote ([begin, end) floats) appended to `written`; then
  // ZeroUnwritten(out, written) of every part's ranges sets the rest as ReadState does.
  Status ReadGroupsState(StatePlane plane, int first, int last, std::span<float> out,
                         std::vector<std::pair<int64_t, int64_t>>* written) const;
  static void ZeroUnwritten(std::span<float> out, std::vector<std::pair<int64_t, int64_t>> written);
  // Every group's SchemeRunner::RestartWarmStart (a plan becoming active). Not during a step.
  Status RestartWarmStart();
  int64_t StateFloats(StatePlane plane) const;
  // Whether some group keeps `plane` (from the layouts: the same on every rank).
  bool KeepsState(StatePlane plane) const;

 private:
  PlanSlot(SessionLayout layout, comm::Communicator& comm);
  Status MakeGroups(const Options& options, std::vector<Tensor>* tensors, const uint64_t* iteration);

  SessionLayout layout_;
  comm::Communicator& comm_;
  std::vector<Tensor>* tensors_ = nullptr;  // the session's
  std::unique_ptr<comm::Communicator> intra_, inter_;  // hierarchical groups
  std::unique_ptr<kernels::zen::DeviceSteps> zen_steps_;  // zen groups on GPU memory, one at a time
  std::unique_ptr<DeviceStreams> device_;  // until the engine takes it
  std::vector<Group> groups_;
  // Declared last: destroyed first (stops its threads; the device engine then waits for the
  // compute stream) before the groups' buffers go.
  std::unique_ptr<Engine> engine_;
};

// The plane's offset in floats within a group's state (planes of state_elements() floats each),
// or -1 when the compressor keeps none.
int64_t PlaneOffset(const GroupLayout& group, StatePlane plane);

}  // namespace cupcake::runtime::internal

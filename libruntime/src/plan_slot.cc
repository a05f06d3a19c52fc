#include "plan_slot.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace cupcake::runtime::internal {

bool PerElement(StatePlane plane) { return plane == StatePlane::kErrorFeedback || plane == StatePlane::kMomentum; }

int64_t PlaneOffset(const GroupLayout& group, StatePlane plane) {
  // PowerSGD's runner state is e (the group's elements first) then Q (powersgd_runner.cc): its
  // e over the group's elements is its per-element error feedback (carried across plans).
  if (group.scheme == SchemeKind::kPowerSgd) return plane == StatePlane::kErrorFeedback ? 0 : -1;
  if (group.state_floats() == 0 || !PerElement(plane)) return -1;
  const kernels::CompressorLayout& c = group.codec;
  const int64_t n = group.state_elements();
  const bool signum = c.kind == kernels::CompressorKind::kSignum;
  switch (plane) {
    case StatePlane::kErrorFeedback:
      return c.memory == kernels::MemoryKind::kResidual ? 0 : c.memory == kernels::MemoryKind::kDgc ? n : -1;
    case StatePlane::kMomentum:
      if (c.memory == kernels::MemoryKind::kDgc) return 0;
      if (!signum) return -1;
      return c.memory == kernels::MemoryKind::kResidual ? n : 0;
    case StatePlane::kPowerSgdPadding:
    case StatePlane::kPowerSgdQ: break;
  }
  return -1;
}

PlanSlot::PlanSlot(SessionLayout layout, comm::Communicator& comm) : layout_(std::move(layout)), comm_(comm) {}
PlanSlot::~PlanSlot() = default;

StatusOr<std::unique_ptr<PlanSlot>> PlanSlot::Create(SessionLayout layout, const Options& options,
                                                     comm::Communicator& comm, std::vector<Tensor>* tensors,
                                                     const uint64_t* iteration) {
  std::unique_ptr<PlanSlot> slot(new PlanSlot(std::move(layout), comm));
  slot->tensors_ = tensors;
  const int count = static_cast<int>(slot->layout_.groups.size());
  if (slot->layout_.device_memory) {
    CUPCAKE_ASSIGN_OR_RETURN(slot->device_, MakeDeviceStreams(DeviceEventCount(count), DeviceGraphCount(count),
                                                              comm.rank(), comm.host(), "Session"));
  }
  if (const int devices = slot->layout_.hierarchical_devices; devices > 0) {
    // Ranks r of node r / devices_per_node (mpirun's default placement by slot): one
    // communicator per node (intra), one per local rank across the nodes (inter).
    const int rank = comm.rank();
    CUPCAKE_ASSIGN_OR_RETURN(slot->intra_, comm.Split(rank / devices, rank % devices));
    CUPCAKE_ASSIGN_OR_RETURN(slot->inter_, comm.Split(rank % devices, rank / devices));
  }
  if (slot->layout_.has_zen_on_device()) {
    CUPCAKE_ASSIGN_OR_RETURN(slot->zen_steps_, kernels::zen::DeviceSteps::Create());
  }
  CUPCAKE_RETURN_IF_ERROR(slot->MakeGroups(options, tensors, iteration));
  return slot;
}

Status PlanSlot::MakeGroups(const Options& options, std::vector<Tensor>* tensors, const uint64_t* iteration) {
  const kernels::Backend backend = layout_.device_memory ? kernels::Backend::kCuda : kernels::Backend::kCpu;
  for (const GroupLayout& gl : layout_.groups) {
    Group g;
    g.layout = &gl;
    CUPCAKE_ASSIGN_OR_RETURN(g.runner, MakeRunner(gl, backend, device_.get()));
    g.pending = gl.last - gl.first + 1;
    groups_.push_back(std::move(g));
  }
  StepState state;
  state.tensors = tensors;
  state.groups = &groups_;
  state.context.comm = &comm_;
  state.context.intra = intra_.get();
  state.context.inter = inter_.get();
  state.context.zen_steps = zen_steps_.get();
  state.context.hop_event = DeviceHopEvent(static_cast<int>(groups_.size()));
  state.iteration = iteration;
  state.gain = options.gain;
  state.clock = options.clock;
  state.timeout_us = options.timeout_us;
  state.record_timeline = options.record_timeline;
  state.device_graphs = options.device_graphs;
  state.job_stream = options.job_stream;
  state.after_collective = options.after_collective;
  state.plan = options.plan;
  engine_ = layout_.device_memory ? MakeDeviceEngine(state, std::move(device_)) : MakeHostEngine(state);
  return Status::Ok();
}

Status PlanSlot::AttachBuffers() {
  std::vector<const float*> buffers;
  for (const Tensor& t : *tensors_) buffers.push_back(t.buffer.data());
  PlaceBuffers(layout_, buffers);
  const kernels::Backend backend = layout_.device_memory ? kernels::Backend::kCuda : kernels::Backend::kCpu;
  for (Group& g : groups_) {
    const GroupLayout& gl = *g.layout;
    g.data = (*tensors_)[static_cast<size_t>(gl.first)].buffer.data();
    if (!gl.fused) continue;
    CUPCAKE_ASSIGN_OR_RETURN(g.fusion, AllocateZeroed(backend, 4 * gl.numel));
    std::vector<kernels::FusionSegment> segments;
    for (int j = gl.first; j <= gl.last; ++j) {
      const Tensor& member = (*tensors_)[static_cast<size_t>(j)];
      segments.push_back({member.buffer.data(), member.numel});
    }
    CUPCAKE_ASSIGN_OR_RETURN(g.table, kernels::MakeFusionTable(backend, segments, g.fusion.as<float>()));
    g.data = g.fusion.as<float>();
  }
  return Status::Ok();
}

namespace {

// The group elements [begin, end) this rank's state covers and the state index of `begin`:
// the group (flat, zen), or this rank's shard of it (hierarchical: local rank l holds elements
// l * shard .. (l + 1) * shard - 1 of the node's sum).
struct StateSpan {
  int64_t begin = 0, end = 0;
};
StateSpan CoveredElements(const GroupLayout& g, int rank) {
  if (g.scheme != SchemeKind::kHierarchical) return {0, g.numel};
  const int64_t local = rank % g.devices_per_node;
  return {std::min(g.numel, local * g.shard), std::min(g.numel, (local + 1) * g.shard)};
}

// Where `plane` lies in group g's runner state: `count` floats from `at`, which are the slot's
// ReadState floats from `out` on. Per element: the elements this rank covers, at their model
// index; PowerSGD: that part of its codec's state (e's padding after the group's n floats, or
// Q), at `next`, after the previous groups' parts.
struct PlaneRun {
  int64_t at = 0, count = 0, out = 0;
};
PlaneRun RunOf(const Group& g, int rank, StatePlane plane, int64_t next) {
  const GroupLayout& gl = *g.layout;
  if (!PerElement(plane)) {
    const kernels::powersgd::Layout* l = g.runner->powersgd();
    if (l == nullptr) return {};
    if (plane == StatePlane::kPowerSgdPadding) return {l->n, l->matrix_floats - l->n, next};
    return {l->matrix_floats, l->q_floats, next};
  }
  const int64_t at = PlaneOffset(gl, plane);
  if (at < 0) return {};
  const StateSpan covered = CoveredElements(gl, rank);
  return {at, covered.end - covered.begin, gl.offset + covered.begin};
}

// For every group of [first, last) that keeps `plane`: apply(values, count, out) with the
// `count` floats of the plane this rank holds, which are the slot's ReadState floats from `out`
// on. Host memory is passed in place; device memory through a host copy, written back with
// `write_back`.
template <typename Apply>
Status ForEachStateRun(const std::vector<Group>& groups, int rank, StatePlane plane, bool write_back, Apply apply,
                       int first = 0, int last = -1) {
  if (last < 0) last = static_cast<int>(groups.size());
  std::vector<float> host;
  int64_t next = 0;
  for (int k = 0; k < last; ++k) {
    const Group& g = groups[static_cast<size_t>(k)];
    const PlaneRun run = RunOf(g, rank, plane, next);
    next += run.count;  // only PowerSGD's parts are placed by it
    if (run.count == 0 || k < first) continue;
    kernels::Buffer* state = g.runner->state();
    if (state->backend() == kernels::Backend::kCpu) {
      apply(state->as<float>() + run.at, run.count, run.out);
      continue;
    }
    host.resize(static_cast<size_t>(state->size_bytes() / 4));
    CUPCAKE_RETURN_IF_ERROR(state->CopyToHost(host.data(), state->size_bytes()));
    apply(host.data() + run.at, run.count, run.out);
    if (write_back) CUPCAKE_RETURN_IF_ERROR(state->CopyFromHost(host.data(), state->size_bytes()));
  }
  return Status::Ok();
}

}  // namespace

Status PlanSlot::ReadGroupsState(StatePlane plane, int first, int last, std::span<float> out,
                                 std::vector<std::pair<int64_t, int64_t>>* written) const {
  return ForEachStateRun(
      groups_, comm_.rank(), plane, /*write_back=*/false,
      [&](const float* values, int64_t count, int64_t at) {
        std::copy_n(values, count, out.begin() + at);
        written->emplace_back(at, at + count);
      },
      first, last);
}

void PlanSlot::ZeroUnwritten(std::span<float> out, std::vector<std::pair<int64_t, int64_t>> written) {
  std::sort(written.begin(), written.end());
  int64_t done = 0;
  for (const auto& [begin, end] : written) {
    if (begin > done) std::fill(out.begin() + done, out.begin() + begin, 0.0f);
    done = std::max(done, end);
  }
  std::fill(out.begin() + done, out.end(), 0.0f);
}

// Called at every checkpoint commit with `out` the size of the model: one pass over it, the
// floats no group keeps set to zero.
Status PlanSlot::ReadState(StatePlane plane, std::span<float> out) const {
  std::vector<std::pair<int64_t, int64_t>> written;  // [begin, end) of `out`
  CUPCAKE_RETURN_IF_ERROR(ReadGroupsState(plane, 0, static_cast<int>(groups_.size()), out, &written));
  ZeroUnwritten(out, std::move(written));
  return Status::Ok();
}

Status PlanSlot::WriteState(StatePlane plane, std::span<const float> in) {
  return ForEachStateRun(
      groups_, comm_.rank(), plane, /*write_back=*/true,
      [&](float* values, int64_t count, int64_t at) { std::copy_n(in.begin() + at, count, values); });
}

Status PlanSlot::RestartWarmStart() {
  for (Group& g : groups_) CUPCAKE_RETURN_IF_ERROR(g.runner->RestartWarmStart());
  return Status::Ok();
}

int64_t PlanSlot::StateFloats(StatePlane plane) const {
  if (PerElement(plane)) return layout_.total_elements;
  int64_t floats = 0;
  for (const Group& g : groups_) floats += RunOf(g, comm_.rank(), plane, floats).count;
  return floats;
}

bool PlanSlot::KeepsState(StatePlane plane) const {
  if (!PerElement(plane)) return StateFloats(plane) > 0;  // PowerSGD's parts are whole, not shards
  return std::ranges::any_of(layout_.groups, [&](const GroupLayout& g) { return PlaneOffset(g, plane) >= 0; });
}

}  // namespace cupcake::runtime::internal

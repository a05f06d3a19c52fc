// Session: the public calls, registration and the step's bookkeeping; the plan's meaning is
// layout.cc's, the schemes are the runners', the scheduling the engines'. Several plans are
// PlanSlots, one active at a time.
#include "cupcake/runtime/session.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"
#include "gravac.h"
#include "plan_agreement.h"
#include "plan_slot.h"

namespace cupcake::runtime {

using internal::PlanSlot;
using internal::Quoted;
using internal::StatePlane;

uint64_t GroupSeed(uint64_t plan_seed, int group, int rank, bool allreduce) {
  uint64_t seed = plan_seed + static_cast<uint64_t>(group) * 0x9E3779B97F4A7C15ull;
  return allreduce ? seed : seed + static_cast<uint64_t>(rank);
}

namespace {

StatePlane PlaneOf(CompressorState which) {
  switch (which) {
    case CompressorState::kErrorFeedback: return StatePlane::kErrorFeedback;
    case CompressorState::kMomentum: return StatePlane::kMomentum;
    case CompressorState::kPowerSgdPadding: return StatePlane::kPowerSgdPadding;
    case CompressorState::kPowerSgdQ: return StatePlane::kPowerSgdQ;
  }
  return StatePlane::kErrorFeedback;
}

std::string Ms(double us) {
  std::ostringstream s;
  s.precision(3);
  s << us / 1e3 << " ms";
  return s.str();
}

std::string Percent(double fraction) {
  std::ostringstream s;
  s.precision(3);
  s << 100 * fraction << "%";
  return s.str();
}

// GraVAC's state in a session: the controller, the probe the groups feed, and the window (its
// first step is the session's iteration less `steps`).
struct Adaptive {
  Adaptive(std::vector<internal::GravacController::Rung> rungs, const GravacOptions& o, internal::Selection selection,
           int64_t max_numel, uint64_t seed, Clock* clock, int world)
      : options(o), controller(std::move(rungs), o), probe(selection, max_numel, seed, clock),
        exchanged(static_cast<size_t>(kFields * world)) {}

  static constexpr int kFields = 6;  // gain sums (4), measured time sum, measured steps
  GravacOptions options;
  internal::GravacController controller;
  internal::GainProbe probe;
  std::vector<double> exchanged;  // every rank's fields, allocated once
  std::vector<GravacDecision> decisions;
  int steps = 0;
  int64_t bytes = 0;
  double measured_us = 0;
  int measured_steps = 0;
};

// What EnableGravac's ranks compare.
struct GravacVote {
  int32_t ok = 0;
  int32_t window = 0;
  double epsilon = 0, omega = 0, measured_tolerance = 0;
  int32_t probe_every = 0;
};

// A StateReader's progress, shared with its session: the groups it has copied; `ended` once Run
// has ended or the reader was destroyed unrun.
struct StateReadProgress {
  std::mutex mu;
  std::condition_variable cv;
  int groups_read = 0;  // guarded by mu
  bool ended = false;  // guarded by mu
};

}  // namespace

class StateReader::Impl {
 public:
  // `slot` nullptr: the read was made at BeginStateRead (GPU memory); Run does nothing.
  Impl(const PlanSlot* slot, std::vector<std::pair<StatePlane, std::span<float>>> targets,
       std::shared_ptr<StateReadProgress> progress)
      : slot_(slot), targets_(std::move(targets)), progress_(std::move(progress)) {}
  ~Impl() { End(); }

  Status Run() {
    if (ran_) return FailedPreconditionError("StateReader::Run: called twice; expected one Run per BeginStateRead");
    ran_ = true;
    if (slot_ == nullptr) return Status::Ok();
    std::vector<std::vector<std::pair<int64_t, int64_t>>> written(targets_.size());
    Status s;
    const int groups = static_cast<int>(slot_->groups().size());
    for (int k = 0; k < groups && s.ok(); ++k) {
      for (size_t t = 0; t < targets_.size() && s.ok(); ++t)
        s = slot_->ReadGroupsState(targets_[t].first, k, k + 1, targets_[t].second, &written[t]);
      std::lock_guard lock(progress_->mu);
      progress_->groups_read = k + 1;
      progress_->cv.notify_all();
    }
    End();
    if (!s.ok()) return s.WithPrefix("StateReader::Run");
    for (size_t t = 0; t < targets_.size(); ++t) PlanSlot::ZeroUnwritten(targets_[t].second, std::move(written[t]));
    return Status::Ok();
  }

 private:
  void End() {
    if (progress_ == nullptr) return;
    {
      std::lock_guard lock(progress_->mu);
      progress_->ended = true;
    }
    progress_->cv.notify_all();
    progress_.reset();
  }

  const PlanSlot* slot_;
  std::vector<std::pair<StatePlane, std::span<float>>> targets_;
  std::shared_ptr<StateReadProgress> progress_;
  bool ran_ = false;
};

StateReader::StateReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StateReader::~StateReader() = default;
Status StateReader::Run() { return impl_->Run(); }

class Session::Impl {
 public:
  Impl(std::string origin, std::unique_ptr<comm::Communicator> comm, const SessionOptions& options)
      : origin_(std::move(origin)), comm_(std::move(comm)), options_(options) {
    if (options.clock == nullptr) owned_clock_ = std::make_unique<SteadyClock>();
    slot_options_ = {options.clock != nullptr ? options.clock : owned_clock_.get(),
                     options.ready_timeout_us,
                     options.record_timeline,
                     options.device_graphs,
                     options.job_stream,
                     &gain_,
                     &after_collective_};
    spans_.reserve(static_cast<size_t>(std::max(options.drift_window, 1)));
  }
  ~Impl() { WaitForStateRead(); }

  // Checks the plan, agrees on it with the other ranks (also when this rank's checks failed),
  // then allocates it. The first plan's tensors become the session's.
  StatusOr<int> AddSlot(const pb::Plan& plan, const std::string& origin, Status local) {
    WaitForStateRead();  // the reader walks the active plan's slot
    internal::LayoutContext context{origin, comm_->size(), comm_->rank(), on_device(), "", ""};
    if (slots_.empty()) {
      context.compressor = options_.compressor;
      context.model_fingerprint = options_.model_fingerprint;
    }
    StatusOr<internal::SessionLayout> layout = InvalidArgumentError("");
    if (local.ok()) {
      layout = internal::PlanLayout(plan, context);
      local = layout.status();
      if (local.ok() && !slots_.empty()) local = internal::CheckSameModel(slots_[0]->layout(), *layout, origin);
    }
    // Before any other collective (Split in PlanSlot::Create).
    CUPCAKE_RETURN_IF_ERROR(internal::AgreeOnPlan(*comm_, {origin, local.ok() ? layout->plan_fingerprint : "", local}));
    if (slots_.empty()) {
      for (const internal::TensorLayout& t : layout->tensors) tensors_.push_back({t.name, t.numel, {}, false});
      model_name_ = layout->model_name;
    }
    PlanSlot::Options slot_options = slot_options_;
    slot_options.plan = static_cast<int>(slots_.size());
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<PlanSlot> slot,
                             PlanSlot::Create(std::move(layout).value(), slot_options, *comm_, &tensors_, &iteration_));
    if (registered_ == tensor_count() && !slots_.empty()) CUPCAKE_RETURN_IF_ERROR(slot->AttachBuffers());
    slots_.push_back(std::move(slot));
    origins_.push_back(origin);
    return static_cast<int>(slots_.size()) - 1;
  }

  // `read`: whether the plan could be read (its file).
  StatusOr<int> AddPlan(const pb::Plan& plan, const std::string& origin, Status read) {
    // A failed session or a call mid-step (the communication thread may be in a collective)
    // refuses at once, without the agreement.
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("AddPlan"));
    Status local = read;
    if (local.ok()) local = ValidatePlan(plan, origin);
    if (!local.ok()) return internal::AgreeOnPlan(*comm_, {origin, "", local});
    return AddSlot(plan, origin, local);
  }

  Status SwitchPlan(int index) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("SwitchPlan"));
    Status local = Status::Ok();
    if (index < 0 || index >= plan_count())
      local = InvalidArgumentError("SwitchPlan: plan index out of range; got " + std::to_string(index) +
                                   ", expected 0 <= index < " + std::to_string(plan_count()) + " (plans added)");
    const std::string origin = local.ok() ? origins_[static_cast<size_t>(index)] : "SwitchPlan";
    const std::string fingerprint = local.ok() ? slots_[static_cast<size_t>(index)]->layout().plan_fingerprint : "";
    CUPCAKE_RETURN_IF_ERROR(internal::AgreeOnPlan(*comm_, {origin, fingerprint, local}));
    return Activate(index, "SwitchPlan");
  }

  Status EnableGravac(const GravacOptions& options) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("EnableGravac"));
    Status local = internal::CheckGravacOptions(options);
    if (local.ok()) local = CheckLadder();
    std::unique_ptr<Adaptive> adaptive;
    if (local.ok()) {
      adaptive = MakeAdaptive(options);
      if (on_device()) local = adaptive->probe.UseDevice();
    }
    if (!local.ok()) local = local.WithPrefix("EnableGravac");
    GravacVote mine{local.ok() ? 1 : 0,   options.window,
                    options.epsilon,       options.omega,
                    options.measured_tolerance, options.probe_every};
    std::vector<GravacVote> votes(static_cast<size_t>(comm_->size()));
    CUPCAKE_RETURN_IF_ERROR(
        comm_->Allgather(&mine, votes.data(), sizeof(GravacVote)).WithPrefix("EnableGravac: options exchange"));
    if (!local.ok()) return local;
    std::string failed, options_text;
    bool differ = false;
    for (size_t r = 0; r < votes.size(); ++r) {
      const GravacVote& v = votes[r];
      if (!v.ok) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
      differ = differ || v.window != mine.window || v.epsilon != mine.epsilon || v.omega != mine.omega ||
               v.measured_tolerance != mine.measured_tolerance || v.probe_every != mine.probe_every;
      std::ostringstream o;
      o << "rank " << r << ": window " << v.window << ", epsilon " << v.epsilon << ", omega " << v.omega
        << ", measured_tolerance " << v.measured_tolerance << ", probe_every " << v.probe_every;
      options_text += (r ? "; " : "") + o.str();
    }
    if (!failed.empty())
      return FailedPreconditionError("EnableGravac: ranks " + failed + " could not enable it (see their messages)");
    if (differ)
      return InvalidArgumentError("EnableGravac: the ranks' options differ; got " + options_text +
                                  ", expected the same on every rank");
    gravac_ = std::move(adaptive);
    CUPCAKE_RETURN_IF_ERROR(Activate(gravac_->controller.sent(), "EnableGravac"));
    StartWindow();
    return Status::Ok();
  }

  const std::vector<GravacDecision>& decisions() const {
    static const std::vector<GravacDecision> kNone;
    return gravac_ != nullptr ? gravac_->decisions : kNone;
  }
  const std::vector<std::string>& warnings() const { return warnings_; }

  StatusOr<std::vector<float>> ReadState(CompressorState which) const {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    std::vector<float> values(static_cast<size_t>(StateFloats(which)));
    CUPCAKE_RETURN_IF_ERROR(ReadState(values, which));
    return values;
  }

  Status ReadState(std::span<float> out, CompressorState which) const {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("ReadState"));
    CUPCAKE_RETURN_IF_ERROR(CheckStateSize("ReadState", out.size(), which));
    WaitForStateRead();
    for (const PlanSlot* slot : StateSlots(which)) {
      const auto floats = static_cast<size_t>(slot->StateFloats(PlaneOf(which)));
      CUPCAKE_RETURN_IF_ERROR(slot->ReadState(PlaneOf(which), out.first(floats)).WithPrefix("ReadState"));
      out = out.subspan(floats);
    }
    return Status::Ok();
  }

  Status WriteState(std::span<const float> values, CompressorState which) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("WriteState"));
    CUPCAKE_RETURN_IF_ERROR(CheckStateSize("WriteState", values.size(), which));
    WaitForStateRead();
    for (PlanSlot* slot : StateSlots(which)) {
      const auto floats = static_cast<size_t>(slot->StateFloats(PlaneOf(which)));
      CUPCAKE_RETURN_IF_ERROR(slot->WriteState(PlaneOf(which), values.first(floats)).WithPrefix("WriteState"));
      values = values.subspan(floats);
    }
    return Status::Ok();
  }

  StatusOr<std::unique_ptr<StateReader>> BeginStateRead(std::vector<StateTarget> targets) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("BeginStateRead"));
    std::vector<std::pair<StatePlane, std::span<float>>> planes;
    for (size_t i = 0; i < targets.size(); ++i) {
      const StateTarget& t = targets[i];
      if (!internal::PerElement(PlaneOf(t.which)))
        return InvalidArgumentError("BeginStateRead: targets[" + std::to_string(i) +
                                    "].which: not per element; expected kErrorFeedback or kMomentum");
      CUPCAKE_RETURN_IF_ERROR(CheckStateSize("BeginStateRead", t.out.size(), t.which));
      planes.emplace_back(PlaneOf(t.which), t.out);
    }
    if (on_device()) {
      for (const StateTarget& t : targets) CUPCAKE_RETURN_IF_ERROR(ReadState(t.out, t.which));
      return std::make_unique<StateReader>(std::make_unique<StateReader::Impl>(nullptr, decltype(planes){}, nullptr));
    }
    WaitForStateRead();  // one read at a time
    state_read_ = std::make_shared<StateReadProgress>();
    return std::make_unique<StateReader>(
        std::make_unique<StateReader::Impl>(&active(), std::move(planes), state_read_));
  }

  // A state buffer of `floats` for `which`: the size StateFloats gives, else an error.
  Status CheckStateSize(const char* what, size_t floats, CompressorState which) const {
    const int64_t total = StateFloats(which);
    if (static_cast<int64_t>(floats) == total) return Status::Ok();
    return InvalidArgumentError(
        std::string(what) + ": wrong size; got " + std::to_string(floats) + " floats, expected " +
        std::to_string(total) +
        (internal::PerElement(PlaneOf(which)) ? " (elements of model " : " (PowerSGD's state of model ") + model_name_ +
        ")");
  }

  StatusOr<std::vector<double>> ReadControlState(ControlState which) const {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("ReadControlState"));
    std::vector<double> values(static_cast<size_t>(ControlStateSize(which)));
    if (which == ControlState::kPlan) {
      values[0] = active_;
      if (gravac_ != nullptr) {
        gravac_->controller.ReadState(std::span(values).subspan(1, values.size() - 2));
        values.back() = gravac_->steps;
      }
    } else if (gravac_ != nullptr) {
      const Adaptive& a = *gravac_;
      values[0] = a.measured_us;
      values[1] = a.measured_steps;
      values[2] = static_cast<double>(a.bytes);
      CUPCAKE_RETURN_IF_ERROR(a.probe.ReadState(std::span(values).subspan(3)).WithPrefix("ReadControlState"));
    }
    return values;
  }

  Status WriteControlState(std::span<const double> values, ControlState which) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("WriteControlState"));
    const int64_t size = ControlStateSize(which);
    if (static_cast<int64_t>(values.size()) != size)
      return InvalidArgumentError("WriteControlState: wrong size; got " + std::to_string(values.size()) +
                                  " doubles, expected " + std::to_string(size) + " (" + std::to_string(plan_count()) +
                                  " plans, GraVAC " + (gravac_ != nullptr ? "enabled" : "not enabled") + ")");
    const auto whole = [](double v, double low, double end) { return v == std::floor(v) && v >= low && v < end; };
    if (which == ControlState::kPlan) {
      if (!whole(values[0], 0, plan_count()) ||
          (gravac_ != nullptr && !whole(values.back(), 0, gravac_->options.window)))
        return InvalidArgumentError(
            "WriteControlState: plan or window out of range; got plan " + FormatDouble(values[0]) + ", window steps " +
            (gravac_ != nullptr ? FormatDouble(values.back()) : "none") + ", expected 0 <= plan < " +
            std::to_string(plan_count()) + " (plans added)" +
            (gravac_ != nullptr ? " and 0 <= steps < " + std::to_string(gravac_->options.window) + " (GraVAC's window)"
                                : ""));
      if (gravac_ != nullptr) {
        CUPCAKE_RETURN_IF_ERROR(
            gravac_->controller.WriteState(values.subspan(1, values.size() - 2)).WithPrefix("WriteControlState"));
        gravac_->steps = static_cast<int>(values.back());
      }
      CUPCAKE_RETURN_IF_ERROR(Activate(static_cast<int>(values[0]), "WriteControlState"));
    } else if (gravac_ != nullptr) {
      Adaptive& a = *gravac_;
      a.measured_us = values[0];
      a.measured_steps = static_cast<int>(values[1]);
      a.bytes = static_cast<int64_t>(values[2]);
      CUPCAKE_RETURN_IF_ERROR(a.probe.WriteState(values.subspan(3)).WithPrefix("WriteControlState"));
    }
    if (gravac_ != nullptr) AimProbe();
    return Status::Ok();
  }

  // Register (host memory) and RegisterDevice (device memory) in one; `call` names which.
  Status Register(const char* call, const std::string& name, std::span<float> gradient, comm::MemoryKind memory) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    const int i = registered_;
    if (i >= tensor_count())
      return InvalidArgumentError(
          origin_ + ": tensors: the job has more gradients than the plan; got at least " + std::to_string(i + 1) +
          " (gradient " + std::to_string(i) + " is " + Quoted(name) + "), expected " + std::to_string(tensor_count()) +
          " (the plan's model " + model_name_ + ")");
    internal::Tensor& t = tensors_[static_cast<size_t>(i)];
    if (t.name != name || t.numel != static_cast<int64_t>(gradient.size()))
      return InvalidArgumentError(
          origin_ + ": tensor " + std::to_string(i) + ": the job's gradient is not the plan's; got " + Quoted(name) +
          " with " + std::to_string(gradient.size()) + " elements (the job's gradient " + std::to_string(i) +
          "), expected " + Quoted(t.name) + " with " + std::to_string(t.numel) + " elements (the plan's model " +
          model_name_ + ")");
    if (memory != comm_->memory())
      return InvalidArgumentError(std::string(call) + ": gradient " + std::to_string(i) + " (" + Quoted(name) + "): " +
                                  (on_device() ? "host memory for a session on GPU memory; expected RegisterDevice"
                                               : "device memory for a session on host memory; expected Register") +
                                  " (the communicator works on " + (on_device() ? "GPU" : "host") + " memory)");
    if (on_device())
      CUPCAKE_RETURN_IF_ERROR(
          active()
              .engine()
              .CheckDeviceMemory(gradient.data())
              .WithPrefix(std::string(call) + ": gradient " + std::to_string(i) + " (" + Quoted(name) + ")"));
    t.buffer = gradient;
    ++registered_;
    if (registered_ == tensor_count()) return AllRegistered();
    return Status::Ok();
  }

  // A raw buffer's arguments checked, then Register.
  Status RegisterBuffer(const char* call, const GradientBuffer& g, comm::MemoryKind memory) {
    if (g.numel < 0 || (g.data == nullptr && g.numel > 0))
      return InvalidArgumentError(std::string(call) + ": gradient " + std::to_string(registered_) + " ('" + g.name +
                                  "'): bad arguments; got numel " + std::to_string(g.numel) + ", expected a " +
                                  (memory == comm::MemoryKind::kDevice ? "device " : "") + "buffer and numel >= 0");
    return Register(call, g.name, std::span<float>(g.data, static_cast<size_t>(g.numel)), memory);
  }

  Status RegisterAll(std::span<const GradientBuffer> gradients) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    Status local;
    if (registered_ > 0)
      local = FailedPreconditionError("RegisterAll: " + std::to_string(registered_) +
                                      " gradients registered before; expected none (RegisterAll registers them all)");
    const char* call = on_device() ? "RegisterDevice" : "Register";
    for (size_t i = 0; local.ok() && i < gradients.size(); ++i)
      local = RegisterBuffer(call, gradients[i], comm_->memory());
    if (local.ok() && registered_ < tensor_count())
      local = InvalidArgumentError(origin_ + ": tensors: the job has fewer gradients than the plan; got " +
                                   std::to_string(registered_) + ", expected " + std::to_string(tensor_count()) +
                                   " (the plan's tensors from index " + std::to_string(registered_) +
                                   " on are missing from the job; the plan's model " + model_name_ + ")");
    return Fail(internal::AgreeOnPlan(*comm_, {origin_, "", local}));
  }

  Status GradientReady(int i) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckRegistered("GradientReady"));
    if (i < 0 || i >= tensor_count())
      return InvalidArgumentError("GradientReady: tensor index out of range; got " + std::to_string(i) +
                                  ", expected 0 <= i < " + std::to_string(tensor_count()) + " (model " + model_name_ +
                                  ")");
    if (accumulating_) return Status::Ok();
    if (step_start_us_ < 0) step_start_us_ = slot_options_.clock->NowUs();
    internal::Tensor& t = tensors_[static_cast<size_t>(i)];
    if (t.ready)
      return InvalidArgumentError("GradientReady: tensor " + std::to_string(i) + " (" + Quoted(t.name) +
                                  ") reported twice in one step; got a second call, expected one per step (iteration " +
                                  std::to_string(iteration_) + ")");
    t.ready = true;
    const int k = active().layout().tensors[static_cast<size_t>(i)].group;
    internal::Group& g = active().groups()[static_cast<size_t>(k)];
    if (--g.pending > 0) return Status::Ok();
    WaitForStateRead(k + 1);  // the encode writes the group's state
    return Fail(active().engine().GroupReady(k));
  }

  Status Synchronize() {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckRegistered("Synchronize"));
    if (accumulating_) return Status::Ok();
    CUPCAKE_RETURN_IF_ERROR(Fail(active().engine().Synchronize()));
    for (internal::Tensor& t : tensors_) t.ready = false;
    active().engine().EndStep();
    ++iteration_;
    const double now_us = slot_options_.clock->NowUs();
    CheckDrift(now_us);
    Status adapted = gravac_ != nullptr ? Fail(EndGravacStep(now_us)) : Status::Ok();
    last_end_us_ = now_us;
    step_start_us_ = -1;
    return adapted;
  }

  Status SetAccumulating(bool accumulating) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("SetAccumulating"));
    accumulating_ = accumulating;
    last_end_us_ = -1;  // the next step's iteration time spans the accumulation: not one step
    return Status::Ok();
  }

  // The engines' communication threads read the hook only after a group's GroupReady, whose
  // lock orders this write before that read.
  Status SetAfterCollective(AfterCollective hook) {
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("SetAfterCollective"));
    if (on_device() && hook)
      return FailedPreconditionError(
          "SetAfterCollective: a session on GPU memory; expected a session on host memory (on GPU memory the "
          "collectives are queued on CUDA streams, with no thread between them)");
    after_collective_ = std::move(hook);
    return Status::Ok();
  }

  int tensor_count() const { return static_cast<int>(tensors_.size()); }
  int group_count() const { return static_cast<int>(active().groups().size()); }
  int registered() const { return registered_; }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->size(); }
  int64_t fusion_bytes() const { return active().layout().fusion_bytes(); }
  uint64_t iteration() const { return iteration_; }
  bool KeepsState(CompressorState which) const {
    return std::ranges::any_of(slots_, [&](const auto& slot) { return slot->KeepsState(PlaneOf(which)); });
  }
  // Checkpoints: a restarted session draws the random choices the lost one would have.
  Status SetIteration(uint64_t iteration) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("SetIteration"));
    if (gravac_ != nullptr && iteration < static_cast<uint64_t>(gravac_->steps))
      return InvalidArgumentError("SetIteration: before GraVAC's window; got " + std::to_string(iteration) +
                                  ", expected >= " + std::to_string(gravac_->steps) +
                                  " (the steps of its current window so far)");
    iteration_ = iteration;
    return Status::Ok();
  }
  int plan_count() const { return static_cast<int>(slots_.size()); }
  int active_plan() const { return active_; }

  StatusOr<std::vector<GroupTimeline>> Timeline() const {
    if (!options_.record_timeline)
      return FailedPreconditionError("Timeline: not recorded; expected SessionOptions::record_timeline = true");
    if (on_device())
      return FailedPreconditionError("Timeline: not recorded on GPU memory yet; expected a session on host memory");
    if (iteration_ == 0) return FailedPreconditionError("Timeline: no step synchronized yet");
    std::vector<GroupTimeline> out;
    out.reserve(active().groups().size());
    for (const internal::Group& g : active().groups()) out.push_back(g.times);
    return out;
  }

 private:
  bool on_device() const { return comm_->memory() == comm::MemoryKind::kDevice; }

  // The plans whose state `which` ReadState gives, in order: the active one for the per-element
  // planes (Activate carries them to the next); every plan for PowerSGD's, so that its size, a
  // checkpoint entry's, stays the same when GraVAC or SwitchPlan changes the active plan (the
  // inactive plans' parts are what they were when last active; Activate restarts Q and the
  // padding's memory, and carries e through the per-element plane).
  std::vector<PlanSlot*> StateSlots(CompressorState which) const {
    if (internal::PerElement(PlaneOf(which))) return {slots_[static_cast<size_t>(active_)].get()};
    std::vector<PlanSlot*> out;
    for (const auto& slot : slots_) out.push_back(slot.get());
    return out;
  }
  int64_t StateFloats(CompressorState which) const {
    int64_t total = 0;
    for (const PlanSlot* slot : StateSlots(which)) total += slot->StateFloats(PlaneOf(which));
    return total;
  }
  int64_t ControlStateSize(ControlState which) const {
    if (which == ControlState::kPlan) return 1 + (gravac_ != nullptr ? gravac_->controller.StateSize() + 1 : 0);
    return gravac_ != nullptr ? 3 + gravac_->probe.StateSize() : 0;
  }

  // Makes plan `index` active; per-element state carries over: element e's residual (and
  // momentum) in the old plan's groups becomes element e's in the new one's. State that is not
  // per element (PowerSGD's Q) restarts in the new plan (SchemeRunner::RestartWarmStart), so a
  // rung runs after a switch as a fresh session of its plan given the carried state would.
  Status Activate(int index, const char* call) {
    WaitForStateRead();
    if (index == active_) return Status::Ok();
    std::vector<float> values(static_cast<size_t>(active().layout().total_elements));
    PlanSlot& next = *slots_[static_cast<size_t>(index)];
    CUPCAKE_RETURN_IF_ERROR(Fail(next.RestartWarmStart().WithPrefix(call)));
    for (StatePlane plane : {StatePlane::kErrorFeedback, StatePlane::kMomentum}) {
      CUPCAKE_RETURN_IF_ERROR(Fail(active().ReadState(plane, values).WithPrefix(call)));
      CUPCAKE_RETURN_IF_ERROR(Fail(next.WriteState(plane, values).WithPrefix(call)));
    }
    active_ = index;
    spans_.clear();  // the self-check starts over on the new plan, with a warm-up window
    drift_windows_ = 0;
    return Status::Ok();
  }

  // GraVAC over the session's ladder (CheckLadder passed): the rungs' predicted times and the
  // probe of the compressed rungs' selection.
  std::unique_ptr<Adaptive> MakeAdaptive(const GravacOptions& options) const {
    std::vector<internal::GravacController::Rung> rungs;
    int64_t max_numel = 0;  // of the groups probed on the host: on GPU memory, the offloaded ones
    for (const auto& slot : slots_) {
      rungs.push_back({slot->layout().ratio, slot->layout().predicted_iteration_us});
      for (const internal::GroupLayout& g : slot->layout().groups)
        if (!on_device() || g.place == internal::CodecPlace::kOffloaded) max_numel = std::max(max_numel, g.numel);
    }
    const internal::SessionLayout& first = slots_[1]->layout();
    const internal::Selection selection = first.powersgd_rank > 0       ? internal::Selection::kLowRank
                                          : first.compressor == "randk" ? internal::Selection::kRandom
                                                                        : internal::Selection::kMagnitude;
    auto adaptive = std::make_unique<Adaptive>(std::move(rungs), options, selection, max_numel, first.seed,
                                               slot_options_.clock, comm_->size());
    if (selection == internal::Selection::kLowRank) {
      std::vector<std::vector<int64_t>> shapes;
      std::vector<int64_t> numels;
      for (const internal::TensorLayout& t : first.tensors) {
        shapes.push_back(t.shape);
        numels.push_back(t.numel);
      }
      adaptive->probe.SetTensors(shapes, numels, first.powersgd_rank);
    }
    return adaptive;
  }

  // The plans as GraVAC needs them (EnableGravac's contract): plan 0 fp32, then either one
  // ratio-selecting compressor at decreasing ratios or PowerSGD rungs at decreasing ranks.
  Status CheckLadder() const {
    if (plan_count() < 2 || slots_[0]->layout().compressor != "fp32" || slots_[0]->layout().powersgd_rank != 0)
      return FailedPreconditionError("the session's plans are not a ladder; got " + std::to_string(plan_count()) +
                                     " plans, plan 0 " + slots_[0]->layout().compressor +
                                     ", expected plan 0 fp32 and at least one compressed rung (a ladder file)");
    const internal::SessionLayout& first = slots_[1]->layout();
    const bool by_rank = first.compressor == "fp32" && first.powersgd_rank > 0;
    for (int p = 1; p < plan_count(); ++p) {
      const internal::SessionLayout& l = slots_[static_cast<size_t>(p)]->layout();
      const internal::SessionLayout& above = slots_[static_cast<size_t>(p - 1)]->layout();
      const std::string where = origins_[static_cast<size_t>(p)] + ": ";
      if (by_rank) {
        if (l.compressor != "fp32" || l.powersgd_rank < 1)
          return FailedPreconditionError(where + "compressor: not a rung of the ladder; got " + l.compressor +
                                         " at rank " + std::to_string(l.powersgd_rank) +
                                         ", expected fp32 with a PowerSGD rank (PowerSGD rungs)");
        if (p > 1 && !(l.powersgd_rank < above.powersgd_rank))
          return FailedPreconditionError(where + "compressor.rank: the rungs are out of order; got " +
                                         std::to_string(l.powersgd_rank) + " after " +
                                         std::to_string(above.powersgd_rank) + ", expected decreasing ranks");
        continue;
      }
      if (l.compressor != first.compressor ||
          (first.compressor != "topk" && first.compressor != "randk" && first.compressor != "dgc"))
        return FailedPreconditionError(where + "compressor: not a rung of the ladder; got " + l.compressor +
                                       ", expected " + (p > 1 ? first.compressor : std::string("topk, randk or dgc")) +
                                       " (one ratio-selecting compressor for every compressed rung, or PowerSGD "
                                       "ranks)");
      if (p > 1 && !(l.ratio < above.ratio))
        return FailedPreconditionError(where + "compressor.ratio: the rungs are out of order; got " +
                                       std::to_string(l.ratio) + " after " + std::to_string(above.ratio) +
                                       ", expected decreasing ratios");
    }
    for (int p = 0; p < plan_count(); ++p)
      for (const internal::GroupLayout& g : slots_[static_cast<size_t>(p)]->layout().groups)
        if (g.scheme != internal::SchemeKind::kFlat && !(by_rank && g.scheme == internal::SchemeKind::kPowerSgd))
          return FailedPreconditionError(origins_[static_cast<size_t>(p)] + ": groups[" + std::to_string(g.index) +
                                         "]: scheme " + internal::SchemeKindName(g.scheme) +
                                         " has no gain probe; expected flat groups only" +
                                         (by_rank ? " (and powersgd ones)" : ""));
    return Status::Ok();
  }

  void StartWindow() {
    Adaptive& a = *gravac_;
    a.steps = 0;
    a.bytes = 0;
    a.measured_us = 0;
    a.measured_steps = 0;
    AimProbe();
  }

  // Points the probe at the controller's cf_min and candidate and at the active plan's groups;
  // the next step is probed when the window's steps so far say so (its first step, then every
  // probe_every-th).
  void AimProbe() {
    Adaptive& a = *gravac_;
    const internal::GravacController& c = a.controller;
    const internal::SessionLayout& min = slots_[static_cast<size_t>(c.min_rung())]->layout();
    const internal::SessionLayout& cand = slots_[static_cast<size_t>(c.cand_rung())]->layout();
    a.probe.SetRatios(min.ratio, cand.ratio);
    if (min.powersgd_rank > 0) a.probe.SetRanks(min.powersgd_rank, cand.powersgd_rank, active().layout().groups);
    gain_ = a.steps % a.options.probe_every == 0 ? &a.probe : nullptr;
  }

  // One synchronized step of GraVAC's window; at its end the ranks exchange their sums, every
  // rank takes the same decision and the next window's rung becomes active.
  Status EndGravacStep(double now_us) {
    Adaptive& a = *gravac_;
    ++a.steps;
    a.bytes += active().layout().payload_bytes();
    if (last_end_us_ >= 0) {
      a.measured_us += now_us - last_end_us_;
      ++a.measured_steps;
    }
    if (a.steps < a.options.window) {
      gain_ = a.steps % a.options.probe_every == 0 ? &a.probe : nullptr;
      return Status::Ok();
    }
    double cost_us = 0;
    StatusOr<internal::GainSums> taken = a.probe.Take(&cost_us);
    if (!taken.ok()) return taken.status().WithPrefix("Synchronize: GraVAC's gain probe");
    const internal::GainSums mine = *taken;
    const double fields[Adaptive::kFields] = {mine.input,   mine.min,      mine.cand,
                                              mine.skipped, a.measured_us, static_cast<double>(a.measured_steps)};
    CUPCAKE_RETURN_IF_ERROR(
        comm_->Allgather(fields, a.exchanged.data(), sizeof fields).WithPrefix("Synchronize: GraVAC's exchange"));
    // Summed in rank order: the same doubles, so the same decision, on every rank.
    internal::GainSums all;
    double measured_us = 0, measured_steps = 0;
    for (int r = 0; r < comm_->size(); ++r) {
      const double* f = a.exchanged.data() + static_cast<size_t>(r) * Adaptive::kFields;
      all += {f[0], f[1], f[2], f[3]};
      measured_us += f[4];
      measured_steps += f[5];
    }
    a.decisions.push_back(a.controller.Decide(iteration_ - static_cast<uint64_t>(a.steps), a.steps, all,
                                              measured_steps > 0 ? measured_us / measured_steps : 0, a.bytes,
                                              cost_us / a.steps));
    CUPCAKE_RETURN_IF_ERROR(Activate(a.controller.sent(), "Synchronize: GraVAC's switch"));
    StartWindow();
    return Status::Ok();
  }

  // The self-check (SessionOptions::drift_*): one span per step, judged per window.
  void CheckDrift(double now_us) {
    if (options_.drift_threshold <= 0 || drift_warned_ || step_start_us_ < 0) return;
    spans_.push_back(now_us - step_start_us_);
    if (static_cast<int>(spans_.size()) < options_.drift_window) return;
    const bool warm_up = drift_windows_++ == 0;
    const double predicted_us = active().layout().predicted_span_us;
    if (!warm_up && predicted_us > 0) {
      std::nth_element(spans_.begin(), spans_.begin() + static_cast<std::ptrdiff_t>(spans_.size() / 2), spans_.end());
      const double median_us = spans_[spans_.size() / 2];
      if (std::abs(median_us - predicted_us) > options_.drift_threshold * predicted_us) {
        const std::string change =
            (median_us >= predicted_us ? "+" : "") + Percent((median_us - predicted_us) / predicted_us);
        Warn(origins_[static_cast<size_t>(active_)] + ": drift: steps " + std::to_string(iteration_ - spans_.size()) +
             "-" + std::to_string(iteration_ - 1) + " took " + Ms(median_us) +
             " (median) from the first GradientReady to the end of Synchronize; the plan predicts " +
             Ms(predicted_us) + " (" + change + ", more than " + Percent(options_.drift_threshold) +
             "): its profile or model no longer describes this job; re-measure it (cupcake-profile comm and kernels "
             "on this cluster, cupcake-profile compute for the model) and re-plan (cupcake-plan search)");
      }
    }
    spans_.clear();
  }

  void Warn(const std::string& message) {
    drift_warned_ = true;
    warnings_.push_back(message);
    if (options_.on_warning) {
      options_.on_warning(message);
    } else if (comm_->rank() == 0) {
      std::fprintf(stderr, "cupcake: warning: %s\n", message.c_str());
    }
  }
  PlanSlot& active() { return *slots_[static_cast<size_t>(active_)]; }
  const PlanSlot& active() const { return *slots_[static_cast<size_t>(active_)]; }

  // Every plan's groups get their buffers; the registered gradients must be the plan's model.
  Status AllRegistered() {
    for (auto& slot : slots_) CUPCAKE_RETURN_IF_ERROR(slot->AttachBuffers());
    pb::Model job;
    for (const internal::Tensor& r : tensors_) {
      pb::Tensor* pt = job.add_tensors();
      pt->set_name(r.name);
      pt->set_numel(r.numel);
      pt->set_dtype(pb::FLOAT32);
    }
    const std::string fp = ModelFingerprint(job);
    const std::string& planned = slots_[0]->layout().model_fingerprint;
    if (fp != planned)
      return InvalidArgumentError(origin_ + ": model.fingerprint: does not match the registered gradients; got " +
                                  planned + ", expected " + fp + " (model " + model_name_ + ")");
    return Status::Ok();
  }

  Status Fail(Status s) {
    if (!s.ok()) failed_ = s;
    return s;
  }
  Status CheckNotFailed() const {
    if (failed_.ok()) return Status::Ok();
    return FailedPreconditionError("session failed earlier: " + failed_.message()).ReportedBy(failed_.reporter());
  }
  Status CheckRegistered(const char* call) const {
    if (registered_ == tensor_count()) return Status::Ok();
    return FailedPreconditionError(std::string(call) + ": gradients not all registered; got " +
                                   std::to_string(registered_) + ", expected " + std::to_string(tensor_count()) +
                                   " (model " + model_name_ + ")");
  }
  // Until the pending BeginStateRead's reader has copied `groups` groups of the active plan (by
  // default: until it has ended).
  void WaitForStateRead(int groups = INT_MAX) const {
    if (state_read_ == nullptr) return;
    std::unique_lock lock(state_read_->mu);
    state_read_->cv.wait(lock, [&] { return state_read_->ended || state_read_->groups_read >= groups; });
    const bool ended = state_read_->ended;
    lock.unlock();
    if (ended) state_read_.reset();
  }

  Status CheckBetweenSteps(const char* call) const {
    for (const internal::Tensor& t : tensors_)
      if (t.ready)
        return FailedPreconditionError(std::string(call) + ": called in the middle of a step; tensor " +
                                       Quoted(t.name) +
                                       " is already ready, expected a call between Synchronize() and the next "
                                       "GradientReady");
    return Status::Ok();
  }

  std::string origin_;
  std::unique_ptr<comm::Communicator> comm_;
  SessionOptions options_;
  std::unique_ptr<Clock> owned_clock_;
  PlanSlot::Options slot_options_;
  std::string model_name_;
  std::vector<internal::Tensor> tensors_;
  uint64_t iteration_ = 0;
  AfterCollective after_collective_;  // the host engines call it (PlanSlot::Options::after_collective)
  // Declared after the tensors, the communicator and the hook, which their engines use until
  // destroyed.
  std::vector<std::unique_ptr<PlanSlot>> slots_;
  std::vector<std::string> origins_;
  int active_ = 0;
  int registered_ = 0;
  bool accumulating_ = false;
  Status failed_;
  // The self-check and GraVAC's clock readings: this step's first GradientReady, the previous
  // step's end (< 0: none).
  double step_start_us_ = -1;
  double last_end_us_ = -1;
  std::vector<double> spans_;  // this window's, reserved for drift_window
  int drift_windows_ = 0;  // windows of the active plan so far
  bool drift_warned_ = false;
  std::vector<std::string> warnings_;
  std::unique_ptr<Adaptive> gravac_;
  internal::GainProbe* gain_ = nullptr;  // the engines read it (PlanSlot::Options::gain)
  // The pending BeginStateRead's progress (nullptr: none); the job's thread only.
  mutable std::shared_ptr<StateReadProgress> state_read_;
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

StatusOr<std::unique_ptr<Session>> Session::Create(const std::string& plan_path,
                                                   std::unique_ptr<comm::Communicator> communicator,
                                                   const SessionOptions& options) {
  SessionOptions o = options;
  if (o.origin.empty()) o.origin = plan_path;
  StatusOr<Plans> plans = ReadPlansFile(plan_path);
  if (!plans.ok()) {
    if (communicator == nullptr) return plans.status();
    return internal::AgreeOnPlan(*communicator, {o.origin, "", plans.status()});
  }
  const pb::Ladder& ladder = plans->ladder;
  if (plans->single) return Create(ladder.rungs(0).plan(), std::move(communicator), o);
  // A ladder: its rungs are plans 0..N-1, the fp32 rung active first; the job's compressor is
  // the compressed rungs'.
  const std::string& compressor = ladder.rungs(1).plan().compressor().name();
  if (!o.compressor.empty() && compressor != o.compressor) {
    const Status wrong = InvalidArgumentError(o.origin + ": rungs[1].plan.compressor.name: does not match the job; got '" +
                                              compressor + "', expected '" + o.compressor + "'");
    if (communicator == nullptr) return wrong;
    return internal::AgreeOnPlan(*communicator, {o.origin, "", wrong});
  }
  SessionOptions dense = o;
  dense.compressor.clear();
  dense.origin = o.origin + ": rungs[0].plan";
  CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<Session> session,
                           Create(ladder.rungs(0).plan(), std::move(communicator), dense));
  for (int i = 1; i < ladder.rungs_size(); ++i)
    CUPCAKE_RETURN_IF_ERROR(
        session->AddPlan(ladder.rungs(i).plan(), o.origin + ": rungs[" + std::to_string(i) + "].plan").status());
  return session;
}

StatusOr<std::unique_ptr<Session>> Session::Create(const pb::Plan& plan,
                                                   std::unique_ptr<comm::Communicator> communicator,
                                                   const SessionOptions& options) {
  const std::string origin = options.origin.empty() ? "plan" : options.origin;
  if (communicator == nullptr) return InvalidArgumentError(origin + ": no communicator; expected one");
  if (options.drift_window < 1 || !(options.drift_threshold >= 0 && std::isfinite(options.drift_threshold)))
    return internal::AgreeOnPlan(
        *communicator, {origin, "",
                        InvalidArgumentError("SessionOptions: drift_window or drift_threshold out of range; got " +
                                             std::to_string(options.drift_window) + " and " +
                                             std::to_string(options.drift_threshold) +
                                             ", expected a window >= 1 (steps) and a threshold >= 0")});
  // Every rank takes part in the plan agreement, also one whose plan is invalid (AgreeOnPlan).
  if (Status valid = ValidatePlan(plan, origin); !valid.ok())
    return internal::AgreeOnPlan(*communicator, {origin, "", valid});
  auto impl = std::make_unique<Impl>(origin, std::move(communicator), options);
  CUPCAKE_RETURN_IF_ERROR(impl->AddSlot(plan, origin, Status::Ok()).status());
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Status Session::Register(const std::string& name, std::span<float> gradient) {
  return impl_->Register("Register", name, gradient, comm::MemoryKind::kHost);
}
Status Session::RegisterDevice(const std::string& name, float* device_gradient, int64_t numel) {
  return impl_->RegisterBuffer("RegisterDevice", {name, device_gradient, numel}, comm::MemoryKind::kDevice);
}
Status Session::RegisterAll(std::span<const GradientBuffer> gradients) { return impl_->RegisterAll(gradients); }
int Session::registered() const { return impl_->registered(); }
int Session::tensor_count() const { return impl_->tensor_count(); }
int Session::group_count() const { return impl_->group_count(); }
int Session::rank() const { return impl_->rank(); }
int Session::world_size() const { return impl_->world_size(); }
int64_t Session::fusion_bytes() const { return impl_->fusion_bytes(); }
Status Session::GradientReady(int i) { return impl_->GradientReady(i); }
Status Session::Synchronize() { return impl_->Synchronize(); }
Status Session::SetAccumulating(bool accumulating) { return impl_->SetAccumulating(accumulating); }
Status Session::SetAfterCollective(AfterCollective hook) { return impl_->SetAfterCollective(std::move(hook)); }
uint64_t Session::iteration() const { return impl_->iteration(); }
Status Session::SetIteration(uint64_t iteration) { return impl_->SetIteration(iteration); }
StatusOr<std::vector<GroupTimeline>> Session::Timeline() const { return impl_->Timeline(); }

StatusOr<int> Session::AddPlan(const std::string& plan_path) {
  StatusOr<pb::Plan> plan = ReadPlanFile(plan_path);
  if (!plan.ok()) return impl_->AddPlan({}, plan_path, plan.status());
  return impl_->AddPlan(*plan, plan_path, Status::Ok());
}
StatusOr<int> Session::AddPlan(const pb::Plan& plan, const std::string& origin) {
  return impl_->AddPlan(plan, origin.empty() ? "plan" : origin, Status::Ok());
}
Status Session::SwitchPlan(int index) { return impl_->SwitchPlan(index); }
Status Session::EnableGravac(const GravacOptions& options) { return impl_->EnableGravac(options); }
const std::vector<GravacDecision>& Session::decisions() const { return impl_->decisions(); }
const std::vector<std::string>& Session::warnings() const { return impl_->warnings(); }
int Session::plan_count() const { return impl_->plan_count(); }
int Session::active_plan() const { return impl_->active_plan(); }
bool Session::KeepsState(CompressorState which) const { return impl_->KeepsState(which); }
StatusOr<std::vector<float>> Session::ReadState(CompressorState which) const { return impl_->ReadState(which); }
Status Session::ReadState(std::span<float> out, CompressorState which) const { return impl_->ReadState(out, which); }
Status Session::WriteState(std::span<const float> values, CompressorState which) {
  return impl_->WriteState(values, which);
}
StatusOr<std::unique_ptr<StateReader>> Session::BeginStateRead(std::vector<StateTarget> targets) {
  return impl_->BeginStateRead(std::move(targets));
}
StatusOr<std::vector<double>> Session::ReadControlState(ControlState which) const {
  return impl_->ReadControlState(which);
}
Status Session::WriteControlState(std::span<const double> values, ControlState which) {
  return impl_->WriteControlState(values, which);
}

}  // namespace cupcake::runtime

// Session: the public calls, registration and the step's bookkeeping; the plan's meaning is
// layout.cc's, the schemes are the runners', the scheduling the engines'. Several plans are
// PlanSlots, one active at a time.
#include "cupcake/runtime/session.h"

#include <vector>

#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/plan_io.h"
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
  return which == CompressorState::kMomentum ? StatePlane::kMomentum : StatePlane::kErrorFeedback;
}

}  // namespace

class Session::Impl {
 public:
  Impl(std::string origin, std::unique_ptr<comm::Communicator> comm, const SessionOptions& options)
      : origin_(std::move(origin)), comm_(std::move(comm)), options_(options) {
    if (options.clock == nullptr) owned_clock_ = std::make_unique<SteadyClock>();
    slot_options_ = {options.clock != nullptr ? options.clock : owned_clock_.get(), options.ready_timeout_us,
                     options.record_timeline, options.device_graphs, options.job_stream};
  }

  // Checks the plan, agrees on it with the other ranks (also when this rank's checks failed),
  // then allocates it. The first plan's tensors become the session's.
  StatusOr<int> AddSlot(const pb::Plan& plan, const std::string& origin, Status local) {
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
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<PlanSlot> slot, PlanSlot::Create(std::move(layout).value(), slot_options_,
                                                                              *comm_, &tensors_, &iteration_));
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
    if (index == active_) return Status::Ok();
    // Per-element state carries over: element e's residual (and momentum) in the old plan's
    // groups becomes element e's in the new one's.
    std::vector<float> values(static_cast<size_t>(active().layout().total_elements));
    for (StatePlane plane : {StatePlane::kErrorFeedback, StatePlane::kMomentum}) {
      CUPCAKE_RETURN_IF_ERROR(Fail(active().ReadState(plane, values).WithPrefix("SwitchPlan")));
      CUPCAKE_RETURN_IF_ERROR(
          Fail(slots_[static_cast<size_t>(index)]->WriteState(plane, values).WithPrefix("SwitchPlan")));
    }
    active_ = index;
    return Status::Ok();
  }

  StatusOr<std::vector<float>> ReadState(CompressorState which) const {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("ReadState"));
    std::vector<float> values(static_cast<size_t>(active().layout().total_elements));
    CUPCAKE_RETURN_IF_ERROR(active().ReadState(PlaneOf(which), values).WithPrefix("ReadState"));
    return values;
  }

  Status WriteState(std::span<const float> values, CompressorState which) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("WriteState"));
    const int64_t total = active().layout().total_elements;
    if (static_cast<int64_t>(values.size()) != total)
      return InvalidArgumentError("WriteState: wrong size; got " + std::to_string(values.size()) +
                                  " floats, expected " + std::to_string(total) + " (elements of model " + model_name_ +
                                  ")");
    return active().WriteState(PlaneOf(which), values).WithPrefix("WriteState");
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

  Status GradientReady(int i) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckRegistered("GradientReady"));
    if (i < 0 || i >= tensor_count())
      return InvalidArgumentError("GradientReady: tensor index out of range; got " + std::to_string(i) +
                                  ", expected 0 <= i < " + std::to_string(tensor_count()) + " (model " + model_name_ +
                                  ")");
    if (accumulating_) return Status::Ok();
    internal::Tensor& t = tensors_[static_cast<size_t>(i)];
    if (t.ready)
      return InvalidArgumentError("GradientReady: tensor " + std::to_string(i) + " (" + Quoted(t.name) +
                                  ") reported twice in one step; got a second call, expected one per step (iteration " +
                                  std::to_string(iteration_) + ")");
    t.ready = true;
    const int k = active().layout().tensors[static_cast<size_t>(i)].group;
    internal::Group& g = active().groups()[static_cast<size_t>(k)];
    if (--g.pending > 0) return Status::Ok();
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
    return Status::Ok();
  }

  Status SetAccumulating(bool accumulating) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckBetweenSteps("SetAccumulating"));
    accumulating_ = accumulating;
    return Status::Ok();
  }

  int tensor_count() const { return static_cast<int>(tensors_.size()); }
  int group_count() const { return static_cast<int>(active().groups().size()); }
  int registered() const { return registered_; }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->size(); }
  int64_t fusion_bytes() const { return active().layout().fusion_bytes(); }
  uint64_t iteration() const { return iteration_; }
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
    return FailedPreconditionError("session failed earlier: " + failed_.message());
  }
  Status CheckRegistered(const char* call) const {
    if (registered_ == tensor_count()) return Status::Ok();
    return FailedPreconditionError(std::string(call) + ": gradients not all registered; got " +
                                   std::to_string(registered_) + ", expected " + std::to_string(tensor_count()) +
                                   " (model " + model_name_ + ")");
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
  // Declared after the tensors and the communicator, which their engines use until destroyed.
  std::vector<std::unique_ptr<PlanSlot>> slots_;
  std::vector<std::string> origins_;
  int active_ = 0;
  int registered_ = 0;
  bool accumulating_ = false;
  Status failed_;
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
  if (numel < 0 || (device_gradient == nullptr && numel > 0))
    return InvalidArgumentError("RegisterDevice: gradient " + std::to_string(impl_->registered()) + " ('" + name +
                                "'): bad arguments; got numel " + std::to_string(numel) +
                                ", expected a device buffer and numel >= 0");
  return impl_->Register("RegisterDevice", name, std::span<float>(device_gradient, static_cast<size_t>(numel)),
                         comm::MemoryKind::kDevice);
}
int Session::registered() const { return impl_->registered(); }
int Session::tensor_count() const { return impl_->tensor_count(); }
int Session::group_count() const { return impl_->group_count(); }
int Session::rank() const { return impl_->rank(); }
int Session::world_size() const { return impl_->world_size(); }
int64_t Session::fusion_bytes() const { return impl_->fusion_bytes(); }
Status Session::GradientReady(int i) { return impl_->GradientReady(i); }
Status Session::Synchronize() { return impl_->Synchronize(); }
Status Session::SetAccumulating(bool accumulating) { return impl_->SetAccumulating(accumulating); }
uint64_t Session::iteration() const { return impl_->iteration(); }
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
int Session::plan_count() const { return impl_->plan_count(); }
int Session::active_plan() const { return impl_->active_plan(); }
StatusOr<std::vector<float>> Session::ReadState(CompressorState which) const { return impl_->ReadState(which); }
Status Session::WriteState(std::span<const float> values, CompressorState which) {
  return impl_->WriteState(values, which);
}

}  // namespace cupcake::runtime

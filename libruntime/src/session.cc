#include "cupcake/runtime/session.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"

namespace cupcake::runtime {

uint64_t GroupSeed(uint64_t plan_seed, int group, int rank, bool allreduce) {
  uint64_t seed = plan_seed + static_cast<uint64_t>(group) * 0x9E3779B97F4A7C15ull;
  return allreduce ? seed : seed + static_cast<uint64_t>(rank);
}

namespace {

// The longest a wait sleeps before it reads the clock again (real time), so a fake clock that
// advances on every read ends a wait after a few polls.
constexpr auto kPoll = std::chrono::milliseconds(1);

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

std::string Seconds(double us) {
  std::ostringstream os;
  os << us / 1e6 << " s";
  return os.str();
}

enum class Stage { kIdle, kEncoded, kExchanged };

struct Tensor {
  std::string name;
  int64_t numel = 0;
  std::span<float> buffer;
  int group = 0;
  bool ready = false;  // this step; caller's thread only
};

struct Group {
  int first = 0, last = 0;
  int64_t numel = 0;
  bool allreduce = false;
  ReduceType reduce_type = ReduceType::kFloat32;
  int64_t reduce_count = 0;
  std::unique_ptr<kernels::Compressor> compressor;
  std::vector<float> fusion;   // numel floats when the group has >= 2 tensors
  std::vector<float> state;    // error-feedback memory, momentum; kept across iterations
  std::vector<std::byte> payload;
  std::vector<std::byte> received;
  int pending = 0;             // tensors not yet ready this step; caller's thread only
  Stage stage = Stage::kIdle;  // guarded by Impl::mu_
  bool fused() const { return last > first; }
};

}  // namespace

class Session::Impl {
 public:
  Impl(std::string origin, std::unique_ptr<Communicator> comm, const SessionOptions& options)
      : origin_(std::move(origin)), comm_(std::move(comm)), timeout_us_(options.ready_timeout_us) {
    if (options.clock == nullptr) {
      owned_clock_ = std::make_unique<SteadyClock>();
      clock_ = owned_clock_.get();
    } else {
      clock_ = options.clock;
    }
  }

  ~Impl() {
    if (!thread_.joinable()) return;
    bool abort = false;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      abort = in_collective_;
    }
    cv_.notify_all();
    // A collective still running at destruction waits for a peer that may never come: give up
    // on the group (MPI ends the job with a non-zero exit) rather than hang.
    if (abort) comm_->Abort("session destroyed during a collective (rank " + std::to_string(comm_->rank()) + ")");
    thread_.join();
  }

  Status Init(const pb::Plan& plan, const SessionOptions& options) {
    std::vector<std::string> problems;
    auto add = [&](const std::string& field, const std::string& text) {
      problems.push_back(origin_ + ": " + field + ": " + text);
    };
    const pb::Model& model = plan.model().model();
    const int world = comm_->size();
    if (plan.world_size() != world)
      add("world_size", "does not match the job; got " + std::to_string(plan.world_size()) + ", expected " +
                            std::to_string(world) + " (ranks in the communicator)");
    if (!options.compressor.empty() && plan.compressor().name() != options.compressor)
      add("compressor.name", "does not match the job; got " + Quoted(plan.compressor().name()) + ", expected " +
                                 Quoted(options.compressor));
    if (!options.model_fingerprint.empty() && plan.model().fingerprint() != options.model_fingerprint)
      add("model.fingerprint", "plan for another model; got " + plan.model().fingerprint() + " (model " +
                                   model.name() + "), expected " + options.model_fingerprint + " (the job's model)");
    for (int i = 0; i < model.tensors_size(); ++i) {
      const pb::Tensor& t = model.tensors(i);
      if (t.dtype() != pb::FLOAT32)
        add("model.model.tensors[" + std::to_string(i) + "].dtype",
            "not supported by the runtime; got " + std::string(Name(t.dtype())) + ", expected float32 (tensor " +
                Quoted(t.name()) + ")");
      tensors_.push_back(Tensor{t.name(), t.numel(), {}, 0, false});
    }
    const pb::CompressorSpec& spec = plan.compressor();
    std::vector<kernels::CompressorConfig> configs;
    for (int k = 0; k < plan.groups_size(); ++k) {
      const pb::Group& g = plan.groups(k);
      const std::string f = "groups[" + std::to_string(k) + "]";
      const bool compress = g.options().compress() || spec.name() == "fp32";
      kernels::CompressorConfig c;
      c.name = compress ? spec.name() : "fp32";
      c.memory = compress ? spec.memory() : "none";
      c.n = g.numel();
      c.world_size = world;
      c.ratio = spec.ratio() > 0 ? spec.ratio() : kDefaultRatio;
      const CompressorInfo* info = FindCompressor(c.name);
      const bool allreduce = info != nullptr && info->collective == pb::ALLREDUCE;
      c.seed = GroupSeed(spec.seed(), k, comm_->rank(), allreduce);
      auto layout = kernels::ResolveLayout(c);
      if (!layout.ok()) {
        add(f, layout.status().message());
        continue;
      }
      if (g.payload_bytes() != layout->payload_bytes)
        add(f + ".payload_bytes", "does not match the compressor; got " + std::to_string(g.payload_bytes()) +
                                      ", expected " + std::to_string(layout->payload_bytes) + " (" + c.name + ", " +
                                      std::to_string(c.n) + " elements)");
      const pb::CommOp op = layout->allreduce ? pb::ALLREDUCE : pb::ALLGATHER;
      if (g.options().collective() != op)
        add(f + ".options.collective", "does not match the compressor; got " +
                                           std::string(Name(g.options().collective())) + ", expected " +
                                           std::string(Name(op)) + " (" + c.name + ")");
      configs.push_back(c);
    }
    if (!problems.empty()) {
      std::string text;
      for (const auto& line : problems) text += (text.empty() ? "" : "\n") + line;
      return InvalidArgumentError(text);
    }
    // Everything below is allocated once; the step path reuses it.
    for (int k = 0; k < plan.groups_size(); ++k) {
      const pb::Group& pg = plan.groups(k);
      Group g;
      g.first = pg.first_tensor();
      g.last = pg.last_tensor();
      g.numel = pg.numel();
      CUPCAKE_ASSIGN_OR_RETURN(g.compressor, kernels::MakeCompressor(configs[static_cast<size_t>(k)], kernels::Backend::kCpu));
      const kernels::CompressorLayout& layout = g.compressor->layout();
      g.allreduce = layout.allreduce;
      g.reduce_type = layout.kind == kernels::CompressorKind::kFp16 ? ReduceType::kFloat16 : ReduceType::kFloat32;
      g.reduce_count = layout.payload_bytes / (g.reduce_type == ReduceType::kFloat16 ? 2 : 4);
      if (g.fused()) g.fusion.assign(static_cast<size_t>(g.numel), 0.0f);
      g.state.assign(static_cast<size_t>(layout.state_floats), 0.0f);
      g.payload.assign(static_cast<size_t>(layout.payload_bytes), std::byte{0});
      g.received.assign(static_cast<size_t>(layout.decode_input_bytes), std::byte{0});
      g.pending = g.last - g.first + 1;
      for (int i = g.first; i <= g.last; ++i) tensors_[static_cast<size_t>(i)].group = k;
      groups_.push_back(std::move(g));
    }
    model_name_ = model.name();
    fingerprint_ = plan.model().fingerprint();
    thread_ = std::thread([this] { CommLoop(); });
    return Status::Ok();
  }

  Status Register(const std::string& name, std::span<float> gradient) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    const int i = registered_;
    if (i >= tensor_count())
      return InvalidArgumentError(origin_ + ": model.model.tensors: the job registers more gradients than the plan has; got " +
                                  std::to_string(tensor_count()) + " tensors, expected at least " + std::to_string(i + 1) +
                                  " (gradient " + Quoted(name) + ", model " + model_name_ + ")");
    Tensor& t = tensors_[static_cast<size_t>(i)];
    if (t.name != name || t.numel != static_cast<int64_t>(gradient.size()))
      return InvalidArgumentError(origin_ + ": model.model.tensors[" + std::to_string(i) +
                                  "]: does not match the job's gradient " + std::to_string(i) + "; got " + Quoted(t.name) +
                                  " with " + std::to_string(t.numel) + " elements, expected " + Quoted(name) + " with " +
                                  std::to_string(gradient.size()) + " elements (model " + model_name_ + ")");
    t.buffer = gradient;
    ++registered_;
    if (registered_ == tensor_count()) {
      pb::Model job;
      for (const Tensor& r : tensors_) {
        pb::Tensor* pt = job.add_tensors();
        pt->set_name(r.name);
        pt->set_numel(r.numel);
        pt->set_dtype(pb::FLOAT32);
      }
      const std::string fp = ModelFingerprint(job);
      if (fp != fingerprint_)
        return InvalidArgumentError(origin_ + ": model.fingerprint: does not match the registered gradients; got " +
                                    fingerprint_ + ", expected " + fp + " (model " + model_name_ + ")");
    }
    return Status::Ok();
  }

  Status GradientReady(int i) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckRegistered("GradientReady"));
    if (i < 0 || i >= tensor_count())
      return InvalidArgumentError("GradientReady: tensor index out of range; got " + std::to_string(i) +
                                  ", expected 0 <= i < " + std::to_string(tensor_count()) + " (model " + model_name_ + ")");
    if (accumulating_) return Status::Ok();
    Tensor& t = tensors_[static_cast<size_t>(i)];
    if (t.ready)
      return InvalidArgumentError("GradientReady: tensor " + std::to_string(i) + " (" + Quoted(t.name) +
                                  ") reported twice in one step; got a second call, expected one per step (iteration " +
                                  std::to_string(iteration_) + ")");
    t.ready = true;
    Group& g = groups_[static_cast<size_t>(t.group)];
    if (--g.pending > 0) return Status::Ok();
    // The group is complete: pack and encode on this (the compute) thread.
    std::span<const float> input;
    if (g.fused()) {
      float* at = g.fusion.data();
      for (int j = g.first; j <= g.last; ++j) {
        const Tensor& member = tensors_[static_cast<size_t>(j)];
        std::memcpy(at, member.buffer.data(), member.buffer.size_bytes());
        at += member.numel;
      }
      input = g.fusion;
    } else {
      input = t.buffer;
    }
    Status s = g.compressor->Encode(input, g.state, iteration_, g.payload);
    if (!s.ok()) return Fail(s.WithPrefix("GradientReady: groups[" + std::to_string(t.group) + "] encode"));
    {
      std::lock_guard lock(mu_);
      g.stage = Stage::kEncoded;
    }
    cv_.notify_all();
    return Status::Ok();
  }

  Status Synchronize() {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    CUPCAKE_RETURN_IF_ERROR(CheckRegistered("Synchronize"));
    if (accumulating_) return Status::Ok();
    const double start_us = clock_->NowUs();
    for (size_t k = 0; k < groups_.size(); ++k) {
      Group& g = groups_[k];
      {
        std::unique_lock lock(mu_);
        while (g.stage != Stage::kExchanged && comm_status_.ok()) {
          if (clock_->NowUs() - start_us >= timeout_us_) {
            lock.unlock();
            return Fail(TimeoutError(static_cast<int>(k)));
          }
          cv_.wait_for(lock, kPoll);
        }
        if (!comm_status_.ok()) return Fail(comm_status_.WithPrefix("Synchronize"));
      }
      std::span<float> out = g.fused() ? std::span<float>(g.fusion) : tensors_[static_cast<size_t>(g.first)].buffer;
      Status s = g.compressor->Decode(g.received, out, iteration_);
      if (!s.ok()) return Fail(s.WithPrefix("Synchronize: groups[" + std::to_string(k) + "] decode"));
      if (g.fused()) {
        const float* at = g.fusion.data();
        for (int j = g.first; j <= g.last; ++j) {
          Tensor& member = tensors_[static_cast<size_t>(j)];
          std::memcpy(member.buffer.data(), at, member.buffer.size_bytes());
          at += member.numel;
        }
      }
    }
    for (Tensor& t : tensors_) t.ready = false;
    {
      std::lock_guard lock(mu_);
      for (Group& g : groups_) {
        g.pending = g.last - g.first + 1;
        g.stage = Stage::kIdle;
      }
    }
    ++iteration_;
    return Status::Ok();
  }

  Status SetAccumulating(bool accumulating) {
    CUPCAKE_RETURN_IF_ERROR(CheckNotFailed());
    for (const Tensor& t : tensors_)
      if (t.ready)
        return FailedPreconditionError("SetAccumulating: called in the middle of a step; tensor " + Quoted(t.name) +
                                       " is already ready, expected a call between Synchronize() and the next "
                                       "GradientReady");
    accumulating_ = accumulating;
    return Status::Ok();
  }

  int tensor_count() const { return static_cast<int>(tensors_.size()); }
  int group_count() const { return static_cast<int>(groups_.size()); }
  int registered() const { return registered_; }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->size(); }
  uint64_t iteration() const { return iteration_; }

 private:
  // The communication thread: the groups' collectives in group order, one step after another.
  void CommLoop() {
    std::unique_lock lock(mu_);
    size_t k = 0;
    while (true) {
      cv_.wait(lock, [&] { return stop_ || groups_[k].stage == Stage::kEncoded; });
      if (stop_) return;
      Group& g = groups_[k];
      in_collective_ = true;
      lock.unlock();
      Status s = g.allreduce ? comm_->Allreduce(g.payload.data(), g.received.data(), g.reduce_count, g.reduce_type)
                             : comm_->Allgather(g.payload.data(), g.received.data(), static_cast<int64_t>(g.payload.size()));
      lock.lock();
      in_collective_ = false;
      if (!s.ok()) {
        comm_status_ = s.WithPrefix("groups[" + std::to_string(k) + "] " + (g.allreduce ? "allreduce" : "allgather"));
        cv_.notify_all();
        return;
      }
      g.stage = Stage::kExchanged;
      cv_.notify_all();
      k = (k + 1) % groups_.size();
    }
  }

  Status TimeoutError(int group) const {
    std::string missing;
    int count = 0;
    for (int i = 0; i < tensor_count(); ++i) {
      if (tensors_[static_cast<size_t>(i)].ready) continue;
      if (count < 10) missing += (count ? ", " : "") + std::to_string(i) + " (" + Quoted(tensors_[static_cast<size_t>(i)].name) + ")";
      ++count;
    }
    if (count > 10) missing += " and " + std::to_string(count - 10) + " more";
    const std::string where = " (iteration " + std::to_string(iteration_) + ", rank " + std::to_string(comm_->rank()) +
                              " on " + comm_->host() + ")";
    if (count > 0)
      return DeadlineExceededError("Synchronize: gradients never became ready; got no GradientReady within " +
                                   Seconds(timeout_us_) + " for " + std::to_string(count) + " of " +
                                   std::to_string(tensor_count()) + " tensors: " + missing + where);
    const Group& g = groups_[static_cast<size_t>(group)];
    return DeadlineExceededError("Synchronize: groups[" + std::to_string(group) + "] " +
                                 (g.allreduce ? "allreduce" : "allgather") + " did not finish within " +
                                 Seconds(timeout_us_) +
                                 "; every gradient of this rank is ready, so a peer is missing gradients or has died" +
                                 where);
  }

  Status Fail(Status s) {
    failed_ = s;
    return s;
  }
  Status CheckNotFailed() const {
    if (failed_.ok()) return Status::Ok();
    return FailedPreconditionError("session failed earlier: " + failed_.message());
  }
  Status CheckRegistered(const char* call) const {
    if (registered_ == tensor_count()) return Status::Ok();
    return FailedPreconditionError(std::string(call) + ": gradients not all registered; got " + std::to_string(registered_) +
                                   ", expected " + std::to_string(tensor_count()) + " (model " + model_name_ + ")");
  }

  std::string origin_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Clock> owned_clock_;
  Clock* clock_ = nullptr;
  double timeout_us_;
  std::string model_name_;
  std::string fingerprint_;
  std::vector<Tensor> tensors_;
  std::vector<Group> groups_;
  int registered_ = 0;
  uint64_t iteration_ = 0;
  bool accumulating_ = false;
  Status failed_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;           // guarded by mu_
  bool in_collective_ = false;  // guarded by mu_
  Status comm_status_;          // guarded by mu_
  std::thread thread_;
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

StatusOr<std::unique_ptr<Session>> Session::Create(const std::string& plan_path, std::unique_ptr<Communicator> communicator,
                                                   const SessionOptions& options) {
  CUPCAKE_ASSIGN_OR_RETURN(pb::Plan plan, ReadPlanFile(plan_path));
  SessionOptions o = options;
  if (o.origin.empty()) o.origin = plan_path;
  return Create(plan, std::move(communicator), o);
}

StatusOr<std::unique_ptr<Session>> Session::Create(const pb::Plan& plan, std::unique_ptr<Communicator> communicator,
                                                   const SessionOptions& options) {
  const std::string origin = options.origin.empty() ? "plan" : options.origin;
  if (communicator == nullptr) return InvalidArgumentError(origin + ": no communicator; expected one");
  CUPCAKE_RETURN_IF_ERROR(ValidatePlan(plan, origin));
  auto impl = std::make_unique<Impl>(origin, std::move(communicator), options);
  CUPCAKE_RETURN_IF_ERROR(impl->Init(plan, options));
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

Status Session::Register(const std::string& name, std::span<float> gradient) { return impl_->Register(name, gradient); }
int Session::registered() const { return impl_->registered(); }
int Session::tensor_count() const { return impl_->tensor_count(); }
int Session::group_count() const { return impl_->group_count(); }
int Session::rank() const { return impl_->rank(); }
int Session::world_size() const { return impl_->world_size(); }
Status Session::GradientReady(int i) { return impl_->GradientReady(i); }
Status Session::Synchronize() { return impl_->Synchronize(); }
Status Session::SetAccumulating(bool accumulating) { return impl_->SetAccumulating(accumulating); }
uint64_t Session::iteration() const { return impl_->iteration(); }

}  // namespace cupcake::runtime

#include "training_job.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cupcake/comm/mpi.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/runtime/checkpoint.h"
#include "cupcake/runtime/recorder.h"
#include "cupcake/runtime/session.h"
#include "training_loop.h"

namespace cupcake::examples {
namespace {

using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

// The parameters in gradient-ready order, found from the hooks of one backward pass (the same
// graph on every rank, so the same order).
NamedParameters GradientReadyOrder(TrainingJob& job, const Batch& batch) {
  NamedParameters named;
  for (const auto& p : job.module().named_parameters()) named.emplace_back(p.key(), p.value());
  std::vector<std::string> order;
  std::vector<unsigned> handles;
  for (const auto& [name, tensor] : named) {
    handles.push_back(tensor.register_hook([&order, name = name](torch::Tensor g) {
      order.push_back(name);
      return g;
    }));
  }
  job.Loss(batch).backward();
  for (size_t i = 0; i < named.size(); ++i) named[i].second.remove_hook(handles[i]);
  job.module().zero_grad();
  std::map<std::string, torch::Tensor> by_name(named.begin(), named.end());
  NamedParameters result;
  for (const auto& name : order) result.emplace_back(name, by_name.at(name));
  return result;
}

double EvalLoss(TrainingJob& job, const Batch& eval) {
  torch::NoGradGuard no_grad;
  return job.Loss(eval).item<double>();
}

// Whether every rank holds bitwise the same parameters: each rank compares its values with the
// elementwise maximum over ranks; the ranks agree when no rank finds a difference.
StatusOr<bool> RanksAgree(const NamedParameters& params, comm::Communicator& comm) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.second.detach().reshape({-1}));
  torch::Tensor mine = torch::cat(flat).contiguous();
  torch::Tensor most = torch::empty_like(mine);
  CUPCAKE_RETURN_IF_ERROR(comm.Allreduce(mine.data_ptr<float>(), most.data_ptr<float>(), mine.numel(),
                                         comm::DataType::kFloat32, comm::ReduceOp::kMax));
  int32_t differs = torch::equal(mine, most) ? 0 : 1, any = 0;
  CUPCAKE_RETURN_IF_ERROR(comm.Allreduce(&differs, &any, 1, comm::DataType::kInt32, comm::ReduceOp::kMax));
  return any == 0;
}

// The checkpointer of --checkpoint: every parameter and its SGD momentum buffer (made here, zero,
// so that a restart has memory to restore into before the first step; the first step's momentum is
// then 0 * 0.9 + g = g, the clone LibTorch would make, but for the sign of zeros), and the
// session's error feedback. Parameters and buffers are written only in sgd.step(). Both are the
// same on every rank (the session averages the gradients; RanksAgree checks it), so they are
// registered kShared: replicas carry the session's state only.
StatusOr<std::unique_ptr<runtime::Checkpointer>> MakeCheckpointer(const LoopFlags& flags, comm::Communicator* comm,
                                                                  const NamedParameters& params, torch::optim::SGD& sgd,
                                                                  runtime::Session* session,
                                                                  std::shared_ptr<runtime::NetworkGate> gate) {
  CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Checkpointer> ckpt,
                           runtime::Checkpointer::Create(CheckpointOptionsOf(flags, std::move(gate)), comm));
  auto bytes = [](const torch::Tensor& t) {
    return std::span<std::byte>(static_cast<std::byte*>(t.data_ptr()), static_cast<size_t>(t.numel()) * 4);
  };
  for (const auto& [pname, p] : params) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(torch::zeros_like(p));
    CUPCAKE_RETURN_IF_ERROR(ckpt->Add("param." + pname, bytes(p), runtime::Capture::kInBackground,
                                      runtime::Scope::kShared));
    CUPCAKE_RETURN_IF_ERROR(ckpt->Add("momentum." + pname, bytes(state->momentum_buffer()),
                                      runtime::Capture::kInBackground, runtime::Scope::kShared));
    sgd.state()[c10::guts::to_string(p.unsafeGetTensorImpl())] = std::move(state);
  }
  CUPCAKE_RETURN_IF_ERROR(ckpt->AttachSession(session));
  return ckpt;
}

// --blocking-save DIR --save-every N: the baseline a persisted Checkpointer is compared against
// (docs/CHECKPOINT.md), a blocking save as torch.save by rank 0 makes it in a DDP job. Save(step),
// collective, after the update:
//   1. every rank sends its own state to rank 0: the session's error feedback, and its momentum
//      where a plan keeps one (Session::ReadState). They differ between the ranks, so a save of
//      the whole state must gather them;
//   2. rank 0 puts the whole state into one buffer (as torch.save serializes first): every
//      parameter and its SGD momentum (the same on every rank: rank 0's), every rank's state
//      from 1., PowerSGD's padding and Q (the same on every rank) and the session's iteration;
//      then writes it to DIR/blocking-save.bin with WriteFileAtomic (a temporary, fsync, rename)
//      and syncs DIR (SyncDirectory);
//   3. the other ranks wait for it in an allreduce of rank 0's outcome (a barrier that also
//      carries its failure: then every rank fails).
// What --checkpoint holds besides (GraVAC's control state, a few hundred bytes) is left out. The
// file, written to be timed and read by nothing: per entry its name, a NUL, its size in bytes (8
// bytes, host order) and its bytes. Rank 0 prints a line per save (its size and times).
class BlockingSave {
 public:
  // Collective: rank 0 checks that `dir` is a directory; every rank fails when it is not (rank 0
  // prints it).
  static StatusOr<std::unique_ptr<BlockingSave>> Create(const std::string& dir, std::unique_ptr<comm::Communicator> comm,
                                                        Clock& clock) {
    Status found = Status::Ok();
    struct stat st {};
    if (comm->rank() == 0 && (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)))
      found = InvalidArgumentError(dir + ": not a directory; expected an existing directory");
    CUPCAKE_RETURN_IF_ERROR(Agree(*comm, found));
    return std::unique_ptr<BlockingSave>(new BlockingSave(dir, std::move(comm), clock));
  }

  // What a save holds; before the first save. Not owned; they outlive this object.
  void Attach(const NamedParameters* params, torch::optim::SGD* sgd, runtime::Session* session) {
    params_ = params;
    sgd_ = sgd;
    session_ = session;
  }

  Status Save(int64_t step) {
    const double start_us = clock_.NowUs();
    // 1. This rank's own state, to rank 0.
    CUPCAKE_ASSIGN_OR_RETURN(std::vector<float> own, session_->ReadState(runtime::CompressorState::kErrorFeedback));
    const size_t elements = own.size();
    const bool momentum = session_->KeepsState(runtime::CompressorState::kMomentum);
    if (momentum) {
      CUPCAKE_ASSIGN_OR_RETURN(std::vector<float> m, session_->ReadState(runtime::CompressorState::kMomentum));
      own.insert(own.end(), m.begin(), m.end());
    }
    const int world = comm_->size(), rank = comm_->rank();
    const int64_t own_bytes = static_cast<int64_t>(own.size() * 4);
    std::vector<int64_t> send(static_cast<size_t>(world), 0), recv(static_cast<size_t>(world), 0);
    send[0] = own_bytes;
    if (rank == 0) std::fill(recv.begin(), recv.end(), own_bytes);
    std::vector<float> gathered(rank == 0 ? own.size() * static_cast<size_t>(world) : 0);
    CUPCAKE_RETURN_IF_ERROR(comm_->Alltoallv(own.data(), send, gathered.data(), recv));
    const double gathered_us = clock_.NowUs();
    // 2. Rank 0 writes the whole state.
    Status written = Status::Ok();
    size_t bytes = 0;
    if (rank == 0) {
      auto whole = Serialize(gathered, elements, momentum);
      written = whole.ok() ? WriteFileAtomic(dir_ + "/blocking-save.bin", *whole) : whole.status();
      if (written.ok()) written = SyncDirectory(dir_);
      if (whole.ok()) bytes = whole->size();
    }
    // 3. Every rank waits for rank 0's outcome.
    CUPCAKE_RETURN_IF_ERROR(Agree(*comm_, written));
    if (rank == 0) {
      const double end_us = clock_.NowUs();
      std::printf("blocking save: step %lld, %zu bytes in %.1f ms (the ranks' state gathered in %.1f ms)\n",
                  static_cast<long long>(step), bytes, (end_us - start_us) / 1e3, (gathered_us - start_us) / 1e3);
      std::fflush(stdout);
    }
    return Status::Ok();
  }

 private:
  BlockingSave(std::string dir, std::unique_ptr<comm::Communicator> comm, Clock& clock)
      : dir_(std::move(dir)), comm_(std::move(comm)), clock_(clock) {}

  // Rank 0's `status` on every rank: rank 0's own error there, a quiet one elsewhere.
  static Status Agree(comm::Communicator& comm, const Status& status) {
    int32_t failed = status.ok() ? 0 : 1, any = 0;
    CUPCAKE_RETURN_IF_ERROR(comm.Allreduce(&failed, &any, 1, comm::DataType::kInt32, comm::ReduceOp::kMax));
    if (!status.ok()) return status.ReportedBy(0);
    if (any != 0) return UnavailableError("rank 0 failed (see its message)").ReportedBy(0);
    return Status::Ok();
  }

  // The file's bytes (see the class comment) from rank 0's memory and every rank's state
  // (`gathered`: per rank `elements` floats of error feedback, then as many of momentum when kept).
  StatusOr<std::string> Serialize(const std::vector<float>& gathered, size_t elements, bool momentum) const {
    std::string out;
    auto put = [&out](const std::string& name, const void* data, size_t n) {
      const uint64_t size = n;
      out.append(name);
      out.push_back('\0');
      out.append(reinterpret_cast<const char*>(&size), sizeof size);  // NOLINT: the integer's bytes
      out.append(static_cast<const char*>(data), n);
    };
    for (const auto& [name, p] : *params_) put("param." + name, p.data_ptr(), static_cast<size_t>(p.numel()) * 4);
    for (const auto& [name, p] : *params_) {
      auto found = sgd_->state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
      if (found == sgd_->state().end())
        return FailedPreconditionError("momentum." + name + ": no SGD momentum buffer; expected one after a step");
      const torch::Tensor& m = static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
      put("momentum." + name, m.data_ptr(), static_cast<size_t>(m.numel()) * 4);
    }
    const size_t per_rank = elements * (momentum ? 2 : 1);
    for (int r = 0; r < comm_->size(); ++r) {
      const float* own = gathered.data() + per_rank * static_cast<size_t>(r);
      const std::string prefix = "rank" + std::to_string(r) + ".session.";
      put(prefix + "error_feedback", own, elements * 4);
      if (momentum) put(prefix + "momentum", own + elements, elements * 4);
    }
    for (auto [which, name] : {std::pair{runtime::CompressorState::kPowerSgdPadding, "session.powersgd.padding"},
                               std::pair{runtime::CompressorState::kPowerSgdQ, "session.powersgd.q"}}) {
      CUPCAKE_ASSIGN_OR_RETURN(std::vector<float> shared, session_->ReadState(which));
      if (!shared.empty()) put(name, shared.data(), shared.size() * 4);
    }
    const uint64_t iteration = session_->iteration();
    put("session.iteration", &iteration, sizeof iteration);
    return out;
  }

  std::string dir_;
  std::unique_ptr<comm::Communicator> comm_;
  Clock& clock_;
  const NamedParameters* params_ = nullptr;
  torch::optim::SGD* sgd_ = nullptr;
  runtime::Session* session_ = nullptr;
};

// The LibTorch job as the shared loop's body: forward and backward through the module, each
// gradient hook copying into its registered buffer, SGD with momentum as the update.
class TorchBody final : public LoopBody {
 public:
  TorchBody(TrainingJob& job, const LoopFlags& flags, std::vector<Batch> batches, Batch eval, NamedParameters params)
      : job_(job),
        flags_(flags),
        batches_(std::move(batches)),
        eval_(std::move(eval)),
        params_(std::move(params)),
        sgd_(job.module().parameters(), torch::optim::SGDOptions(flags.lr).momentum(0.9)) {}

  const NamedParameters& params() const { return params_; }
  torch::optim::SGD& sgd() { return sgd_; }

  // Registers every parameter's gradient as a slice of one flat buffer in gradient-ready (=
  // plan) order, as frameworks keep gradients, so a session's groups work on them in place;
  // the hooks copy each gradient there and make it ready.
  Status Register(LoopRuntime& runtime, std::vector<std::span<float>>& spans) {
    int64_t total = 0;
    for (const auto& p : params_) total += p.second.numel();
    flat_ = torch::zeros({total});
    std::vector<LoopGradient> gradients;
    for (size_t i = 0, at = 0; i < params_.size(); at += static_cast<size_t>(params_[i].second.numel()), ++i) {
      const auto& [pname, tensor] = params_[i];
      buffers_.push_back(flat_.narrow(0, static_cast<int64_t>(at), tensor.numel()));
      spans.emplace_back(buffers_[i].data_ptr<float>(), static_cast<size_t>(tensor.numel()));
      gradients.push_back({pname, spans.back(), tensor.sizes().vec()});
    }
    CUPCAKE_RETURN_IF_ERROR(RegisterGradients(runtime, gradients));
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].second.register_hook([this, i](torch::Tensor g) {
        buffers_[i].copy_(g.reshape({-1}));
        if (ready_ != nullptr) (void)(*ready_)(static_cast<int>(i));  // the loop keeps the first error
        return g;
      });
    }
    return Status::Ok();
  }

  Status Forward(int iteration) override {
    sgd_.zero_grad();
    loss_ = job_.Loss(batches_[static_cast<size_t>(iteration % flags_.batches)]);
    return Status::Ok();
  }
  Status Backward(int, const std::function<Status(int)>& ready) override {
    ready_ = &ready;
    loss_.backward();
    ready_ = nullptr;
    return Status::Ok();
  }
  Status Step(int) override {
    // Every rank now steps with the averaged gradient.
    for (size_t i = 0; i < params_.size(); ++i)
      params_[i].second.mutable_grad().copy_(buffers_[i].view_as(params_[i].second));
    sgd_.step();
    return Status::Ok();
  }
  std::optional<double> EvalLoss() override { return cupcake::examples::EvalLoss(job_, eval_); }
  StatusOr<bool> RanksAgree(comm::Communicator& comm) override { return cupcake::examples::RanksAgree(params_, comm); }

 private:
  TrainingJob& job_;
  const LoopFlags& flags_;
  std::vector<Batch> batches_;
  Batch eval_;
  NamedParameters params_;
  torch::optim::SGD sgd_;
  torch::Tensor flat_, loss_;
  std::vector<torch::Tensor> buffers_;
  const std::function<Status(int)>* ready_ = nullptr;
};

}  // namespace

int RunTrainingJob(int argc, char** argv, TrainingJob& job) {
  const std::string name = job.name();
  runtime::SteadyClock clock;
  const double started_us = clock.NowUs();  // a restore's report counts from here
  // MPI's process state is made here and passed down; sessions are destroyed before it.
  auto mpi = comm::InitMpi(&argc, &argv);
  if (!mpi.ok()) return Fail(name, "MPI", mpi.status(), 0);  // MPI's own failure: every rank prints it
  auto world = (*mpi)->World();
  if (!world.ok()) return Fail(name, "MPI", world.status(), 0);
  auto report = (*mpi)->World();  // the job's own collectives, after training
  if (!report.ok()) return Fail(name, "MPI", report.status(), 0);
  const int rank = (*world)->rank();

  LoopFlags flags;
  const JobFlags job_flags;  // the LibTorch jobs take every shared flag and none of their own
  if (std::string problem = ParseLoopFlags(argc, argv, job_flags, flags); !problem.empty())
    return UsageError(name, problem, job_flags, rank);
  torch::set_num_threads(flags.threads);
  std::unique_ptr<BlockingSave> save;
  if (!flags.blocking_save_dir.empty()) {
    auto c = (*mpi)->World();
    if (!c.ok()) return Fail(name, "MPI", c.status(), rank);
    auto made = BlockingSave::Create(flags.blocking_save_dir, std::move(c).value(), clock);
    if (!made.ok()) return Fail(name, "--blocking-save", made.status(), rank);
    save = std::move(made).value();
  }

  std::vector<Batch> batches;
  for (int b = 0; b < flags.batches; ++b) batches.push_back(job.MakeBatch(rank, b));
  Batch eval = job.MakeBatch(1 << 20, 0);  // a fixed batch, the same on every rank
  NamedParameters params = GradientReadyOrder(job, eval);

  LoopRuntime runtime;
  if (int code = MakeLoopRuntime(name, flags, std::move(world).value(), &clock, !flags.timeline_path.empty(), runtime);
      code != 0)
    return code;
  TorchBody body(job, flags, std::move(batches), std::move(eval), std::move(params));
  LoopSetup setup(name, flags, rank, clock, runtime, **report);
  if (Status r = body.Register(runtime, setup.buffers); !r.ok())
    return Fail(name, flags.recording() ? "record" : "plan", r, rank);

  // Declared after the session: destroyed before it (it holds the session's address).
  std::unique_ptr<comm::Communicator> ckpt_comm;
  std::unique_ptr<runtime::Checkpointer> ckpt;
  int start = 0;
  if (!flags.checkpoint.empty()) {
    auto c = (*mpi)->World();
    if (!c.ok()) return Fail(name, "MPI", c.status(), rank);
    ckpt_comm = std::move(c).value();
    auto made = MakeCheckpointer(flags, ckpt_comm.get(), body.params(), body.sgd(), runtime.session.get(), runtime.gate);
    if (!made.ok()) return Fail(name, "--checkpoint", made.status(), rank);
    ckpt = std::move(made).value();
    if (int code = RestoreCheckpoint(name, *ckpt, rank, clock, started_us, start); code != 0) return code;
  }

  setup.checkpoint = ckpt.get();
  setup.start = start;
  if (save != nullptr) {
    save->Attach(&body.params(), &body.sgd(), runtime.session.get());
    setup.save = [&save](int64_t step) { return save->Save(step); };
  }
  if (!flags.weights_path.empty()) {
    setup.after_training = [&] {
      std::string bytes;
      for (const auto& p : body.params())
        bytes.append(static_cast<const char*>(p.second.data_ptr()), static_cast<size_t>(p.second.numel()) * 4);
      return WriteFileAtomic(flags.weights_path + "-rank" + std::to_string(rank), bytes);
    };
  }
  return RunLoop(setup, body);
}

}  // namespace cupcake::examples

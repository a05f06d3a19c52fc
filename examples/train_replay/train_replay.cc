// train_replay: a recorded model (a cupcake.model.v1 file: examples/models/resnet50.json, or any
// model the profiler recorded) trained data-parallel on the Cupcake runtime with its compute
// replayed: the training loop of every example (examples/common/training_loop.h: record mode,
// plans, --timing, --timeline), but forward, backward and update are the model's forward_us,
// backward_us gaps and update_us (0 where the file has none) played on an emulated accelerator
// (emulated_device.h: sleeps, no CPU time), each scaled by --compute-scale to emulate a cluster
// of another speed. Everything else is real: gradient buffers of the model's sizes (one flat
// float32 buffer in gradient-ready order), the runtime's encodes, error feedback and collectives.
//
//   record: CUPCAKE_RECORD=out.json mpirun -np 2 train_replay --model resnet50.json
//   train:  mpirun -np 2 train_replay --model resnet50.json --plan plan.pb [--compute-scale S]
//               [--seed N] [--epochs E] [--steps N] [--warmup N] [--timing F] [--timeline F]
//               [--sgd LR [--weights F] [--checkpoint NAME ...]]
//
// Gradient content: multiples of 2^-12 in [-8, 8), element j of rank r in step s is
// ((base(seed, r, j) + shift(seed, s, tensor)) mod 2^16 - 2^15) / 2^12, so it changes every step
// and differs between ranks, sums over up to 512 ranks are exact in float32, and a selection
// (topk, dgc) meets few ties at its threshold, as in float gradients (with a few values, many
// elements tie there and slow the selection down). Written between iterations (untimed: a GPU
// computes its gradients without the host), after which the ranks meet at a barrier, so the
// host work of writing them does not skew the next iteration's start between ranks.
//
// Checks (exit 1 when one fails): every step's averaged buffers, folded into a digest per rank,
// are the same on every rank, for any plan; and where the plan is exact (every group lossless:
// fp32 flat or hierarchical, zen_sparse), the last step's buffers equal the exact average
// sum_r value(r) / W worked out here from the content's definition.
//
// Parameters (--sgd LR): one float32 per gradient element and its momentum, on the host, the same
// on every rank (zero at step 0), updated in the update by SGD with momentum 0.9 (m = 0.9 m + g;
// p -= LR m) from the averaged gradients. Unlike the replayed times this is real work on the
// loop's thread, a pass over three buffers of the model's size, before update_us's sleep: it
// gives --checkpoint a state that training writes (parameters and momentum, shared; the
// session's error feedback, per rank) and --weights something to write, so that a restarted run
// can be compared bitwise with an uninterrupted one. The digest of the ranks' agreement folds the
// parameters in too.
//
// The timing file gains "replay": the compute scale, whether the plan is exact, and the
// emulation's own costs, the slowest rank's (emulated_device.h): every sleep's lateness and
// the two hand-offs per backward between the loop's thread and the device thread.
#include <algorithm>
#include <array>
#include <cctype>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../common/training_loop.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/plan_io.h"
#include "emulated_device.h"

namespace cupcake::examples {
namespace {

constexpr uint32_t kLevels = 1u << 16;  // values (k - 2^15) / 2^12, k in [0, 2^16)

struct ReplayFlags {
  std::string model;
  double compute_scale = 1;
  uint64_t seed = 1;
  double sgd_lr = 0;  // 0: no parameters
};

std::optional<std::string> ParseReplayFlag(const std::string& arg, const char* value, ReplayFlags& f) {
  if (arg == "--model") {
    f.model = value;
  } else if (arg == "--compute-scale") {
    char* end = nullptr;
    f.compute_scale = std::strtod(value, &end);
    if (end == value || *end != '\0' || !(f.compute_scale > 0 && f.compute_scale <= 1000))
      return arg + ": got '" + value + "', expected a number in (0, 1000]";
  } else if (arg == "--sgd") {
    char* end = nullptr;
    f.sgd_lr = std::strtod(value, &end);
    if (end == value || *end != '\0' || !(f.sgd_lr > 0 && f.sgd_lr < 1000))
      return arg + ": got '" + value + "', expected a learning rate in (0, 1000)";
  } else if (arg == "--seed") {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(value, &end, 10);
    if (end == value || *end != '\0' || value[0] == '-') return arg + ": got '" + value + "', expected an integer >= 0";
    f.seed = v;
  } else {
    return std::nullopt;
  }
  return "";
}

// splitmix64's finalizer: a well-mixed 64-bit function of its input.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The content's definition (see the header comment): base and shift in [0, 2^16).
uint16_t Base(uint64_t seed, int rank, int64_t element) {
  return static_cast<uint16_t>(Mix(Mix(seed) ^ Mix(static_cast<uint64_t>(rank) + 1) ^ static_cast<uint64_t>(element)) %
                               kLevels);
}
uint32_t Shift(uint64_t seed, int64_t step, int tensor) {
  // An odd stride: the shifts of consecutive steps run through every residue.
  return static_cast<uint32_t>(
      (Mix(seed ^ (static_cast<uint64_t>(tensor) << 32)) + static_cast<uint64_t>(step) * 40503) % kLevels);
}
float Value(uint32_t base, uint32_t shift) {
  return static_cast<float>(static_cast<int32_t>((base + shift) % kLevels) - static_cast<int32_t>(kLevels / 2)) /
         4096.0f;
}

struct ReplayTensor {
  std::string name;
  int64_t numel = 0;
  int64_t offset = 0;  // in the flat buffer
  std::vector<int64_t> shape;
  double backward_us = 0;
};

struct ReplayModel {
  std::string name;
  std::vector<ReplayTensor> tensors;
  int64_t numel = 0;
  double forward_us = 0, update_us = 0;
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The model file, validated by the profiler's reader; the replay adds that every gradient is
// float32 (what the runtime registers), reporting every tensor that is not.
StatusOr<ReplayModel> LoadReplayModel(const std::string& path) {
  CUPCAKE_ASSIGN_OR_RETURN(pb::Model m, profile::LoadModelFile(path));
  ReplayModel model;
  model.name = m.name();
  model.forward_us = m.has_forward_us() ? m.forward_us() : 0;
  model.update_us = m.has_update_us() ? m.update_us() : 0;
  std::string problems;
  for (int i = 0; i < m.tensors_size(); ++i) {
    const pb::Tensor& t = m.tensors(i);
    if (t.dtype() != pb::FLOAT32) {
      problems += (problems.empty() ? "" : "\n") + path + ": tensors[" + std::to_string(i) +
                  "].dtype: the replay plays float32 gradients only; got " + Lower(pb::DType_Name(t.dtype())) +
                  ", expected float32";
      continue;
    }
    model.tensors.push_back({t.name(), t.numel(), model.numel, {t.shape().begin(), t.shape().end()}, t.backward_us()});
    model.numel += t.numel();
  }
  if (!problems.empty()) return InvalidArgumentError(problems);
  return model;
}

// Whether every group of the plan sums exactly (lossless schemes; see the header comment), and
// why not when it does not.
std::pair<bool, std::string> PlanIsExact(const std::string& plan_path) {
  auto plan = ReadPlanFile(plan_path);
  if (!plan.ok()) return {false, "not a single plan (a ladder)"};
  for (int k = 0; k < plan->groups_size(); ++k) {
    const pb::GroupOptions& o = plan->groups(k).options();
    const std::string scheme = !o.scheme().empty() ? o.scheme() : o.compress() ? "flat" : "flat_fp32";
    const bool lossless = scheme == "flat_fp32" || scheme == "hier_fp32" || scheme == "zen_sparse" ||
                          ((scheme == "flat" || scheme == "hier") && plan->compressor().name() == "fp32");
    if (!lossless) return {false, "groups[" + std::to_string(k) + "] is " + scheme + " " + plan->compressor().name()};
  }
  return {true, ""};
}

class ReplayBody final : public LoopBody {
 public:
  ReplayBody(const ReplayModel& model, const ReplayFlags& flags, int rank, comm::Communicator& peers)
      : model_(model),
        flags_(flags),
        rank_(rank),
        peers_(peers),
        flat_(static_cast<size_t>(model.numel)),
        base_(static_cast<size_t>(model.numel)),
        params_(flags.sgd_lr > 0 ? static_cast<size_t>(model.numel) : 0),
        momentum_(params_.size()) {
    for (int64_t j = 0; j < model.numel; ++j) base_[static_cast<size_t>(j)] = Base(flags.seed, rank, j);
    for (const ReplayTensor& t : model.tensors) gaps_us_.push_back(t.backward_us * flags.compute_scale);
    Fill(0, /*digest=*/false);
  }

  std::span<float> buffer(size_t i) {
    return {flat_.data() + model_.tensors[i].offset, static_cast<size_t>(model_.tensors[i].numel)};
  }
  // The parameters and their momentum (empty without --sgd).
  std::span<float> params() { return params_; }
  std::span<float> momentum() { return momentum_; }
  // A restored run resumes at `step`: its gradient content is that step's.
  void StartAt(int step) { Fill(step, /*digest=*/false); }
  void set_exact(bool exact, std::string why_not) {
    exact_ = exact;
    why_not_exact_ = std::move(why_not);
  }

  Status Forward(int) override {
    device_.SleepFor(model_.forward_us * flags_.compute_scale);
    return Status::Ok();
  }
  Status Backward(int, const std::function<Status(int)>& ready) override {
    return device_.Backward(SteadyNowUs(), gaps_us_, ready);
  }
  Status Step(int iteration) override {
    const float lr = static_cast<float>(flags_.sgd_lr);
    for (size_t j = 0; j < params_.size(); ++j) {
      momentum_[j] = 0.9f * momentum_[j] + flat_[j];
      params_[j] -= lr * momentum_[j];
    }
    device_.SleepFor(model_.update_us * flags_.compute_scale);
    last_step_ = iteration;
    return Status::Ok();
  }
  // Folds the step's averaged gradients into the digest, writes the next step's, and meets the
  // other ranks.
  Status BetweenIterations(int iteration) override {
    Fill(iteration + 1, /*digest=*/true);
    return peers_.Barrier();
  }
  StatusOr<bool> RanksAgree(comm::Communicator& comm) override {
    Digest();
    std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
    CUPCAKE_RETURN_IF_ERROR(comm.Allgather(&digest_, all.data(), sizeof digest_));
    return std::all_of(all.begin(), all.end(), [&](uint64_t d) { return d == all[0]; });
  }
  StatusOr<std::string> Report(comm::Communicator& comm) override;

 private:
  // Writes step `step`'s content into every buffer; with `digest`, first folds what the buffers
  // hold (the previous step's averaged gradients) into the digest, in the same pass.
  void Fill(int64_t step, bool digest) {
    uint64_t h = digest_;
    for (size_t t = 0; t < model_.tensors.size(); ++t) {
      const uint32_t shift = Shift(flags_.seed, step, static_cast<int>(t));
      float* out = flat_.data() + model_.tensors[t].offset;
      const uint16_t* base = base_.data() + model_.tensors[t].offset;
      const int64_t n = model_.tensors[t].numel;
      if (digest) {
        for (int64_t j = 0; j < n; ++j) {
          uint32_t bits;
          std::memcpy(&bits, &out[j], 4);
          h = (h ^ bits) * 0x100000001b3ull;
          out[j] = Value(base[j], shift);
        }
      } else {
        for (int64_t j = 0; j < n; ++j) out[j] = Value(base[j], shift);
      }
    }
    digest_ = h;
  }
  void Digest() {
    uint64_t h = digest_;
    for (const std::vector<float>* v : {&flat_, &params_}) {
      for (float f : *v) {
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        h = (h ^ bits) * 0x100000001b3ull;
      }
    }
    digest_ = h;
  }
  // Elements of the last step whose averaged value differs from the exact average over the
  // ranks, and the first of them as text.
  std::pair<int64_t, std::string> CheckExactAverage(int world) const;

  const ReplayModel& model_;
  const ReplayFlags& flags_;
  const int rank_;
  comm::Communicator& peers_;  // the barrier between iterations
  std::vector<float> flat_;
  std::vector<uint16_t> base_;  // this rank's base(seed, rank, j)
  std::vector<float> params_, momentum_;
  std::vector<double> gaps_us_;
  EmulatedDevice device_;
  uint64_t digest_ = 0xcbf29ce484222325ull;
  int last_step_ = -1;
  bool exact_ = false;
  std::string why_not_exact_ = "record mode";
};

std::pair<int64_t, std::string> ReplayBody::CheckExactAverage(int world) const {
  int64_t wrong = 0;
  std::string first;
  for (size_t t = 0; t < model_.tensors.size(); ++t) {
    const ReplayTensor& tensor = model_.tensors[t];
    const uint32_t shift = Shift(flags_.seed, last_step_, static_cast<int>(t));
    for (int64_t j = 0; j < tensor.numel; ++j) {
      const int64_t e = tensor.offset + j;
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += Value(Base(flags_.seed, r, e), shift);
      const float expected = sum / static_cast<float>(world);
      const float got = flat_[static_cast<size_t>(e)];
      if (std::memcmp(&expected, &got, 4) == 0) continue;
      if (wrong++ == 0) {
        char text[256];
        std::snprintf(text, sizeof text, "tensor %zu ('%s') element %" PRId64 ": got %.9g, expected %.9g", t,
                      tensor.name.c_str(), j, static_cast<double>(got), static_cast<double>(expected));
        first = text;
      }
    }
  }
  return {wrong, first};
}

StatusOr<std::string> ReplayBody::Report(comm::Communicator& comm) {
  // The exact average, where the plan sums exactly.
  int64_t wrong = 0, any_wrong = 0;
  std::string first;
  if (exact_) std::tie(wrong, first) = CheckExactAverage(comm.size());
  CUPCAKE_RETURN_IF_ERROR(comm.Allreduce(&wrong, &any_wrong, 1, comm::DataType::kInt64, comm::ReduceOp::kMax));
  if (wrong > 0)
    std::fprintf(stderr,
                 "%s: rank %d: %" PRId64 " of %" PRId64
                 " elements of the last step differ from the exact average over the ranks; first: %s\n",
                 model_.name.c_str(), rank_, wrong, model_.numel, first.c_str());
  if (any_wrong > 0)
    return InternalError(
        "the plan is exact, but the averaged gradients of the last step are not the exact average "
        "over the ranks on some rank (up to " +
        std::to_string(any_wrong) + " elements)");
  // The emulation's costs: the slowest rank's of each statistic.
  const WakeSummary late = Summarize(device_.late_us()), to = Summarize(device_.handoff_us()),
                    back = Summarize(device_.handback_us());
  std::array<double, 9> mine = {late.median_us, late.p90_us,    late.max_us, to.median_us, to.p90_us,
                                to.max_us,      back.median_us, back.p90_us, back.max_us};
  std::array<double, 9> most{};
  CUPCAKE_RETURN_IF_ERROR(
      comm.Allreduce(mine.data(), most.data(), mine.size(), comm::DataType::kFloat64, comm::ReduceOp::kMax));
  auto stats = [&](size_t at, int64_t count) {
    char text[160];
    std::snprintf(text, sizeof text,
                  "{\"count\": %" PRId64 ", \"median_us\": %.1f, \"p90_us\": %.1f, \"max_us\": %.1f}", count, most[at],
                  most[at + 1], most[at + 2]);
    return std::string(text);
  };
  char scale[32];
  std::snprintf(scale, sizeof scale, "%g", flags_.compute_scale);
  if (rank_ == 0) {
    std::printf(
        "%s: replay at compute scale %s; plan exact: %s; sleeps woke late by median %.1f us (p90 %.1f, max "
        "%.1f, %" PRId64 " sleeps); hand-off to the device thread %.1f us, back %.1f us (medians, slowest rank)\n",
        model_.name.c_str(), scale, exact_ ? "yes, the average checked bitwise" : ("no: " + why_not_exact_).c_str(),
        most[0], most[1], most[2], late.count, most[3], most[6]);
  }
  return "\"replay\": {\"compute_scale\": " + std::string(scale) + ", \"exact\": " + (exact_ ? "true" : "false") +
         ", \"wake_late\": " + stats(0, late.count) + ", \"handoff\": " + stats(3, to.count) +
         ", \"handback\": " + stats(6, back.count) + "}";
}

int Main(int argc, char** argv) {
  const std::string job = "train_replay";
  runtime::SteadyClock clock;
  const double started_us = clock.NowUs();  // a restore's report counts from here
  // MPI's process state is made here and passed down; sessions are destroyed before it.
  auto mpi = comm::InitMpi(&argc, &argv);
  if (!mpi.ok()) return Fail(job, "MPI", mpi.status(), 0);  // MPI's own failure: every rank prints it
  auto world = (*mpi)->World();
  if (!world.ok()) return Fail(job, "MPI", world.status(), 0);
  auto report = (*mpi)->World();  // the job's own collectives: barriers between iterations, the checks
  if (!report.ok()) return Fail(job, "MPI", report.status(), 0);
  const int rank = (*world)->rank();

  LoopFlags flags;
  ReplayFlags replay;
  JobFlags job_flags;
  job_flags.parse = [&](const std::string& arg, const char* value) { return ParseReplayFlag(arg, value, replay); };
  // No batches or LibTorch threads; the parameters' learning rate is --sgd's. The blocking save
  // (the LibTorch jobs' baseline) is not built for the replay.
  job_flags.unsupported = {"--lr", "--threads", "--batches", "--blocking-save", "--save-every"};
  job_flags.usage = "--model MODEL.json [--compute-scale S] [--seed N] [--sgd LR]   (--model required)";
  std::string problem = ParseLoopFlags(argc, argv, job_flags, flags);
  if (problem.empty() && replay.model.empty()) problem = "--model: missing; expected a cupcake.model.v1 file";
  if (problem.empty() && replay.sgd_lr == 0 && (!flags.checkpoint.empty() || !flags.weights_path.empty()))
    problem = "--checkpoint and --weights: need --sgd LR (the replay's parameters)";
  if (!problem.empty()) return UsageError(job, problem, job_flags, rank);

  auto model = LoadReplayModel(replay.model);
  if (!model.ok()) return Fail(job, "--model", model.status(), rank);
  const std::string name = model->name;

  LoopRuntime runtime;
  if (int code = MakeLoopRuntime(name, flags, std::move(world).value(), &clock, !flags.timeline_path.empty(), runtime);
      code != 0)
    return code;
  ReplayBody body(*model, replay, rank, **report);
  LoopSetup setup(name, flags, rank, clock, runtime, **report);
  std::vector<LoopGradient> gradients;
  for (size_t i = 0; i < model->tensors.size(); ++i) {
    setup.buffers.push_back(body.buffer(i));
    gradients.push_back({model->tensors[i].name, body.buffer(i), model->tensors[i].shape});
  }
  if (Status r = RegisterGradients(runtime, gradients); !r.ok())
    return Fail(name, flags.recording() ? "record" : "plan", r, rank);
  if (!flags.recording()) {
    auto [exact, why_not] = PlanIsExact(flags.plan);
    body.set_exact(exact, why_not);
  }
  // Declared after the session and the body: destroyed before them (it holds their addresses).
  std::unique_ptr<comm::Communicator> ckpt_comm;
  std::unique_ptr<runtime::Checkpointer> ckpt;
  if (!flags.checkpoint.empty()) {
    auto c = (*mpi)->World();
    if (!c.ok()) return Fail(name, "MPI", c.status(), rank);
    ckpt_comm = std::move(c).value();
    auto made = runtime::Checkpointer::Create(CheckpointOptionsOf(flags, runtime.gate), ckpt_comm.get());
    if (!made.ok()) return Fail(name, "--checkpoint", made.status(), rank);
    ckpt = std::move(made).value();
    // Parameters and momentum are the same on every rank (RanksAgree checks it); the session's
    // state (error feedback) is each rank's own.
    Status added = ckpt->Add("params", std::as_writable_bytes(body.params()), runtime::Capture::kInBackground,
                             runtime::Scope::kShared);
    if (added.ok())
      added = ckpt->Add("momentum", std::as_writable_bytes(body.momentum()), runtime::Capture::kInBackground,
                        runtime::Scope::kShared);
    if (added.ok()) added = ckpt->AttachSession(runtime.session.get());
    if (!added.ok()) return Fail(name, "--checkpoint", added, rank);
    if (int code = RestoreCheckpoint(name, *ckpt, rank, clock, started_us, setup.start); code != 0) return code;
    body.StartAt(setup.start);
    setup.checkpoint = ckpt.get();
  }
  if (!flags.weights_path.empty()) {
    setup.after_training = [&] {
      const std::span<const std::byte> bytes = std::as_bytes(body.params());
      return WriteFileAtomic(flags.weights_path + "-rank" + std::to_string(rank),
                             std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    };
  }
  if (Status b = (*report)->Barrier(); !b.ok())
    return Fail(name, "MPI", b, rank);  // every rank's first content written
  return RunLoop(setup, body);
}

}  // namespace
}  // namespace cupcake::examples

int main(int argc, char** argv) { return cupcake::examples::Main(argc, argv); }

#include "training_job.h"

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

namespace cupcake::examples {
namespace {

struct Flags {
  std::string plan;
  int epochs = 5;
  int steps = 10;  // per epoch
  int warmup = 0;  // iterations left out of --timing's statistics (still in the file's count)
  double lr = 0.05;
  int threads = 1;  // LibTorch intra-op threads per rank (several ranks share the cores)
  int batches = 4;  // per rank, made before the loop and used in turn
  std::string timing_path, timeline_path;
  std::string record_path;  // from CUPCAKE_RECORD
  int record_iterations = 20;
  int adapt_window = 0;  // --adapt W: GraVAC over the plan's ladder, a decision every W steps
  // --checkpoint NAME: a snapshot every step in host memory (docs/CHECKPOINT.md), restored at start.
  std::string checkpoint;
  std::string persist_dir;  // --persist DIR
  int persist_every = 0;  // --persist-every N
  int crash_at = 0;  // --crash-at STEP: the process ends (_Exit(3)) right after commit(STEP), a crash for tests
  // --replicate [--replica-chunk-bytes N] [--replica-group-hosts M]: replicas on other hosts,
  // streamed in chunks between the session's collectives (a NetworkGate on its communicator).
  bool replicate = false;
  int replica_chunk_bytes = 0;
  int replica_group_hosts = 2;
  std::string weights_path;  // --weights FILE: each rank writes its parameters' bytes to FILE-rank<r>
};

int Usage(const std::string& job, const std::string& problem) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s --plan PLAN.pb [--epochs N] [--steps N] [--lr X] [--warmup N] [--timing FILE.json]\n"
               "           [--timeline FILE.json] [--threads N] [--batches N] [--adapt WINDOW]\n"
               "           [--checkpoint NAME [--persist DIR --persist-every N] [--crash-at STEP]\n"
               "            [--replicate [--replica-chunk-bytes N] [--replica-group-hosts M]]] [--weights FILE]\n"
               "       CUPCAKE_RECORD=MODEL.json [CUPCAKE_RECORD_ITERATIONS=N] %s   (record mode)\n",
               job.c_str(), problem.c_str(), job.c_str(), job.c_str());
  return 2;
}

// A flag's integer value in [lo, hi], or nullopt.
std::optional<int> ParseInt(const char* text, int lo, int hi) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi) return std::nullopt;
  return static_cast<int>(v);
}

// Parses argv and the record-mode environment; an error message or "".
std::string ParseFlags(int argc, char** argv, Flags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--replicate") {  // the one flag without a value
      f.replicate = true;
      continue;
    }
    if (i + 1 >= argc) return arg + ": missing value";
    const char* value = argv[++i];
    auto integer = [&](int& out, int lo, int hi) -> std::string {
      auto v = ParseInt(value, lo, hi);
      if (!v)
        return arg + ": got '" + value + "', expected an integer in [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "]";
      out = *v;
      return "";
    };
    std::string problem;
    if (arg == "--plan") {
      f.plan = value;
    } else if (arg == "--epochs") {
      problem = integer(f.epochs, 1, 1000000);
    } else if (arg == "--steps") {
      problem = integer(f.steps, 1, 1000000);
    } else if (arg == "--warmup") {
      problem = integer(f.warmup, 0, 1000000);
    } else if (arg == "--threads") {
      problem = integer(f.threads, 1, 1024);
    } else if (arg == "--batches") {
      problem = integer(f.batches, 1, 1024);
    } else if (arg == "--adapt") {
      problem = integer(f.adapt_window, 1, 1000000);
    } else if (arg == "--lr") {
      char* end = nullptr;
      f.lr = std::strtod(value, &end);
      if (end == value || *end != '\0' || !(f.lr > 0 && f.lr < 1e3))
        problem = arg + ": got '" + value + "', expected a number in (0, 1000)";
    } else if (arg == "--timing") {
      f.timing_path = value;
    } else if (arg == "--timeline") {
      f.timeline_path = value;
    } else if (arg == "--checkpoint") {
      f.checkpoint = value;
    } else if (arg == "--persist") {
      f.persist_dir = value;
    } else if (arg == "--persist-every") {
      problem = integer(f.persist_every, 1, 1000000);
    } else if (arg == "--replica-chunk-bytes") {
      problem = integer(f.replica_chunk_bytes, 0, 1 << 30);
    } else if (arg == "--replica-group-hosts") {
      problem = integer(f.replica_group_hosts, 2, 1 << 20);
    } else if (arg == "--crash-at") {
      problem = integer(f.crash_at, 1, 1000000);
    } else if (arg == "--weights") {
      f.weights_path = value;
    } else {
      problem = "unknown flag " + arg;
    }
    if (!problem.empty()) return problem;
  }
  // The job's main reads the environment; the runtime never does.
  if (const char* path = std::getenv("CUPCAKE_RECORD"); path != nullptr && *path != '\0') f.record_path = path;
  if (const char* n = std::getenv("CUPCAKE_RECORD_ITERATIONS"); n != nullptr && *n != '\0') {
    auto v = ParseInt(n, 1, 1000000);
    if (!v) return std::string("CUPCAKE_RECORD_ITERATIONS: got '") + n + "', expected an integer in [1, 1000000]";
    f.record_iterations = *v;
  }
  if (f.record_path.empty() == f.plan.empty())
    return "expected either --plan PLAN.pb or CUPCAKE_RECORD in the environment";
  if (f.checkpoint.empty() && (!f.persist_dir.empty() || f.persist_every > 0 || f.crash_at > 0 || f.replicate))
    return "--persist, --persist-every, --crash-at and --replicate need --checkpoint NAME";
  if (!f.replicate && (f.replica_chunk_bytes > 0 || f.replica_group_hosts != 2))
    return "--replica-chunk-bytes and --replica-group-hosts need --replicate";
  if (!f.checkpoint.empty() && f.plan.empty()) return "--checkpoint: needs --plan (not in record mode)";
  if (f.warmup >= f.epochs * f.steps)
    return "--warmup: must be below --epochs x --steps (" + std::to_string(f.epochs * f.steps) + ")";
  return "";
}

int Fail(const std::string& job, const std::string& what, const Status& s) {
  std::fprintf(stderr, "%s: %s: %s\n", job.c_str(), what.c_str(), s.message().c_str());
  return 1;
}

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

std::string JsonNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// What one training iteration's own marks were, on the session's clock.
struct IterationMarks {
  double forward_start_us = 0, backward_start_us = 0, backward_end_us = 0, synchronized_us = 0, end_us = 0;
};

std::string TimelineJson(const std::string& model, const IterationMarks& m,
                         const std::vector<runtime::GroupTimeline>& groups) {
  // Times relative to the start of backward, as a plan's group times are.
  auto rel = [&](double t) { return JsonNumber(t - m.backward_start_us); };
  std::string out = "{\n  \"model\": " + JsonString(model) + ",\n  \"origin\": \"backward start\",\n";
  out += "  \"forward_start_us\": " + rel(m.forward_start_us) + ",\n  \"backward_end_us\": " + rel(m.backward_end_us) +
         ",\n  \"synchronized_us\": " + rel(m.synchronized_us) + ",\n  \"iteration_end_us\": " + rel(m.end_us) +
         ",\n  \"groups\": [";
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& t = groups[g];
    out += std::string(g == 0 ? "\n" : ",\n") + "    {\"encode_start_us\": " + rel(t.encode_start_us) +
           ", \"encode_end_us\": " + rel(t.encode_end_us) + ", \"comm_start_us\": " + rel(t.comm_start_us) +
           ", \"comm_end_us\": " + rel(t.comm_end_us) + ", \"decode_start_us\": " + rel(t.decode_start_us) +
           ", \"decode_end_us\": " + rel(t.decode_end_us) +
           (t.zen_union > 0 ? ", \"zen_union\": " + std::to_string(t.zen_union) : "") + "}";
  }
  return out + "\n  ]\n}\n";
}

// The checkpointer of --checkpoint: every parameter and its SGD momentum buffer (made here, zero,
// so that a restart has memory to restore into before the first step; the first step's momentum is
// then 0 * 0.9 + g = g, the clone LibTorch would make, but for the sign of zeros), and the
// session's error feedback. Parameters and buffers are written only in sgd.step().
StatusOr<std::unique_ptr<runtime::Checkpointer>> MakeCheckpointer(const Flags& flags, comm::Communicator* comm,
                                                                  const NamedParameters& params, torch::optim::SGD& sgd,
                                                                  runtime::Session* session,
                                                                  std::shared_ptr<runtime::NetworkGate> gate) {
  runtime::CheckpointOptions options;
  options.name = flags.checkpoint;
  options.persist_dir = flags.persist_dir;
  options.persist_every = flags.persist_every;
  options.replicate = flags.replicate;
  options.replica_chunk_bytes = flags.replica_chunk_bytes;
  options.replica_group_hosts = flags.replica_group_hosts;
  options.gate = std::move(gate);
  CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Checkpointer> ckpt, runtime::Checkpointer::Create(options, comm));
  auto bytes = [](const torch::Tensor& t) {
    return std::span<std::byte>(static_cast<std::byte*>(t.data_ptr()), static_cast<size_t>(t.numel()) * 4);
  };
  for (const auto& [pname, p] : params) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(torch::zeros_like(p));
    CUPCAKE_RETURN_IF_ERROR(ckpt->Add("param." + pname, bytes(p)));
    CUPCAKE_RETURN_IF_ERROR(ckpt->Add("momentum." + pname, bytes(state->momentum_buffer())));
    sgd.state()[c10::guts::to_string(p.unsafeGetTensorImpl())] = std::move(state);
  }
  CUPCAKE_RETURN_IF_ERROR(ckpt->AttachSession(session));
  return ckpt;
}

}  // namespace

int RunTrainingJob(int argc, char** argv, TrainingJob& job) {
  const std::string name = job.name();
  // MPI's process state is made here and passed down; sessions are destroyed before it.
  auto mpi = comm::InitMpi(&argc, &argv);
  if (!mpi.ok()) return Fail(name, "MPI", mpi.status());
  auto world = (*mpi)->World();
  if (!world.ok()) return Fail(name, "MPI", world.status());
  auto report = (*mpi)->World();  // the job's own collectives, after training
  if (!report.ok()) return Fail(name, "MPI", report.status());
  const int rank = (*world)->rank();

  Flags flags;
  if (std::string problem = ParseFlags(argc, argv, flags); !problem.empty()) return Usage(name, problem);
  const bool recording = !flags.record_path.empty();
  torch::set_num_threads(flags.threads);

  std::vector<Batch> batches;
  for (int b = 0; b < flags.batches; ++b) batches.push_back(job.MakeBatch(rank, b));
  const Batch eval = job.MakeBatch(1 << 20, 0);  // a fixed batch, the same on every rank
  NamedParameters params = GradientReadyOrder(job, eval);

  runtime::SteadyClock clock;
  std::unique_ptr<runtime::Recorder> recorder;
  std::unique_ptr<runtime::Session> session;
  // --replicate: the session's collectives and the replica exchanges take turns on the network.
  std::shared_ptr<runtime::NetworkGate> gate = flags.replicate ? std::make_shared<runtime::NetworkGate>() : nullptr;
  if (recording) {
    runtime::RecorderOptions options;
    options.clock = &clock;
    auto r = runtime::Recorder::Create(name, options);
    if (!r.ok()) return Fail(name, "record", r.status());
    recorder = std::move(r).value();
  } else {
    runtime::SessionOptions options;
    options.clock = &clock;
    options.record_timeline = !flags.timeline_path.empty();
    std::unique_ptr<comm::Communicator> session_comm = std::move(world).value();
    if (gate != nullptr) session_comm = runtime::GateCommunicator(gate, std::move(session_comm));
    auto s = runtime::Session::Create(flags.plan, std::move(session_comm), options);
    if (!s.ok()) return Fail(name, "plan", s.status());
    session = std::move(s).value();
    if (flags.adapt_window > 0) {
      runtime::GravacOptions gravac;
      gravac.window = flags.adapt_window;
      if (Status a = session->EnableGravac(gravac); !a.ok()) return Fail(name, "--adapt", a);
    }
  }

  // The gradients' buffers: slices of one flat buffer in gradient-ready (= plan) order, as
  // frameworks keep gradients, so a session's groups work on them in place.
  int64_t total = 0;
  for (const auto& p : params) total += p.second.numel();
  torch::Tensor flat = torch::zeros({total});
  std::vector<torch::Tensor> buffers;
  for (size_t i = 0, at = 0; i < params.size(); at += static_cast<size_t>(params[i].second.numel()), ++i) {
    const auto& [pname, tensor] = params[i];
    buffers.push_back(flat.narrow(0, static_cast<int64_t>(at), tensor.numel()));
    Status status = recording
                        ? recorder->Register(pname, tensor.numel(), tensor.sizes().vec())
                        : session->Register(pname, std::span<float>(buffers[i].data_ptr<float>(), tensor.numel()));
    if (!status.ok()) return Fail(name, recording ? "record" : "plan", status);
  }
  Status hook_status;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].second.register_hook([&, i](torch::Tensor g) {
      buffers[i].copy_(g.reshape({-1}));
      Status s = recording ? recorder->GradientReady(static_cast<int>(i)) : session->GradientReady(static_cast<int>(i));
      if (!s.ok() && hook_status.ok()) hook_status = s;
      return g;
    });
  }

  torch::optim::SGD sgd(job.module().parameters(), torch::optim::SGDOptions(flags.lr).momentum(0.9));
  // Declared after the session: destroyed before it (it holds the session's address).
  std::unique_ptr<comm::Communicator> ckpt_comm;
  std::unique_ptr<runtime::Checkpointer> ckpt;
  int start = 0;
  if (!flags.checkpoint.empty()) {
    auto c = (*mpi)->World();
    if (!c.ok()) return Fail(name, "MPI", c.status());
    ckpt_comm = std::move(c).value();
    auto made = MakeCheckpointer(flags, ckpt_comm.get(), params, sgd, session.get(), gate);
    if (!made.ok()) return Fail(name, "--checkpoint", made.status());
    ckpt = std::move(made).value();
    auto point = ckpt->Restore();
    if (!point.ok()) return Fail(name, "--checkpoint", point.status());
    start = static_cast<int>(point->step);
    if (rank == 0 && start > 0) std::printf("checkpoint: restored step %d from %s\n", start, point->source.c_str());
    if (rank != 0 && start > 0) std::printf("checkpoint: rank %d restored from %s\n", rank, point->source.c_str());
  }
  const int iterations = recording ? flags.record_iterations : flags.epochs * flags.steps;
  const int steps_per_epoch = recording ? iterations : flags.steps;
  std::vector<double> iteration_us;
  IterationMarks marks;
  const double loss_first = EvalLoss(job, eval);
  double loss_last = loss_first;
  if (rank == 0 && !recording) std::printf("epoch 0 loss %.6f\n", loss_first);
  for (int it = start; it < iterations; ++it) {
    marks.forward_start_us = clock.NowUs();
    Status s = recording ? recorder->BeginForward() : Status::Ok();
    sgd.zero_grad();
    torch::Tensor loss = job.Loss(batches[static_cast<size_t>(it % flags.batches)]);
    marks.backward_start_us = clock.NowUs();
    if (s.ok() && recording) s = recorder->BeginBackward();
    if (!s.ok()) return Fail(name, "record", s);
    loss.backward();
    marks.backward_end_us = clock.NowUs();
    if (!hook_status.ok()) return Fail(name, recording ? "record" : "gradient ready", hook_status);
    if (!recording) {
      if (Status sync = session->Synchronize(); !sync.ok()) return Fail(name, "synchronize", sync);
    }
    marks.synchronized_us = clock.NowUs();
    // Every rank now steps with the averaged gradient.
    for (size_t i = 0; i < params.size(); ++i)
      params[i].second.mutable_grad().copy_(buffers[i].view_as(params[i].second));
    if (ckpt != nullptr) {
      if (Status w = ckpt->WaitForCopy(); !w.ok()) return Fail(name, "--checkpoint", w);  // it reads what step() writes
    }
    sgd.step();
    if (ckpt != nullptr) {
      if (Status c = ckpt->Commit(it + 1); !c.ok()) return Fail(name, "--checkpoint", c);
      if (it + 1 == flags.crash_at) std::_Exit(3);
    }
    marks.end_us = clock.NowUs();
    if (recording) {
      if (Status end = recorder->EndIteration(); !end.ok()) return Fail(name, "record", end);
      // Each gradient's share of non-zeros (an embedding table's is naturally sparse), after
      // the iteration's times are taken.
      for (size_t i = 0; i < params.size(); ++i) {
        const torch::Tensor& g = buffers[i];
        if (Status d =
                recorder->SampleDensity(static_cast<int>(i), {g.data_ptr<float>(), static_cast<size_t>(g.numel())});
            !d.ok())
          return Fail(name, "record", d);
      }
    }
    iteration_us.push_back(marks.end_us - marks.forward_start_us);
    if (!recording && (it + 1) % steps_per_epoch == 0) {
      loss_last = EvalLoss(job, eval);
      if (rank == 0) {
        std::printf("epoch %d loss %.6f\n", (it + 1) / steps_per_epoch, loss_last);
        std::fflush(stdout);
      }
    }
  }

  if (recording) {
    // Every rank recorded; merged, every rank holds the slowest rank's times, and rank 0 writes them.
    if (Status s = recorder->MergeRanks(**report); !s.ok()) return Fail(name, "record", s);
    if (rank == 0) {
      if (Status s = recorder->Write(flags.record_path); !s.ok()) return Fail(name, "record", s);
      std::printf("%s: recorded %d tensors over %d iterations into %s\n", name.c_str(), recorder->registered(),
                  recorder->completed_iterations(), flags.record_path.c_str());
    }
    return 0;
  }

  std::string timeline;
  if (!flags.timeline_path.empty()) {
    auto groups = session->Timeline();
    if (!groups.ok()) return Fail(name, "timeline", groups.status());
    timeline = TimelineJson(name, marks, *groups);
  }
  if (!flags.weights_path.empty()) {
    std::string bytes;
    for (const auto& p : params)
      bytes.append(static_cast<const char*>(p.second.data_ptr()), static_cast<size_t>(p.second.numel()) * 4);
    const std::string path = flags.weights_path + "-rank" + std::to_string(rank);
    if (Status s = WriteFileAtomic(path, bytes); !s.ok()) return Fail(name, "--weights", s);
  }
  auto agree = RanksAgree(params, **report);
  if (!agree.ok()) return Fail(name, "ranks agree", agree.status());
  // Each iteration's time is the slowest rank's.
  std::vector<double> slowest(iteration_us.size());
  if (Status s = (*report)->Allreduce(iteration_us.data(), slowest.data(), static_cast<int64_t>(iteration_us.size()),
                                      comm::DataType::kFloat64, comm::ReduceOp::kMax);
      !s.ok()) {
    return Fail(name, "timing", s);
  }
  if (rank == 0) {
    if (!flags.timing_path.empty()) {
      std::string out = "{\n  \"model\": " + JsonString(name) + ",\n  \"plan\": " + JsonString(flags.plan) +
                        ",\n  \"world_size\": " + std::to_string(session->world_size()) +
                        ",\n  \"warmup\": " + std::to_string(flags.warmup) +
                        ",\n  \"loss_first\": " + JsonNumber(loss_first) +
                        ",\n  \"loss_last\": " + JsonNumber(loss_last) +
                        ",\n  \"ranks_agree\": " + (*agree ? "true" : "false") + ",\n  \"iteration_us\": [";
      for (size_t i = 0; i < slowest.size(); ++i) out += (i == 0 ? "" : ", ") + JsonNumber(slowest[i]);
      out += "]\n}\n";
      if (Status s = WriteFileAtomic(flags.timing_path, out); !s.ok()) return Fail(name, "--timing", s);
    }
    if (!timeline.empty()) {
      if (Status s = WriteFileAtomic(flags.timeline_path, timeline); !s.ok()) return Fail(name, "--timeline", s);
    }
    for (const runtime::GravacDecision& d : session->decisions())
      std::printf("gravac: steps %llu-%llu sent ratio %g (gain %.3f at %g, %.3f at %g), next %g\n",
                  static_cast<unsigned long long>(d.step), static_cast<unsigned long long>(d.step + d.steps - 1),
                  d.ratio, d.gain_min, d.ratio_min, d.gain_c, d.ratio_c, d.next_ratio);
    // A restarted run (--checkpoint) may have fewer iterations than the warm-up.
    std::vector<double> timed(slowest.begin() + std::min<size_t>(static_cast<size_t>(flags.warmup), slowest.size()),
                              slowest.end());
    std::sort(timed.begin(), timed.end());
    std::printf("%s: %zu timed iterations, median %.1f ms (slowest rank), ranks agree: %s\n", name.c_str(),
                timed.size(), timed.empty() ? 0.0 : timed[timed.size() / 2] / 1e3, *agree ? "yes" : "NO");
    if (gate != nullptr)
      std::printf("checkpoint: rank 0: %lld replica exchanges; %lld collectives waited for one\n",
                  static_cast<long long>(gate->transfers()), static_cast<long long>(gate->collectives_waited()));
  }
  if (!*agree) {
    if (rank == 0) std::fprintf(stderr, "%s: the ranks ended with different parameters\n", name.c_str());
    return 1;
  }
  return 0;
}

}  // namespace cupcake::examples

// The C API: each function turns a Status into its code and keeps the message per thread.
#include "cupcake/runtime/cupcake.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <string>

#include "c_api_internal.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/runtime/checkpoint.h"
#include "cupcake/runtime/recorder.h"
#include "cupcake/runtime/session.h"

struct cupcake_session {
  std::unique_ptr<cupcake::runtime::Session> session;
};

struct cupcake_checkpointer {
  std::unique_ptr<cupcake::comm::Communicator> comm;  // outlives `checkpointer`
  std::unique_ptr<cupcake::runtime::Checkpointer> checkpointer;
};

struct cupcake_recorder {
  std::unique_ptr<cupcake::ActivitySource> activity;  // cupcake_recorder_create_cupti; outlives `recorder`
  std::unique_ptr<cupcake::runtime::Recorder> recorder;
};

namespace {

// The C boundary's only state: the last failure (its message and reporter), per thread, as
// errno is; OK before the first.
thread_local cupcake::Status last_error;

int Report(const cupcake::Status& s) {
  if (s.ok()) return CUPCAKE_OK;
  last_error = s;
  return static_cast<int>(s.code());
}

int NullSession(const char* call) {
  return Report(cupcake::InvalidArgumentError(
      std::string(call) + ": session is NULL; expected one from cupcake_session_create_with_options"));
}

int NullRecorder(const char* call) {
  return Report(cupcake::InvalidArgumentError(std::string(call) +
                                              ": recorder is NULL; expected one from cupcake_recorder_create"));
}

int NullCheckpointer(const char* call) {
  return Report(cupcake::InvalidArgumentError(std::string(call) +
                                              ": checkpointer is NULL; expected one from cupcake_checkpointer_create"));
}

}  // namespace

namespace cupcake::runtime::internal {

int CreateCCheckpointer(const cupcake_checkpoint_options& o, std::unique_ptr<comm::Communicator> comm,
                        cupcake_checkpointer** out) {
  if (out == nullptr)
    return Report(InvalidArgumentError("cupcake_checkpointer_create: out is NULL; expected a place for the handle"));
  CheckpointOptions options;
  if (o.name != nullptr && o.name[0] != 0) options.name = o.name;
  if (o.persist_dir != nullptr) options.persist_dir = o.persist_dir;
  options.persist_every = o.persist_every;
  options.replicate = o.replicate != 0;
  options.replica_chunk_bytes = o.replica_chunk_bytes;
  if (o.replica_group_hosts != 0) options.replica_group_hosts = o.replica_group_hosts;
  options.replica_max_commits = o.replica_max_commits;
  if (o.replica_gap_count < 0 || (o.replica_gap_count > 0 && o.replica_gaps == nullptr))
    return Report(InvalidArgumentError(
        "cupcake_checkpointer_create: options.replica_gaps: not an array of replica_gap_count gaps; got " +
        std::string(o.replica_gaps == nullptr ? "NULL" : "an array") + " and replica_gap_count " +
        std::to_string(o.replica_gap_count) + ", expected replica_gap_count >= 0 gaps there"));
  for (int i = 0; i < o.replica_gap_count; ++i)
    options.replica_gaps.push_back({o.replica_gaps[i].after_group, o.replica_gaps[i].bytes});
  auto made = Checkpointer::Create(options, comm.get());
  if (!made.ok()) return Report(made.status().WithPrefix("cupcake_checkpointer_create"));
  *out = new cupcake_checkpointer{std::move(comm), std::move(made).value()};
  return CUPCAKE_OK;
}

int CreateCSession(const char* plan_path, std::unique_ptr<comm::Communicator> comm, const SessionOptions& options,
                   cupcake_session** out) {
  if (out == nullptr)
    return Report(InvalidArgumentError("cupcake_session_create_with_options: out is NULL; expected a pointer"));
  *out = nullptr;
  if (plan_path == nullptr)
    return Report(InvalidArgumentError("cupcake_session_create_with_options: plan_path is NULL; expected a path"));
  auto session = Session::Create(plan_path, std::move(comm), options);
  if (!session.ok()) return Report(session.status());
  *out = new cupcake_session{std::move(session).value()};
  return CUPCAKE_OK;
}

StatusOr<SessionOptions> ToSessionOptions(const cupcake_session_options& o, const char* call) {
  std::string problems;
  auto add = [&](const std::string& m) { problems += (problems.empty() ? "" : "\n") + std::string(call) + ": " + m; };
  const int backend = o.backend;
  if (backend < CUPCAKE_BACKEND_MPI || backend > CUPCAKE_BACKEND_NCCL_COMM)
    add("options.backend: unknown backend; got " + std::to_string(backend) +
        ", expected CUPCAKE_BACKEND_MPI (0), CUPCAKE_BACKEND_NCCL (1) or CUPCAKE_BACKEND_NCCL_COMM (2)");
  if (!std::isfinite(o.ready_timeout_us) || o.ready_timeout_us < 0) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", o.ready_timeout_us);
    add(std::string("options.ready_timeout_us: out of range; got ") + got +
        ", expected > 0 microseconds, or 0 for the default (60 s)");
  }
  if (o.backend == CUPCAKE_BACKEND_MPI && o.job_stream != nullptr)
    add("options.job_stream: set for backend MPI; expected NULL (a stream is for the NCCL backends)");
  if (!problems.empty()) return InvalidArgumentError(problems);
  SessionOptions options;
  if (o.compressor != nullptr) options.compressor = o.compressor;
  if (o.model_fingerprint != nullptr) options.model_fingerprint = o.model_fingerprint;
  if (o.ready_timeout_us > 0) options.ready_timeout_us = o.ready_timeout_us;
  options.job_stream = o.job_stream;
  return options;
}

}  // namespace cupcake::runtime::internal

namespace {

using cupcake::InvalidArgumentError;

// The communicator the backend names; errors prefixed `call`.
cupcake::StatusOr<std::unique_ptr<cupcake::comm::Communicator>> MakeComm(const cupcake_session_options& o,
                                                                         const char* call) {
  switch (o.backend) {
    case CUPCAKE_BACKEND_MPI: return cupcake::comm::MpiCommunicatorFromHandle(o.mpi_comm);
    case CUPCAKE_BACKEND_NCCL: {
      std::unique_ptr<cupcake::comm::Communicator> bootstrap;
      if (o.mpi_comm != nullptr || cupcake::comm::MpiInitialized()) {
        auto mpi = cupcake::comm::MpiCommunicatorFromHandle(o.mpi_comm);
        if (!mpi.ok()) return mpi.status().WithPrefix(call);
        bootstrap = std::move(mpi).value();
      }
      auto comm = cupcake::comm::MakeNcclCommunicator(bootstrap.get());
      if (!comm.ok()) return comm.status().WithPrefix(call);
      return comm;
    }
    case CUPCAKE_BACKEND_NCCL_COMM: {
      auto comm = cupcake::comm::NcclCommunicatorFromHandle(o.nccl_comm);
      if (!comm.ok()) return comm.status().WithPrefix(call);
      return comm;
    }
  }
  return InvalidArgumentError(std::string(call) + ": options.backend: unknown backend");  // checked before
}

// Every create: the new function and the deprecated ones, each naming itself in errors.
int CreateSession(const char* plan_path, const cupcake_session_options& o, const char* call, cupcake_session** out) {
  if (out == nullptr) return Report(InvalidArgumentError(std::string(call) + ": out is NULL; expected a pointer"));
  *out = nullptr;
  if (plan_path == nullptr)
    return Report(InvalidArgumentError(std::string(call) + ": plan_path is NULL; expected a path"));
  auto options = cupcake::runtime::internal::ToSessionOptions(o, call);
  if (!options.ok()) return Report(options.status());
  auto comm = MakeComm(o, call);
  if (!comm.ok()) return Report(comm.status());
  return cupcake::runtime::internal::CreateCSession(plan_path, std::move(comm).value(), *options, out);
}

int Register(const char* call, cupcake_session* session, const char* name, float* data, int64_t numel) {
  if (session == nullptr) return NullSession(call);
  if (name == nullptr || (data == nullptr && numel != 0) || numel < 0)
    return Report(InvalidArgumentError(std::string(call) + ": bad arguments; got name " +
                                       std::string(name ? name : "NULL") + ", numel " + std::to_string(numel) +
                                       ", expected a name, a buffer and numel >= 0"));
  return Report(session->session->Register(name, std::span<float>(data, static_cast<size_t>(numel))));
}

int RegisterDevice(const char* call, cupcake_session* session, const char* name, float* device_data, int64_t numel) {
  if (session == nullptr) return NullSession(call);
  if (name == nullptr)
    return Report(InvalidArgumentError(std::string(call) + ": name is NULL; expected the gradient's name"));
  return Report(session->session->RegisterDevice(name, device_data, numel));
}

int GradientReady(const char* call, cupcake_session* session, int tensor) {
  if (session == nullptr) return NullSession(call);
  return Report(session->session->GradientReady(tensor));
}

int Synchronize(const char* call, cupcake_session* session) {
  if (session == nullptr) return NullSession(call);
  return Report(session->session->Synchronize());
}

int SetAccumulating(const char* call, cupcake_session* session, int accumulating) {
  if (session == nullptr) return NullSession(call);
  return Report(session->session->SetAccumulating(accumulating != 0));
}

}  // namespace

extern "C" {

int cupcake_session_create_with_options(const char* plan_path, const cupcake_session_options* options,
                                        cupcake_session** out) {
  const cupcake_session_options defaults{};
  return CreateSession(plan_path, options != nullptr ? *options : defaults, "cupcake_session_create_with_options", out);
}

int cupcake_session_register(cupcake_session* session, const char* name, float* data, int64_t numel) {
  return Register("cupcake_session_register", session, name, data, numel);
}

int cupcake_session_register_device(cupcake_session* session, const char* name, float* device_data, int64_t numel) {
  return RegisterDevice("cupcake_session_register_device", session, name, device_data, numel);
}

int cupcake_session_gradient_ready(cupcake_session* session, int tensor) {
  return GradientReady("cupcake_session_gradient_ready", session, tensor);
}

int cupcake_session_synchronize(cupcake_session* session) {
  return Synchronize("cupcake_session_synchronize", session);
}

int cupcake_session_set_accumulating(cupcake_session* session, int accumulating) {
  return SetAccumulating("cupcake_session_set_accumulating", session, accumulating);
}

int cupcake_session_plan_count(const cupcake_session* session, int* count) {
  if (session == nullptr) return NullSession("cupcake_session_plan_count");
  if (count == nullptr) return Report(InvalidArgumentError("cupcake_session_plan_count: count is NULL; expected a pointer"));
  *count = session->session->plan_count();
  return CUPCAKE_OK;
}

int cupcake_session_active_plan(const cupcake_session* session, int* index) {
  if (session == nullptr) return NullSession("cupcake_session_active_plan");
  if (index == nullptr) return Report(InvalidArgumentError("cupcake_session_active_plan: index is NULL; expected a pointer"));
  *index = session->session->active_plan();
  return CUPCAKE_OK;
}

int cupcake_session_switch_plan(cupcake_session* session, int index) {
  if (session == nullptr) return NullSession("cupcake_session_switch_plan");
  return Report(session->session->SwitchPlan(index));
}

int cupcake_session_enable_gravac(cupcake_session* session, const cupcake_gravac_options* options) {
  if (session == nullptr) return NullSession("cupcake_session_enable_gravac");
  cupcake::runtime::GravacOptions o;
  if (options != nullptr) {
    if (options->window != 0) o.window = options->window;
    if (options->epsilon != 0) o.epsilon = options->epsilon;
    if (options->omega != 0) o.omega = options->omega;
    if (options->measured_tolerance != 0) o.measured_tolerance = options->measured_tolerance;
    if (options->probe_every != 0) o.probe_every = options->probe_every;
  }
  return Report(session->session->EnableGravac(o));
}

int cupcake_session_decision_count(const cupcake_session* session, int* count) {
  if (session == nullptr) return NullSession("cupcake_session_decision_count");
  if (count == nullptr)
    return Report(InvalidArgumentError("cupcake_session_decision_count: count is NULL; expected a pointer"));
  *count = static_cast<int>(session->session->decisions().size());
  return CUPCAKE_OK;
}

int cupcake_session_decision(const cupcake_session* session, int index, cupcake_gravac_decision* out) {
  if (session == nullptr) return NullSession("cupcake_session_decision");
  if (out == nullptr) return Report(InvalidArgumentError("cupcake_session_decision: out is NULL; expected a pointer"));
  const std::vector<cupcake::runtime::GravacDecision>& all = session->session->decisions();
  if (index < 0 || index >= static_cast<int>(all.size()))
    return Report(InvalidArgumentError("cupcake_session_decision: index out of range; got " + std::to_string(index) +
                                       ", expected 0 <= index < " + std::to_string(all.size()) + " (decisions so far)"));
  const cupcake::runtime::GravacDecision& d = all[static_cast<size_t>(index)];
  *out = {d.step,         d.steps,       d.ratio,      d.ratio_min, d.ratio_c,    d.gain_min,      d.gain_c,
          d.predicted_ms, d.measured_ms, d.bytes_sent, d.probe_ms,  d.next_ratio, d.groups_skipped};
  return CUPCAKE_OK;
}

void cupcake_session_destroy(cupcake_session* session) { delete session; }

// The deprecated aliases: the same implementations, each error naming the alias called.

int cupcake_session_create(const char* plan_path, const void* mpi_comm, cupcake_session** out) {
  cupcake_session_options o{};
  o.mpi_comm = mpi_comm;
  return CreateSession(plan_path, o, "cupcake_session_create", out);
}

int cupcake_session_create_ex(const char* plan_path, const void* mpi_comm, const char* compressor,
                              const char* model_fingerprint, double ready_timeout_s, cupcake_session** out) {
  cupcake_session_options o{};
  o.mpi_comm = mpi_comm;
  o.compressor = compressor;
  o.model_fingerprint = model_fingerprint;
  o.ready_timeout_us = ready_timeout_s > 0 ? ready_timeout_s * 1e6 : 0;
  return CreateSession(plan_path, o, "cupcake_session_create_ex", out);
}

int cupcake_session_create_nccl(const char* plan_path, const void* mpi_comm, void* job_stream, cupcake_session** out) {
  cupcake_session_options o{};
  o.backend = CUPCAKE_BACKEND_NCCL;
  o.mpi_comm = mpi_comm;
  o.job_stream = job_stream;
  return CreateSession(plan_path, o, "cupcake_session_create_nccl", out);
}

int cupcake_session_create_nccl_comm(const char* plan_path, const void* nccl_comm, void* job_stream,
                                     cupcake_session** out) {
  cupcake_session_options o{};
  o.backend = CUPCAKE_BACKEND_NCCL_COMM;
  o.nccl_comm = nccl_comm;
  o.job_stream = job_stream;
  return CreateSession(plan_path, o, "cupcake_session_create_nccl_comm", out);
}

int cupcake_register(cupcake_session* session, const char* name, float* data, int64_t numel) {
  return Register("cupcake_register", session, name, data, numel);
}

int cupcake_register_device(cupcake_session* session, const char* name, float* device_data, int64_t numel) {
  return RegisterDevice("cupcake_register_device", session, name, device_data, numel);
}

int cupcake_gradient_ready(cupcake_session* session, int tensor) {
  return GradientReady("cupcake_gradient_ready", session, tensor);
}

int cupcake_synchronize(cupcake_session* session) { return Synchronize("cupcake_synchronize", session); }

int cupcake_set_accumulating(cupcake_session* session, int accumulating) {
  return SetAccumulating("cupcake_set_accumulating", session, accumulating);
}

int cupcake_recorder_create(const char* model_name, cupcake_recorder** out) {
  if (out == nullptr)
    return Report(cupcake::InvalidArgumentError("cupcake_recorder_create: out is NULL; expected a pointer"));
  *out = nullptr;
  auto recorder = cupcake::runtime::Recorder::Create(model_name != nullptr ? model_name : "");
  if (!recorder.ok()) return Report(recorder.status());
  *out = new cupcake_recorder{nullptr, std::move(recorder).value()};
  return CUPCAKE_OK;
}

int cupcake_recorder_create_cupti(const char* model_name, cupcake_recorder** out) {
  if (out == nullptr)
    return Report(cupcake::InvalidArgumentError("cupcake_recorder_create_cupti: out is NULL; expected a pointer"));
  *out = nullptr;
  auto activity = cupcake::runtime::OpenKernelTimeSource();
  if (!activity.ok()) return Report(activity.status().WithPrefix("cupcake_recorder_create_cupti"));
  cupcake::runtime::RecorderOptions options;
  options.activity = activity->get();
  auto recorder = cupcake::runtime::Recorder::Create(model_name != nullptr ? model_name : "", options);
  if (!recorder.ok()) return Report(recorder.status());
  *out = new cupcake_recorder{std::move(activity).value(), std::move(recorder).value()};
  return CUPCAKE_OK;
}

int cupcake_recorder_register(cupcake_recorder* recorder, const char* name, int64_t numel) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_register");
  return Report(recorder->recorder->Register(name != nullptr ? name : "", numel));
}

int cupcake_recorder_register_shape(cupcake_recorder* recorder, const char* name, int64_t numel, const int64_t* shape,
                                    int dims) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_register_shape");
  if (dims < 0 || (dims > 0 && shape == nullptr)) {
    return Report(InvalidArgumentError("cupcake_recorder_register_shape: shape: got " + std::to_string(dims) +
                                       " dimensions at " + (shape == nullptr ? "NULL" : "a pointer") +
                                       ", expected dims >= 0 and a non-NULL shape when dims > 0"));
  }
  return Report(recorder->recorder->Register(name != nullptr ? name : "", numel,
                                             std::span<const int64_t>(shape, static_cast<size_t>(dims))));
}

int cupcake_recorder_begin_forward(cupcake_recorder* recorder) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_begin_forward");
  return Report(recorder->recorder->BeginForward());
}

int cupcake_recorder_end_iteration(cupcake_recorder* recorder) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_end_iteration");
  return Report(recorder->recorder->EndIteration());
}

int cupcake_recorder_begin_backward(cupcake_recorder* recorder) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_begin_backward");
  return Report(recorder->recorder->BeginBackward());
}

int cupcake_recorder_gradient_ready(cupcake_recorder* recorder, int tensor) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_gradient_ready");
  return Report(recorder->recorder->GradientReady(tensor));
}

int cupcake_recorder_sample_density(cupcake_recorder* recorder, int tensor, const float* grad, int64_t numel) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_sample_density");
  if (grad == nullptr || numel < 1)
    return Report(cupcake::InvalidArgumentError(
        "cupcake_recorder_sample_density: grad: expected a non-null buffer of numel >= 1 floats; got " +
        std::string(grad == nullptr ? "NULL" : "a buffer") + ", numel " + std::to_string(numel)));
  return Report(recorder->recorder->SampleDensity(tensor, {grad, static_cast<size_t>(numel)}));
}

int cupcake_recorder_merge(cupcake_recorder* recorder, const void* mpi_comm) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_merge");
  auto comm = cupcake::comm::MpiCommunicatorFromHandle(mpi_comm);
  if (!comm.ok()) return Report(comm.status().WithPrefix("cupcake_recorder_merge"));
  return Report(recorder->recorder->MergeRanks(**comm));
}

int cupcake_recorder_write(cupcake_recorder* recorder, const char* path) {
  if (recorder == nullptr) return NullRecorder("cupcake_recorder_write");
  if (path == nullptr)
    return Report(cupcake::InvalidArgumentError("cupcake_recorder_write: path is NULL; expected a path"));
  return Report(recorder->recorder->Write(path));
}

void cupcake_recorder_destroy(cupcake_recorder* recorder) { delete recorder; }

int cupcake_checkpointer_create(const cupcake_checkpoint_options* options, cupcake_checkpointer** out) {
  const cupcake_checkpoint_options defaults = {};
  const cupcake_checkpoint_options& o = options != nullptr ? *options : defaults;
  auto comm = cupcake::comm::MpiCommunicatorFromHandle(o.mpi_comm);
  if (!comm.ok()) return Report(comm.status().WithPrefix("cupcake_checkpointer_create"));
  return cupcake::runtime::internal::CreateCCheckpointer(o, std::move(comm).value(), out);
}

int cupcake_checkpointer_add(cupcake_checkpointer* checkpointer, const char* name, void* data, int64_t bytes,
                             int flags) {
  if (checkpointer == nullptr) return NullCheckpointer("cupcake_checkpointer_add");
  if (name == nullptr || (data == nullptr && bytes != 0) || bytes < 0)
    return Report(cupcake::InvalidArgumentError(
        "cupcake_checkpointer_add: bad arguments; got name " + std::string(name == nullptr ? "NULL" : name) + ", " +
        std::to_string(bytes) + " bytes, expected a name and bytes >= 0 of host memory at data"));
  constexpr int kKnown = CUPCAKE_CHECKPOINT_AT_COMMIT | CUPCAKE_CHECKPOINT_SHARED;
  if ((flags & ~kKnown) != 0)
    return Report(cupcake::InvalidArgumentError("cupcake_checkpointer_add: flags: unknown bits; got " +
                                                std::to_string(flags) + " for '" + name +
                                                "', expected CUPCAKE_CHECKPOINT_AT_COMMIT (1) and "
                                                "CUPCAKE_CHECKPOINT_SHARED (2) or'ed"));
  return Report(checkpointer->checkpointer->Add(
      name, std::span<std::byte>(static_cast<std::byte*>(data), static_cast<size_t>(bytes)),
      (flags & CUPCAKE_CHECKPOINT_AT_COMMIT) != 0 ? cupcake::runtime::Capture::kAtCommit
                                                  : cupcake::runtime::Capture::kInBackground,
      (flags & CUPCAKE_CHECKPOINT_SHARED) != 0 ? cupcake::runtime::Scope::kShared : cupcake::runtime::Scope::kRank));
}

int cupcake_checkpointer_attach_session(cupcake_checkpointer* checkpointer, cupcake_session* session) {
  if (checkpointer == nullptr) return NullCheckpointer("cupcake_checkpointer_attach_session");
  return Report(checkpointer->checkpointer->AttachSession(session != nullptr ? session->session.get() : nullptr));
}

int cupcake_checkpointer_commit(cupcake_checkpointer* checkpointer, int64_t step) {
  if (checkpointer == nullptr) return NullCheckpointer("cupcake_checkpointer_commit");
  return Report(checkpointer->checkpointer->Commit(step));
}

int cupcake_checkpointer_wait(cupcake_checkpointer* checkpointer) {
  if (checkpointer == nullptr) return NullCheckpointer("cupcake_checkpointer_wait");
  return Report(checkpointer->checkpointer->WaitForCopy());
}

int cupcake_checkpointer_restore(cupcake_checkpointer* checkpointer, int64_t* step) {
  if (checkpointer == nullptr) return NullCheckpointer("cupcake_checkpointer_restore");
  if (step == nullptr)
    return Report(cupcake::InvalidArgumentError("cupcake_checkpointer_restore: step is NULL; expected a place for it"));
  auto point = checkpointer->checkpointer->Restore();
  if (!point.ok()) return Report(point.status());
  *step = point->step;
  return CUPCAKE_OK;
}

int cupcake_checkpointer_remove_segment(const char* name, int rank) {
  if (name == nullptr)
    return Report(cupcake::InvalidArgumentError("cupcake_checkpointer_remove_segment: name is NULL; expected a name"));
  return Report(cupcake::runtime::Checkpointer::RemoveSegment(name, rank));
}

void cupcake_checkpointer_destroy(cupcake_checkpointer* checkpointer) { delete checkpointer; }

const char* cupcake_last_error(void) { return last_error.message().c_str(); }

int cupcake_last_error_reporter(void) { return last_error.reporter(); }

int cupcake_last_error_printed_by(int rank) { return last_error.PrintedBy(rank) ? 1 : 0; }

}  // extern "C"

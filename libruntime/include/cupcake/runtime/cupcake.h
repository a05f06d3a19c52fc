/* The C API of the Cupcake runtime: a Session (cupcake/runtime/session.h) behind an opaque
 * handle, for jobs and bindings that are not C++. Every function returns 0 on success and a
 * non-zero cupcake_status otherwise; cupcake_last_error() then says what went wrong, and
 * cupcake_last_error_printed_by(rank) whether this rank prints it (an error every rank gets alike
 * is printed by one rank).
 *
 * Use (MPI: initialize with MPI_Init_thread, at least MPI_THREAD_SERIALIZED):
 *   cupcake_session_options o = {0};  (defaults: MPI on MPI_COMM_WORLD, nothing checked, 60 s)
 *   cupcake_session* s;
 *   if (cupcake_session_create_with_options("plan.pb", &o, &s)) die(cupcake_last_error());
 *   cupcake_session_register(s, "fc.weight", grad0, n0);  ... in plan order
 *   each step: cupcake_session_gradient_ready(s, i) from the backward hooks;
 *              cupcake_session_synchronize(s);
 *   cupcake_session_destroy(s);
 * Every function on a session is named cupcake_session_*, as the recorder's are
 * cupcake_recorder_*. The earlier names (cupcake_register, cupcake_session_create_ex, ...) are
 * kept for one release as deprecated aliases at the end of this header.
 * Thread-safety: one thread at a time per session; cupcake_last_error is per thread. */
#ifndef CUPCAKE_RUNTIME_CUPCAKE_H_
#define CUPCAKE_RUNTIME_CUPCAKE_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the aliases kept for one release; the compiler names the replacement. */
#if defined(__GNUC__) || defined(__clang__)
#define CUPCAKE_DEPRECATED(replacement) __attribute__((deprecated("use " replacement)))
#else
#define CUPCAKE_DEPRECATED(replacement)
#endif

/* The codes of cupcake::StatusCode. */
typedef enum {
  CUPCAKE_OK = 0,
  CUPCAKE_INVALID_ARGUMENT = 1,
  CUPCAKE_NOT_FOUND = 2,
  CUPCAKE_ALREADY_EXISTS = 3,
  CUPCAKE_FAILED_PRECONDITION = 4,
  CUPCAKE_DATA_LOSS = 5,
  CUPCAKE_UNAVAILABLE = 6,
  CUPCAKE_DEADLINE_EXCEEDED = 7,
  CUPCAKE_INTERNAL = 8
} cupcake_status;

typedef struct cupcake_session cupcake_session;

/* Where a session's collectives run. */
typedef enum {
  /* Host memory over MPI: `mpi_comm` points to the job's MPI_Comm (NULL: MPI_COMM_WORLD), which
   * the session duplicates. The plan's world size must be the communicator's size. */
  CUPCAKE_BACKEND_MPI = 0,
  /* GPU memory over NCCL on the current CUDA device (one per rank), for a plan whose device is
   * gpu. NCCL's id travels over `mpi_comm` (NULL: MPI_COMM_WORLD); with `mpi_comm` NULL and MPI
   * not initialized, a group of one rank (no launcher needed). Gradients are registered with
   * cupcake_session_register_device. On a machine without a GPU: CUPCAKE_FAILED_PRECONDITION,
   * "cupcake_session_create_with_options: NCCL communicator: no CUDA device found; ...". */
  CUPCAKE_BACKEND_NCCL = 1,
  /* GPU memory on a NCCL communicator the job owns: `nccl_comm` points to its ncclComm_t (the
   * runtime makes its own of it with ncclCommSplit; every rank calls create;
   * NcclCommunicatorFromHandle in cupcake/comm/nccl.h). */
  CUPCAKE_BACKEND_NCCL_COMM = 2
} cupcake_backend;

/* What a session is made with. All zero (`cupcake_session_options o = {0};`) is the defaults. */
typedef struct cupcake_session_options {
  /* A cupcake_backend; CUPCAKE_BACKEND_MPI by default. An int, so that a value that is none of
   * them can be held (and reported) in C++ as in C. */
  int backend;
  /* MPI, NCCL: points to the job's MPI_Comm; NULL: MPI_COMM_WORLD. */
  const void* mpi_comm;
  /* NCCL_COMM: points to the job's ncclComm_t (required there). */
  const void* nccl_comm;
  /* NCCL, NCCL_COMM: the cudaStream_t the job computes gradients on; NULL: the legacy default
   * stream. Must be NULL for MPI. */
  void* job_stream;
  /* Checked against the plan's; NULL or "": not checked. */
  const char* compressor;
  const char* model_fingerprint;
  /* Microseconds cupcake_session_synchronize waits for missing gradients before it gives up
   * (SessionOptions::ready_timeout_us: the same unit in C++, C and Python); 0: the default,
   * 60 s; negative or not finite: CUPCAKE_INVALID_ARGUMENT. */
  double ready_timeout_us;
} cupcake_session_options;

/* Loads the plan at `plan_path` and makes a session as `options` say (NULL: the defaults). On
 * success *out owns the session. Errors start with the function's name, e.g.
 * "cupcake_session_create_with_options: options.backend: unknown backend; got 7, ...". */
int cupcake_session_create_with_options(const char* plan_path, const cupcake_session_options* options,
                                        cupcake_session** out);

/* Registers the next float32 gradient buffer (plan order). Name and size must match the plan. */
int cupcake_session_register(cupcake_session* session, const char* name, float* data, int64_t numel);
/* The same for a GPU session: `device_data` is CUDA device memory. */
int cupcake_session_register_device(cupcake_session* session, const char* name, float* device_data, int64_t numel);
/* Tensor `tensor` (plan order) has its gradient for this step. */
int cupcake_session_gradient_ready(cupcake_session* session, int tensor);
/* Waits until every gradient is the average over ranks. */
int cupcake_session_synchronize(cupcake_session* session);
/* Non-zero: gradient accumulation steps, no synchronization until called again with 0. */
int cupcake_session_set_accumulating(cupcake_session* session, int accumulating);
/* Several plans (a ladder file's rungs, or plans added with Session::AddPlan): how many, which
 * one is active, and a switch to plan `index` from the next step. The switch is collective and
 * between steps only; each element's error feedback carries over. */
int cupcake_session_plan_count(const cupcake_session* session, int* count);
int cupcake_session_active_plan(const cupcake_session* session, int* index);
int cupcake_session_switch_plan(cupcake_session* session, int index);

/* GraVAC (docs/ADAPTIVE.md; Session::EnableGravac): the ratio chosen per window of `window`
 * steps among a ladder's rungs. Collective, between steps, the same options on every rank.
 * A field left 0 takes its default (options NULL: every default). */
typedef struct cupcake_gravac_options {
  int window;  /* steps per decision, >= 1; default 500 */
  double epsilon;  /* gain threshold in (0, 1]; default 0.7 */
  double omega;  /* saturation threshold in [0, 1); default 0.01 */
  double measured_tolerance;  /* >= 0; default 0.1 */
  int probe_every;  /* the gain measured on every probe_every-th step of a window; default 1 */
} cupcake_gravac_options;
int cupcake_session_enable_gravac(cupcake_session* session, const cupcake_gravac_options* options);
/* One window's decision (GravacDecision), the same on every rank; ratios: 1 is the fp32 rung. */
typedef struct cupcake_gravac_decision {
  uint64_t step; /* the window's first step */
  int steps;
  double ratio; /* the rung sent */
  double ratio_min, ratio_c; /* the rungs probed */
  double gain_min, gain_c;
  double predicted_ms, measured_ms;
  int64_t bytes_sent; /* this rank's */
  double probe_ms; /* the controller's cost per step on this rank */
  double next_ratio; /* the rung of the next window */
  int64_t groups_skipped; /* probed groups left out of the gains (g_ef not finite), all ranks */
} cupcake_gravac_decision;
int cupcake_session_decision_count(const cupcake_session* session, int* count);
int cupcake_session_decision(const cupcake_session* session, int index, cupcake_gravac_decision* out);
/* Destroys the session; NULL is ignored. */
void cupcake_session_destroy(cupcake_session* session);

/* Record mode (cupcake/runtime/recorder.h): with no plan, measures gradient-ready times on a
 * steady clock and writes them as a cupcake.model.v1 file. Register in gradient-ready order;
 * each iteration: cupcake_recorder_begin_backward, then cupcake_recorder_gradient_ready(r, i)
 * for i = 0, 1, ...; then, with several ranks, cupcake_recorder_merge on every rank, and
 * cupcake_recorder_write on rank 0. Optional per iteration, for the model's forward_us and
 * update_us: cupcake_recorder_begin_forward before begin_backward, and
 * cupcake_recorder_end_iteration after the optimizer step. */
typedef struct cupcake_recorder cupcake_recorder;
int cupcake_recorder_create(const char* model_name, cupcake_recorder** out);
/* On a GPU: the gaps are the device's busy time of the work launched between the marks, from
 * CUPTI activity records (RecorderOptions::activity in recorder.h), not the host clock.
 * CUPCAKE_FAILED_PRECONDITION when the build has no CUPTI or another CUPTI source exists. */
int cupcake_recorder_create_cupti(const char* model_name, cupcake_recorder** out);
int cupcake_recorder_register(cupcake_recorder* recorder, const char* name, int64_t numel);
/* The same with the tensor's shape (`dims` dimensions at `shape`, their product `numel`), which
 * the model records for PowerSGD (Recorder::Register). */
int cupcake_recorder_register_shape(cupcake_recorder* recorder, const char* name, int64_t numel, const int64_t* shape,
                                    int dims);
int cupcake_recorder_begin_forward(cupcake_recorder* recorder);
int cupcake_recorder_begin_backward(cupcake_recorder* recorder);
int cupcake_recorder_end_iteration(cupcake_recorder* recorder);
int cupcake_recorder_gradient_ready(cupcake_recorder* recorder, int tensor);
/* Optional, for naturally sparse gradients: one sample of tensor `tensor`'s density, the share of
 * its `numel` float32 values at `grad` (host memory) that are non-zero (Recorder::SampleDensity). */
int cupcake_recorder_sample_density(cupcake_recorder* recorder, int tensor, const float* grad, int64_t numel);
/* A collective over MPI (`mpi_comm` points to the job's MPI_Comm, NULL: MPI_COMM_WORLD; the
 * runtime duplicates it): every rank calls it; afterwards every rank holds the same model, per
 * tensor the slowest rank's ready time (cupcake/runtime/recorder.h says why). */
int cupcake_recorder_merge(cupcake_recorder* recorder, const void* mpi_comm);
/* Writes the model (medians of the completed iterations, merged if merged) to `path` atomically. */
int cupcake_recorder_write(cupcake_recorder* recorder, const char* path);
/* Destroys the recorder; NULL is ignored. */
void cupcake_recorder_destroy(cupcake_recorder* recorder);

/* Checkpoints in host memory (cupcake/runtime/checkpoint.h, docs/CHECKPOINT.md): a snapshot
 * every step in /dev/shm/cupcake-<name>-<rank> (two slots, copied in the background), restored
 * after a restart from the newest step every rank holds; optionally persisted to a directory.
 *   cupcake_checkpoint_options o = {0};  o.name = "job";
 *   cupcake_checkpointer* c;  cupcake_checkpointer_create(&o, &c);
 *   cupcake_checkpointer_add(c, "weights", w, bytes, CUPCAKE_CHECKPOINT_SHARED);  ...  (the same
 *                                                        entries after a restart)
 *   cupcake_checkpointer_attach_session(c, s);           (optional: its error feedback)
 *   cupcake_checkpointer_restore(c, &start);             (collective; 0: a fresh job)
 *   each step, after the optimizer step: cupcake_checkpointer_commit(c, step);  (collective)
 *   before the next optimizer step writes the entries: cupcake_checkpointer_wait(c); */
typedef struct cupcake_checkpointer cupcake_checkpointer;
/* One idle network gap of the attached session's plan and the replica chunk sent in it
 * (Checkpointer's ReplicaGap; cupcake-plan show --format json's replica_schedule.gaps). */
typedef struct cupcake_replica_gap {
  int after_group;  /* -1: before the first collective (the commit's exchange); k: after group k's */
  int64_t bytes;  /* the chunk; 0: none */
} cupcake_replica_gap;
typedef struct cupcake_checkpoint_options {
  const char* name;  /* segment and file names; NULL or "": "job" */
  const char* persist_dir;  /* NULL or "": no persisted snapshots */
  int persist_every;  /* persist every this many steps; 0: never */
  const void* mpi_comm;  /* points to the job's MPI_Comm (duplicated); NULL: MPI_COMM_WORLD */
  int replicate;  /* non-zero: each rank's own entries also go to ranks on other hosts (>= 2 ranks) */
  int64_t replica_chunk_bytes;  /* replicas sent in chunks of this size, one per commit; 0: whole */
  int replica_group_hosts;  /* hosts per group that back each other up (Gemini's m); 0: 2 */
  /* replica_gap_count gaps in increasing after_group, the chunks between the attached session's
   * collectives (replicate; attach the session before the first commit); NULL and 0: none. */
  const cupcake_replica_gap* replica_gaps;
  int replica_gap_count;
  int replica_max_commits; /* the most commits a replica stream may take; 0: no bound */
} cupcake_checkpoint_options;
int cupcake_checkpointer_create(const cupcake_checkpoint_options* options, cupcake_checkpointer** out);
/* cupcake_checkpointer_add's flags, or'ed. */
typedef enum {
  /* Copied inside commit (memory written before the next optimizer step), else in the background. */
  CUPCAKE_CHECKPOINT_AT_COMMIT = 1,
  /* The same bytes on every rank at every commit (data parallelism: parameters, optimizer state):
   * replicas leave it out, and a rank whose host lost its memory takes it from another rank, the
   * snapshot then verified against its own checksum (Scope::kShared). Else this rank's own. */
  CUPCAKE_CHECKPOINT_SHARED = 2
} cupcake_checkpoint_flag;
/* The next entry: `bytes` bytes of host memory at `data`; `flags`: cupcake_checkpoint_flag values
 * or'ed (0: copied in the background, this rank's own). */
int cupcake_checkpointer_add(cupcake_checkpointer* checkpointer, const char* name, void* data, int64_t bytes,
                             int flags);
/* Includes the session's state: error-feedback memory, momentum, PowerSGD's, the active plan and
 * GraVAC's (Checkpointer::AttachSession; after cupcake_session_enable_gravac). NULL:
 * detaches. */
int cupcake_checkpointer_attach_session(cupcake_checkpointer* checkpointer, cupcake_session* session);
int cupcake_checkpointer_commit(cupcake_checkpointer* checkpointer, int64_t step);
/* Waits for the background copy of the last commit (not for a persist still writing its file,
 * nor for the replica exchanges, which the next commit waits for). */
int cupcake_checkpointer_wait(cupcake_checkpointer* checkpointer);
/* *step: the step restored, 0 for a fresh job (nothing written). */
int cupcake_checkpointer_restore(cupcake_checkpointer* checkpointer, int64_t* step);
/* Deletes rank `rank`'s segment of job `name`; 0 when there is none. */
int cupcake_checkpointer_remove_segment(const char* name, int rank);
/* Waits for the copy and the persist in progress and destroys the checkpointer (the segment stays);
 * NULL is ignored. */
void cupcake_checkpointer_destroy(cupcake_checkpointer* checkpointer);

/* The message of the last failed call on this thread ("" if none); valid until the next call. */
const char* cupcake_last_error(void);
/* Which rank of the job prints the last failed call's error on this thread (C++:
 * Status::reporter), so that a job shows it once. CUPCAKE_ANY_RANK: this rank's own failure (a
 * NULL argument, a gradient of the wrong size), printed by the rank that got it; also when no
 * call has failed. A rank r >= 0: every rank got this error, having checked the same input alike
 * or agreed on it (a plan for another world size, ranks with different plans, from
 * cupcake_session_create_with_options): rank r prints it and the others stay quiet; since every
 * rank failed alike, they can all end with MPI_Finalize rather than abort the job. */
#define CUPCAKE_ANY_RANK (-1)
int cupcake_last_error_reporter(void);
/* Non-zero when rank `rank` prints the last failed call's error on this thread: a call failed,
 * and its reporter is `rank` or CUPCAKE_ANY_RANK (C++: Status::PrintedBy). The idiom:
 *   if (cupcake_session_create_with_options(path, &o, &s)) {
 *     if (cupcake_last_error_printed_by(rank)) fprintf(stderr, "%s\n", cupcake_last_error());
 *     ...  } */
int cupcake_last_error_printed_by(int rank);

/* Deprecated aliases, kept for one release (libruntime/README.md lists them). They behave as
 * before; their errors still start with their own names. */
/* = cupcake_session_create_with_options with backend MPI on `mpi_comm`. */
CUPCAKE_DEPRECATED("cupcake_session_create_with_options")
int cupcake_session_create(const char* plan_path, const void* mpi_comm, cupcake_session** out);
/* The same with compressor and fingerprint checks; `ready_timeout_s` is in seconds (<= 0: the
 * default), where the options struct's ready_timeout_us is in microseconds. */
CUPCAKE_DEPRECATED("cupcake_session_create_with_options")
int cupcake_session_create_ex(const char* plan_path, const void* mpi_comm, const char* compressor,
                              const char* model_fingerprint, double ready_timeout_s, cupcake_session** out);
/* = backend NCCL. */
CUPCAKE_DEPRECATED("cupcake_session_create_with_options")
int cupcake_session_create_nccl(const char* plan_path, const void* mpi_comm, void* job_stream, cupcake_session** out);
/* = backend NCCL_COMM. */
CUPCAKE_DEPRECATED("cupcake_session_create_with_options")
int cupcake_session_create_nccl_comm(const char* plan_path, const void* nccl_comm, void* job_stream,
                                     cupcake_session** out);
CUPCAKE_DEPRECATED("cupcake_session_register")
int cupcake_register(cupcake_session* session, const char* name, float* data, int64_t numel);
CUPCAKE_DEPRECATED("cupcake_session_register_device")
int cupcake_register_device(cupcake_session* session, const char* name, float* device_data, int64_t numel);
CUPCAKE_DEPRECATED("cupcake_session_gradient_ready")
int cupcake_gradient_ready(cupcake_session* session, int tensor);
CUPCAKE_DEPRECATED("cupcake_session_synchronize")
int cupcake_synchronize(cupcake_session* session);
CUPCAKE_DEPRECATED("cupcake_session_set_accumulating")
int cupcake_set_accumulating(cupcake_session* session, int accumulating);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CUPCAKE_RUNTIME_CUPCAKE_H_ */

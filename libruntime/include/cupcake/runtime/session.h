// Session: executes a plan (docs/MODEL.md, libruntime/README.md) in a data-parallel job.
//
// The job registers its float32 gradient buffers in plan order, calls GradientReady(i) from its
// backward hooks and Synchronize() before the optimizer step; afterwards every registered
// gradient holds the average over ranks (exactly, for fp32; within the compressor's semantics
// otherwise, kernels/README.md). A group is encoded (error feedback included) when its last
// tensor becomes ready, the groups' collectives run in group order while backward goes on, and
// Synchronize() decodes them in group order into the registered buffers.
//
// Memory: a group works directly on the registered memory when that is one buffer (a one-tensor
// group, or buffers adjacent in plan order); other groups have a fusion buffer. Lossless groups
// (fp32, or uncompressed, with no error-feedback memory) run their allreduce in place and decode
// by dividing by W. Over a communicator whose memory() is kDevice (NCCL) the plan's device must
// be gpu, the job registers device pointers (RegisterDevice), everything runs on the session's
// CUDA streams behind the job's stream (SessionOptions::job_stream), and the job's streams must
// not write gradient i from GradientReady(i) until Synchronize() returns.
//
// Several plans: AddPlan adds plans for the same model and world (e.g. the compressor at
// another ratio); SwitchPlan(index) makes one active between steps, the same on every rank.
// Per-element compressor state (error-feedback memory, PowerSGD's too, momentum) carries element
// by element to the new plan; ReadState/WriteState read and write it as a whole in model
// element order.
//
// Ownership: a Session owns its communicator, fusion and payload buffers, compressors and their
// state, all allocated at creation, AddPlan or registration; GradientReady and Synchronize
// neither allocate nor log on success, except zen groups on host memory (ZenAllreduce's
// exchange buffers) and a zen_sparse group's GradientReady when a step has more non-zeros than
// twice the plan's expected count and any step before. It does not own the gradient buffers.
// No globals: several sessions in one process work.
// Thread-safety: every call from one thread at a time (the job's backward hooks and training
// loop). All ranks make the same sequence of synchronizing steps and collective calls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/cupcake.pb.h"
#include "cupcake/proto/clock.h"
#include "cupcake/proto/status.h"

namespace cupcake::runtime {

// The clock waits read (proto/clock.h), passed in so tests run on a fake one.
using ::cupcake::Clock;
using ::cupcake::SteadyClock;

struct SessionOptions {
  // Where waits read the time; nullptr: a SteadyClock the session owns. Not owned.
  Clock* clock = nullptr;
  // Synchronize() fails when the step's gradients have not all become ready and been exchanged
  // within this many microseconds of its call, naming the missing tensors.
  double ready_timeout_us = 60e6;
  // What the job expects; empty: not checked. The compressor name must equal the plan's; the
  // fingerprint (cupcake::ModelFingerprint of the job's model) the plan's model fingerprint.
  std::string compressor;
  std::string model_fingerprint;
  // Prefixes the messages about the plan; empty: the plan file's path (or "plan").
  std::string origin;
  // Sessions on GPU memory: the cudaStream_t the job computes its gradients on (nullptr: the
  // legacy default stream). When a group completes, its pack and encode wait (a CUDA event, not
  // the host) for the work queued on this stream so far, so a backward hook may call
  // GradientReady(i) as soon as it has queued gradient i's last kernel.
  void* job_stream = nullptr;
  // Host sessions: record when each group's encode (pack included), collective and decode
  // (unpack included) started and ended, on `clock`, for Timeline(): what the runtime did,
  // beside what the plan predicted. Off, a step reads no extra clock times.
  bool record_timeline = false;
  // Sessions on GPU memory: each group's pack and encode, and its decode and unpack, with the
  // event waits and records around them, are captured into a CUDA graph in the first step and
  // replayed (one launch each) in later ones. Groups whose kernels take the iteration (randk,
  // qsgd and terngrad encode, randk decode) are always queued directly. Off: always directly.
  bool device_graphs = true;
  // Self-check: per window of `drift_window` steps of one plan (the first window after creation
  // or a switch is warm-up and not judged), the median time from the step's first GradientReady
  // to the end of its Synchronize against the active plan's prediction for the same span (the
  // last group's decode end minus tensor 0's backward time, docs/MODEL.md). When they differ by
  // more than `drift_threshold` (a fraction; 0: never) the session warns once: the message goes
  // to `on_warning` (nullptr: stderr, rank 0 only) and to warnings() on every rank.
  int drift_window = 50;
  double drift_threshold = 0.2;
  std::function<void(const std::string&)> on_warning;
};

// GraVAC (docs/ADAPTIVE.md): the compression ratio chosen during training among the plans of a
// ladder, from the compression gain of the gradients and the rungs' iteration times.
struct GravacOptions {
  int window = 500;  // steps per decision, >= 1
  double epsilon = 0.7;  // gain threshold, in (0, 1]
  double omega = 0.01;  // saturation threshold, in [0, 1)
  // A rung's system time is its plan's predicted iteration time, replaced by the measured one
  // once the rung has run a window and the two differ by more than this fraction (>= 0).
  double measured_tolerance = 0.1;
  // The gain probe runs on every probe_every-th step of a window (its first step, then every
  // probe_every-th): the gains are ratios of sums, so fewer steps estimate them with less of
  // the probe's cost. >= 1.
  int probe_every = 1;
};

// One window of GraVAC, the same on every rank (ratios: 1 is the fp32 rung).
struct GravacDecision {
  uint64_t step = 0;  // the window's first step (iteration())
  int steps = 0;
  double ratio = 1;  // the rung sent during the window
  double ratio_min = 0, ratio_c = 0;  // the rungs probed: cf_min's and the candidate's
  // Compression gains over the window and all ranks: sum ||C(g_ef)||^2 / sum ||g_ef||^2 at
  // ratio_min, and of the candidate compressing that output further (multi-level).
  double gain_min = 0, gain_c = 0;
  // Probed groups left out of the gains over the window and all ranks: their g_ef was not finite
  // (a NaN or infinite gradient or residual); the gains are over the other groups.
  int64_t groups_skipped = 0;
  double predicted_ms = 0;  // the sent rung's plan
  double measured_ms = 0;  // mean iteration time over the window's steps and the ranks
  int64_t bytes_sent = 0;  // this rank's payload bytes over the window
  double probe_ms = 0;  // the controller's own cost per step on this rank (gain probe)
  double next_ratio = 1;  // the rung sent in the next window
};

// What one group did in the last synchronized step, in microseconds on the session's clock:
// the same six times a plan predicts per group (pb::Group's *_us), measured.
struct GroupTimeline {
  double encode_start_us = 0, encode_end_us = 0;
  double comm_start_us = 0, comm_end_us = 0;
  double decode_start_us = 0, decode_end_us = 0;
  // Zen groups: the indices in the ranks' summed union (how much their selections overlap, which
  // the planner assumes independent, docs/MODEL.md); 0 for other schemes.
  int64_t zen_union = 0;
};

// Compressor state kept across steps. Per element (kernels/compressor.h): the error-feedback
// memory (residual e; dgc's accumulator v; PowerSGD's e over its group's elements) or the
// momentum (dgc's u, signum's m). Per PowerSGD group (kernels/powersgd.h; its runner's own): the
// rest of its error-feedback memory, a batched group's padding (its padded square's floats after
// the group's n; none per tensor), and the warm-started Q (its compressed matrices',
// concatenated). So each float of the memory is in exactly one of the two.
enum class CompressorState { kErrorFeedback, kMomentum, kPowerSgdPadding, kPowerSgdQ };

// The session's own state beyond its compressors', for checkpoints, as doubles (exact for its
// counters too). kPlan: the active plan's index; with GraVAC then its controller's state (the
// rung sent, cf_min's, the candidate's, whether it explores, each rung's last measured time and
// gain) and the current window's steps so far. kGravacWindow (empty without GraVAC): this rank's
// part of the current window: its measured iteration times and their count, its bytes sent,
// the probe's gain sums and time, and for PowerSGD rungs the probe's warm-start Q.
enum class ControlState { kPlan, kGravacWindow };

// One gradient for Session::RegisterAll: its name and float32 buffer of `numel` elements (host
// memory, or CUDA device memory of the current device for a session on GPU memory).
struct GradientBuffer {
  std::string name;
  float* data = nullptr;
  int64_t numel = 0;
};

// One per-element plane of state (kErrorFeedback or kMomentum) and the buffer that
// Session::BeginStateRead reads it into: ReadState's size for it.
struct StateTarget {
  CompressorState which = CompressorState::kErrorFeedback;
  std::span<float> out;
};

// Session::BeginStateRead's read, made by another thread. Run it once, on any one thread, and
// run or destroy it before the session is destroyed (whose destructor waits for it).
class StateReader {
 public:
  class Impl;
  explicit StateReader(std::unique_ptr<Impl> impl);
  // Without Run: the session's waits end, and nothing is read.
  ~StateReader();
  StateReader(const StateReader&) = delete;
  StateReader& operator=(const StateReader&) = delete;
  // Copies the state group by group, in group order, into the targets (each as ReadState would
  // have read it at BeginStateRead); the session's waits for each group end as it is copied.
  Status Run();

 private:
  std::unique_ptr<Impl> impl_;
};

class Session {
 public:
  // Loads `plan_path` (validated by ReadPlanFile) and checks it against the communicator
  // (world size) and `options` (compressor, model fingerprint). Every mismatch is reported
  // together, one per line: `<plan>: world_size: does not match the job; got 4, expected 2
  // (ranks in the communicator)`.
  // A ladder file (docs/FORMATS.md) gives a session of several plans: its rungs in order, plan 0
  // the fp32 rung and active first (SwitchPlan changes rung); options.compressor is checked
  // against the compressed rungs, and messages name the rung (`l.pb: rungs[2].plan: ...`).
  // Collective: every rank of the communicator calls Create, also one whose plan turns out
  // invalid. Before any other collective the ranks compare their plans' fingerprints
  // (PlanFingerprint); when they differ every rank fails with InvalidArgument naming each plan,
  // its ranks and a file it was read from (`<plan>: the ranks run different plans; ...`), and
  // when some rank's own checks failed the others fail with FailedPrecondition naming it.
  static StatusOr<std::unique_ptr<Session>> Create(const std::string& plan_path,
                                                   std::unique_ptr<comm::Communicator> communicator,
                                                   const SessionOptions& options = {});
  // The same for a plan already in memory (validated here with ValidatePlan).
  static StatusOr<std::unique_ptr<Session>> Create(const pb::Plan& plan,
                                                   std::unique_ptr<comm::Communicator> communicator,
                                                   const SessionOptions& options = {});
  // Stops the communication thread. If a collective is still in progress (a peer never joined
  // it, or the session is dropped mid-step), it aborts the group first: the in-process group's
  // collectives fail; over MPI the job ends with a non-zero exit (MPI_Abort) instead of hanging.
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Registers the next gradient buffer in plan order (its index is the number registered
  // before). `name` and the size must match the plan's tensor: `<plan>: tensor 3: the job's
  // gradient is not the plan's; got 'fc.weight' with 100 elements (the job's gradient 3),
  // expected 'fc.bias' with 10 elements (the plan's model m)`. The buffer must stay valid while the
  // session uses it. From GradientReady(i) to the end of Synchronize() the session may read and
  // write gradient i's buffer (a lossless collective runs in place on it): the job leaves it
  // alone then.
  Status Register(const std::string& name, std::span<float> gradient);
  // The same for a session on GPU memory (its communicator's memory() is kDevice: NCCL): a
  // float32 gradient of `numel` elements in CUDA device memory of the current device (checked
  // with cudaPointerGetAttributes). Each kind of session refuses the other kind of memory:
  // `RegisterDevice: gradient 0 ('fc.bias'): device memory for a session on host memory; expected
  // Register (the communicator works on host memory)`.
  Status RegisterDevice(const std::string& name, float* device_gradient, int64_t numel);
  // Collective: registers every gradient of the job at once, in plan order, each checked as
  // Register (RegisterDevice on GPU memory) checks it, and their count: `<plan>: tensors: the
  // job has fewer gradients than the plan; got 8, expected 10 (...)`. Then the ranks agree on the
  // outcome as Create does on the plan: no rank goes on to a step another rank cannot take, a
  // rank whose gradients passed fails naming those that did not, and a failure every rank finds
  // alike (a plan for another model) is reported by the lowest of them (Status::reporter), so a
  // job prints it once. After a failure the session is failed. Call it once, with no gradient
  // registered before, on every rank.
  Status RegisterAll(std::span<const GradientBuffer> gradients);
  int registered() const;
  int tensor_count() const;
  int group_count() const;
  int rank() const;
  int world_size() const;
  // Bytes of the fusion buffers the registered gradients need (0 when every group works on
  // registered memory: one-tensor groups and groups whose buffers are adjacent).
  int64_t fusion_bytes() const;

  // Tensor i's gradient is final for this step. Encodes its group when it completes it.
  Status GradientReady(int i);
  // Waits for every group's collective, decodes and unpacks; the step's gradients then hold
  // the average over ranks. DeadlineExceeded after options.ready_timeout_us naming the missing
  // tensors (or, when this rank has them all, the group whose collective did not finish).
  // After an error the session is failed: every later call returns FailedPrecondition.
  Status Synchronize();

  // Gradient accumulation: while `accumulating` is true, GradientReady and Synchronize do
  // nothing (no encode, no collective, no change to the buffers or the error-feedback memory),
  // so the job accumulates locally; the next step with false synchronizes the sum. Set between
  // steps, the same on every rank.
  Status SetAccumulating(bool accumulating);

  // The last synchronized step's timeline, one entry per group of the active plan
  // (SessionOptions::record_timeline). FailedPrecondition when not recording, on a session on GPU memory (not
  // built there yet), or before the first step.
  StatusOr<std::vector<GroupTimeline>> Timeline() const;

  // Called on the session's communication thread each time group `group` of plan `plan` (the
  // AddPlan index; Create's is 0) has finished its collective: after that collective returned
  // and before the thread starts the next group's, and before Synchronize can see the group
  // done. So when it runs, no other collective of this session is in flight on this rank, and
  // every rank calls it at the same point of the same plan's group order (checkpoint replicas in
  // the idle gaps between collectives, docs/CHECKPOINT.md). `next_waiting`: this rank's next
  // group of the step is already encoded and waits for the network (the step runs behind its
  // plan: the gap after `group` has closed); false after the step's last group. It must return at
  // once (hand work to a thread of its own) and call nothing of the session.
  using AfterCollective = std::function<void(int plan, int group, bool next_waiting)>;
  // Sets the hook (an empty function removes it). Between steps. Host sessions only: on GPU
  // memory the collectives are queued on CUDA streams, with no thread between them
  // (FailedPrecondition).
  Status SetAfterCollective(AfterCollective hook);

  // Synchronized steps so far (the iteration that keys the compressors' random choices).
  uint64_t iteration() const;
  // Sets that counter, for checkpoints: a restarted session then draws the random choices (randk,
  // qsgd, terngrad) the lost one would have. Between steps. With GraVAC the current window's
  // steps so far are the ones before `iteration` (InvalidArgument when it is smaller).
  Status SetIteration(uint64_t iteration);

  // Adds another plan for this session's model (same tensors, fingerprint) and world, checked
  // and agreed on across ranks as in Create; returns its index (Create's plan is 0). It is
  // allocated now (and its fusion buffers, once every gradient is registered), not active.
  // SessionOptions::compressor is not checked: an added plan may use another compressor.
  // Collective: every rank adds the same plans in the same order, between steps.
  StatusOr<int> AddPlan(const std::string& plan_path);
  StatusOr<int> AddPlan(const pb::Plan& plan, const std::string& origin = "");
  // Makes plan `index` active from the next step. Between steps only: in the middle of one
  // (or on a failed session) it fails with FailedPrecondition at once, with no collective (as
  // AddPlan). Collective: the ranks agree on the plan as in Create (every rank fails
  // alike when they name different plans). Element e's error-feedback memory and momentum in
  // the old plan become element e's in the new one; where the new plan's compressor keeps no
  // such state it is dropped, and where the old one kept none the new one starts from zero.
  // Hierarchical groups keep state for this rank's shard of the node's sum only (elements
  // l * shard .. (l + 1) * shard - 1 of the group on local rank l): those elements carry; the
  // others read as zero (that residual is of the node's sum and carries as it is). PowerSGD
  // groups' error feedback carries as well; their warm-start Q is not per element and restarts
  // from its seeded first draw in the new plan (the same on every rank), as in a fresh session.
  // Random choices are keyed by iteration(), which goes on across plans.
  Status SwitchPlan(int index);
  int plan_count() const;
  int active_plan() const;
  // State `which`, for checkpoints: per element, the active plan's in model element order (one
  // float per element of every tensor, 0 where a group keeps none; a PowerSGD group's error
  // feedback over its elements); PowerSGD's, that part of every PowerSGD group's state (a
  // batched group's padding, or its Q) in plan, then group order, of every plan, empty when there
  // is none. Write sets it (the same layout, the same size). Between steps only; on GPU memory a
  // synchronous copy.
  StatusOr<std::vector<float>> ReadState(CompressorState which = CompressorState::kErrorFeedback) const;
  // The same into `out`, which must hold exactly that many floats (else an error naming both
  // sizes): a checkpoint reads it every step into one buffer, where a new vector of the model's
  // size would be allocated and faulted in, page by page, each time.
  Status ReadState(std::span<float> out, CompressorState which = CompressorState::kErrorFeedback) const;
  // Whether any of the session's plans keeps that state in any group (the same on every rank);
  // false: ReadState gives zeros (PowerSGD's: nothing), on every rank.
  bool KeepsState(CompressorState which) const;
  Status WriteState(std::span<const float> values, CompressorState which = CompressorState::kErrorFeedback);
  // A read of per-element state that another thread makes while the job goes on with its next
  // step: a checkpoint's copy thread takes the error feedback off the training thread. Between
  // steps, like ReadState; each target's plane per element (else InvalidArgument) and its buffer
  // ReadState's size (else the same error as ReadState's), valid until Run ends. On host memory
  // the returned reader's Run copies the active plan's state, and until it has, the session holds
  // back what would change it: the GradientReady that encodes group k waits until Run has copied
  // group k, and ReadState, WriteState, AddPlan, SwitchPlan, EnableGravac, WriteControlState and
  // the destructor wait until Run has ended (or the reader is destroyed unrun). Synchronize's
  // GraVAC switch follows every group's encode. On GPU memory the read is made here,
  // synchronously (ReadState), and Run has nothing left to do.
  StatusOr<std::unique_ptr<StateReader>> BeginStateRead(std::vector<StateTarget> targets);
  // State `which` (ControlState), for checkpoints; its size is fixed by the plans added and
  // whether GraVAC is enabled. Write sets it (the same size): kPlan makes its plan active as
  // SwitchPlan does but without the agreement (every rank writes the same values: a snapshot's
  // of one step), and GraVAC's window goes on from the steps it holds. Values that are not this
  // session's (a rung or plan out of range) are refused naming them. Between steps only.
  StatusOr<std::vector<double>> ReadControlState(ControlState which) const;
  Status WriteControlState(std::span<const double> values, ControlState which);

  // Hands the choice of plan to GraVAC: the session's plans must be a ladder (plan 0 fp32, then
  // one ratio-selecting compressor, topk, randk or dgc, at decreasing ratios, or PowerSGD rungs
  // at decreasing ranks; Create with a ladder file gives that), on host memory, every group flat
  // (or powersgd). From the next step every group's encode also measures the compression gain (a
  // pass over the group's gradient plus its error-feedback memory and a selection, or for PowerSGD
  // rungs one power iteration: the controller's cost, GravacDecision::probe_ms);
  // at the end of every window's last Synchronize the ranks exchange their sums (one allgather
  // of a few doubles) and take the same decision, switching plans as SwitchPlan does (state
  // carries element by element) without another agreement. The fp32 rung runs the first window.
  // Collective: every rank calls it between the same steps with the same options (checked).
  Status EnableGravac(const GravacOptions& options);
  // Every window's decision so far, in order (empty without EnableGravac).
  const std::vector<GravacDecision>& decisions() const;
  // The warnings the session gave (the drift self-check), in order.
  const std::vector<std::string>& warnings() const;

  class Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The seed group `group` of a plan with compressor seed `plan_seed` uses on `rank`. Payloads
// that are summed (allreduce compressors: randk) need the same random choices on every rank;
// the others (qsgd, terngrad) round independently per rank:
//   seed = plan_seed + group * 0x9E3779B97F4A7C15 (+ rank, for allgather compressors).
// A zen group's owner hash (docs/ZEN.md) uses the low 32 bits of the shared form (no rank).
uint64_t GroupSeed(uint64_t plan_seed, int group, int rank, bool allreduce);

}  // namespace cupcake::runtime

// The data-parallel training loop every example job shares, apart from what computes its
// gradients: the LibTorch jobs (training_job.h) and the replay job (bench/replay/, a recorded
// model's times played on an emulated accelerator) both run it, so an iteration, record mode,
// the timing file and the check that the ranks agree are the same for all of them.
//
//   record:  CUPCAKE_RECORD=model.json [CUPCAKE_RECORD_ITERATIONS=20] mpirun -np 4 JOB
//   train:   mpirun -np 4 JOB --plan plan.pb [--epochs 5] [--steps 10] [--warmup N]
//                [--timing FILE.json] [--timeline FILE.json] [--adapt W] [job's own flags]
//
// One iteration: the forward mark, LoopBody::Forward, the backward mark, LoopBody::Backward
// (which makes every gradient ready in gradient-ready order through the loop's callback:
// Session::GradientReady, or Recorder::GradientReady in record mode), Synchronize, the
// checkpoint's copy wait, LoopBody::Step (the update, with the averaged gradients in the
// registered buffers), the checkpoint's commit and the end mark; then, untimed,
// LoopBody::BetweenIterations. The iteration's time runs from the forward mark to the end mark.
// With --blocking-save the save comes after LoopBody::Step, every --save-every steps.
// Record mode does the same with a Recorder and, after each iteration, samples every
// gradient's share of non-zeros from the registered buffers.
//
// After record mode's iterations, collectively: LoopBody::Report (its text is not written),
// then the recording. After training, collectively: LoopBody::RanksAgree, every iteration's slowest-rank time
// (allreduce max), LoopBody::Report; rank 0 writes `--timing` (every iteration's time, the
// losses, whether the ranks agree, the body's extra keys) and `--timeline` (the runtime's
// groups in the last iteration beside the iteration's marks) and prints the median. The job
// exits 1 when the ranks do not agree.
//
// The phases of an iteration, between its consecutive marks, so that a rank's phases sum to its
// iteration's time: `forward`, `backward` (LoopBody::Backward, the gradients' encodes and the
// collectives started inside it), `synchronize` (the collectives still running), `copy_wait`
// (the checkpoint's copy of the previous step), `step` (LoopBody::Step and --blocking-save's
// save) and `commit` (the checkpoint's Commit). The timing file's `phases_us` holds each phase's
// time per iteration on the rank slowest in that phase (so the phases of one iteration may sum
// to more than its time), and rank 0 prints their medians past the warm-up.
//
// Durable checkpoints (--persist-every, --blocking-save): the loop notes, per step written to
// storage, how long after the end of that step's iteration it knew the write durable. A blocking
// save is durable before its iteration ends (0). The Checkpointer writes step s's file in the
// background after Commit(s), possibly into later iterations, and its
// Checkpointer::persisted_step() reaches s once the file is written: the loop looks at the
// synchronized mark of each later iteration (an upper bound: it was durable earlier) and, for
// files still being written after the last iteration, waits for them. The timing file lists them (`durable_steps`,
// `durable_after_ms`, the slowest rank's) and rank 0 prints a summary line.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/proto/clock.h"
#include "cupcake/proto/status.h"
#include "cupcake/runtime/checkpoint.h"
#include "cupcake/runtime/recorder.h"
#include "cupcake/runtime/session.h"

namespace cupcake::examples {

struct LoopFlags {
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
  // --persist-chunk-bytes B: each persist written in pieces of B bytes in the idle time between the
  // session's collectives (a NetworkGate on its communicator; CheckpointOptions::persist_chunk_bytes).
  int persist_chunk_bytes = 0;
  int crash_at = 0;  // --crash-at STEP: the process ends (_Exit(3)) right after commit(STEP), a crash for tests
  // --replicate [--replica-chunk-bytes N | --replica-gaps G:B,...] [--replica-group-hosts M]
  // [--replica-max-commits K]: replicas on other hosts, streamed in chunks between the session's
  // collectives (a NetworkGate on its communicator): one per commit, or one in each listed idle
  // gap of the plan (after group G, -1 before the first; CheckpointOptions::replica_gaps); each
  // within K commits (CheckpointOptions::replica_max_commits; 0: no bound).
  bool replicate = false;
  int replica_chunk_bytes = 0;
  std::vector<runtime::ReplicaGap> replica_gaps;
  int replica_group_hosts = 2;
  int replica_max_commits = 0;
  std::string weights_path;  // --weights FILE: each rank writes its parameters' bytes to FILE-rank<r>
  // --blocking-save DIR --save-every N: the baseline --persist-every is measured against
  // (docs/CHECKPOINT.md): every N steps, after the update, rank 0 writes the whole state to one
  // file in DIR durably while the other ranks wait (LoopSetup::save). Not with --checkpoint.
  std::string blocking_save_dir;
  int save_every = 0;

  bool recording() const { return !record_path.empty(); }
  int iterations() const { return recording() ? record_iterations : epochs * steps; }
  int steps_per_epoch() const { return recording() ? record_iterations : steps; }
};

// A job's own flag `flag value`: nullopt when `flag` is not the job's, "" when taken, else the
// problem (`--x: got 'y', expected ...`).
using JobFlagParser = std::function<std::optional<std::string>(const std::string& flag, const char* value)>;

// What a job tells the shared flag parser and usage text about itself.
struct JobFlags {
  JobFlagParser parse;  // may be empty
  // The shared flags this job has no use for: giving one is a usage error naming the job.
  std::vector<std::string> unsupported;
  // The usage lines of the job's own flags, and the flags the job requires; appended to the
  // shared usage.
  std::string usage;
};

// Parses argv (after MPI took its own arguments) and the record-mode environment into `flags`;
// the problem, or "" when the command line is good.
std::string ParseLoopFlags(int argc, char** argv, const JobFlags& job_flags, LoopFlags& flags);
// Prints `job: problem` and the usage to stderr on rank 0 of the job (every rank parses the
// same command line: printed once per job); returns 2 (main's exit code for usage errors).
int UsageError(const std::string& job, const std::string& problem, const JobFlags& job_flags, int rank);
// Prints `job: what: message` to stderr unless another rank of the job reports it (a failure
// every rank finds alike, e.g. a plan for another world size: Status::PrintedBy(rank)); returns 1.
int Fail(const std::string& job, const std::string& what, const Status& status, int rank);

// The job's model as the loop sees it, one iteration at a time. Every call comes from the
// loop's thread, except that Backward may make gradients ready from another thread (one thread
// at a time, as the runtime requires).
class LoopBody {
 public:
  virtual ~LoopBody() = default;
  // Forward pass of iteration `iteration` (from the forward mark to the backward mark).
  virtual Status Forward(int iteration) = 0;
  // Backward: calls ready(i) for every registered gradient in gradient-ready order, after
  // writing gradient i into its registered buffer; returns when backward has ended (the
  // backward-end mark), with the first error of ready() or its own.
  virtual Status Backward(int iteration, const std::function<Status(int)>& ready) = 0;
  // The update, with the step's gradients (averaged over the ranks, unless recording) in the
  // registered buffers.
  virtual Status Step(int iteration) = 0;
  // Untimed, after iteration `iteration`'s end mark (and its record-mode density samples).
  virtual Status BetweenIterations(int iteration) {
    (void)iteration;
    return Status::Ok();
  }
  // The loss on the job's evaluation batch (before training and after every epoch); nullopt
  // where the job has none (`epoch E` lines are then not printed, the timing file says null).
  virtual std::optional<double> EvalLoss() { return std::nullopt; }
  // Collective, after training: whether every rank holds bitwise the same state.
  virtual StatusOr<bool> RanksAgree(comm::Communicator& comm) = 0;
  // Collective, after RanksAgree (in record mode, after the last iteration): the job's own results, as extra members of
  // the timing file
  // (`"key": value` pairs joined by ",\n  ", or ""), and on rank 0 its own printed lines.
  virtual StatusOr<std::string> Report(comm::Communicator& comm) {
    (void)comm;
    return std::string();
  }
};

// The runtime the loop drives: a Session (training with a plan) or a Recorder (record mode).
struct LoopRuntime {
  std::unique_ptr<runtime::Recorder> recorder;
  std::unique_ptr<runtime::Session> session;
  // --replicate: the session's collectives and the replica exchanges take turns on the network.
  std::shared_ptr<runtime::NetworkGate> gate;
};

// Makes the Recorder (record mode) or the Session over `world` (GraVAC on with --adapt); the
// exit code after printing the problem, or 0.
int MakeLoopRuntime(const std::string& job, const LoopFlags& flags, std::unique_ptr<comm::Communicator> world,
                    Clock* clock, bool record_timeline, LoopRuntime& out);
// --checkpoint's options: the name, persistence and replicas of `flags`, and the session's gate.
runtime::CheckpointOptions CheckpointOptionsOf(const LoopFlags& flags, std::shared_ptr<runtime::NetworkGate> gate);
// --checkpoint's restore (collective), after the job registered its entries: prints what each rank
// refused and where it restored from, and on rank 0 the recovery time as the job sees it (the
// restore itself, and its end after `started_us`, the job's start: MPI, the job's setup and the
// checkpointer included, the process's launch and loading not); sets `start` to the step to
// resume from (0 for a fresh job). The exit code after printing the problem, or 0.
int RestoreCheckpoint(const std::string& job, runtime::Checkpointer& ckpt, int rank, Clock& clock, double started_us,
                      int& start);
// One gradient of the job: its name, its buffer (host memory the job keeps while the runtime
// lives) and shape (record mode writes it into the model).
struct LoopGradient {
  std::string name;
  std::span<float> buffer;
  std::vector<int64_t> shape;
};
// Registers every gradient, in gradient-ready order: one by one with the Recorder; with the
// Session collectively (Session::RegisterAll: a plan for another model fails every rank alike,
// reported by one rank).
Status RegisterGradients(LoopRuntime& runtime, const std::vector<LoopGradient>& gradients);

// What RunLoop runs. The constructor takes the fields every job has, so a job cannot leave one
// out (a new one is a compile error in every job until it passes it); the fields after those
// are each job's own. Nothing pointed to is owned; it must outlive RunLoop.
struct LoopSetup {
  LoopSetup(std::string job_name, const LoopFlags& loop_flags, int job_rank, Clock& job_clock,
            LoopRuntime& loop_runtime, comm::Communicator& report_comm)
      : job(std::move(job_name)),
        flags(&loop_flags),
        rank(job_rank),
        clock(&job_clock),
        runtime(&loop_runtime),
        report(&report_comm) {}

  std::string job;  // the name in messages and the timing file's "model"
  const LoopFlags* flags;
  int rank;
  Clock* clock;
  LoopRuntime* runtime;
  comm::Communicator* report;  // the job's own collectives after training

  std::vector<std::span<float>> buffers;  // the registered gradients, in gradient-ready order
  runtime::Checkpointer* checkpoint = nullptr;  // may be null
  int start = 0;  // the first iteration (a restored checkpoint's step)
  // Called on every rank after training and the agreement check, before the timing file (the
  // LibTorch jobs' --weights); may be empty.
  std::function<Status()> after_training;
  // --blocking-save: collective, the save of step `step`, called on every rank after the update
  // of every --save-every-th step, inside the timed iteration; durable when it returns. May be empty.
  std::function<Status(int64_t step)> save;
};

// Runs the loop and the report; returns main's exit code.
int RunLoop(const LoopSetup& setup, LoopBody& body);

}  // namespace cupcake::examples

// Recorder: record mode (docs/FORMATS.md, libruntime/README.md). With no plan yet, a job measures its
// gradient-ready times and writes them as a cupcake.model.v1 file, which `cupcake-profile
// import` (or `cupcake-profile compute`) stores in a profile DB for the planner.
//
// The job registers its gradients in gradient-ready order (name, element count; float32), and
// each iteration calls BeginBackward() when backward starts and GradientReady(i) from the hook
// of tensor i, in that order. Gap i of an iteration is the time from gradient i-1 becoming ready
// to gradient i becoming ready (for i = 0: from BeginBackward); a tensor's backward_us is the
// median of its gaps over the completed iterations (the mean of the two middle ones for an even
// count). Time comes from the Clock passed in.
//
// Forward and update (optional): BeginForward() before BeginBackward() marks the start of the
// iteration's forward pass, and EndIteration() after the last GradientReady() marks the end of the
// optimizer's update. The model's forward_us is the median of BeginForward -> BeginBackward, its
// update_us the median of the last GradientReady -> EndIteration (what follows the last gradient
// hook: the rest of backward, the job's copies and the optimizer step), over the completed
// iterations that marked them. A job that never calls them writes a model without those fields
// (read as 0 by the planner).
//
// Across ranks (MergeRanks): every rank records, then all merge over a communicator, so every
// rank holds the same model and rank 0 writes it. The merged backward_us of tensor i is the
// *slowest rank's*, taken on ready times rather than gaps: each rank's ready time of tensor i is
// the sum of its median gaps 0..i; the merged ready time is the maximum over ranks, and the
// merged gaps are the differences of consecutive merged ready times (>= 0, as a maximum of
// non-decreasing sequences is non-decreasing). Why the slowest: a group's collective starts only
// when every rank has the group's gradients (C_k in docs/MODEL.md is the time the last
// rank is ready); a median over ranks would predict collectives starting before a slow rank
// joins them. Why on ready times: the maximum of each gap separately would add up the worst
// gap of every rank, a ready time no rank ever had. Noise within a rank is already filtered by
// its median over iterations.
//
// Ownership: a Recorder owns its samples; it does not own the clock or the communicator.
// Thread-safety: one thread at a time (the job's backward hooks and training loop).
#pragma once

#include "cupcake/comm/communicator.h"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cupcake/proto/activity.h"
#include "cupcake/proto/status.h"
#include "cupcake/runtime/session.h"

namespace cupcake::runtime {

struct RecorderOptions {
  // Where the gradient-ready times come from; nullptr: a SteadyClock the recorder owns. Not owned.
  Clock* clock = nullptr;
  // On a GPU: when set, a tensor's gap is the device's busy time (KernelBusyUs) of the work
  // launched between its two marks, not the host clock's gap, which on a GPU measures launches,
  // not kernels. BeginBackward starts the source and sets mark 1 on its thread;
  // GradientReady(i) sets mark i + 2 on its thread (the last one clears it), and the last
  // GradientReady of an iteration flushes the source (which waits for the device) and takes,
  // for tensor t, the records marked t + 1. Records with no mark count for tensor 0: frameworks
  // run backward on a worker thread of their own, whose launches before the first hook carry
  // no mark (BeginBackward ran on the job's thread). An error of the source abandons the
  // iteration and is returned. Not owned; OpenKernelTimeSource() makes the CUPTI one.
  ActivitySource* activity = nullptr;
  // The model file's "source"; empty: "cupcake runtime record mode: median of <n> iterations"
  // (with `activity`: "..., kernel time between gradient-ready marks"; after MergeRanks:
  // "..., slowest of <w> ranks").
  std::string source;
};

class Recorder {
 public:
  // `model_name` is the model file's "name" (non-empty).
  static StatusOr<std::unique_ptr<Recorder>> Create(const std::string& model_name, const RecorderOptions& options = {});
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  // Registers the next gradient (its index is the number registered before), before the first
  // BeginBackward. Names are non-empty and distinct, numel >= 1. `shape` (optional: the
  // tensor's dimensions, each >= 1, their product numel) goes into the model's Tensor.shape,
  // which PowerSGD reads; empty: not recorded.
  Status Register(const std::string& name, int64_t numel, std::span<const int64_t> shape = {});
  int registered() const;

  // Forward starts (optional, before BeginBackward): the reference time of forward_us.
  Status BeginForward();
  // Backward starts: the reference time of gap 0. The previous iteration, if any, must be
  // complete (every registered gradient ready).
  Status BeginBackward();
  // Tensor i's gradient is ready; i must be the next in gradient-ready order.
  Status GradientReady(int i);
  // The update after the last gradient is done (optional, once per completed iteration).
  Status EndIteration();
  // Iterations whose every gradient became ready.
  int completed_iterations() const;

  // Naturally sparse gradients (optional; e.g. an embedding table's, whose rows a batch did not
  // touch are zero): one sample of tensor i's density, the share of `grad` (its numel values,
  // host memory, read during the call) that is non-zero (-0 counts as zero). The model records
  // each sampled tensor's median over its samples, at least 1 / numel, as Tensor.density (after
  // MergeRanks the largest over the ranks: the exchange of non-zeros waits for the rank with the
  // most); tensors never sampled record none. Any time after Register.
  Status SampleDensity(int i, std::span<const float> grad);
  // Per tensor: the density the model records, -1 where none (merged after MergeRanks).
  std::vector<double> Densities() const;

  // The gaps, one per registered tensor, between the tensors' median ready times (measured from
  // BeginBackward; their sum is the median iteration's backward); FailedPrecondition before a
  // completed iteration.
  StatusOr<std::vector<double>> MedianBackwardUs() const;

  // A collective over `comm` (every rank calls it, in the same order as the job's other
  // collectives on it): gathers every rank's median gaps and keeps the merged model described
  // above, the same on every rank, for ToJson and Write (until another iteration completes).
  // Fails the same way on every rank when ranks registered different tensors (names or sizes)
  // or one of them has no completed iteration, naming the rank.
  Status MergeRanks(comm::Communicator& comm);
  // Ranks merged by the last MergeRanks (0: the model is this rank's alone).
  int merged_ranks() const;
  // The model's backward_us: the merged ones after MergeRanks, else MedianBackwardUs().
  StatusOr<std::vector<double>> BackwardUs() const;
  // The model's forward_us and update_us: medians over this rank's marked iterations (the
  // slowest rank's after MergeRanks); a negative value when no iteration marked them.
  double ForwardUs() const;
  double UpdateUs() const;

  // The cupcake.model.v1 JSON text (docs/FORMATS.md) of BackwardUs().
  StatusOr<std::string> ToJson() const;
  // Writes ToJson() to `path` atomically (WriteFileAtomic).
  Status Write(const std::string& path) const;

 private:
  Recorder(std::string model_name, const RecorderOptions& options);

  // The activity source's part of GradientReady(i): the next mark, and at the last tensor the
  // flush that replaces the iteration's host gaps with kernel time.
  Status MarkKernelTime(int i);

  std::string model_name_;
  std::string source_;
  std::unique_ptr<Clock> owned_clock_;
  Clock* clock_;
  ActivitySource* activity_;
  std::vector<std::string> names_;
  std::vector<int64_t> numels_;
  std::vector<std::vector<int64_t>> shapes_;  // empty where not recorded
  std::vector<std::vector<double>> gaps_us_;  // [tensor][iteration], completed iterations only
  std::vector<double> current_us_;  // this iteration's gaps so far
  bool in_backward_ = false;
  int next_ = 0;  // the next tensor expected this iteration
  double last_us_ = 0;  // when the previous mark happened
  int completed_ = 0;
  double forward_start_us_ = -1;  // BeginForward of this iteration; < 0: not marked
  double current_forward_us_ = -1;
  bool awaiting_end_ = false;  // an iteration completed and EndIteration may mark its update
  std::vector<double> forward_us_, update_us_;  // samples, marked iterations only
  std::vector<std::vector<double>> density_samples_;  // [tensor][sample]
  std::vector<double> merged_density_;  // after MergeRanks: the largest over ranks, -1: none
  std::vector<double> merged_us_;  // after MergeRanks, until the next iteration completes
  double merged_forward_us_ = -1, merged_update_us_ = -1;
  int merged_ranks_ = 0;
  int merged_iterations_ = 0;  // the fewest completed iterations over the merged ranks
};

// The CUPTI activity source with marks (kernels::OpenCuptiActivitySource) for
// RecorderOptions::activity: one per process, made in `main`, outliving the recorder.
// FailedPrecondition when this build has no CUPTI.
StatusOr<std::unique_ptr<ActivitySource>> OpenKernelTimeSource();

}  // namespace cupcake::runtime

// Recorder: record mode (DESIGN.md sections 3.1 and 7). With no plan yet, a job measures its
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
// Ownership: a Recorder owns its samples; it does not own the clock. It needs no communicator:
// every rank may record, and the job writes the file from one rank (rank 0).
// Thread-safety: one thread at a time (the job's backward hooks and training loop).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cupcake/proto/status.h"
#include "cupcake/runtime/session.h"

namespace cupcake::runtime {

struct RecorderOptions {
  // Where the gradient-ready times come from; nullptr: a SteadyClock the recorder owns. Not owned.
  Clock* clock = nullptr;
  // The model file's "source"; empty: "cupcake runtime record mode: median of <n> iterations".
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
  // BeginBackward. Names are non-empty and distinct, numel >= 1.
  Status Register(const std::string& name, int64_t numel);
  int registered() const;

  // Backward starts: the reference time of gap 0. The previous iteration, if any, must be
  // complete (every registered gradient ready).
  Status BeginBackward();
  // Tensor i's gradient is ready; i must be the next in gradient-ready order.
  Status GradientReady(int i);
  // Iterations whose every gradient became ready.
  int completed_iterations() const;

  // The median gaps, one per registered tensor; FailedPrecondition before a completed iteration.
  StatusOr<std::vector<double>> MedianBackwardUs() const;
  // The cupcake.model.v1 JSON text (DESIGN.md 3.1) of the completed iterations.
  StatusOr<std::string> ToJson() const;
  // Writes ToJson() to `path` atomically (WriteFileAtomic).
  Status Write(const std::string& path) const;

 private:
  Recorder(std::string model_name, const RecorderOptions& options);

  std::string model_name_;
  std::string source_;
  std::unique_ptr<Clock> owned_clock_;
  Clock* clock_;
  std::vector<std::string> names_;
  std::vector<int64_t> numels_;
  std::vector<std::vector<double>> gaps_us_;  // [tensor][iteration], completed iterations only
  std::vector<double> current_us_;            // this iteration's gaps so far
  bool in_backward_ = false;
  int next_ = 0;                              // the next tensor expected this iteration
  double last_us_ = 0;                        // when the previous mark happened
  int completed_ = 0;
};

}  // namespace cupcake::runtime

// GraVAC's two parts (docs/ADAPTIVE.md): the gain probe a group's encode feeds, and the
// controller that turns a window's gains and the rungs' iteration times into the next rung.
// Neither has a communicator: the session exchanges the sums between ranks and applies the
// decision, so the rules are tested alone (test/runtime/gravac_test.cc).
// Thread-safety: the probe's calls may come from two threads (on GPU memory, the job's and the
// CPU worker's for offloaded groups); the controller's from one.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/gain.h"
#include "cupcake/runtime/session.h"
#include "layout.h"

namespace cupcake::runtime::internal {

// Sums over a window's steps and groups (and, once exchanged, over ranks).
struct GainSums {
  double input = 0;  // ||g_ef||^2
  double min = 0;  // ||C(g_ef, r_min)||^2
  double cand = 0;  // ||C(C(g_ef, r_min), r_c)||^2
  double skipped = 0;  // groups left out: their g_ef was not finite (a count, exact as a double)
  GainSums& operator+=(const GainSums& o) {
    input += o.input;
    min += o.min;
    cand += o.cand;
    skipped += o.skipped;
    return *this;
  }
};

// How the ladder's compressor selects: the largest magnitudes (topk; dgc, whose selection of
// its accumulator is approximated by that of g + v), shared random indices (randk), or a
// low-rank approximation per matrix (a ladder of PowerSGD ranks).
enum class Selection { kMagnitude, kRandom, kLowRank };

class GainProbe {
 public:
  // `max_numel`: the largest group it will see (its scratch is allocated here, once). `seed`:
  // the compressed rungs' plan seed (random selection: group k uses GroupSeed's shared form).
  // `clock` times Observe, the controller's own cost; not owned.
  GainProbe(Selection selection, int64_t max_numel, uint64_t seed, Clock* clock);
  // Sessions on GPU memory, once: the sums of groups on the device are kept there
  // (kernels::DeviceGain), added to the host's at Take. kMagnitude and kRandom only.
  Status UseDevice();
  void SetRatios(double ratio_min, double ratio_c) {
    ratio_min_ = ratio_min;
    ratio_c_ = ratio_c;
  }
  // kLowRank, once: the model's tensors in element order (shape as recorded, empty for a vector;
  // numel) and the highest rank it will probe. Allocates the warm-start Q and the scratch.
  void SetTensors(const std::vector<std::vector<int64_t>>& shapes, const std::vector<int64_t>& numels, int max_rank);
  // kLowRank, per window: cf_min's and the candidate's PowerSGD rank, and the active plan's
  // groups (those Observe is given; their first tensors are kept, within SetTensors' reserve).
  void SetRanks(int rank_min, int rank_c, std::span<const GroupLayout> groups);
  // One group's g_ef = gradient + memory (memory: nullptr for none): adds ||g_ef||^2, the part
  // r_min of the group keeps (k = max(1, floor(r n)), as the compressors) and the part r_c
  // keeps of that. A group whose g_ef is not finite is left out of this step (GainSums::skipped).
  // `group` and `iteration` key the random selection. kLowRank: per tensor of the group, the
  // energy of its rank-r_min PowerSGD approximation (ObserveLowRank) and of the rank-r_c one
  // of that. kernels::Backend::kCuda: gradient and memory are device memory and the sums are
  // queued on `stream` (after UseDevice; the time counted is the host's, queueing them).
  Status Observe(std::span<const float> gradient, const float* memory, int group, uint64_t iteration,
                 kernels::Backend where = kernels::Backend::kCpu, void* stream = nullptr);
  // The sums since the last Take, and zero; `cost_us` gets the time Observe took since then.
  // On the device, once the work Observe queued is done (the step synchronized).
  StatusOr<GainSums> Take(double* cost_us);
  // What a window carries from one step to the next, for checkpoints (StateSize() doubles): the
  // sums (not the skipped count: a restored window counts from its restore) and Observe's time
  // since the last Take, then (kLowRank) every tensor's warm-start Q.
  // Ratios and ranks are not in it: the session sets them from the controller's rungs.
  int64_t StateSize() const { return 4 + static_cast<int64_t>(q_.size()); }
  Status ReadState(std::span<double> out) const;
  Status WriteState(std::span<const double> in);

 private:
  void ObserveGroup(std::span<const float> gradient, const float* memory, int group, uint64_t iteration);
  // False when the group's g_ef is not finite (then `step` is partial and dropped).
  bool ObserveLowRank(std::span<const float> gradient, const float* memory, int group, GainSums& step);
  // One power iteration (PowerSGD's, warm-started from the tensor's Q) on x_, the tensor's g_ef
  // as a rows x cols matrix, at rank r: returns ||P P^T x||^2 and, in `first`, the energy of the
  // rank-rc approximation of that (its first rc columns). Updates the tensor's Q.
  double PowerStep(int tensor, int64_t rows, int64_t cols, int r, int rc, double* first);

  struct Tensor {
    std::vector<int64_t> shape;
    int64_t numel = 0;
    int64_t q_offset = 0;  // into q_ (cols x max_rank floats)
  };

  Selection selection_;
  uint64_t seed_;
  Clock* clock_;
  double cost_us_ = 0;
  double ratio_min_ = 1, ratio_c_ = 1;
  std::vector<float> scratch_;  // squares of g_ef
  // kLowRank
  std::vector<Tensor> tensors_;
  std::vector<int> group_first_;  // reserved for one group per tensor
  std::vector<double> q_;  // every tensor's warm-start Q (cols x max_rank_)
  std::vector<double> p_, qn_, x_;  // scratch: P, x^T P, the tensor's g_ef
  int max_rank_ = 0, rank_min_ = 1, rank_c_ = 1;
  GainSums sums_;
  mutable std::mutex mu_;  // the host sums, cost and scratch
  std::unique_ptr<kernels::DeviceGain> device_;
  void* device_stream_ = nullptr;  // the last stream device sums were queued on
};

class GravacController {
 public:
  struct Rung {
    double ratio = 1;
    double predicted_us = 0;
  };
  // rungs[0] the fp32 rung; then decreasing ratios. Options valid (CheckGravacOptions).
  GravacController(std::vector<Rung> rungs, const GravacOptions& options);

  int sent() const { return sent_; }  // the rung sent in the current window
  int min_rung() const { return min_; }
  int cand_rung() const { return cand_; }

  // What the next Decide depends on besides its arguments, for checkpoints (StateSize()
  // doubles): the rung sent, cf_min's, the candidate's, whether it is exploring, then per rung
  // its last measured time and its last gain. WriteState refuses rungs that are not this
  // ladder's (InvalidArgument naming them).
  int64_t StateSize() const { return 4 + 2 * static_cast<int64_t>(rungs_.size()); }
  void ReadState(std::span<double> out) const;
  Status WriteState(std::span<const double> in);

  // The window that just ended: its first step and length, the gain sums over it and every
  // rank, the mean measured iteration time (<= 0: none measured), this rank's bytes and probe
  // cost per step. Applies GraVAC's rules; the decision names the next window's rung.
  GravacDecision Decide(uint64_t first_step, int steps, const GainSums& sums, double measured_us, int64_t bytes_sent,
                        double probe_us);

 private:
  double SystemUs(int rung) const;
  int SaturationRung() const;

  std::vector<Rung> rungs_;
  GravacOptions options_;
  std::vector<double> measured_us_;  // per rung: the last window's measurement, 0 until one
  std::vector<double> gain_;  // per rung: the last window's gain, 0 until probed
  int sent_ = 0;
  int min_ = 1;
  int cand_ = 1;
  bool exploring_ = true;
};

// InvalidArgument naming the field: `GravacOptions.window: out of range; got 0, expected >= 1`.
Status CheckGravacOptions(const GravacOptions& options);

}  // namespace cupcake::runtime::internal

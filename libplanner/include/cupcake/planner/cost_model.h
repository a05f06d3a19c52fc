// The iteration-time model of docs/MODEL.md (v1: fusion).
//
// A Problem is a model's tensors plus the curves one compressor needs on one device,
// resolved once from a Model and a Profile. GroupCost() prices one contiguous group and
// Evaluate() runs the two-resource timeline for a whole strategy:
//
//   enc_k = pack(s_k) [|G_k| >= 2] + encode(n_k)      (no encode for fp32)
//   com_k = comm(op, global, payload(n_k))
//   chain_k = max(0, chained comm(payload(n_k)) - com_k)   (0 without a chained curve; above
//             its last point x_c, max(0, chained comm(x_c) - comm(x_c)))
//   dec_k = decode(n_k) + unpack(s_k) [|G_k| >= 2]    (no decode for fp32)
//   C_k = sum(b_i, i <= last(G_k)) + sum(enc_m, m <= k)
//   F_1 = C_1 + com_1;   F_k = max(C_k, F_{k-1} + chain_k) + com_k   (k >= 2)
//   D_0 = C_K; D_k = max(D_{k-1}, F_k) + dec_k
//   iteration_us = forward_us + D_K + update_us
//
// Problems are immutable values; everything here is pure and deterministic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/curve.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/status.h"

namespace cupcake::planner {

struct PlanRequest {
  std::string compressor = "fp32";
  double ratio = kDefaultRatio;  // used by topk, randk, dgc
  pb::Device device = pb::DEVICE_UNSPECIFIED;  // unspecified: gpu if the profile has its curves
  std::string memory;  // empty: the compressor's default
  uint64_t seed = 0;
  double zen_union = 0;  // Zen groups' measured union share (CompressorSpec.zen_union); 0: independent
  int rank = 0;  // PowerSGD's rank (CompressorSpec.rank); 0: the powersgd schemes are not offered
  // The options search offers only these schemes (names of Schemes()), plus the plan's own
  // fusion option (flat, or flat_fp32 for fp32), which it always offers; empty: every scheme.
  std::vector<std::string> schemes;
};

struct Problem {
  // Per tensor, in gradient-ready order.
  std::vector<int64_t> numel;
  std::vector<int64_t> bytes;
  std::vector<double> backward_us;
  // Prefix sums: numel_prefix[i] = sum of numel[0..i-1]; same for bytes and backward_us.
  std::vector<int64_t> numel_prefix;
  std::vector<int64_t> bytes_prefix;
  std::vector<double> backward_prefix;
  // Naturally sparse gradients (Tensor.density): nonzero_prefix[i] = sum of ExpectedNonzeros
  // over tensors 0..i-1; sparse_density = the non-zero share of the tensors that record a
  // density <= kSparseDensityLimit, together (0: none; the zen_sparse scheme's kernel curves are
  // read at it).
  std::vector<int64_t> nonzero_prefix;
  double sparse_density = 0;
  double forward_us = 0;
  double update_us = 0;
  // PowerSGD: per tensor its recorded shape (empty: not recorded, a vector), and the rank.
  std::vector<std::vector<int64_t>> shapes;
  int rank = 0;

  const CompressorInfo* compressor = nullptr;
  double ratio = kDefaultRatio;
  double zen_union = 0;  // PlanRequest's
  pb::Device device = pb::GPU;
  int world_size = 1;
  bool compress = false;  // false for fp32: no encode or decode
  Curve encode, decode, comm, pack, unpack;
  // The collective's curve measured beside busy cores (docs/MODEL.md, "Busy cores"); the zero
  // curve when the profile has none, and then collectives cost `comm` whatever runs beside them.
  Curve comm_busy;
  // The collective's curve measured on calls back to back (docs/MODEL.md, "Chained
  // collectives"); the zero curve when the profile has none, and then a collective that follows
  // another costs `comm` too.
  Curve comm_chained;
  // ChainedTailUs(comm_chained, comm): what a collective beyond the chained curve's last point
  // adds.
  double comm_chained_tail_us = 0;
  // The profile keys of those curves (docs/FORMATS.md), empty for a curve the profile lacks.
  std::string encode_key, decode_key, comm_key, pack_key, unpack_key, comm_busy_key, comm_chained_key;
  // Encode or decode curves read at a ratio the profile did not measure (KernelCurve::ratio_note).
  std::vector<pb::Extrapolation> ratio_notes;

  int size() const { return static_cast<int>(numel.size()); }
  int64_t GroupNumel(int first, int last) const { return numel_prefix[last + 1] - numel_prefix[first]; }
  int64_t GroupBytes(int first, int last) const { return bytes_prefix[last + 1] - bytes_prefix[first]; }
  int64_t GroupNonzeros(int first, int last) const { return nonzero_prefix[last + 1] - nonzero_prefix[first]; }
  int64_t PayloadOf(int64_t n) const { return PayloadBytes(*compressor, n, ratio); }
  // The PowerSGD sizes of tensors [first, last] (PowerSgdSizes at `rank`).
  LowRankSizes GroupLowRank(int first, int last, bool batched) const;
};

// The profile's curve with `key` (CurveKey), or nullptr.
const pb::Curve* FindProfileCurve(const pb::Profile& profile, const std::string& key);

// An encode or decode curve as the planner reads it for a plan at `ratio` (docs/MODEL.md,
// "Kernel curves and the ratio").
struct KernelCurve {
  Curve curve;
  // The profile's key of the curve read ("decode topk cpu ratio 0.001"); for an interpolation,
  // both keys joined by " + ".
  std::string key;
  // Set when the plan's ratio lies outside the profile's recorded ratios: the nearest one's curve
  // is read (unit "ratio": last_size the ratio measured, max_size the plan's).
  std::optional<pb::Extrapolation> ratio_note;
};
// `name` is a compressor, kZenCurveName or kNonzeroCurveName. For one that selects ratio n
// elements (and for zen and nonzero):
// the curve recorded at `ratio`; between two recorded ratios, the two interpolated linearly in the
// ratio (a kernel's time is affine in k = ratio n at fixed n); outside them, the nearest; when no
// curve of the name records a ratio (profiles from before it was recorded), the one without.
// For other compressors, the one curve of the key. nullopt when the profile has none.
std::optional<KernelCurve> FindKernelCurve(const pb::Profile& profile, pb::CurveKind kind, std::string_view name,
                                           pb::Device device, double ratio);

// Resolves the curves `request` needs from `profile`. Errors name what is missing, e.g.
// `profile: curve "encode topk gpu" not found; ...`.
StatusOr<Problem> MakeProblem(const pb::Model& model, const pb::Profile& profile, const PlanRequest& request);
// The checks of the request's own values (compressor, ratio, zen_union, memory) that MakeProblem
// applies first, for the tools to report them as usage errors; messages name the flags.
Status CheckRequest(const PlanRequest& request);

struct GroupCost {
  double enc_us = 0;
  double com_us = 0;
  // The collective beside busy cores: max(busy curve, com_us), com_us without a busy curve.
  double com_busy_us = 0;
  // What the collective adds when it follows the previous group's back to back (ChainUs).
  double chain_us = 0;
  double dec_us = 0;
};

// A chained curve's excess over its spaced curve at the chained curve's last measured point,
// never below 0; 0 without a chained curve. Above that point a collective adds this much when
// chained, not what the two curves' last slopes extrapolate to: the slowdown of a call that
// follows another is a transient at its start, which a longer transfer does not stretch
// (docs/MODEL.md, "Chained collectives").
double ChainedTailUs(const Curve& chained, const Curve& spaced);

// What a collective of `bytes`, whose spaced time is `spaced_us`, adds when it follows another
// back to back: max(0, chained(bytes) - spaced_us), read through `at` (a cursor over `chained`);
// above the chained curve's last point `tail_us` (ChainedTailUs); 0 without a chained curve.
inline double ChainUs(const Curve& chained, CurveCursor& at, double tail_us, double bytes, double spaced_us) {
  if (chained.empty()) return 0.0;
  if (bytes > chained.last_size()) return tail_us;
  return std::max(0.0, at.At(bytes) - spaced_us);
}

// When the network starts a collective that is ready at `ready`, after a collective that ended
// at `previous` (nullopt: none before it): as if each collective needed `chain_us` of rest
// after the one before it; one that follows back to back thus costs its chained time, one
// ready `chain_us` or more after the previous end its spaced time. Non-decreasing in both.
inline double CommStart(double ready, std::optional<double> previous, double chain_us) {
  return previous ? std::max(ready, *previous + chain_us) : ready;
}

// When a collective started at `start` ends (docs/MODEL.md, "Busy cores"): it progresses at
// 1 / busy_us of its work per microsecond until `busy_until` (the end of the compute stream's
// known work) and at 1 / idle_us after. Requires busy_us >= idle_us >= 0; non-decreasing and
// continuous in start and in busy_until. Inline: the label searches call it per node.
inline double CommEnd(double start, double idle_us, double busy_us, double busy_until) {
  // Equal speeds (no busy curve): exactly start + idle, as the branches below give up to rounding.
  if (start >= busy_until || busy_us <= idle_us) return start + idle_us;
  if (start + busy_us <= busy_until) return start + busy_us;
  // Part of the work, (busy_until - start) / busy_us, is done by busy_until; the rest at idle speed.
  return busy_until + (1.0 - (busy_until - start) / busy_us) * idle_us;
}

GroupCost CostOfGroup(const Problem& problem, int first, int last);

// Prices groups [first, last] for one `first` and increasing `last` with amortized O(1)
// curve lookups (the search's inner loop). Price(last) equals CostOfGroup(first, last).
// Holds a reference to the problem, which must outlive it. Not thread-safe.
class GroupPricer {
 public:
  explicit GroupPricer(const Problem& p)
      : p_(p),
        pack_(p.pack),
        encode_(p.encode),
        comm_(p.comm),
        comm_busy_(p.comm_busy),
        comm_chained_(p.comm_chained),
        decode_(p.decode),
        unpack_(p.unpack) {}

  void Start(int first);
  // `last` must not decrease between calls after a Start.
  GroupCost Price(int last);

 private:
  const Problem& p_;
  int first_ = 0;
  CurveCursor pack_, encode_, comm_, comm_busy_, comm_chained_, decode_, unpack_;
};

// One group's place on the predicted timeline.
struct GroupTimes {
  int first = 0;
  int last = 0;
  GroupCost cost;
  double encode_start_us = 0, encode_end_us = 0;
  double comm_start_us = 0, comm_end_us = 0;
  double decode_start_us = 0, decode_end_us = 0;
};

struct Timeline {
  std::vector<GroupTimes> groups;
  double iteration_us = 0;
};

// A strategy is the last tensor of each group, increasing, ending at size() - 1.
Timeline Evaluate(const Problem& problem, std::span<const int> group_ends);
double IterationTime(const Problem& problem, std::span<const int> group_ends);

// Baseline strategies (docs/MODEL.md).
std::vector<int> LayerwiseStrategy(const Problem& problem);
std::vector<int> OneGroupStrategy(const Problem& problem);
// Appends tensors in order and closes a bucket as soon as its uncompressed bytes reach cap.
std::vector<int> BucketStrategy(const Problem& problem, int64_t cap_bytes);

}  // namespace cupcake::planner

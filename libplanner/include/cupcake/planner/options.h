// The iteration-time model of docs/MODEL.md, v2: every fused group gets an option (a scheme of
// proto/catalogue.h's Schemes() table and a device), the CPU worker is a resource of its own,
// and hierarchical schemes read the profile's intra and inter curves.
//
// An OptionProblem is a v1 Problem (tensors, the plan's compressor and device) plus the curves
// every offered option needs, resolved once. OptionPricer prices a group under every option as
// five stage costs; EvaluateOptions runs the three-resource timeline (compute stream, CPU
// worker, network) of docs/MODEL.md for a whole strategy. Pure and deterministic.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/cost_model.h"
#include "cupcake/planner/curve.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/status.h"

namespace cupcake::planner {

// One offered option: a scheme and where its encode and decode run.
struct Option {
  const SchemeInfo* scheme = nullptr;
  pb::Device device = pb::GPU;
  bool offload = false;  // device differs from the plan's: the CPU worker, through host copies
  std::string Name() const;  // "hier gpu", "flat cpu"
};

// The stage costs of one group under one option (docs/MODEL.md, "Stages").
struct StageCost {
  double gpu_pre = 0;  // on the compute stream, right after the group's last tensor
  double cpu_pre = 0;  // on the CPU worker (offloaded options)
  double net = 0;  // the network block: every step, and encodes/decodes between steps
  // The network block beside busy cores: the steps by their busy curves where the profile has
  // them (never below the idle ones); >= net (docs/MODEL.md, "Busy cores").
  double net_busy = 0;
  // What the block adds when its first collective follows the previous group's back to back
  // (GroupCost::chain_us of that step: its chained curve less its own, >= 0).
  double chain = 0;
  double gpu_post = 0;  // on the compute stream after backward
  double cpu_post = 0;  // on the CPU worker after its last encode
  double pre() const { return gpu_pre + cpu_pre; }
  double post() const { return gpu_post + cpu_post; }
};

// The curves one option reads, resolved from the profile.
struct OptionCurves {
  // Zero curves where unused. mid_decode: a decode between steps, or Zen's merge in the network
  // block ("encode zen", else the codec's decode curve, docs/MODEL.md); post_kernel of zen:
  // "decode zen", else the codec's decode.
  Curve pre_kernel, mid_encode, mid_decode, post_kernel;
  std::vector<Curve> steps;  // one per scheme step
  std::vector<Curve> steps_busy;  // parallel: the step's busy curve, the zero curve where none
  std::vector<std::string> step_keys;
  std::vector<std::string> step_busy_keys;  // parallel: "" where there is no busy curve
  // The first step's chained curve (the zero curve where none) and its key ("" where none).
  Curve first_chained;
  double first_chained_tail_us = 0;  // ChainedTailUs(first_chained, steps[0])
  std::string first_chained_key;
  std::string pre_key, mid_encode_key, mid_decode_key, post_key;
  std::vector<pb::Extrapolation> ratio_notes;  // kernel curves read at an unmeasured ratio
};

struct OptionProblem {
  Problem base;  // tensors, compressor, ratio, the plan's device, pack and unpack
  int nodes = 1;
  int devices_per_node = 1;
  std::vector<Option> options;
  std::vector<OptionCurves> curves;  // parallel to options
  // sum of d2h(bytes_t), h2d(bytes_t) over tensors t < i (offloaded groups copy tensor by tensor)
  std::vector<double> d2h_prefix, h2d_prefix;
  // Options of the table left out, each with why (a missing curve, a single node, a duplicate).
  std::vector<std::string> dropped;
  // The option every group of a v1 plan has: "flat" (or "flat_fp32" for fp32) on the plan's device.
  int fusion_option = 0;

  int size() const { return base.size(); }
  RankLayout ranks() const { return {base.world_size, devices_per_node}; }
  int option_count() const { return static_cast<int>(options.size()); }
  // The entries of `dropped` that name `scheme` (on any device): why it is not offered.
  std::vector<std::string> DroppedReasons(const std::string& scheme) const;
};

// Resolves the options of Schemes() on the plan's device (and, for a GPU plan, offloaded to the
// CPU) whose curves the profile has. Errors as MakeProblem's.
StatusOr<OptionProblem> MakeOptionProblem(const pb::Model& model, const pb::Profile& profile,
                                          const PlanRequest& request);

// Prices groups [first, last] for one `first` and increasing `last`, every option at once, with
// amortized O(1) curve lookups. Holds a reference to the problem. Not thread-safe.
class OptionPricer {
 public:
  explicit OptionPricer(const OptionProblem& p);
  void Start(int first);
  // `last` must not decrease between calls after a Start. Fills out[o] for every option, or
  // only out[only] when only >= 0.
  void Price(int last, std::span<StageCost> out, int only = -1);

 private:
  struct Cursors {
    CurveCursor pre, mid_encode, mid_decode, post;
    std::vector<CurveCursor> steps, steps_busy;
    CurveCursor first_chained;
  };
  const OptionProblem& p_;
  int first_ = 0;
  CurveCursor pack_, unpack_;
  std::vector<Cursors> cursors_;
  // Where each option's scheme runs its codec.
  struct Shape {
    bool encode_before, decode_after, encode_in_network, reads_decode_in_network;
  };
  // One scheme's share of a group's costs: its kernels' elements and its steps' idle sum, busy
  // excess and first step's chained excess, which every option of the scheme shares (the
  // collectives' curves do not depend on the codec's device).
  struct SchemeCosts {
    double m, x, idle, busy_extra, chain;
  };
  std::vector<Shape> shapes_;
  std::vector<size_t> step_twin_;  // the first option of o's scheme
  std::vector<SchemeCosts> scheme_costs_;  // this call's, at each scheme's first option
};

// The ratio StepBytes reads for group [first, last] under `s`: the plan's, or for the
// non-zero codec (zen_sparse) the group's expected non-zero share, as SchemeRatio computes it
// from the plan's model.
double GroupStepRatio(const OptionProblem& p, const SchemeInfo& s, int first, int last);
// The elements a group's kernel curves are read at: the group's (whole) or its shard's (the
// in-network encode and decode of hierarchical schemes); for the non-zero codec, whose curves
// are measured at the model's sparse share, max(n, nonzeros / sparse_density): the size at
// which a tensor of that share has the group's non-zeros (docs/MODEL.md, "Naturally sparse
// gradients").
double KernelElements(const OptionProblem& p, const SchemeInfo& s, int first, int last, bool whole);

// One group's costs under one option, by OptionPricer.
StageCost CostOfOption(const OptionProblem& p, int option, int first, int last);

// One group's place on the v2 timeline.
struct OptionGroupTimes {
  int first = 0;
  int last = 0;
  int option = 0;
  StageCost cost;
  double pre_start_us = 0, pre_end_us = 0;  // on its device (compute stream or CPU worker)
  double comm_start_us = 0, comm_end_us = 0;
  double post_start_us = 0, post_end_us = 0;
  struct StepTimes {
    pb::CommOp op;
    pb::Scope scope;
    int64_t bytes;
    double start_us, end_us;
  };
  std::vector<StepTimes> steps;
};

struct OptionTimeline {
  std::vector<OptionGroupTimes> groups;
  double iteration_us = 0;
};

// A strategy: the last tensor of each group and each group's option index.
OptionTimeline EvaluateOptions(const OptionProblem& p, std::span<const int> group_ends, std::span<const int> options);
// The v2 recurrences' running state (docs/MODEL.md), group by group in order: e, f, x, y on
// the compute stream and the network, g, u, v on the CPU worker.
struct TimelineState {
  double e = 0, f = 0, x = 0, y = 0, g = 0, u = 0, v = 0;
  bool any = false;  // a group was added: f is a collective's end
  // Appends the group ending at tensor `last`, with an option of that offload kind and costs.
  void Add(const OptionProblem& p, int last, bool offload, const StageCost& c);
  // The iteration time if no group follows; never decreases as groups are added.
  double Final(const OptionProblem& p) const;
};

// The same timeline's iteration time from each group's stage costs already priced (costs[k] is
// group k's under options[k]); what the searches call in their inner loops.
double IterationFromCosts(const OptionProblem& p, std::span<const int> group_ends, std::span<const int> options,
                          std::span<const StageCost> costs);
double OptionIterationTime(const OptionProblem& p, std::span<const int> group_ends, std::span<const int> options);

// The index in p.options of `scheme` on `device`, or -1.
int FindOption(const OptionProblem& p, std::string_view scheme, pb::Device device);

}  // namespace cupcake::planner

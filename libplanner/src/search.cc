// The exact fusion search. The algorithm and the proofs of its pruning rules are in
// docs/MODEL.md ("Search"); the step numbers below refer to it.
#include "cupcake/planner/search.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "label_search.h"

namespace cupcake::planner {
namespace {

using detail::kInf;

// Lower bounds on what the tensors j..N-1 still add (step 1 of the search, docs/MODEL.md).
// A completion P of a label (e, f, x, y) ends at max(y + a_P, x + b_P, f + c_P, e + d_P) +
// forward + update: the recurrences are (max, +)-linear. These are lower bounds of a_P..d_P
// over every P of the suffix. Index N is the empty suffix.
struct SuffixBounds {
  std::vector<double> enc_dec;  // a_P - B(N) = sum of enc + dec: exact minimum
  std::vector<double> dec;  // b_P = sum of dec: exact minimum
  std::vector<double> net;  // c_P = max over k of (com_1..com_k + dec_k..dec_K)
  std::vector<double> ready;  // d_P = max over k of (B(last_k + 1) + enc_1..enc_k + c of groups k..K)
  double min_com = kInf, min_dec = kInf;  // over every group of the model
};

SuffixBounds ComputeSuffixBounds(const Problem& p, GroupPricer& pricer, int64_t& transitions) {
  const int n = p.size();
  SuffixBounds b;
  b.enc_dec.assign(n + 1, kInf);
  b.dec.assign(n + 1, kInf);
  b.net.assign(n + 1, kInf);
  b.ready.assign(n + 1, kInf);
  b.enc_dec[n] = b.dec[n] = b.net[n] = b.ready[n] = 0;
  for (int j = n - 1; j >= 0; --j) {
    pricer.Start(j);
    for (int q = j; q < n; ++q) {
      // The first group is [j, q]; the rest, q+1..N-1, is bounded by the entries at q + 1.
      const GroupCost c = pricer.Price(q);
      ++transitions;
      b.enc_dec[j] = std::min(b.enc_dec[j], c.enc_us + c.dec_us + b.enc_dec[q + 1]);
      b.dec[j] = std::min(b.dec[j], c.dec_us + b.dec[q + 1]);
      // c_P = com_1 + max(dec_1 + sum of the rest's dec, c of the rest)
      const double net = c.com_us + std::max(c.dec_us + b.dec[q + 1], b.net[q + 1]);
      b.net[j] = std::min(b.net[j], net);
      // d_P = max(B(q+1) + enc_1 + c_P, enc_1 + d of the rest)
      b.ready[j] = std::min(b.ready[j], c.enc_us + std::max(p.backward_prefix[q + 1] + net, b.ready[q + 1]));
      b.min_com = std::min(b.min_com, c.com_us);
      b.min_dec = std::min(b.min_dec, c.dec_us);
    }
  }
  return b;
}

// A prefix label: tensors 0..end-1 are grouped. Every field only ever raises the final
// time (docs/MODEL.md, "Dominance"), so a label no better in all four is dropped.
struct FusionLabel {
  double e;  // sum of the encodes so far (C = backward_prefix[end] + e)
  double f;  // F: when the network finishes the last collective so far
  double x;  // the decode chain started at 0: max(x, F_k) + dec_k
  double y;  // e + the sum of the decodes so far
  int32_t parent;
  int32_t end;

  static bool Dominates(const FusionLabel& a, const FusionLabel& b) {
    return a.e <= b.e && a.f <= b.f && a.x <= b.x && a.y <= b.y;
  }
};

// CommEnd called, not inlined: inlined into Extend it made the label-heavy searches slower on
// the development VM (docs/PLANNER_BENCH.md), where the options search gains from inlining it.
[[gnu::noinline]] double CommEndCall(double start, double idle_us, double busy_us, double busy_until) {
  return CommEnd(start, idle_us, busy_us, busy_until);
}

// Appends group [l.end, q] to label l (the recurrences of cost_model.h).
FusionLabel Extend(const Problem& p, const FusionLabel& l, int32_t id, int q, const GroupCost& c) {
  FusionLabel next;
  next.e = l.e + c.enc_us;
  const double c_k = p.backward_prefix[q + 1] + next.e;
  const double start = CommStart(c_k, l.end > 0 ? std::optional(l.f) : std::nullopt, c.chain_us);
  next.f = CommEndCall(start, c.com_us, c.com_busy_us, p.backward_prefix.back() + next.e);
  next.x = std::max(l.x, next.f) + c.dec_us;
  next.y = l.y + c.enc_us + c.dec_us;
  next.parent = id;
  next.end = q + 1;
  return next;
}

// The fusion search's space for detail::LabelSearch: one option (the plan's) per group, the
// four-coordinate labels above, the suffix bounds of step 1. Every label of prefix j extends
// over the same groups j..q, so the DP prices each group once per prefix (by the first label
// that reaches it) and reuses it for the others; nodes count per label and group regardless.
class FusionSpace {
 public:
  using Label = FusionLabel;

  FusionSpace(const Problem& p, GroupPricer& pricer, const SuffixBounds& sb)
      : p_(p), pricer_(pricer), sb_(sb), fixed_(p.forward_us + p.update_us), backward_(p.backward_prefix.back()) {}

  int size() const { return p_.size(); }
  Label Root() const { return {0, 0, 0, 0, -1, 0}; }
  int OptionOf(const Label&) const { return 0; }

  double LowerBound(const Label& l) const {
    const int j = l.end;
    return fixed_ +
           std::max({backward_ + l.y + sb_.enc_dec[j], l.x + sb_.dec[j], l.f + sb_.net[j], l.e + sb_.ready[j]});
  }
  // The final time of a label that covers every tensor: max(C_K + sum of decodes, D chain).
  double Final(const Label& l) const { return p_.forward_us + std::max(backward_ + l.y, l.x) + p_.update_us; }
  // Step 4: every later q closes this group later still (docs/MODEL.md, "Cutoff").
  double Cutoff(const Label& l, int q) const {
    return fixed_ + p_.backward_prefix[q + 1] + l.e + sb_.min_com + sb_.min_dec;
  }

  void StartGreedyRow(int j) { pricer_.Start(j); }
  template <class F>
  void ForGreedyOptions(int, int q, const Label& l, int32_t id, F&& f) {
    f(Extend(p_, l, id, q, pricer_.Price(q)));
  }

  void StartRow(int j) {
    row_.clear();
    pricer_.Start(j);
  }
  template <class F>
  void ForOptions(int j, int q, const Label& l, int32_t id, F&& f) {
    if (static_cast<size_t>(q - j) == row_.size()) row_.push_back(pricer_.Price(q));
    f(Extend(p_, l, id, q, row_[static_cast<size_t>(q - j)]));
  }

 private:
  const Problem& p_;
  GroupPricer& pricer_;
  const SuffixBounds& sb_;
  const double fixed_, backward_;
  std::vector<GroupCost> row_;  // row_[q - j] of the row StartRow began
};

SearchResult Exhaustive(const Problem& p) {
  const int n = p.size();
  SearchResult best;
  best.iteration_us = kInf;
  std::vector<int> ends;
  const uint64_t count = uint64_t{1} << (n - 1);
  for (uint64_t mask = 0; mask < count; ++mask) {
    ends.clear();
    for (int i = 0; i < n - 1; ++i)
      if (mask >> i & 1) ends.push_back(i);
    ends.push_back(n - 1);
    double t = IterationTime(p, ends);
    ++best.stats.states;
    best.stats.transitions += static_cast<int64_t>(ends.size());
    if (t < best.iteration_us) {
      best.iteration_us = t;
      best.group_ends = ends;
    }
  }
  best.stats.optimal = true;
  return best;
}

// The best of the baselines and the greedy strategy that keeps, for every prefix, only the
// label with the smallest lower bound (step 2).
std::pair<std::vector<int>, double> SeedIncumbent(const Problem& p, detail::LabelSearch<FusionSpace>& dp) {
  std::vector<int> best;
  double incumbent = kInf;
  for (const auto& ends : {OneGroupStrategy(p), LayerwiseStrategy(p), BucketStrategy(p, int64_t{25} << 20),
                           BucketStrategy(p, int64_t{64} << 20)}) {
    const double t = IterationTime(p, ends);
    if (t < incumbent) {
      incumbent = t;
      best = ends;
    }
  }
  auto [greedy, greedy_time] = dp.Greedy();
  if (greedy_time < incumbent) return {std::move(greedy.ends), greedy_time};
  return {std::move(best), incumbent};
}

// Steps 1-5 of docs/MODEL.md's search (budget in nodes); without `seed`, from no incumbent.
SearchResult BranchAndBound(const Problem& p, int64_t budget, bool seed) {
  SearchResult result;
  SearchStats& st = result.stats;
  st.budget = budget;
  GroupPricer pricer(p);
  // Step 1: suffix bounds.
  const SuffixBounds sb = ComputeSuffixBounds(p, pricer, st.transitions);
  FusionSpace space(p, pricer, sb);
  detail::LabelSearch<FusionSpace> dp(space, st);
  double incumbent = kInf;
  if (seed) std::tie(result.group_ends, incumbent) = SeedIncumbent(p, dp);
  // Steps 3-5: labels by prefix length, expanded in increasing prefix length and, within one,
  // in increasing lower bound; cutoff; dominance.
  const detail::LabelSearchResult found = dp.Run(incumbent, budget, detail::OnBudget::kStop);
  if (found.found) result.group_ends = found.best.ends;
  if (result.group_ends.empty()) result.group_ends = OneGroupStrategy(p);  // unseeded, stopped first
  result.iteration_us = IterationTime(p, result.group_ends);
  st.optimal = !found.stopped;
  return result;
}

}  // namespace

std::string AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kBranchAndBound: return "branch_and_bound";
    case Algorithm::kExhaustive: return "exhaustive";
    case Algorithm::kLayerwise: return "layerwise";
    case Algorithm::kOneGroup: return "one_group";
    case Algorithm::kBucket: return "bucket";
    case Algorithm::kEspresso: return "espresso";
  }
  return "?";
}

std::string SearchSpaceName(SearchSpace s) { return s == SearchSpace::kOptions ? "options" : "fusion"; }

int64_t DefaultNodeBudget(SearchSpace s) {
  return s == SearchSpace::kOptions ? kDefaultOptionsNodeBudget : kDefaultNodeBudget;
}

StatusOr<SearchSpace> ParseSearchSpace(const std::string& name) {
  for (SearchSpace s : {SearchSpace::kFusion, SearchSpace::kOptions})
    if (name == SearchSpaceName(s)) return s;
  return InvalidArgumentError("--search-space: unknown search space '" + name +
                              "'; expected fusion (groups, the plan's one option) or options (groups and each "
                              "group's option)");
}

StatusOr<Algorithm> ParseAlgorithm(const std::string& name) {
  if (name == "bnb") return Algorithm::kBranchAndBound;
  for (Algorithm a : {Algorithm::kBranchAndBound, Algorithm::kExhaustive, Algorithm::kLayerwise, Algorithm::kOneGroup,
                      Algorithm::kBucket, Algorithm::kEspresso})
    if (name == AlgorithmName(a)) return a;
  return InvalidArgumentError("--algorithm: unknown algorithm '" + name +
                              "'; expected branch_and_bound, exhaustive, espresso (--search-space options), or a "
                              "fixed strategy: layerwise, one_group, bucket");
}

StatusOr<SearchResult> Search(const Problem& problem, const SearchOptions& options) {
  CUPCAKE_CHECK_GE(problem.size(), 1);
  if (options.node_budget < 1)
    return InvalidArgumentError("--budget: must be positive; got " + std::to_string(options.node_budget));
  SearchResult r;
  if (options.algorithm == Algorithm::kEspresso)
    return InvalidArgumentError("--algorithm espresso: chooses per-group options; needs --search-space options");
  if (IsFixedStrategy(options.algorithm)) {
    if (options.bucket_bytes < 1)
      return InvalidArgumentError("--bucket-mib: must be positive; got " + std::to_string(options.bucket_bytes) +
                                  " bytes");
    r.group_ends = options.algorithm == Algorithm::kLayerwise  ? LayerwiseStrategy(problem)
                   : options.algorithm == Algorithm::kOneGroup ? OneGroupStrategy(problem)
                                                               : BucketStrategy(problem, options.bucket_bytes);
    r.iteration_us = IterationTime(problem, r.group_ends);
  } else if (options.algorithm == Algorithm::kExhaustive) {
    if (problem.size() > kMaxExhaustiveTensors)
      return InvalidArgumentError("--algorithm exhaustive: too many tensors; got " + std::to_string(problem.size()) +
                                  ", expected <= " + std::to_string(kMaxExhaustiveTensors) +
                                  " (2^(N-1) partitions); use branch_and_bound");
    r = Exhaustive(problem);
  } else {
    r = BranchAndBound(problem, options.node_budget, options.seed_incumbents);
  }
  r.stats.algorithm = AlgorithmName(options.algorithm);
  return r;
}

}  // namespace cupcake::planner

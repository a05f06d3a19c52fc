// The search over groups and per-group options (docs/MODEL.md, "Iteration time (v2)", "Search
// over groups and options"): the label DP of label_search.h over OptionsSpace (v1's labels with
// the CPU worker as three more coordinates, canonical forms, useful options, the price table),
// its seeded passes and its exhaustive oracle. Step numbers refer to MODEL.md.
#include <algorithm>
#include <limits>

#include "cupcake/planner/options.h"
#include "cupcake/planner/search.h"
#include "espresso.h"
#include "label_search.h"

namespace cupcake::planner {
namespace {

using detail::CostTable;
using detail::Espresso;
using detail::Improve;
using detail::kInf;

// Step 2: lower bounds on what the tensors j..N-1 still add, over every cut and option.
struct OptionBounds {
  std::vector<double> net;  // Net*(j): the network from f, then the last post stage
  std::vector<double> ready;  // Ready*(j): from e, a group's readiness, its network and the rest
  double min_net = kInf, min_post = kInf;
  double max_chain = 0;  // the largest StageCost::chain of any group (step 1's canonical form)
};

// Every group's stage costs under every option, for all the passes of one search (step 2's
// bounds, the greedy passes, the seeds, step 5). Where the whole table fits in `max_bytes`
// (SearchOptions::price_table_bytes) every group is priced once, when the table is built, and
// stored option by option (a seed's passes read one option's costs in order); otherwise one row
// (groups [j, q] of one j) at a time, extended as far as the passes reach, and priced again when
// a later pass comes back to it. Not thread-safe.
class GroupCosts {
 public:
  GroupCosts(const OptionProblem& p, int64_t max_bytes) : p_(p), pricer_(p), options_(p.options.size()) {
    const auto n = static_cast<size_t>(p.size());
    const size_t groups = n * (n + 1) / 2;
    whole_ = max_bytes > 0 && groups * options_ * sizeof(Stored) <= static_cast<size_t>(max_bytes);
    if (!whole_) return;
    offset_.resize(n);
    groups_ = groups;
    table_.resize(groups * options_);
    std::vector<StageCost> buf(options_);
    size_t at = 0;
    for (size_t j = 0; j < n; ++j) {
      offset_[j] = at;
      pricer_.Start(static_cast<int>(j));
      for (size_t q = j; q < n; ++q, ++at) {
        pricer_.Price(static_cast<int>(q), buf);
        for (size_t o = 0; o < options_; ++o) {
          const StageCost& c = buf[o];
          table_[o * groups + at] = {c.pre(), c.net, c.net_busy, c.chain, c.post()};
        }
      }
    }
  }

  // Makes group [j, q] readable by Get. Where the table is not whole, row j is priced up to q
  // (with only >= 0, option `only` alone), from its start when j or only changed since the last
  // call; q may go back to any group the row holds.
  void Reach(int j, int q, int only = -1) {
    if (whole_) return;
    if (j != row_j_ || only != row_only_) {
      row_j_ = j;
      row_only_ = only;
      row_.clear();
      pricer_.Start(j);
    }
    while (row_.size() <= static_cast<size_t>(q - j) * options_) {
      const size_t at = row_.size();
      row_.resize(at + options_);
      pricer_.Price(j + static_cast<int>(at / options_), std::span<StageCost>(row_).subspan(at, options_), only);
    }
  }

  // Group [j, q]'s costs under option o, once Reach(j, q) (or Reach(j, q, o)) has run.
  StageCost Get(int j, int q, int o) const {
    if (!whole_) return row_[static_cast<size_t>(q - j) * options_ + static_cast<size_t>(o)];
    const Stored& c =
        table_[static_cast<size_t>(o) * groups_ + offset_[static_cast<size_t>(j)] + static_cast<size_t>(q - j)];
    StageCost r;
    r.net = c.net;
    r.net_busy = c.net_busy;
    r.chain = c.chain;
    if (p_.options[static_cast<size_t>(o)].offload) {
      r.cpu_pre = c.pre;
      r.cpu_post = c.post;
    } else {
      r.gpu_pre = c.pre;
      r.gpu_post = c.post;
    }
    return r;
  }

 private:
  // A StageCost without the device: an option's stages are all on the compute stream or all on
  // the CPU worker (offloaded), which the option says.
  struct Stored {
    double pre, net, net_busy, chain, post;
  };
  const OptionProblem& p_;
  OptionPricer pricer_;
  size_t options_;
  bool whole_ = false;
  std::vector<Stored> table_;  // whole: table_[o * groups_ + offset_[j] + q - j]
  size_t groups_ = 0;
  std::vector<size_t> offset_;
  std::vector<StageCost> row_;  // not whole: row_[(q - j) * options_ + o] of row row_j_
  int row_j_ = -1, row_only_ = -2;
};

// The bounds over every option (element option_count()) and, in the same pass over the groups,
// over each option alone (element o: every group with option o; step 4's seeds).
std::vector<OptionBounds> ComputeOptionBounds(const OptionProblem& p, GroupCosts& costs, int64_t& transitions) {
  const int n = p.size();
  const size_t options = p.options.size();
  std::vector<OptionBounds> all(options + 1);
  for (OptionBounds& b : all) {
    b.net.assign(n + 1, kInf);
    b.ready.assign(n + 1, kInf);
    b.net[n] = b.ready[n] = 0;
  }
  auto add = [&](OptionBounds& b, const StageCost& c, int j, int q) {
    const double net = c.net + std::max(c.post(), b.net[q + 1]);
    b.net[j] = std::min(b.net[j], net);
    b.ready[j] =
        std::min(b.ready[j], std::max(p.base.backward_prefix[q + 1] + c.pre() + net, c.gpu_pre + b.ready[q + 1]));
    b.min_net = std::min(b.min_net, c.net);
    b.min_post = std::min(b.min_post, c.post());
    b.max_chain = std::max(b.max_chain, c.chain);
  };
  for (int j = n - 1; j >= 0; --j) {
    for (int q = j; q < n; ++q) {
      costs.Reach(j, q);
      transitions += p.option_count();
      for (size_t o = 0; o < options; ++o) {
        const StageCost c = costs.Get(j, q, static_cast<int>(o));
        add(all[options], c, j, q);
        add(all[o], c, j, q);
      }
    }
  }
  return all;
}

// Step 1: a grouped prefix. Every coordinate only ever raises the final time.
struct OptionLabel {
  double e, f, x, y;  // as v1: encodes on the compute stream, network, decode chain from 0, e + decodes
  double g, u, v;  // the CPU worker: its encode chain, its decode chain from 0, the sum of its decodes
  int32_t parent;
  int32_t end;
  int32_t option;

  static bool Dominates(const OptionLabel& a, const OptionLabel& b) {
    return a.e <= b.e && a.f <= b.f && a.x <= b.x && a.y <= b.y && a.g <= b.g && a.u <= b.u && a.v <= b.v;
  }
};

// The recurrence of TimelineState::Add, kept apart from it: here the busy window ends at
// backward + (e + gpu_pre), there at (backward + e) + gpu_pre, which round differently; merging
// them would move label times by an ulp and could flip dominance and ties, so plans would change.
// `max_chain` bounds StageCost::chain over the groups and options the search extends with.
OptionLabel Extend(const OptionProblem& p, const OptionLabel& l, int32_t id, int q, int option, const StageCost& c,
                   double max_chain) {
  OptionLabel n = l;
  n.parent = id;
  n.end = q + 1;
  n.option = option;
  const double b = p.base.backward_prefix[static_cast<size_t>(q) + 1];
  const double backward = p.base.backward_prefix.back();  // the compute stream's work ends after
  const std::optional<double> previous = l.end > 0 ? std::optional(l.f) : std::nullopt;
  if (p.options[static_cast<size_t>(option)].offload) {
    n.g = std::max(b + l.e, l.g) + c.cpu_pre;
    n.f = CommEnd(CommStart(n.g, previous, c.chain), c.net, c.net_busy, backward + l.e);
    n.u = std::max(l.u, n.f) + c.cpu_post;
    n.v = l.v + c.cpu_post;
  } else {
    n.e = l.e + c.gpu_pre;
    n.f = CommEnd(CommStart(b + n.e, previous, c.chain), c.net, c.net_busy, backward + n.e);
    n.x = std::max(l.x, n.f) + c.gpu_post;
    n.y = l.y + c.gpu_pre + c.gpu_post;
  }
  // Step 1's canonical form: a coordinate that can no longer change the final time of any
  // completion is set to 0, so that more labels dominate one another (docs/MODEL.md). The next
  // collective is ready at b + n.e or later, so f no longer delays it once f + max_chain is not
  // later; then f = 0 delays it neither (b + n.e >= max_chain).
  if (n.x <= p.base.backward_prefix.back() + n.y) n.x = 0;
  if (n.u <= n.g + n.v) n.u = 0;
  if (n.f + max_chain <= b + n.e) n.f = 0;
  return n;
}

// Marks the options of one group worth extending a label with: an option whose seven stage costs
// are all >= another's of the same kind (both on-device or both offloaded) gives, from any
// label, a label the other's dominates (Extend is non-decreasing in the costs), so it is
// skipped; of equal ones the first is kept.
void UsefulOptions(const OptionProblem& p, std::span<const StageCost> c, std::vector<char>& useful) {
  const size_t n = c.size();
  useful.assign(n, 1);
  auto le = [](const StageCost& a, const StageCost& b) {
    return a.gpu_pre <= b.gpu_pre && a.cpu_pre <= b.cpu_pre && a.net <= b.net && a.net_busy <= b.net_busy &&
           a.chain <= b.chain && a.gpu_post <= b.gpu_post && a.cpu_post <= b.cpu_post;
  };
  for (size_t o = 0; o < n; ++o)
    for (size_t other = 0; other < n && useful[o]; ++other) {
      if (other == o || !useful[other] || p.options[other].offload != p.options[o].offload) continue;
      if (le(c[other], c[o]) && (other < o || !le(c[o], c[other]))) useful[o] = 0;
    }
}

double TimeOf(const OptionProblem& p, std::span<const int> ends, std::span<const int> opts,
              const std::vector<StageCost>& table, std::vector<StageCost>& scratch) {
  scratch.resize(ends.size());
  for (size_t k = 0; k < ends.size(); ++k) scratch[k] = table[k * p.options.size() + static_cast<size_t>(opts[k])];
  return IterationFromCosts(p, ends, opts, scratch);
}

OptionSearchResult ExhaustiveOptions(const OptionProblem& p) {
  const int n = p.size();
  const int options = p.option_count();
  OptionSearchResult best;
  best.iteration_us = kInf;
  std::vector<int> ends, opts;
  std::vector<StageCost> scratch;
  for (uint64_t mask = 0; mask < (uint64_t{1} << (n - 1)); ++mask) {
    ends.clear();
    for (int i = 0; i < n - 1; ++i)
      if (mask >> i & 1) ends.push_back(i);
    ends.push_back(n - 1);
    const std::vector<StageCost> table = CostTable(p, ends);
    opts.assign(ends.size(), 0);
    while (true) {
      const double t = TimeOf(p, ends, opts, table, scratch);
      ++best.stats.states;
      best.stats.transitions += static_cast<int64_t>(ends.size());
      if (t < best.iteration_us) {
        best.iteration_us = t;
        best.group_ends = ends;
        best.options = opts;
      }
      size_t k = 0;  // the next option tuple, as an odometer
      while (k < opts.size() && ++opts[k] == options) opts[k++] = 0;
      if (k == opts.size()) break;
    }
  }
  best.stats.optimal = true;
  best.lower_bound_us = best.iteration_us;
  return best;
}

// The options search's space for detail::LabelSearch: seven-coordinate labels, step 2's
// bounds, and per group the options worth extending (UsefulOptions; with `only_option` >= 0,
// that option alone, even where another would dominate it). The greedy pass tries every
// option (or only_option). Which options are useful is computed once per group, by the first
// label of its prefix that reaches it, and reused by the others.
class OptionsSpace {
 public:
  using Label = OptionLabel;

  OptionsSpace(const OptionProblem& p, GroupCosts& costs, const OptionBounds& sb, int only_option)
      : p_(p),
        costs_(costs),
        sb_(sb),
        only_(only_option),
        options_(p.options.size()),
        fixed_(p.base.forward_us + p.base.update_us),
        backward_(p.base.backward_prefix.back()),
        tried_(options_, only_option < 0 ? 1 : 0),
        group_(options_) {
    if (only_option >= 0) tried_[static_cast<size_t>(only_option)] = 1;
  }

  int size() const { return p_.size(); }
  Label Root() const { return {0, 0, 0, 0, 0, 0, 0, -1, 0, -1}; }
  int OptionOf(const Label& l) const { return l.option; }

  // Step 3.
  double LowerBound(const Label& l) const {
    const auto j = static_cast<size_t>(l.end);
    return fixed_ + std::max({backward_ + l.y, l.x, l.g + l.v, l.u, l.f + sb_.net[j], l.e + sb_.ready[j]});
  }
  double Final(const Label& l) const {
    return p_.base.forward_us + std::max({backward_ + l.y, l.x, l.g + l.v, l.u}) + p_.base.update_us;
  }
  // Step 5's cutoff.
  double Cutoff(const Label& l, int q) const {
    return fixed_ + p_.base.backward_prefix[static_cast<size_t>(q) + 1] + l.e + sb_.min_net + sb_.min_post;
  }

  void StartGreedyRow(int) {}
  template <class F>
  void ForGreedyOptions(int j, int q, const Label& l, int32_t id, F&& f) {
    costs_.Reach(j, q, only_);
    for (int o = 0; o < static_cast<int>(options_); ++o)
      if (tried_[static_cast<size_t>(o)]) f(Extend(p_, l, id, q, o, costs_.Get(j, q, o), sb_.max_chain));
  }

  void StartRow(int) { row_useful_.clear(); }
  template <class F>
  void ForOptions(int j, int q, const Label& l, int32_t id, F&& f) {
    const auto k = static_cast<size_t>(q - j);
    costs_.Reach(j, q, only_);
    if (row_useful_.size() == k * options_) {  // the first label here to reach q
      if (only_ < 0) {
        for (size_t o = 0; o < options_; ++o) group_[o] = costs_.Get(j, q, static_cast<int>(o));
        UsefulOptions(p_, group_, useful_);
        row_useful_.insert(row_useful_.end(), useful_.begin(), useful_.end());
      } else {
        row_useful_.insert(row_useful_.end(), tried_.begin(), tried_.end());
      }
    }
    const char* usable = &row_useful_[k * options_];
    for (int o = 0; o < static_cast<int>(options_); ++o)
      if (usable[o]) f(Extend(p_, l, id, q, o, costs_.Get(j, q, o), sb_.max_chain));
  }

 private:
  const OptionProblem& p_;
  GroupCosts& costs_;
  const OptionBounds& sb_;
  const int only_;
  const size_t options_;
  const double fixed_, backward_;
  std::vector<char> tried_;  // the greedy pass's options
  std::vector<char> useful_;  // UsefulOptions' of one group
  std::vector<char> row_useful_;  // row_useful_[(q - j) * options_ + o] of the row StartRow began
  std::vector<StageCost> group_;  // one group's costs, for UsefulOptions
};

// The first search gets at most budget / kFirstShare nodes; each single-option seed search at
// most budget / kSeedShare.
constexpr int64_t kFirstShare = 20;
constexpr int64_t kSeedShare = 1000;

struct Incumbent {
  std::vector<int> ends, options;
  double time = kInf;
};

// Steps 1-5 of docs/MODEL.md's v2 search, from `start` as the incumbent (and, with `greedy`,
// step 4's greedy pass), until st.transitions reaches `budget`; with `only_option` >= 0, over
// the strategies with that option on every group.
OptionSearchResult BranchAndBoundOptions(const OptionProblem& p, GroupCosts& costs, const OptionBounds& sb,
                                         int64_t budget, Incumbent start, bool greedy, int only_option,
                                         SearchStats& st) {
  OptionsSpace space(p, costs, sb, only_option);
  detail::LabelSearch<OptionsSpace> dp(space, st);
  Incumbent inc = std::move(start);
  if (greedy) {
    auto [found, time] = dp.Greedy();
    if (time < inc.time) inc = {std::move(found.ends), std::move(found.options), time};
  }
  const detail::LabelSearchResult found = dp.Run(inc.time, budget, detail::OnBudget::kCollectOpenBound);
  OptionSearchResult r;
  r.group_ends = found.found ? found.best.ends : inc.ends;
  r.options = found.found ? found.best.options : inc.options;
  if (!r.group_ends.empty()) r.iteration_us = OptionIterationTime(p, r.group_ends, r.options);
  st.optimal = !found.stopped;
  r.lower_bound_us = found.stopped ? std::min(found.open_bound, r.iteration_us) : r.iteration_us;
  return r;
}

// Step 4 onwards, from the better of Espresso's plan and the fusion optimum: a first search with
// 1/kFirstShare of the budget (most prove their optimum within it, for less than the seeds
// cost); where it does not, the single-option seeds, then the search again from the best of
// them with the rest of the budget.
OptionSearchResult SeededSearch(const OptionProblem& p, GroupCosts& costs, const std::vector<OptionBounds>& bounds,
                                int64_t budget, Incumbent start, SearchStats& st) {
  const int64_t first_cap = std::min(budget, st.transitions + budget / kFirstShare);
  OptionSearchResult found = BranchAndBoundOptions(p, costs, bounds.back(), first_cap, start, true, -1, st);
  if (st.optimal) return found;
  if (found.iteration_us < start.time) start = {found.group_ends, found.options, found.iteration_us};
  // The seeds: per option, the best grouping with that option on every group (a search over
  // cuts only, at most 1/kSeedShare of the budget each), then Espresso's two steps from it.
  for (int o = 0; o < p.option_count(); ++o) {
    SearchStats seed_st = st;
    const int64_t cap = std::min(budget, st.transitions + budget / kSeedShare);
    const OptionSearchResult seed =
        BranchAndBoundOptions(p, costs, bounds[static_cast<size_t>(o)], cap, {}, true, o, seed_st);
    st.transitions = seed_st.transitions;
    if (seed.group_ends.empty()) continue;
    int64_t changes = 0;
    std::vector<int> opts = Improve(p, seed.group_ends, seed.options, changes);
    st.transitions += changes * static_cast<int64_t>(seed.group_ends.size());
    const double t = OptionIterationTime(p, seed.group_ends, opts);
    if (t < start.time) start = {seed.group_ends, std::move(opts), t};
  }
  return BranchAndBoundOptions(p, costs, bounds.back(), budget, std::move(start), false, -1, st);
}

}  // namespace

StatusOr<OptionSearchResult> SearchWithOptions(const OptionProblem& p, const SearchOptions& options) {
  CUPCAKE_CHECK_GE(p.size(), 1);
  if (options.node_budget < 1)
    return InvalidArgumentError("--budget: must be positive; got " + std::to_string(options.node_budget));
  OptionSearchResult r;
  if (options.algorithm == Algorithm::kExhaustive) {
    if (p.size() > kMaxExhaustiveOptionTensors)
      return InvalidArgumentError("--algorithm exhaustive: too many tensors for --search-space options; got " +
                                  std::to_string(p.size()) +
                                  ", expected <= " + std::to_string(kMaxExhaustiveOptionTensors) +
                                  " (every cut times every option per group); use branch_and_bound");
    r = ExhaustiveOptions(p);
    r.stats.algorithm = AlgorithmName(options.algorithm);
    return r;
  }
  SearchOptions v1 = options;
  v1.algorithm = IsFixedStrategy(options.algorithm) ? options.algorithm : Algorithm::kBranchAndBound;
  v1.seed_incumbents = true;  // the fusion optimum: an incumbent, or what an unseeded run falls back to
  CUPCAKE_ASSIGN_OR_RETURN(SearchResult fusion, Search(p.base, v1));
  const std::vector<int> fusion_options(fusion.group_ends.size(), p.fusion_option);
  r.fusion_us = OptionIterationTime(p, fusion.group_ends, fusion_options);
  if (IsFixedStrategy(options.algorithm)) {
    r.group_ends = fusion.group_ends;
    r.options = fusion_options;
    r.iteration_us = r.fusion_us;
    r.stats = fusion.stats;
    r.lower_bound_us = 0;
    return r;
  }
  int64_t evaluations = 0;
  const std::vector<int> espresso = Espresso(p, fusion.group_ends, evaluations);
  r.espresso_us = OptionIterationTime(p, fusion.group_ends, espresso);
  r.espresso_groups = static_cast<int>(fusion.group_ends.size());
  SearchStats st;
  st.algorithm = AlgorithmName(options.algorithm);
  st.budget = options.node_budget;
  st.transitions = fusion.stats.transitions + evaluations * static_cast<int64_t>(fusion.group_ends.size());
  if (options.algorithm == Algorithm::kEspresso) {
    r.group_ends = fusion.group_ends;
    r.options = espresso;
    r.iteration_us = r.espresso_us;
    st.states = evaluations;
    st.optimal = false;
    r.stats = st;
    r.lower_bound_us = 0;
    return r;
  }
  GroupCosts costs(p, options.price_table_bytes);
  const std::vector<OptionBounds> bounds = ComputeOptionBounds(p, costs, st.transitions);
  OptionSearchResult found;
  if (!options.seed_incumbents) {
    Incumbent none{fusion.group_ends, fusion_options, kInf};  // kept only if nothing is found
    found = BranchAndBoundOptions(p, costs, bounds.back(), options.node_budget, std::move(none), false, -1, st);
  } else {
    Incumbent start = r.espresso_us <= r.fusion_us ? Incumbent{fusion.group_ends, espresso, r.espresso_us}
                                                   : Incumbent{fusion.group_ends, fusion_options, r.fusion_us};
    found = SeededSearch(p, costs, bounds, options.node_budget, std::move(start), st);
  }
  found.fusion_us = r.fusion_us;
  found.espresso_us = r.espresso_us;
  found.espresso_groups = r.espresso_groups;
  found.stats = st;
  return found;
}

}  // namespace cupcake::planner

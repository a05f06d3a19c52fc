// The search over groups and per-group options (docs/MODEL.md, "Iteration time (v2)", "Search
// over groups and options"): v1's label DP with the CPU worker as three more label coordinates,
// its exhaustive oracle, and Espresso's two-step heuristic. Step numbers refer to MODEL.md.
#include <algorithm>
#include <limits>

#include "cupcake/planner/options.h"
#include "cupcake/planner/search.h"

namespace cupcake::planner {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Step 2: lower bounds on what the tensors j..N-1 still add, over every cut and option.
struct OptionBounds {
  std::vector<double> net;  // Net*(j): the network from f, then the last post stage
  std::vector<double> ready;  // Ready*(j): from e, a group's readiness, its network and the rest
  double min_net = kInf, min_post = kInf;
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
          table_[o * groups + at] = {c.pre(), c.net, c.net_busy, c.post()};
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
    double pre, net, net_busy, post;
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
struct Label {
  double e, f, x, y;  // as v1: encodes on the compute stream, network, decode chain from 0, e + decodes
  double g, u, v;  // the CPU worker: its encode chain, its decode chain from 0, the sum of its decodes
  int32_t parent;
  int32_t end;
  int32_t option;
};

bool Dominates(const Label& a, const Label& b) {
  return a.e <= b.e && a.f <= b.f && a.x <= b.x && a.y <= b.y && a.g <= b.g && a.u <= b.u && a.v <= b.v;
}

Label Extend(const OptionProblem& p, const Label& l, int32_t id, int q, int option, const StageCost& c) {
  Label n = l;
  n.parent = id;
  n.end = q + 1;
  n.option = option;
  const double b = p.base.backward_prefix[static_cast<size_t>(q) + 1];
  const double backward = p.base.backward_prefix.back();  // the compute stream's work ends after
  if (p.options[static_cast<size_t>(option)].offload) {
    n.g = std::max(b + l.e, l.g) + c.cpu_pre;
    n.f = CommEnd(std::max(n.g, l.f), c.net, c.net_busy, backward + l.e);
    n.u = std::max(l.u, n.f) + c.cpu_post;
    n.v = l.v + c.cpu_post;
  } else {
    n.e = l.e + c.gpu_pre;
    n.f = CommEnd(std::max(b + n.e, l.f), c.net, c.net_busy, backward + n.e);
    n.x = std::max(l.x, n.f) + c.gpu_post;
    n.y = l.y + c.gpu_pre + c.gpu_post;
  }
  // Step 1's canonical form: a coordinate that can no longer change the final time of any
  // completion is set to 0, so that more labels dominate one another (docs/MODEL.md).
  if (n.x <= p.base.backward_prefix.back() + n.y) n.x = 0;
  if (n.u <= n.g + n.v) n.u = 0;
  if (n.f <= b + n.e) n.f = 0;
  return n;
}

double FinalTime(const OptionProblem& p, const Label& l) {
  return p.base.forward_us + std::max({p.base.backward_prefix.back() + l.y, l.x, l.g + l.v, l.u}) + p.base.update_us;
}

void StrategyOf(const std::vector<Label>& labels, int32_t id, std::vector<int>& ends, std::vector<int>& options) {
  ends.clear();
  options.clear();
  for (; labels[static_cast<size_t>(id)].end > 0; id = labels[static_cast<size_t>(id)].parent) {
    ends.push_back(labels[static_cast<size_t>(id)].end - 1);
    options.push_back(labels[static_cast<size_t>(id)].option);
  }
  std::reverse(ends.begin(), ends.end());
  std::reverse(options.begin(), options.end());
}

// Marks the options of one group worth extending a label with: an option whose six stage costs
// are all >= another's of the same kind (both on-device or both offloaded) gives, from any
// label, a label the other's dominates (Extend is non-decreasing in the costs), so it is
// skipped; of equal ones the first is kept.
void UsefulOptions(const OptionProblem& p, std::span<const StageCost> c, std::vector<char>& useful) {
  const size_t n = c.size();
  useful.assign(n, 1);
  auto le = [](const StageCost& a, const StageCost& b) {
    return a.gpu_pre <= b.gpu_pre && a.cpu_pre <= b.cpu_pre && a.net <= b.net && a.net_busy <= b.net_busy &&
           a.gpu_post <= b.gpu_post && a.cpu_post <= b.cpu_post;
  };
  for (size_t o = 0; o < n; ++o)
    for (size_t other = 0; other < n && useful[o]; ++other) {
      if (other == o || !useful[other] || p.options[other].offload != p.options[o].offload) continue;
      if (le(c[other], c[o]) && (other < o || !le(c[o], c[other]))) useful[o] = 0;
    }
}

// Every group's stage costs under every option: costs[k * O + o].
std::vector<StageCost> CostTable(const OptionProblem& p, std::span<const int> ends) {
  OptionPricer pricer(p);
  const size_t options = p.options.size();
  std::vector<StageCost> table(ends.size() * options);
  int first = 0;
  for (size_t k = 0; k < ends.size(); ++k) {
    pricer.Start(first);
    pricer.Price(ends[k], std::span<StageCost>(table).subspan(k * options, options));
    first = ends[k] + 1;
  }
  return table;
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

// One grouping's timeline under options `opts` and under each option tried in one group in its
// place (Espresso's steps try one change at a time): resumed from the state before the changed
// group, and stopped once a lower bound of its time passes the one to beat.
class OneChange {
 public:
  OneChange(const OptionProblem& p, std::span<const int> ends, std::vector<int> opts)
      : p_(p),
        ends_(ends),
        opts_(std::move(opts)),
        table_(CostTable(p, ends)),
        before_(ends.size() + 1),
        rest_stream_(ends.size() + 1),
        rest_cpu_(ends.size() + 1),
        rest_net_(ends.size() + 1) {
    Reset();
  }

  const std::vector<int>& opts() const { return opts_; }
  double time() const { return before_.back().Final(p_); }

  // Group k's option becomes o.
  void Set(size_t k, int o) {
    opts_[k] = o;
    Reset();
  }

  // The time with group k under option o instead; where that is above `beat` (the time to beat),
  // possibly only a lower bound of it, also above `beat`.
  double With(size_t k, int o, double beat) const {
    TimelineState s = before_[k];
    Add(s, k, o);
    // The compute stream's and the CPU worker's chains grow by at least the later groups' work,
    // and the network's by their collectives, which the last group's post stage follows.
    const double fixed = p_.base.forward_us + p_.base.update_us;
    const double backward = p_.base.backward_prefix.back();
    const double stop = beat * (1 + 1e-12);  // rounding never stops one that beats it
    for (size_t m = k + 1; m < ends_.size(); ++m) {
      const double bound = fixed + std::max({backward + s.y + rest_stream_[m], s.x, s.g + s.v + rest_cpu_[m], s.u,
                                             s.f + rest_net_[m] + last_post_});
      if (bound > stop) return bound;
      Add(s, m, opts_[m]);
    }
    return s.Final(p_);
  }

 private:
  const StageCost& Cost(size_t k, int o) const { return table_[k * p_.options.size() + static_cast<size_t>(o)]; }
  void Add(TimelineState& s, size_t k, int o) const {
    s.Add(p_, ends_[k], p_.options[static_cast<size_t>(o)].offload, Cost(k, o));
  }
  void Reset() {
    const size_t n = ends_.size();
    for (size_t k = 0; k < n; ++k) {
      before_[k + 1] = before_[k];
      Add(before_[k + 1], k, opts_[k]);
    }
    rest_stream_[n] = rest_cpu_[n] = rest_net_[n] = 0;
    for (size_t k = n; k-- > 0;) {
      const StageCost& c = Cost(k, opts_[k]);
      rest_stream_[k] = rest_stream_[k + 1] + c.gpu_pre + c.gpu_post;
      rest_cpu_[k] = rest_cpu_[k + 1] + c.cpu_pre + c.cpu_post;
      rest_net_[k] = rest_net_[k + 1] + c.net;
    }
    last_post_ = Cost(n - 1, opts_[n - 1]).post();
  }

  const OptionProblem& p_;
  std::span<const int> ends_;
  std::vector<int> opts_;
  std::vector<StageCost> table_;  // CostTable's
  std::vector<TimelineState> before_;  // before_[k]: after groups 0..k-1 under opts_
  // Groups k.. under opts_: their compute-stream work, CPU work and collectives (idle).
  std::vector<double> rest_stream_, rest_cpu_, rest_net_;
  double last_post_ = 0;  // the last group's post stage under opts_
};

// Espresso's two steps (seeds: Espresso; docs/MODEL.md) on fixed groups, from the options
// `opts` (Espresso's own start: flat_fp32 on the plan's device, every group). Returns the options.
std::vector<int> Improve(const OptionProblem& p, std::span<const int> ends, std::vector<int> opts,
                         int64_t& evaluations) {
  OneChange tl(p, ends, std::move(opts));
  const size_t k_count = ends.size();
  // Step 1: among every group and on-device option, the single change that shortens the whole
  // timeline most, until none does.
  for (size_t round = 0; round < k_count * p.options.size(); ++round) {
    double best = tl.time();
    size_t best_k = 0;
    int best_o = -1;
    for (size_t k = 0; k < k_count; ++k) {
      for (int o = 0; o < p.option_count(); ++o) {
        if (o == tl.opts()[k] || p.options[static_cast<size_t>(o)].offload) continue;
        const double t = tl.With(k, o, best);
        ++evaluations;
        if (t < best) {
          best = t;
          best_k = k;
          best_o = o;
        }
      }
    }
    if (best_o < 0) break;
    tl.Set(best_k, best_o);
  }
  // Step 2: earliest ready first, offload a group (its scheme on the CPU) when that shortens it.
  for (size_t k = 0; k < k_count; ++k) {
    const int offloaded = FindOption(p, p.options[static_cast<size_t>(tl.opts()[k])].scheme->name, pb::CPU);
    if (offloaded < 0 || !p.options[static_cast<size_t>(offloaded)].offload) continue;
    ++evaluations;
    if (tl.With(k, offloaded, tl.time()) < tl.time()) tl.Set(k, offloaded);
  }
  return tl.opts();
}

std::vector<int> Espresso(const OptionProblem& p, std::span<const int> ends, int64_t& evaluations) {
  int start = FindOption(p, "flat_fp32", p.base.device);
  if (start < 0) start = p.fusion_option;
  return Improve(p, ends, std::vector<int>(ends.size(), start), evaluations);
}

// The first search gets at most budget / kFirstShare nodes; each single-option seed search at
// most budget / kSeedShare.
constexpr int64_t kFirstShare = 20;
constexpr int64_t kSeedShare = 1000;

struct Incumbent {
  std::vector<int> ends, options;
  double time = kInf;
};

// Steps 1-5 of docs/MODEL.md's v2 search, from `start` as the incumbent, until st.transitions
// reaches `budget`; with `only_option` >= 0, over the strategies with that option on every group.
OptionSearchResult BranchAndBoundOptions(const OptionProblem& p, GroupCosts& costs, const OptionBounds& sb,
                                         int64_t budget, Incumbent start, bool greedy, int only_option,
                                         SearchStats& st) {
  const int n = p.size();
  const double fixed = p.base.forward_us + p.base.update_us;
  const double backward_total = p.base.backward_prefix[static_cast<size_t>(n)];
  // The options extended: every one (per group, the main search then keeps UsefulOptions'), or
  // only_option alone, even where another would dominate it.
  std::vector<char> useful(p.options.size(), only_option < 0 ? 1 : 0);
  if (only_option >= 0) useful[static_cast<size_t>(only_option)] = 1;
  auto lower_bound = [&](const Label& l) {
    const size_t j = static_cast<size_t>(l.end);
    return fixed + std::max({backward_total + l.y, l.x, l.g + l.v, l.u, l.f + sb.net[j], l.e + sb.ready[j]});
  };
  Incumbent inc = std::move(start);
  const Label root{0, 0, 0, 0, 0, 0, 0, -1, 0, -1};

  // Step 4's greedy pass: per prefix only the label with the smallest bound.
  if (greedy) {
    std::vector<Label> best(static_cast<size_t>(n) + 1);
    std::vector<double> best_lb(static_cast<size_t>(n) + 1, kInf);
    std::vector<Label> chain;
    best[0] = root;
    for (int j = 0; j < n; ++j) {
      if (j > 0 && best_lb[static_cast<size_t>(j)] == kInf) continue;
      chain.push_back(best[static_cast<size_t>(j)]);
      const int32_t id = static_cast<int32_t>(chain.size() - 1);
      for (int q = j; q < n; ++q) {
        costs.Reach(j, q, only_option);
        for (int o = 0; o < p.option_count(); ++o) {
          if (!useful[static_cast<size_t>(o)]) continue;
          const Label next = Extend(p, chain[static_cast<size_t>(id)], id, q, o, costs.Get(j, q, o));
          ++st.transitions;
          const double lb = q == n - 1 ? FinalTime(p, next) : lower_bound(next);
          if (lb < best_lb[static_cast<size_t>(q) + 1]) {
            best_lb[static_cast<size_t>(q) + 1] = lb;
            best[static_cast<size_t>(q) + 1] = next;
          }
        }
      }
    }
    chain.push_back(best[static_cast<size_t>(n)]);
    if (best_lb[static_cast<size_t>(n)] < inc.time) {
      inc.time = best_lb[static_cast<size_t>(n)];
      StrategyOf(chain, static_cast<int32_t>(chain.size() - 1), inc.ends, inc.options);
    }
  }

  // Step 5: labels by prefix length, then bound; cutoff; dominance in all seven coordinates.
  // Every label of prefix j extends over the same groups j..q: which options are useful is
  // computed once per prefix (by the first label that reaches q) and reused by the others. Nodes
  // count per label and group, so budgets and plans do not depend on the reuse.
  const size_t option_count = p.options.size();
  std::vector<char> row_useful;  // row_useful[(q - j) * option_count + o]
  std::vector<StageCost> group(option_count);  // one group's costs, for UsefulOptions
  int row_j = -1;
  std::vector<Label> labels{root};
  std::vector<std::vector<int32_t>> at(static_cast<size_t>(n));
  at[0].push_back(0);
  int32_t best_label = -1;
  bool stopped = false;
  double open_bound = kInf;  // the smallest bound of a label left unexpanded when stopped
  std::vector<std::pair<double, int32_t>> order;
  for (int j = 0; j < n && !stopped; ++j) {
    order.clear();
    for (int32_t id : at[static_cast<size_t>(j)]) order.emplace_back(lower_bound(labels[static_cast<size_t>(id)]), id);
    std::sort(order.begin(), order.end());
    for (auto [lb, id] : order) {
      if (lb >= inc.time) {
        ++st.pruned;
        continue;
      }
      if (st.transitions >= budget) {
        stopped = true;
        open_bound = std::min(open_bound, lb);
        continue;  // the rest of `order` only adds to open_bound
      }
      ++st.states;
      const Label l = labels[static_cast<size_t>(id)];
      if (row_j != j) {
        row_j = j;
        row_useful.clear();
      }
      for (int q = j; q < n; ++q) {
        if (fixed + p.base.backward_prefix[static_cast<size_t>(q) + 1] + l.e + sb.min_net + sb.min_post >= inc.time)
          break;
        const int k = q - j;
        costs.Reach(j, q, only_option);
        if (row_useful.size() == static_cast<size_t>(k) * option_count) {  // the first label here to reach q
          if (only_option < 0) {
            for (size_t o = 0; o < option_count; ++o) group[o] = costs.Get(j, q, static_cast<int>(o));
            UsefulOptions(p, group, useful);
          }
          row_useful.insert(row_useful.end(), useful.begin(), useful.end());
        }
        const char* usable = &row_useful[static_cast<size_t>(k) * option_count];
        for (int o = 0; o < p.option_count(); ++o) {
          if (!usable[o]) continue;
          const Label next = Extend(p, l, id, q, o, costs.Get(j, q, o));
          ++st.transitions;
          if (q == n - 1) {
            const double t = FinalTime(p, next);
            if (t < inc.time) {
              inc.time = t;
              labels.push_back(next);
              best_label = static_cast<int32_t>(labels.size() - 1);
            }
            continue;
          }
          if (lower_bound(next) >= inc.time) {
            ++st.pruned;
            continue;
          }
          std::vector<int32_t>& list = at[static_cast<size_t>(q) + 1];
          bool dominated = false;
          for (size_t i = 0; i < list.size();) {
            ++st.transitions;
            const Label& other = labels[static_cast<size_t>(list[i])];
            if (Dominates(other, next)) {
              std::swap(list[i], list[0]);
              dominated = true;
              break;
            }
            if (Dominates(next, other)) {
              list[i] = list.back();
              list.pop_back();
              ++st.pruned;
              continue;
            }
            ++i;
          }
          if (dominated) {
            ++st.pruned;
            continue;
          }
          labels.push_back(next);
          list.push_back(static_cast<int32_t>(labels.size() - 1));
        }
      }
    }
    at[static_cast<size_t>(j)].clear();
    at[static_cast<size_t>(j)].shrink_to_fit();
  }
  if (stopped)
    for (const auto& list : at)
      for (int32_t id : list) open_bound = std::min(open_bound, lower_bound(labels[static_cast<size_t>(id)]));

  OptionSearchResult r;
  if (best_label >= 0) {
    StrategyOf(labels, best_label, r.group_ends, r.options);
  } else {
    r.group_ends = inc.ends;
    r.options = inc.options;
  }
  if (!r.group_ends.empty()) r.iteration_us = OptionIterationTime(p, r.group_ends, r.options);
  st.optimal = !stopped;
  r.lower_bound_us = stopped ? std::min(open_bound, r.iteration_us) : r.iteration_us;
  return r;
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
    // Step 4: a first search with 1/kFirstShare of the budget; most prove their optimum within
    // it, for less than the seeds below cost.
    const int64_t first_cap = std::min(options.node_budget, st.transitions + options.node_budget / kFirstShare);
    found = BranchAndBoundOptions(p, costs, bounds.back(), first_cap, start, true, -1, st);
    if (!st.optimal) {
      if (found.iteration_us < start.time) start = {found.group_ends, found.options, found.iteration_us};
      // The seeds: per option, the best grouping with that option on every group (a search over
      // cuts only, at most 1/kSeedShare of the budget each), then Espresso's two steps from it.
      for (int o = 0; o < p.option_count(); ++o) {
        SearchStats seed_st = st;
        const int64_t cap = std::min(options.node_budget, st.transitions + options.node_budget / kSeedShare);
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
      // Then the search again, from the best of them, with the rest of the budget.
      found = BranchAndBoundOptions(p, costs, bounds.back(), options.node_budget, std::move(start), false, -1, st);
    }
  }
  found.fusion_us = r.fusion_us;
  found.espresso_us = r.espresso_us;
  found.espresso_groups = r.espresso_groups;
  found.stats = st;
  return found;
}

}  // namespace cupcake::planner

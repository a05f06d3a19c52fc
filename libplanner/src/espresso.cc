// Espresso's two-step heuristic on fixed groups (docs/MODEL.md, "Espresso"), the options
// search's seeds and its `--algorithm espresso`.
#include "espresso.h"

#include <algorithm>

namespace cupcake::planner::detail {

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

namespace {

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

}  // namespace

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

}  // namespace cupcake::planner::detail

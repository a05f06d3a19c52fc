// The label DP that both searches run (docs/MODEL.md, "Search" and "Search over groups and
// options"): labels by prefix length, expanded in increasing lower bound; a greedy pass for an
// incumbent; the cutoff, the bound and dominance against the incumbent; a node budget. Written
// once here and instantiated for the fusion search (one option per group, four coordinates) and
// the options search (every useful option, seven coordinates).
//
// A Space supplies what differs between them:
//   using Label;   with int32_t parent, end; Label::Dominates(a, b)
//   int size() const;  Label Root() const;
//   double LowerBound(const Label&) const;   double Final(const Label&) const;
//   double Cutoff(const Label& l, int q) const;  a lower bound of every strategy that closes
//       l's next group at q or later (non-decreasing in q)
//   void StartGreedyRow(int j);  void StartRow(int j);  the first label of prefix j
//   template <class F> void ForGreedyOptions(int j, int q, const Label& l, int32_t id, F&& f);
//   template <class F> void ForOptions(int j, int q, const Label& l, int32_t id, F&& f);
//       call f(next) with l (label `id`, of prefix j) extended by group [j, q] under each
//       option the pass tries (the greedy pass and the DP may try different sets)
//   int OptionOf(const Label&) const;
// The node count, states and pruned labels are the searches' counters (SearchStats); the space
// counts none of them. Pure; not thread-safe (the space's row caches).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "cupcake/planner/search.h"

namespace cupcake::planner::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A strategy: each group's last tensor and option.
struct Strategy {
  std::vector<int> ends, options;
};

// What one run of the DP found.
struct LabelSearchResult {
  bool found = false;  // a strategy better than the incumbent given (else `best` is empty)
  Strategy best;
  double time = kInf;  // the incumbent at the end: best's final time, or the one given
  bool stopped = false;  // the budget ran out before every label was expanded or pruned
  // Stopped: the smallest lower bound of a label left unexpanded (kInf where none).
  double open_bound = kInf;
};

// Whether the run goes on past the budget to collect every unexpanded label's bound
// (LabelSearchResult::open_bound), or stops at once.
enum class OnBudget { kStop, kCollectOpenBound };

template <class Space>
class LabelSearch {
 public:
  using Label = typename Space::Label;

  LabelSearch(Space& space, SearchStats& stats) : s_(space), st_(stats) {}

  // The greedy pass (per prefix, only the label with the smallest bound): the strategy and its
  // final time, for an incumbent.
  std::pair<Strategy, double> Greedy() {
    const int n = s_.size();
    std::vector<Label> best(static_cast<size_t>(n) + 1);
    std::vector<double> best_lb(static_cast<size_t>(n) + 1, kInf);
    std::vector<Label> chain;  // the greedy labels, for the strategy's reconstruction
    best[0] = s_.Root();
    for (int j = 0; j < n; ++j) {
      if (j > 0 && best_lb[static_cast<size_t>(j)] == kInf) continue;
      chain.push_back(best[static_cast<size_t>(j)]);
      const auto id = static_cast<int32_t>(chain.size() - 1);
      s_.StartGreedyRow(j);
      for (int q = j; q < n; ++q) {
        s_.ForGreedyOptions(j, q, chain[static_cast<size_t>(id)], id, [&](const Label& next) {
          ++st_.transitions;
          const double lb = q == n - 1 ? s_.Final(next) : s_.LowerBound(next);
          if (lb < best_lb[static_cast<size_t>(q) + 1]) {
            best_lb[static_cast<size_t>(q) + 1] = lb;
            best[static_cast<size_t>(q) + 1] = next;
          }
        });
      }
    }
    chain.push_back(best[static_cast<size_t>(n)]);
    return {StrategyOf(chain, static_cast<int32_t>(chain.size() - 1)), best_lb[static_cast<size_t>(n)]};
  }

  // The DP from the incumbent time `incumbent` until the node count reaches `budget`.
  LabelSearchResult Run(double incumbent, int64_t budget, OnBudget on_budget) {
    const int n = s_.size();
    incumbent_ = incumbent;
    labels_.assign(1, s_.Root());
    at_.assign(static_cast<size_t>(n), {});
    at_[0].push_back(0);
    best_label_ = -1;
    LabelSearchResult r;
    std::vector<std::pair<double, int32_t>> order;
    for (int j = 0; j < n && !r.stopped; ++j) {
      order.clear();
      for (int32_t id : at_[static_cast<size_t>(j)]) order.emplace_back(s_.LowerBound(Get(id)), id);
      std::sort(order.begin(), order.end());
      bool row_started = false;
      for (auto [lb, id] : order) {
        if (lb >= incumbent_) {
          ++st_.pruned;
          continue;
        }
        if (st_.transitions >= budget) {
          r.stopped = true;
          if (on_budget == OnBudget::kStop) break;
          r.open_bound = std::min(r.open_bound, lb);
          continue;  // the rest of `order` only adds to open_bound
        }
        ++st_.states;
        if (!row_started) {
          row_started = true;
          s_.StartRow(j);
        }
        Expand(j, id);
      }
      at_[static_cast<size_t>(j)].clear();
      at_[static_cast<size_t>(j)].shrink_to_fit();
    }
    if (r.stopped && on_budget == OnBudget::kCollectOpenBound)
      for (const auto& list : at_)
        for (int32_t id : list) r.open_bound = std::min(r.open_bound, s_.LowerBound(Get(id)));
    r.time = incumbent_;
    if (best_label_ >= 0) {
      r.found = true;
      r.best = StrategyOf(labels_, best_label_);
    }
    return r;
  }

 private:
  const Label& Get(int32_t id) const { return labels_[static_cast<size_t>(id)]; }

  // Every group [j, q] after label `id` (of prefix j), under each option the space offers.
  void Expand(int j, int32_t id) {
    const int n = s_.size();
    const Label l = Get(id);
    for (int q = j; q < n; ++q) {
      // Every later q closes this group later still (docs/MODEL.md, "Cutoff").
      if (s_.Cutoff(l, q) >= incumbent_) break;
      s_.ForOptions(j, q, l, id, [&](const Label& next) {
        ++st_.transitions;
        if (q == n - 1) {
          const double t = s_.Final(next);
          if (t < incumbent_) {
            incumbent_ = t;
            labels_.push_back(next);
            best_label_ = static_cast<int32_t>(labels_.size() - 1);
          }
          return;
        }
        if (s_.LowerBound(next) >= incumbent_) {
          ++st_.pruned;
          return;
        }
        Insert(at_[static_cast<size_t>(q) + 1], next);
      });
    }
  }

  // Dominance among the labels of one prefix. The list holds only live labels; a dominating
  // label moves to the front, where the next check meets it first. Comparisons count as nodes.
  void Insert(std::vector<int32_t>& list, const Label& next) {
    for (size_t i = 0; i < list.size();) {
      ++st_.transitions;
      const Label& other = Get(list[i]);
      if (Label::Dominates(other, next)) {
        std::swap(list[i], list[0]);
        ++st_.pruned;
        return;
      }
      if (Label::Dominates(next, other)) {
        list[i] = list.back();
        list.pop_back();
        ++st_.pruned;
        continue;
      }
      ++i;
    }
    labels_.push_back(next);
    list.push_back(static_cast<int32_t>(labels_.size() - 1));
  }

  Strategy StrategyOf(const std::vector<Label>& labels, int32_t id) const {
    Strategy s;
    for (; labels[static_cast<size_t>(id)].end > 0; id = labels[static_cast<size_t>(id)].parent) {
      s.ends.push_back(labels[static_cast<size_t>(id)].end - 1);
      s.options.push_back(s_.OptionOf(labels[static_cast<size_t>(id)]));
    }
    std::reverse(s.ends.begin(), s.ends.end());
    std::reverse(s.options.begin(), s.options.end());
    return s;
  }

  Space& s_;
  SearchStats& st_;
  double incumbent_ = kInf;
  std::vector<Label> labels_;
  std::vector<std::vector<int32_t>> at_;  // at_[j]: the live labels of prefix j
  int32_t best_label_ = -1;
};

}  // namespace cupcake::planner::detail

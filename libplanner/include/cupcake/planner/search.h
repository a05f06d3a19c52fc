// The fusion search: the strategy (a cut of the tensors into contiguous groups) with the
// minimum predicted iteration time over all 2^(N-1) of them, under cost_model.h's model.
// See docs/MODEL.md for the algorithm and the proof of every pruning rule.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cupcake/planner/cost_model.h"
#include "cupcake/proto/status.h"

namespace cupcake::planner {

enum class Algorithm {
  kBranchAndBound,  // exact DP over prefixes with dominance and bounds (the default)
  kExhaustive,  // every partition; the tests' oracle, refused above kMaxExhaustiveTensors
  // Fixed strategies, no search: what users run today, planned so that the runtime can run
  // them beside the optimum (an evaluation's baselines). Never "proven optimal".
  kLayerwise,  // one group per tensor
  kOneGroup,  // one group of every tensor
  kBucket,  // buckets of SearchOptions::bucket_bytes, closed as DDP closes them
  // Espresso's two steps (docs/MODEL.md, v2) on the fusion optimum's groups: options chosen
  // greedily, then offloading; needs SearchSpace::kOptions. Never "proven optimal".
  kEspresso,
};

// What a search chooses: the groups only, every group with the plan's one option (v1), or the
// groups and each group's option (v2, docs/MODEL.md).
enum class SearchSpace {
  kFusion,
  kOptions,
};
std::string SearchSpaceName(SearchSpace s);
// cupcake-plan's --budget when none is given: kDefaultNodeBudget, or for the options space
// kDefaultOptionsNodeBudget.
int64_t DefaultNodeBudget(SearchSpace s);
// "fusion" / "options"; the error names the flag and the choices.
StatusOr<SearchSpace> ParseSearchSpace(const std::string& name);

// Whether `a` is a fixed strategy rather than a search.
inline bool IsFixedStrategy(Algorithm a) {
  return a == Algorithm::kLayerwise || a == Algorithm::kOneGroup || a == Algorithm::kBucket;
}

inline constexpr int kMaxExhaustiveTensors = 24;
// Options space: every cut times every option per group (about (options + 1)^N strategies).
inline constexpr int kMaxExhaustiveOptionTensors = 7;
// About a second of search on one core; every shipped model needs far less.
inline constexpr int64_t kDefaultNodeBudget = 100'000'000;
// --search-space options: where the search does not prove its optimum within this, more nodes
// have not found a better plan for any shipped model (docs/PLANNER_BENCH.md, "Budget against
// time"); at most about 0.1 s for 400 tensors on one core.
inline constexpr int64_t kDefaultOptionsNodeBudget = 5'000'000;
// Options space: the memory for every group's costs under every option (400 tensors x 12
// options take 31 MiB).
inline constexpr int64_t kDefaultPriceTableBytes = int64_t{64} << 20;

struct SearchOptions {
  Algorithm algorithm = Algorithm::kBranchAndBound;
  // Nodes (groups priced, bounds included, plus dominance comparisons) before the search
  // stops with the best strategy found so far. Counted, not timed, so a plan does not depend on the machine's speed.
  int64_t node_budget = kDefaultNodeBudget;
  // kBucket: the cap of a bucket's uncompressed bytes (PyTorch DDP's default, 25 MiB).
  int64_t bucket_bytes = int64_t{25} << 20;
  SearchSpace space = SearchSpace::kFusion;
  // branch_and_bound: start from incumbents: in the fusion space the baselines and the greedy
  // pass (docs/MODEL.md, step 2); in the options space Espresso's plan, the fusion optimum, the
  // greedy pass and, where needed, the single-option seeds (v2 step 4). Off, the label DP
  // starts with no incumbent (the tests' check that it alone is exact, where its dominance and
  // bounds decide).
  bool seed_incumbents = true;
  // Options space: where every group's costs under every option fit in this many bytes, they
  // are priced once for all the search's passes; otherwise row by row (the groups starting at
  // one tensor) as each pass reaches them. The same plan either way; 0: always row by row.
  int64_t price_table_bytes = kDefaultPriceTableBytes;
};

struct SearchStats {
  std::string algorithm;  // "branch_and_bound" or "exhaustive"
  int64_t states = 0;  // labels expanded (exhaustive: partitions evaluated)
  int64_t transitions = 0;  // nodes: groups priced and labels compared
  int64_t pruned = 0;  // labels dropped by a bound or by dominance
  int64_t budget = 0;
  bool optimal = false;  // proven: the search finished within its budget
};

struct SearchResult {
  std::vector<int> group_ends;  // the last tensor of each group
  double iteration_us = 0;
  SearchStats stats;
};

StatusOr<SearchResult> Search(const Problem& problem, const SearchOptions& options);

struct OptionProblem;

struct OptionSearchResult {
  std::vector<int> group_ends;
  std::vector<int> options;  // per group, an index into OptionProblem::options
  double iteration_us = 0;
  SearchStats stats;
  // When the search stopped without a proof: a lower bound of the optimum (else iteration_us).
  double lower_bound_us = 0;
  // The incumbents it started from (branch_and_bound), for the plan's baselines.
  double fusion_us = 0;  // v1's fusion optimum (or best found)
  double espresso_us = 0;
  int espresso_groups = 0;
};

// Searches groups and options together (docs/MODEL.md, v2): branch_and_bound (Espresso's plan
// and the fusion optimum as incumbents, and the single-option seeds where a first search with
// part of the budget does not prove the optimum), exhaustive (refused above
// kMaxExhaustiveOptionTensors) or espresso. Fixed strategies give their groups with the plan's
// one option.
StatusOr<OptionSearchResult> SearchWithOptions(const OptionProblem& problem, const SearchOptions& options);

std::string AlgorithmName(Algorithm a);
// "branch_and_bound" / "bnb" / "exhaustive" / "layerwise" / "one_group" / "bucket"; error names
// the flag and the choices.
StatusOr<Algorithm> ParseAlgorithm(const std::string& name);

}  // namespace cupcake::planner

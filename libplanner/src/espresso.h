// The options search's helpers on fixed groups: every group's costs under every option, and
// Espresso's two steps (docs/MODEL.md, "Espresso"). Private to libplanner.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cupcake/planner/options.h"

namespace cupcake::planner::detail {

// Every group's stage costs under every option: costs[k * O + o].
std::vector<StageCost> CostTable(const OptionProblem& p, std::span<const int> ends);

// Espresso's two steps (seeds: Espresso; docs/MODEL.md) on the groups `ends`, from the options
// `opts`: returns the options. Adds the timelines it evaluates to `evaluations`.
std::vector<int> Improve(const OptionProblem& p, std::span<const int> ends, std::vector<int> opts,
                         int64_t& evaluations);
// Espresso from its own start (flat_fp32 on the plan's device, every group).
std::vector<int> Espresso(const OptionProblem& p, std::span<const int> ends, int64_t& evaluations);

}  // namespace cupcake::planner::detail

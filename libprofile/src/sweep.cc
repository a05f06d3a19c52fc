#include <algorithm>
#include <bit>
#include <string>

#include "cupcake/profile/sweep.h"

namespace cupcake::profile {

StatusOr<std::vector<int64_t>> PowerOfTwoSizes(std::string_view min_flag, int64_t min, std::string_view max_flag,
                                               int64_t max, int64_t limit, int step) {
  std::string problems;
  auto add = [&](std::string_view flag, const std::string& text) {
    if (!problems.empty()) problems += "\n";
    problems += std::string(flag) + ": " + text;
  };
  auto check = [&](std::string_view flag, int64_t v) {
    if (v < 1 || v > limit)
      add(flag,
          "out of range; got " + std::to_string(v) + ", expected a power of two in [1, " + std::to_string(limit) + "]");
    else if (!std::has_single_bit(static_cast<uint64_t>(v)))
      add(flag, "not a power of two; got " + std::to_string(v) + ", expected a power of two such as " +
                    std::to_string(std::bit_floor(static_cast<uint64_t>(v))));
  };
  check(min_flag, min);
  check(max_flag, max);
  if (problems.empty() && max < min)
    add(max_flag, "empty size range; got " + std::to_string(max) + ", expected >= " + std::string(min_flag) + " (" +
                      std::to_string(min) + ")");
  if (step < 1) add("step", "out of range; got " + std::to_string(step) + ", expected >= 1");
  if (!problems.empty()) return InvalidArgumentError(problems);
  std::vector<int64_t> sizes;
  int i = 0;
  for (int64_t s = min; s <= max; s *= 2, ++i) {
    if (i % step == 0 || s == max) sizes.push_back(s);
    if (s > max / 2) break;
  }
  return sizes;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t m = values.size() / 2;
  return values.size() % 2 == 1 ? values[m] : (values[m - 1] + values[m]) / 2;
}

}  // namespace cupcake::profile

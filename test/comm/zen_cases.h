// ZenAllreduce cases shared by the in-process and the MPI suites: each builds every rank's
// sparse input from (rank, size) alone, so MPI processes agree without exchanging them, and
// checks the result against the dense sum computed here, independently of the code under test.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cupcake/comm/zen.h"

namespace cupcake::comm::testing {

struct ZenCase {
  std::string name;
  int64_t n;
  // Rank `rank`'s sorted, distinct indices out of `size` ranks.
  std::function<std::vector<uint32_t>(int rank, int size, int64_t n)> indices;
};

inline std::vector<uint32_t> UniformIndices(uint64_t seed, int64_t n, int64_t k) {
  std::mt19937_64 rng(seed);
  std::vector<uint32_t> idx;
  for (int64_t i = 0; i < n; ++i) {  // selection sampling: sorted, k of n
    if (static_cast<int64_t>(rng() % static_cast<uint64_t>(n - i)) < k - static_cast<int64_t>(idx.size())) {
      idx.push_back(static_cast<uint32_t>(i));
    }
  }
  return idx;
}

inline std::vector<ZenCase> ZenCases() {
  using Idx = std::vector<uint32_t>;
  return {
      {"Uniform", 5000, [](int r, int, int64_t n) { return UniformIndices(100 + r, n, 300); }},
      {"Clustered", 5000,
       [](int r, int, int64_t) {
         Idx idx;
         for (uint32_t i = 0; i < 200; ++i) idx.push_back(1000 + 37 * r + i);  // runs overlapping by rank
         for (uint32_t i = 0; i < 50; ++i) idx.push_back(4000 + 100 * r + i);
         return idx;
       }},
      {"AllIdentical", 3000, [](int, int, int64_t n) { return UniformIndices(7, n, 400); }},
      {"AllDisjoint", 4000,
       [](int r, int size, int64_t n) {
         Idx idx;
         for (int64_t i = r; i < n; i += size * 3) idx.push_back(static_cast<uint32_t>(i));
         return idx;
       }},
      {"FirstAndLastIndex", 1001,
       [](int r, int, int64_t n) {
         return Idx{0, static_cast<uint32_t>(3 + r), static_cast<uint32_t>(n - 1)};
       }},
      {"EveryRankEmpty", 100, [](int, int, int64_t) { return Idx{}; }},
      {"OneRankEmpty", 2000, [](int r, int, int64_t n) { return r == 1 ? Idx{} : UniformIndices(50 + r, n, 100); }},
      {"AllOnOneOwner", 3000,
       [](int r, int size, int64_t n) {  // every index owned by rank 0: one per row, the hash's member
         Idx idx;
         for (int64_t row = 0; row * size < n; ++row) {
           const int64_t i = kernels::zen::RowMember(static_cast<uint32_t>(row), 0, size, 0);
           if (i < n && (row + r) % 3 != 0) idx.push_back(static_cast<uint32_t>(i));
         }
         return idx;
       }},
  };
}

// Integer values in [-50, 50], so every sum is exact in float.
inline float ZenValue(int rank, uint32_t index) { return static_cast<float>((index * 7 + 13 * rank) % 101) - 50; }

// Runs the case on this rank and checks the result against the dense sum over all ranks.
inline void RunZenCase(Communicator& comm, const ZenCase& c) {
  const int p = comm.size();
  std::vector<double> dense(static_cast<size_t>(c.n), 0);
  std::vector<bool> present(static_cast<size_t>(c.n), false);
  std::vector<uint32_t> mine;
  std::vector<float> my_values;
  for (int r = 0; r < p; ++r) {
    for (uint32_t i : c.indices(r, p, c.n)) {
      dense[i] += ZenValue(r, i);
      present[i] = true;
      if (r == comm.rank()) {
        mine.push_back(i);
        my_values.push_back(ZenValue(r, i));
      }
    }
  }
  if (c.name == "AllOnOneOwner") {
    for (uint32_t i : mine) ASSERT_EQ(kernels::zen::Owner(i, p, 0), 0);
  }
  ZenStats stats;
  auto out = ZenAllreduce(comm, {mine, my_values}, {.n = c.n, .seed = 0}, &stats);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  std::vector<uint32_t> expected_indices;
  std::vector<float> expected_values;
  for (int64_t i = 0; i < c.n; ++i) {
    if (present[static_cast<size_t>(i)]) {
      expected_indices.push_back(static_cast<uint32_t>(i));
      expected_values.push_back(static_cast<float>(dense[static_cast<size_t>(i)]));
    }
  }
  EXPECT_EQ(out->indices, expected_indices);
  EXPECT_EQ(out->values, expected_values);
  EXPECT_EQ(stats.encodings.size(), static_cast<size_t>(p));
  std::vector<float> scattered(static_cast<size_t>(c.n));
  ASSERT_TRUE(kernels::zen::ScatterDense(out->view(), 1.0f / static_cast<float>(p), scattered).ok());
  for (int64_t i = 0; i < c.n; ++i) {
    ASSERT_EQ(scattered[static_cast<size_t>(i)],
              static_cast<float>(dense[static_cast<size_t>(i)]) * (1.0f / static_cast<float>(p)));
  }
}

// The (ranks, case index) parameters the in-process and device suites run every case at, and
// their names ("Uniform_4ranks").
inline auto ZenRanksAndCases() {
  return ::testing::Combine(::testing::Values(1, 2, 3, 4, 8),
                            ::testing::Range(0, static_cast<int>(ZenCases().size())));
}
inline std::string ZenRanksCaseName(const ::testing::TestParamInfo<std::tuple<int, int>>& info) {
  return ZenCases()[static_cast<size_t>(std::get<1>(info.param))].name + "_" + std::to_string(std::get<0>(info.param)) +
         "ranks";
}

}  // namespace cupcake::comm::testing

// The index sets of the Zen benchmarks (docs/ZEN.md): each rank's k distinct sorted indices
// below n, "uniform" (independent per rank) or "overlapping" (most drawn from a hot pool shared
// by all ranks, as top-k selections of correlated gradients are).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace cupcake::bench {

// `count` distinct sorted indices below n: `from` drawn, then topped up uniformly.
inline std::vector<uint32_t> Distinct(std::vector<uint32_t> from, int64_t count, int64_t n, std::mt19937_64& rng) {
  std::sort(from.begin(), from.end());
  from.erase(std::unique(from.begin(), from.end()), from.end());
  while (static_cast<int64_t>(from.size()) < count) {
    for (int64_t j = static_cast<int64_t>(from.size()); j < count; ++j)
      from.push_back(static_cast<uint32_t>(rng() % static_cast<uint64_t>(n)));
    std::sort(from.begin(), from.end());
    from.erase(std::unique(from.begin(), from.end()), from.end());
  }
  return from;
}

struct IndexSet {
  int64_t n = int64_t{1} << 22;
  double overlap = 0.9;  // overlapping: share of a rank's indices drawn from the hot pool
  double pool = 1.1;  // overlapping: hot pool size, in units of k
  uint64_t seed = 1;
};

// Rank r's k indices: "uniform" k distinct uniform indices; "overlapping" round(overlap k)
// distinct indices from a hot pool of round(pool k) uniform indices shared by all ranks, the
// rest uniform over n (distinct from them).
inline std::vector<uint32_t> RankIndices(const IndexSet& o, bool overlapping, int rank, int64_t k) {
  std::mt19937_64 rng(o.seed * 1000003 + static_cast<uint64_t>(rank));
  if (!overlapping) return Distinct({}, k, o.n, rng);
  std::mt19937_64 shared(o.seed);
  const std::vector<uint32_t> hot = Distinct({}, std::llround(o.pool * static_cast<double>(k)), o.n, shared);
  std::vector<uint32_t> picked(hot);
  std::shuffle(picked.begin(), picked.end(), rng);
  picked.resize(static_cast<size_t>(std::llround(o.overlap * static_cast<double>(k))));
  return Distinct(std::move(picked), k, o.n, rng);
}

// `arg` is `name=value`: value set, true.
inline bool ParseFlag(const char* arg, const char* name, std::string& value) {
  const size_t len = std::strlen(name);
  if (std::strncmp(arg, name, len) != 0 || arg[len] != '=') return false;
  value = arg + len + 1;
  return true;
}

// The flags --n, --iters, --overlap, --pool and --seed of both benchmarks; false when `arg` is
// none of them.
inline bool ParseCommonFlag(const char* arg, IndexSet& o, int& iters) {
  std::string v;
  if (ParseFlag(arg, "--n", v))
    o.n = std::atoll(v.c_str());
  else if (ParseFlag(arg, "--iters", v))
    iters = std::atoi(v.c_str());
  else if (ParseFlag(arg, "--overlap", v))
    o.overlap = std::atof(v.c_str());
  else if (ParseFlag(arg, "--pool", v))
    o.pool = std::atof(v.c_str());
  else if (ParseFlag(arg, "--seed", v))
    o.seed = std::strtoull(v.c_str(), nullptr, 10);
  else
    return false;
  return true;
}

// The ranges of those flags (max_n: the largest vector the scheme takes).
inline bool CommonFlagsInRange(const IndexSet& o, int iters, int64_t max_n) {
  return o.n >= 1 && o.n <= max_n && iters >= 1 && o.overlap >= 0 && o.overlap <= 1 && o.pool >= o.overlap;
}

}  // namespace cupcake::bench

// Gemini's group placement of replicas (replica_placement.h).
#include "replica_placement.h"

#include <algorithm>

namespace cupcake::runtime::internal {

ReplicaPlacement PlaceReplicas(const std::vector<int>& host_of_rank, int group_hosts) {
  const int world = static_cast<int>(host_of_rank.size());
  ReplicaPlacement p;
  p.holders.resize(static_cast<size_t>(world));
  p.sources.resize(static_cast<size_t>(world));
  int hosts = 0;
  for (int h : host_of_rank) hosts = std::max(hosts, h + 1);
  std::vector<std::vector<int>> ranks_of(static_cast<size_t>(hosts));
  std::vector<int> local(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::vector<int>& on = ranks_of[static_cast<size_t>(host_of_rank[static_cast<size_t>(r)])];
    local[static_cast<size_t>(r)] = static_cast<int>(on.size());
    on.push_back(r);
  }
  if (hosts == 1) {
    for (int r = 0; r < world; ++r)
      for (int k = 1; k <= std::min(group_hosts - 1, world - 1); ++k)
        p.holders[static_cast<size_t>(r)].push_back((r + k) % world);
  } else {
    const int groups = std::max(1, hosts / group_hosts);
    for (int g = 0; g < groups; ++g) {
      const int first = g * group_hosts, end = g == groups - 1 ? hosts : first + group_hosts;
      const int n = end - first;
      for (int i = 0; i < n; ++i)
        for (int k = 1; k <= std::min(group_hosts - 1, n - 1); ++k) {
          const std::vector<int>& to = ranks_of[static_cast<size_t>(first + (i + k) % n)];
          for (int r : ranks_of[static_cast<size_t>(first + i)])
            p.holders[static_cast<size_t>(r)].push_back(
                to[static_cast<size_t>(local[static_cast<size_t>(r)]) % to.size()]);
        }
    }
  }
  for (int r = 0; r < world; ++r) {
    std::vector<int>& h = p.holders[static_cast<size_t>(r)];
    std::sort(h.begin(), h.end());
    h.erase(std::unique(h.begin(), h.end()), h.end());
    for (int holder : h) p.sources[static_cast<size_t>(holder)].push_back(r);
  }
  return p;  // sources are increasing: filled in rank order
}

}  // namespace cupcake::runtime::internal

#include "cupcake/comm/topology.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace cupcake::comm {
namespace {

constexpr int64_t kHostBytes = 256;

}  // namespace

StatusOr<Topology> DiscoverTopology(Communicator& world) {
  std::vector<char> mine(kHostBytes, 0), all(static_cast<size_t>(kHostBytes * world.size()));
  std::memcpy(mine.data(), world.host().data(), std::min<size_t>(world.host().size(), kHostBytes - 1));
  CUPCAKE_RETURN_IF_ERROR(world.Allgather(mine.data(), all.data(), kHostBytes));
  Topology t;
  std::map<std::string, int> index;
  std::vector<int> count;
  for (int r = 0; r < world.size(); ++r) {
    std::string h(all.data() + r * kHostBytes);
    auto [it, inserted] = index.try_emplace(h, static_cast<int>(t.hosts.size()));
    if (inserted) {
      t.hosts.push_back(h);
      count.push_back(0);
    }
    if (r == world.rank()) t.local_rank = count[static_cast<size_t>(it->second)];
    ++count[static_cast<size_t>(it->second)];
    t.host_of_rank.push_back(it->second);
  }
  t.local_size = count[static_cast<size_t>(t.host_of_rank[static_cast<size_t>(world.rank())])];
  t.ranks_per_host = std::all_of(count.begin(), count.end(), [&](int c) { return c == count[0]; }) ? count[0] : 0;
  return t;
}

}  // namespace cupcake::comm

// Where the ranks of a communicator run: which ranks share a host.
#pragma once

#include <string>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/proto/status.h"

namespace cupcake::comm {

struct Topology {
  std::vector<std::string> hosts;  // distinct hosts, in order of their first rank
  std::vector<int> host_of_rank;  // index into hosts
  int local_rank = 0;  // among the ranks of this rank's host, in rank order
  int local_size = 1;  // ranks on this rank's host
  int ranks_per_host = 0;  // 0 when hosts have different counts
};

// Collective over `world` (host memory): allgathers the ranks' host names (Communicator::host,
// the first 255 bytes).
StatusOr<Topology> DiscoverTopology(Communicator& world);

}  // namespace cupcake::comm

// Where each rank's checkpoint replicas go (docs/CHECKPOINT.md, "Replicas on peers"): Gemini's
// group placement (Wang et al., SOSP'23, section 4.1). Private to libruntime; the tests include it.
#pragma once

#include <vector>

namespace cupcake::runtime::internal {

struct ReplicaPlacement {
  // Per rank: the ranks that keep its replicas (increasing, never itself).
  std::vector<std::vector<int>> holders;
  // Per rank: the ranks whose replicas it keeps (increasing): the inverse of `holders`.
  std::vector<std::vector<int>> sources;
};

// Hosts (host_of_rank: each rank's host index, 0..H-1, as comm::Topology numbers them) in groups
// of `group_hosts` = m >= 2 that back each other up:
//   1. hosts are taken in order in groups of m; the last H mod m hosts join the last group (all
//      of them form one group when H < m);
//   2. in a group of n hosts, the host at position i sends its ranks' replicas to the hosts at
//      positions i+1 .. i+min(m-1, n-1) (mod n): with n = m every other host of the group, so
//      the group survives m-1 lost hosts; a larger last group is a ring of m-1 successors;
//   3. the rank of local index l (its order among its host's ranks) goes to the rank of local
//      index l mod (that host's ranks) on each of those hosts.
// On one host (H = 1) there is no other host: each rank's replicas go to the next
// min(m-1, W-1) ranks (mod W), which survive a lost process's memory, not the host's.
ReplicaPlacement PlaceReplicas(const std::vector<int>& host_of_rank, int group_hosts);

}  // namespace cupcake::runtime::internal

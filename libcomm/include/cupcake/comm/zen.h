// ZenAllreduce: the sum over ranks of sparse vectors, by Zen's balanced parallelism
// (cupcake/kernels/zen.h has the hash and the encodings; docs/ZEN.md the scheme and status).
// Each index has one owner rank; ranks send their pairs to the owners, owners sum them and
// every rank gathers the owners' sums, so a rank moves about its share of the union instead of
// every other rank's pairs (the allgather scheme).
#pragma once

#include <cstdint>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/kernels/zen.h"

namespace cupcake::comm {

struct ZenOptions {
  int64_t n = 0;  // elements of the dense vector, 1 <= n <= 2^31 - 1, equal on every rank
  uint32_t seed = 0;  // the owner hash's seed, equal on every rank
};

// Bytes this rank sent to and received from other ranks (its own blocks excluded), per phase.
struct ZenPhaseBytes {
  int64_t sent = 0;
  int64_t received = 0;
};
// Wall time this rank spent in each step of ZenAllreduce (host memory; the device path leaves
// them 0), in microseconds; a collective's includes its wait for the other ranks.
struct ZenPhaseTimes {
  double partition = 0;  // its pairs split by owner
  double counts = 0;  // Alltoall of the counts
  double pairs = 0;  // Alltoallv of the pairs
  double merge = 0;  // the owner's merge-sum of what it received
  double encode = 0;  // its partition encoded
  double sizes = 0;  // Allgather of the sizes
  double partitions = 0;  // allgatherv of the partitions
  double decode = 0;  // the partitions decoded and merged into the union
};
struct ZenStats {
  ZenPhaseBytes counts;  // Alltoall of the per-owner pair counts (int64 each)
  ZenPhaseBytes pairs;  // Alltoallv of the pairs (8 bytes each) to their owners
  ZenPhaseBytes sizes;  // Allgather of the encoded partition sizes (int64 each)
  ZenPhaseBytes partitions;  // allgatherv (over Alltoallv) of the encoded partitions
  std::vector<kernels::zen::Encoding> encodings;  // the encoding of each owner's partition
  ZenPhaseTimes us;
  ZenPhaseBytes Total() const;
};

// Returns on every rank the sum over ranks of `input` (indices strictly increasing, < n), as a
// sparse vector with increasing indices; the values of an index are added in rank order, so
// every rank gets bitwise identical results. Collective: every rank calls it with equal options.
// InvalidArgument on a bad input or options, or a device-memory communicator (host memory only
// so far), found before any collective: the other ranks then wait in it, so the caller Aborts
// the group (as for any failed collective); other errors are the communicator's. `stats` (optional) receives this
// rank's bytes.
StatusOr<kernels::zen::Sparse> ZenAllreduce(Communicator& comm, kernels::zen::SparseView input,
                                            const ZenOptions& options, ZenStats* stats = nullptr);

// ZenAllreduce on device memory (a NCCL communicator): the k pairs at (indices, values) and
// `out` (n floats) are on the device; `out` gets the sum over ranks divided by `divisor` at the
// union's indices and 0 elsewhere, bitwise what dividing ZenAllreduce's values and scattering
// them gives. Every step runs on comm.stream() through `steps` (kernels::zen::DeviceSteps,
// kept between calls by one caller); it returns when `out` is complete, after five waits for
// the stream (the input's checks, the counts, the union's size, the sizes, the decode's checks). Returns the union's
// size. Errors as ZenAllreduce's (a bad input before any collective), InvalidArgument for a
// host-memory communicator, DataLoss for a malformed partition from a peer.
StatusOr<int64_t> ZenAllreduceDevice(Communicator& comm, const uint32_t* indices, const float* values, int64_t k,
                                     const ZenOptions& options, float divisor, float* out,
                                     kernels::zen::DeviceSteps& steps, ZenStats* stats = nullptr);

// The allgather scheme's bytes per rank for comparison: every rank's pairs (8 bytes each) padded
// to the largest count, gathered by a ring, where each rank sends and receives world_size - 1
// blocks.
ZenPhaseBytes AllgatherSchemeBytes(int64_t max_count, int world_size);

}  // namespace cupcake::comm

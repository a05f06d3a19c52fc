// ZenAllreduce (cupcake/comm/zen.h): the exchange around kernels::zen's steps.
#include "cupcake/comm/zen.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace cupcake::comm {
namespace {

namespace zen = kernels::zen;

// Adds the microseconds since the last Lap (or construction) to `field`.
class Stopwatch {
 public:
  void Lap(double& field) {
    const auto now = std::chrono::steady_clock::now();
    field += std::chrono::duration<double, std::micro>(now - last_).count();
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

int64_t SumExcept(const std::vector<int64_t>& v, int skip) {
  return std::accumulate(v.begin(), v.end(), int64_t{0}) - v[static_cast<size_t>(skip)];
}

// Per-rank pair counts as the Alltoallv's byte counts.
std::vector<int64_t> PairBytes(std::vector<int64_t> counts) {
  for (auto& b : counts) b *= sizeof(zen::Pair);
  return counts;
}

// Step 6's allgatherv as an Alltoallv: one copy of this rank's `my_bytes` partition to every
// peer, every peer's `sizes` block received; the own block stays local (0 both ways).
struct GatherBytes {
  std::vector<int64_t> send, recv;
};
GatherBytes PartitionGatherBytes(int me, int64_t my_bytes, const std::vector<int64_t>& sizes) {
  GatherBytes b{std::vector<int64_t>(sizes.size(), my_bytes), sizes};
  b.send[static_cast<size_t>(me)] = b.recv[static_cast<size_t>(me)] = 0;
  return b;
}

// Steps 1-4: pairs to their owners, which sum them into their partition.
StatusOr<zen::Sparse> SumAtOwner(Communicator& comm, zen::SparseView input, const ZenOptions& options,
                                 ZenStats& stats) {
  const int p = comm.size();
  const int me = comm.rank();
  Stopwatch clock;
  const zen::Partitioned out = zen::PartitionByOwner(input, p, options.seed);
  clock.Lap(stats.us.partition);
  std::vector<int64_t> in_counts(static_cast<size_t>(p));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoall(out.counts.data(), in_counts.data(), sizeof(int64_t)));
  clock.Lap(stats.us.counts);
  stats.counts = {8 * (p - 1), 8 * (p - 1)};

  const std::vector<int64_t> send_bytes = PairBytes(out.counts), recv_bytes = PairBytes(in_counts);
  std::vector<zen::Pair> received(static_cast<size_t>(std::accumulate(in_counts.begin(), in_counts.end(), int64_t{0})));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoallv(out.pairs.data(), send_bytes, received.data(), recv_bytes));
  clock.Lap(stats.us.pairs);
  stats.pairs = {SumExcept(send_bytes, me), SumExcept(recv_bytes, me)};
  zen::Sparse sum = zen::MergeSum(received);
  clock.Lap(stats.us.merge);
  return sum;
}

// Steps 5-6: every owner's encoded partition to every rank, decoded and merged.
StatusOr<zen::Sparse> GatherPartitions(Communicator& comm, const zen::Sparse& mine, const ZenOptions& options,
                                       ZenStats& stats) {
  const int p = comm.size();
  const int me = comm.rank();
  Stopwatch clock;
  std::vector<std::byte> encoded;
  const zen::Encoding encoding = zen::EncodePartition(mine.view(), me, options.n, p, options.seed, encoded);
  clock.Lap(stats.us.encode);
  const auto my_bytes = static_cast<int64_t>(encoded.size());
  std::vector<int64_t> sizes(static_cast<size_t>(p));
  CUPCAKE_RETURN_IF_ERROR(comm.Allgather(&my_bytes, sizes.data(), sizeof(int64_t)));
  clock.Lap(stats.us.sizes);
  stats.sizes = {8 * (p - 1), 8 * (p - 1)};

  const GatherBytes bytes = PartitionGatherBytes(me, my_bytes, sizes);
  std::vector<std::byte> send;
  send.reserve(static_cast<size_t>(my_bytes * (p - 1)));
  for (int j = 0; j < p - 1; ++j) send.insert(send.end(), encoded.begin(), encoded.end());
  std::vector<std::byte> recv(static_cast<size_t>(SumExcept(sizes, me)));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoallv(send.data(), bytes.send, recv.data(), bytes.recv));
  clock.Lap(stats.us.partitions);
  stats.partitions = {my_bytes * (p - 1), static_cast<int64_t>(recv.size())};

  std::vector<zen::Sparse> partitions(static_cast<size_t>(p));
  stats.encodings.assign(static_cast<size_t>(p), encoding);
  size_t offset = 0;
  for (int r = 0; r < p; ++r) {
    if (r == me) {
      partitions[static_cast<size_t>(r)] = mine;
      continue;
    }
    const std::span<const std::byte> block(recv.data() + offset, static_cast<size_t>(sizes[static_cast<size_t>(r)]));
    offset += block.size();
    CUPCAKE_ASSIGN_OR_RETURN(partitions[static_cast<size_t>(r)],
                             zen::DecodePartition(block, r, options.n, p, options.seed));
    stats.encodings[static_cast<size_t>(r)] = static_cast<zen::Encoding>(std::to_integer<uint32_t>(block[0]));
  }
  zen::Sparse all = zen::MergePartitions(partitions);
  clock.Lap(stats.us.decode);
  return all;
}

}  // namespace

ZenPhaseBytes ZenStats::Total() const {
  return {counts.sent + pairs.sent + sizes.sent + partitions.sent,
          counts.received + pairs.received + sizes.received + partitions.received};
}

StatusOr<zen::Sparse> ZenAllreduce(Communicator& comm, zen::SparseView input, const ZenOptions& options,
                                   ZenStats* stats) {
  if (comm.memory() != MemoryKind::kHost) {
    return InvalidArgumentError("ZenAllreduce: communicator (" + comm.library() +
                                "): device memory; expected host memory (only host memory is supported so far)");
  }
  CUPCAKE_RETURN_IF_ERROR(
      zen::ValidateSparse(input, options.n, "ZenAllreduce (rank " + std::to_string(comm.rank()) + ")"));
  ZenStats local;
  ZenStats& s = stats != nullptr ? *stats : local;
  s.us = {};
  CUPCAKE_ASSIGN_OR_RETURN(zen::Sparse mine, SumAtOwner(comm, input, options, s));
  return GatherPartitions(comm, mine, options, s);
}

StatusOr<int64_t> ZenAllreduceDevice(Communicator& comm, const uint32_t* indices, const float* values, int64_t k,
                                     const ZenOptions& options, float divisor, float* out, zen::DeviceSteps& steps,
                                     ZenStats* stats) {
  if (comm.memory() != MemoryKind::kDevice) {
    return InvalidArgumentError("ZenAllreduceDevice: communicator (" + comm.library() +
                                "): host memory; expected device memory (ZenAllreduce takes host memory)");
  }
  using Area = zen::DeviceSteps::Area;
  const int p = comm.size();
  const int me = comm.rank();
  void* stream = comm.stream();
  ZenStats local;
  ZenStats& s = stats != nullptr ? *stats : local;

  // Steps 1-4 (SumAtOwner's): partition, counts, pairs to their owners, the owner's merge.
  CUPCAKE_ASSIGN_OR_RETURN(const std::vector<int64_t> counts,
                           steps.Partition(indices, values, k, options.n, p, options.seed,
                                           "ZenAllreduceDevice (rank " + std::to_string(me) + ")", stream));
  CUPCAKE_ASSIGN_OR_RETURN(std::byte * in_counts_device, steps.Reserve(Area::kCounts, 8 * p, stream));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoall(steps.device_counts(), in_counts_device, sizeof(int64_t)));
  std::vector<int64_t> in_counts(static_cast<size_t>(p));
  CUPCAKE_RETURN_IF_ERROR(steps.ToHost(in_counts.data(), in_counts_device, 8 * p, stream));
  s.counts = {8 * (p - 1), 8 * (p - 1)};
  const std::vector<int64_t> send_bytes = PairBytes(counts), recv_bytes = PairBytes(in_counts);
  const int64_t received = std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0});
  CUPCAKE_ASSIGN_OR_RETURN(std::byte * pairs, steps.Reserve(Area::kPairs, received, stream));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoallv(steps.partitioned(), send_bytes, pairs, recv_bytes));
  s.pairs = {SumExcept(send_bytes, me), SumExcept(recv_bytes, me)};
  CUPCAKE_ASSIGN_OR_RETURN(const int64_t count,
                           steps.MergeSum(reinterpret_cast<const zen::Pair*>(pairs),
                                          received / static_cast<int64_t>(sizeof(zen::Pair)), stream));

  // Steps 5-6 (GatherPartitions'): encode, sizes, the partitions to every rank, decode into out.
  const int64_t rows = zen::PartitionRows(me, options.n, p, options.seed);
  const zen::Encoding encoding = zen::ChooseEncoding(count, rows);
  const int64_t my_bytes = zen::EncodedPartitionBytes(encoding, count, rows);
  CUPCAKE_ASSIGN_OR_RETURN(std::byte * send, steps.Reserve(Area::kSend, my_bytes * std::max(p - 1, 1), stream));
  CUPCAKE_RETURN_IF_ERROR(steps.EncodeMerged(me, options.n, p, options.seed, send, stream));
  for (int j = 1; j < p - 1; ++j) CUPCAKE_RETURN_IF_ERROR(steps.Copy(send + j * my_bytes, send, my_bytes, stream));
  CUPCAKE_ASSIGN_OR_RETURN(std::byte * sizes_device, steps.Reserve(Area::kSizes, 8 * (p + 1), stream));
  CUPCAKE_RETURN_IF_ERROR(steps.ToDevice(sizes_device + 8 * p, &my_bytes, 8, stream));
  CUPCAKE_RETURN_IF_ERROR(comm.Allgather(sizes_device + 8 * p, sizes_device, sizeof(int64_t)));
  std::vector<int64_t> sizes(static_cast<size_t>(p));
  CUPCAKE_RETURN_IF_ERROR(steps.ToHost(sizes.data(), sizes_device, 8 * p, stream));
  s.sizes = {8 * (p - 1), 8 * (p - 1)};

  const GatherBytes gather = PartitionGatherBytes(me, my_bytes, sizes);
  CUPCAKE_ASSIGN_OR_RETURN(std::byte * recv, steps.Reserve(Area::kReceived, SumExcept(sizes, me), stream));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoallv(send, gather.send, recv, gather.recv));
  s.partitions = {my_bytes * (p - 1), SumExcept(sizes, me)};

  CUPCAKE_RETURN_IF_ERROR(steps.Zero(out, 4 * options.n, stream));
  std::vector<zen::DevicePartition> partitions;
  int64_t offset = 0;
  for (int r = 0; r < p; ++r) {
    const int64_t bytes = sizes[static_cast<size_t>(r)];
    partitions.push_back({r == me ? send : recv + offset, bytes, r});
    if (r != me) offset += bytes;
  }
  CUPCAKE_ASSIGN_OR_RETURN(const std::vector<zen::PartitionLayout> layouts,
                           steps.Decode(partitions, options.n, p, options.seed, divisor, out, stream));
  int64_t union_size = 0;
  s.encodings.clear();
  for (const zen::PartitionLayout& layout : layouts) {
    s.encodings.push_back(layout.encoding);
    union_size += layout.count;
  }
  return union_size;
}

ZenPhaseBytes AllgatherSchemeBytes(int64_t max_count, int world_size) {
  const int64_t bytes = max_count * static_cast<int64_t>(sizeof(kernels::zen::Pair)) * (world_size - 1);
  return {bytes, bytes};
}

}  // namespace cupcake::comm

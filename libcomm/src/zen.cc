// ZenAllreduce (cupcake/comm/zen.h): the exchange around kernels::zen's steps.
#include "cupcake/comm/zen.h"

#include <numeric>

namespace cupcake::comm {
namespace {

namespace zen = kernels::zen;

int64_t SumExcept(const std::vector<int64_t>& v, int skip) {
  return std::accumulate(v.begin(), v.end(), int64_t{0}) - v[static_cast<size_t>(skip)];
}

// Steps 1-4: pairs to their owners, which sum them into their partition.
StatusOr<zen::Sparse> SumAtOwner(Communicator& comm, zen::SparseView input, const ZenOptions& options,
                                 ZenStats& stats) {
  const int p = comm.size();
  const int me = comm.rank();
  const zen::Partitioned out = zen::PartitionByOwner(input, p, options.seed);
  std::vector<int64_t> in_counts(static_cast<size_t>(p));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoall(out.counts.data(), in_counts.data(), sizeof(int64_t)));
  stats.counts = {8 * (p - 1), 8 * (p - 1)};

  std::vector<int64_t> send_bytes(out.counts), recv_bytes(in_counts);
  for (auto& b : send_bytes) b *= sizeof(zen::Pair);
  for (auto& b : recv_bytes) b *= sizeof(zen::Pair);
  std::vector<zen::Pair> received(static_cast<size_t>(std::accumulate(in_counts.begin(), in_counts.end(), int64_t{0})));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoallv(out.pairs.data(), send_bytes, received.data(), recv_bytes));
  stats.pairs = {SumExcept(send_bytes, me), SumExcept(recv_bytes, me)};
  return zen::MergeSum(received);
}

// Steps 5-6: every owner's encoded partition to every rank, decoded and merged.
StatusOr<zen::Sparse> GatherPartitions(Communicator& comm, const zen::Sparse& mine, const ZenOptions& options,
                                       ZenStats& stats) {
  const int p = comm.size();
  const int me = comm.rank();
  std::vector<std::byte> encoded;
  const zen::Encoding encoding = zen::EncodePartition(mine.view(), me, options.n, p, options.seed, encoded);
  const auto my_bytes = static_cast<int64_t>(encoded.size());
  std::vector<int64_t> sizes(static_cast<size_t>(p));
  CUPCAKE_RETURN_IF_ERROR(comm.Allgather(&my_bytes, sizes.data(), sizeof(int64_t)));
  stats.sizes = {8 * (p - 1), 8 * (p - 1)};

  // Alltoallv as allgatherv: one copy of this partition per peer; the own block stays local.
  std::vector<int64_t> send_bytes(static_cast<size_t>(p), my_bytes), recv_bytes(sizes);
  send_bytes[static_cast<size_t>(me)] = recv_bytes[static_cast<size_t>(me)] = 0;
  std::vector<std::byte> send;
  send.reserve(static_cast<size_t>(my_bytes * (p - 1)));
  for (int j = 0; j < p - 1; ++j) send.insert(send.end(), encoded.begin(), encoded.end());
  std::vector<std::byte> recv(static_cast<size_t>(SumExcept(sizes, me)));
  CUPCAKE_RETURN_IF_ERROR(comm.Alltoallv(send.data(), send_bytes, recv.data(), recv_bytes));
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
  return zen::MergePartitions(partitions);
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
  CUPCAKE_ASSIGN_OR_RETURN(zen::Sparse mine, SumAtOwner(comm, input, options, s));
  return GatherPartitions(comm, mine, options, s);
}

ZenPhaseBytes AllgatherSchemeBytes(int64_t max_count, int world_size) {
  const int64_t bytes = max_count * static_cast<int64_t>(sizeof(kernels::zen::Pair)) * (world_size - 1);
  return {bytes, bytes};
}

}  // namespace cupcake::comm

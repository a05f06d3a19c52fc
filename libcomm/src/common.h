// Internal: checks and message pieces every backend shares.
#pragma once

#include <string>
#include <string_view>

#include "cupcake/comm/communicator.h"

namespace cupcake::comm::internal {

// " (rank 3 on host-a)", the tail of every backend error.
inline std::string RankOnHost(int rank, const std::string& host) {
  return " (rank " + std::to_string(rank) + " on " + host + ")";
}

// A count must be >= 0 and at most `max` (MPI's int counts); InvalidArgument naming the call.
inline Status CheckCount(std::string_view call, int64_t count, int64_t max, int rank, const std::string& host) {
  if (count >= 0 && count <= max) return Status::Ok();
  return InvalidArgumentError(std::string(call) + ": count out of range; got " + std::to_string(count) +
                              ", expected 0 <= count <= " + std::to_string(max) + RankOnHost(rank, host));
}

// Max of float16 has no use here and no host implementation: refused alike by every backend.
inline Status CheckReduce(std::string_view call, DataType type, ReduceOp op, int rank, const std::string& host) {
  if (!(type == DataType::kFloat16 && op == ReduceOp::kMax)) return Status::Ok();
  return InvalidArgumentError(std::string(call) + ": max of float16 is not supported; expected sum" +
                              RankOnHost(rank, host));
}

// Alltoallv's spans must have one entry per rank, each >= 0.
inline Status CheckAlltoallv(std::span<const int64_t> send_bytes, std::span<const int64_t> recv_bytes, int size,
                             int rank, const std::string& host) {
  if (static_cast<int>(send_bytes.size()) != size || static_cast<int>(recv_bytes.size()) != size)
    return InvalidArgumentError("Alltoallv: counts of the wrong length; got " + std::to_string(send_bytes.size()) +
                                " and " + std::to_string(recv_bytes.size()) + ", expected " + std::to_string(size) +
                                " (one per rank)" + RankOnHost(rank, host));
  for (int j = 0; j < size; ++j)
    if (send_bytes[static_cast<size_t>(j)] < 0 || recv_bytes[static_cast<size_t>(j)] < 0)
      return InvalidArgumentError("Alltoallv: negative count for rank " + std::to_string(j) + RankOnHost(rank, host));
  return Status::Ok();
}

}  // namespace cupcake::comm::internal

// Zen's host-side steps (cupcake/kernels/zen.h).
#include "cupcake/kernels/zen.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>

#include "../common.h"
#include "../zen_checks.h"

namespace cupcake::kernels::zen {

Status SparseStatus(const std::string& what, int64_t n, int64_t k, int64_t values, const SparseProblems& found) {
  std::vector<std::string> problems;
  if (n < 1 || n > kMaxElements) {
    problems.push_back(what + ": n: out of range; got " + std::to_string(n) +
                       ", expected 1 <= n <= " + std::to_string(kMaxElements));
  }
  if (values != k) {
    problems.push_back(what + ": values: size mismatch; got " + std::to_string(values) + ", expected " +
                       std::to_string(k) + " (the number of indices)");
  }
  if (found.not_increasing >= 0) {
    problems.push_back(what + ": indices[" + std::to_string(found.not_increasing) + "]: not increasing; got " +
                       std::to_string(found.not_increasing_got) + ", expected > " +
                       std::to_string(found.not_increasing_previous));
  }
  if (found.out_of_range >= 0) {
    problems.push_back(what + ": indices[" + std::to_string(found.out_of_range) + "]: out of range; got " +
                       std::to_string(found.out_of_range_got) + ", expected < " + std::to_string(n) + " (n)");
  }
  if (problems.empty()) return Status::Ok();
  std::string message = problems[0];
  for (size_t p = 1; p < problems.size(); ++p) message += "; " + problems[p];
  return InvalidArgumentError(message);
}

Status ValidateSparse(SparseView input, int64_t n, const std::string& what) {
  SparseProblems found;
  const std::span<const uint32_t> idx = input.indices;
  for (size_t j = 1; j < idx.size() && found.not_increasing < 0; ++j) {
    if (idx[j] <= idx[j - 1]) found = {static_cast<int64_t>(j), idx[j], idx[j - 1]};
  }
  for (size_t j = 0; j < idx.size() && found.out_of_range < 0; ++j) {
    if (idx[j] >= n) {
      found.out_of_range = static_cast<int64_t>(j);
      found.out_of_range_got = idx[j];
    }
  }
  return SparseStatus(what, n, static_cast<int64_t>(idx.size()), static_cast<int64_t>(input.values.size()), found);
}

StatusOr<SparseView> TopkPayloadView(std::span<const std::byte> payload, int64_t k) {
  if (k < 0 || static_cast<int64_t>(payload.size()) != 8 * k) {
    return InvalidArgumentError("topk payload: size: mismatch; got " + std::to_string(payload.size()) +
                                " bytes, expected " + std::to_string(8 * k) + " (8 k, k = " + std::to_string(k) + ")");
  }
  if (reinterpret_cast<uintptr_t>(payload.data()) % 4 != 0) {
    return InvalidArgumentError("topk payload: address: not 4-byte aligned");
  }
  const auto* values = reinterpret_cast<const float*>(payload.data());
  const auto* indices = reinterpret_cast<const uint32_t*>(payload.data() + 4 * k);
  return SparseView{{indices, static_cast<size_t>(k)}, {values, static_cast<size_t>(k)}};
}

uint32_t RowHash(uint32_t row, uint32_t seed) { return detail::ZenRowHash(row, seed); }

int Owner(uint32_t index, int world_size, uint32_t seed) {
  const auto p = static_cast<uint32_t>(world_size);
  return static_cast<int>((index % p + RowHash(index / p, seed) % p) % p);
}

int64_t RowMember(uint32_t row, int owner, int world_size, uint32_t seed) {
  const auto p = static_cast<uint32_t>(world_size);
  const uint32_t column = (static_cast<uint32_t>(owner) + p - RowHash(row, seed) % p) % p;
  return static_cast<int64_t>(row) * world_size + column;
}

int64_t PartitionRows(int owner, int64_t n, int world_size, uint32_t seed) {
  const int64_t full_rows = n / world_size;
  const bool in_last_row =
      n % world_size != 0 && RowMember(static_cast<uint32_t>(full_rows), owner, world_size, seed) < n;
  return full_rows + (in_last_row ? 1 : 0);
}

Partitioned PartitionByOwner(SparseView input, int world_size, uint32_t seed) {
  Partitioned out{std::vector<int64_t>(static_cast<size_t>(world_size), 0), std::vector<Pair>(input.indices.size())};
  std::vector<int> owners(input.indices.size());
  for (size_t j = 0; j < owners.size(); ++j) {
    owners[j] = Owner(input.indices[j], world_size, seed);
    ++out.counts[static_cast<size_t>(owners[j])];
  }
  std::vector<int64_t> next(out.counts.size());
  std::exclusive_scan(out.counts.begin(), out.counts.end(), next.begin(), int64_t{0});
  for (size_t j = 0; j < owners.size(); ++j) {
    out.pairs[static_cast<size_t>(next[static_cast<size_t>(owners[j])]++)] = {input.indices[j], input.values[j]};
  }
  return out;
}

Sparse MergeSum(std::span<const Pair> pairs) {
  // The sender lists split into runs of strictly increasing indices (a run may join several
  // senders' lists; never two pairs of one index), merged by a heap of the runs' heads in
  // (index, run) order, so equal indices come out in run order, which is sender order, and are
  // summed in that order. U log R instead of a sort's U log U.
  std::vector<size_t> at;  // each run's next pair
  std::vector<size_t> end;
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (i == 0 || pairs[i].index <= pairs[i - 1].index) {
      if (i > 0) end.push_back(i);
      at.push_back(i);
    }
  }
  if (!pairs.empty()) end.push_back(pairs.size());
  using Head = std::pair<uint32_t, size_t>;  // (index, run)
  std::vector<Head> heap;
  for (size_t r = 0; r < at.size(); ++r) heap.push_back({pairs[at[r]].index, r});
  const std::greater<Head> later;
  std::make_heap(heap.begin(), heap.end(), later);
  Sparse out;
  out.indices.reserve(pairs.size());
  out.values.reserve(pairs.size());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const size_t r = heap.back().second;
    const Pair& pair = pairs[at[r]];
    if (!out.indices.empty() && out.indices.back() == pair.index) {
      out.values.back() += pair.value;
    } else {
      out.indices.push_back(pair.index);
      out.values.push_back(pair.value);
    }
    if (++at[r] < end[r]) {
      heap.back().first = pairs[at[r]].index;
      std::push_heap(heap.begin(), heap.end(), later);
    } else {
      heap.pop_back();
    }
  }
  return out;
}

const char* EncodingName(Encoding encoding) { return encoding == Encoding::kRows ? "rows" : "bitmap"; }

int64_t EncodedPartitionBytes(Encoding encoding, int64_t count, int64_t rows) {
  return ZenPartitionBytes(encoding == Encoding::kBitmap, count, rows);
}

Encoding ChooseEncoding(int64_t count, int64_t rows) {
  return EncodedPartitionBytes(Encoding::kBitmap, count, rows) < EncodedPartitionBytes(Encoding::kRows, count, rows)
             ? Encoding::kBitmap
             : Encoding::kRows;
}

StatusOr<PartitionLayout> LayoutOfSize(int64_t bytes, int64_t rows, const std::string& what) {
  const int64_t body = bytes - kPartitionHeaderBytes;
  if (body >= 0 && body % 8 == 0 && body / 8 <= rows && ChooseEncoding(body / 8, rows) == Encoding::kRows) {
    return PartitionLayout{Encoding::kRows, body / 8};
  }
  const int64_t values = body - (rows + 7) / 8;
  if (values > 0 && values % 4 == 0 && values / 4 <= rows && ChooseEncoding(values / 4, rows) == Encoding::kBitmap) {
    return PartitionLayout{Encoding::kBitmap, values / 4};
  }
  return DataLossError(what + ": size: mismatch; got " + std::to_string(bytes) +
                       " bytes, expected a header and a body for at most " + std::to_string(rows) + " rows");
}

Encoding EncodePartition(SparseView partition, int owner, int64_t n, int world_size, uint32_t seed,
                         std::vector<std::byte>& out) {
  const auto count = static_cast<int64_t>(partition.indices.size());
  const int64_t rows = PartitionRows(owner, n, world_size, seed);
  const Encoding encoding = ChooseEncoding(count, rows);
  const size_t start = out.size();
  out.resize(start + static_cast<size_t>(EncodedPartitionBytes(encoding, count, rows)), std::byte{0});
  std::byte* at = out.data() + start;
  const uint32_t header[2] = {static_cast<uint32_t>(encoding), static_cast<uint32_t>(count)};
  std::memcpy(at, header, sizeof(header));
  at += sizeof(header);
  if (encoding == Encoding::kRows) {
    for (uint32_t index : partition.indices) {
      const uint32_t row = index / static_cast<uint32_t>(world_size);
      std::memcpy(at, &row, 4);
      at += 4;
    }
  } else {
    for (uint32_t index : partition.indices) {
      const uint32_t row = index / static_cast<uint32_t>(world_size);
      at[row / 8] |= std::byte{static_cast<uint8_t>(1u << (row % 8))};
    }
    at += (rows + 7) / 8;
  }
  if (count > 0) std::memcpy(at, partition.values.data(), 4 * static_cast<size_t>(count));
  return encoding;
}

StatusOr<Sparse> DecodePartition(std::span<const std::byte> bytes, int owner, int64_t n, int world_size,
                                 uint32_t seed) {
  const std::string where = "zen partition of rank " + std::to_string(owner);
  uint32_t header[2] = {0, 0};
  if (bytes.size() >= sizeof(header)) std::memcpy(header, bytes.data(), sizeof(header));
  const int64_t rows = PartitionRows(owner, n, world_size, seed);
  const auto encoding = static_cast<Encoding>(header[0]);
  const int64_t count = header[1];
  if (bytes.size() < sizeof(header) || header[0] > 1 || count > rows ||
      static_cast<int64_t>(bytes.size()) != EncodedPartitionBytes(encoding, count, rows)) {
    return DataLossError(where + ": size: mismatch; got " + std::to_string(bytes.size()) +
                         " bytes, expected a header and a body for at most " + std::to_string(rows) + " rows");
  }
  Sparse out;
  out.indices.reserve(static_cast<size_t>(count));
  const std::byte* body = bytes.data() + sizeof(header);
  if (encoding == Encoding::kRows) {
    for (int64_t j = 0; j < count; ++j) {
      uint32_t row;
      std::memcpy(&row, body + 4 * j, 4);
      const int64_t index = RowMember(row, owner, world_size, seed);
      // A row list from a peer must name increasing rows whose members lie below n.
      if (index >= n || (j > 0 && index <= out.indices.back())) {
        return DataLossError(where + ": rows[" + std::to_string(j) + "]: not an increasing row of the partition; got " +
                             std::to_string(row) + ", expected < " + std::to_string(rows) + " and increasing");
      }
      out.indices.push_back(static_cast<uint32_t>(index));
    }
    body += 4 * count;
  } else {
    for (int64_t row = 0; row < rows; ++row) {
      if ((static_cast<uint8_t>(body[row / 8]) >> (row % 8)) & 1u) {
        out.indices.push_back(static_cast<uint32_t>(RowMember(static_cast<uint32_t>(row), owner, world_size, seed)));
      }
    }
    body += (rows + 7) / 8;
  }
  if (static_cast<int64_t>(out.indices.size()) != count) {
    return DataLossError(where + ": count: mismatch; got " + std::to_string(out.indices.size()) +
                         " set bits, expected " + std::to_string(count) + " (the header)");
  }
  out.values.resize(out.indices.size());
  if (count > 0) std::memcpy(out.values.data(), body, 4 * static_cast<size_t>(count));
  return out;
}

Sparse MergePartitions(std::span<const Sparse> partitions) {
  // A P-way merge of the sorted partitions (a heap of their heads): U log P, where sorting
  // the concatenation took U log U and most of a call's time at 1% density.
  using Head = std::pair<uint32_t, size_t>;  // (index, partition)
  std::vector<Head> heap;
  std::vector<size_t> at(partitions.size(), 0);
  size_t total = 0;
  for (size_t p = 0; p < partitions.size(); ++p) {
    total += partitions[p].indices.size();
    if (!partitions[p].indices.empty()) heap.push_back({partitions[p].indices[0], p});
  }
  const auto later = [](const Head& a, const Head& b) { return a.first > b.first; };
  std::make_heap(heap.begin(), heap.end(), later);
  Sparse out;
  out.indices.reserve(total);
  out.values.reserve(total);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const size_t p = heap.back().second;
    const Sparse& from = partitions[p];
    out.indices.push_back(from.indices[at[p]]);
    out.values.push_back(from.values[at[p]]);
    if (++at[p] < from.indices.size()) {
      heap.back().first = from.indices[at[p]];
      std::push_heap(heap.begin(), heap.end(), later);
    } else {
      heap.pop_back();
    }
  }
  return out;
}

void CollectNonzeros(std::span<const float> dense, Sparse& out) {
  out.indices.clear();
  out.values.clear();
  for (size_t i = 0; i < dense.size(); ++i) {
    if (dense[i] == 0.0f) continue;  // false for NaN
    out.indices.push_back(static_cast<uint32_t>(i));
    out.values.push_back(dense[i]);
  }
}

Status ScatterDense(SparseView input, float scale, std::span<float> out) {
  for (size_t j = 0; j < input.indices.size(); ++j) {
    if (input.indices[j] >= out.size()) {
      return InvalidArgumentError("zen scatter: indices[" + std::to_string(j) + "]: out of range; got " +
                                  std::to_string(input.indices[j]) + ", expected < " + std::to_string(out.size()) +
                                  " (the dense size)");
    }
  }
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < input.indices.size(); ++j) out[input.indices[j]] = scale * input.values[j];
  return Status::Ok();
}

}  // namespace cupcake::kernels::zen

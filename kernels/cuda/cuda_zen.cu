// Zen's steps on GPU memory (cupcake/kernels/zen.h: DeviceSteps), bit for bit the host steps'
// results (kernels/src/cpu/zen.cc):
//   - Partition: one pass computes each pair's owner and finds the input's first problems; a
//     stable radix sort by owner (CUB) keeps the increasing index order within each owner, as
//     the host's counting sort does; each owner's count is the width of its run of keys.
//   - MergeSum: a stable radix sort of the received pairs by index keeps sender order among
//     the pairs of one index; the first pair of each index adds the rest of its run in that
//     order (the host heap merge's order: the first sender's value, then each next one's), and
//     a scan of the run starts places the sums.
//   - EncodeMerged: row numbers, or the bitmap by atomic ORs into 32-bit words; the values by a
//     copy (the bitmap's length leaves them at any byte offset).
//   - DecodeInto: one row-list entry per thread; a bitmap one byte per thread after a scan of
//     the bytes' populations. Blocks arrive at any byte offset (an allgatherv's
//     concatenation), so the decode reads them byte by byte. Problems are counted per owner on
//     the device and reported by FinishDecodes, with DecodePartition's texts.
// Division by the divisor is IEEE (no fast math), as on the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <memory>
#include <string>
#include <vector>

#include "../src/backends.h"
#include "../src/common.h"
#include "../src/zen_checks.h"
#include "cupcake/proto/cuda.h"

namespace cupcake::kernels::cuda {
namespace {

using zen::Pair;
using u64 = unsigned long long;  // the atomics' type
constexpr int kThreads = 256;
constexpr u64 kNone = ULLONG_MAX;

unsigned Blocks(int64_t work) { return static_cast<unsigned>(std::max<int64_t>(1, (work + kThreads - 1) / kThreads)); }

__device__ __forceinline__ uint32_t DeviceOwner(uint32_t index, uint32_t p, uint32_t seed) {
  return (index % p + detail::ZenRowHash(index / p, seed) % p) % p;
}
__device__ __forceinline__ int64_t DeviceRowMember(uint32_t row, uint32_t owner, uint32_t p, uint32_t seed) {
  return static_cast<int64_t>(row) * p + (owner + p - detail::ZenRowHash(row, seed) % p) % p;
}
__device__ __forceinline__ uint32_t LoadU32(const unsigned char* at) {
  return static_cast<uint32_t>(at[0]) | static_cast<uint32_t>(at[1]) << 8 | static_cast<uint32_t>(at[2]) << 16 |
         static_cast<uint32_t>(at[3]) << 24;
}

// ---- Partition ----
// problems[0]: first j with indices[j] <= indices[j - 1]; problems[1]: first j with indices[j] >= n.
__global__ void OwnerKeysKernel(const uint32_t* indices, const float* values, int64_t k, int64_t n, uint32_t p,
                                uint32_t seed, uint32_t* keys, u64* pairs, u64* problems) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= k) return;
  const uint32_t i = indices[j];
  if (j > 0 && i <= indices[j - 1]) atomicMin(&problems[0], static_cast<u64>(j));
  if (i >= n) atomicMin(&problems[1], static_cast<u64>(j));
  keys[j] = DeviceOwner(i, p, seed);
  pairs[j] = static_cast<u64>(i) | static_cast<u64>(__float_as_uint(values[j])) << 32;  // Pair's layout
}

// counts[o] = the width of owner o's run in the sorted keys (two binary searches).
__global__ void OwnerCountsKernel(const uint32_t* sorted, int64_t k, uint32_t p, int64_t* counts) {
  const uint32_t o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= p) return;
  auto lower = [&](uint32_t key) {
    int64_t lo = 0, hi = k;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (sorted[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo;
  };
  counts[o] = lower(o + 1) - lower(o);
}

// ---- MergeSum ----
__global__ void SplitPairsKernel(const Pair* pairs, int64_t total, uint32_t* keys, float* values) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= total) return;
  keys[j] = pairs[j].index;
  values[j] = pairs[j].value;
}

__global__ void RunStartsKernel(const uint32_t* keys, int64_t total, int* starts) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < total) starts[j] = j == 0 || keys[j] != keys[j - 1];
}

// The first pair of each index adds the run's values in order; `size` gets the union's size.
__global__ void SumRunsKernel(const uint32_t* keys, const float* values, const int* starts, const int* slots,
                              int64_t total, uint32_t* out_indices, float* out_values, int64_t* size) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= total) return;
  if (j == total - 1) *size = static_cast<int64_t>(slots[j]) + starts[j];
  if (!starts[j]) return;
  float sum = values[j];
  for (int64_t t = j + 1; t < total && keys[t] == keys[j]; ++t) sum += values[t];
  out_indices[slots[j]] = keys[j];
  out_values[slots[j]] = sum;
}

// ---- EncodeMerged ----
__global__ void EncodeRowsKernel(const uint32_t* indices, int64_t count, uint32_t p, uint32_t* rows) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < count) rows[j] = indices[j] / p;
}

// Bit r of the bitmap (byte r / 8, bit r % 8) is bit r % 32 of little-endian word r / 32.
__global__ void EncodeBitmapKernel(const uint32_t* indices, int64_t count, uint32_t p, uint32_t* words) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const uint32_t row = indices[j] / p;
  atomicOr(&words[row / 32], 1u << (row % 32));
}

// ---- DecodeInto ----
// Per owner: what FinishDecodes reports.
struct DecodeProblems {
  u64 bad_header;  // 1 when the header disagrees with the block's size
  u64 first_bad_row;  // the first row-list entry that is not an increasing row below n
  u64 set_bits;  // the bitmap's population (rows of the partition only)
};

__global__ void ResetProblemsKernel(DecodeProblems* problems, int p) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o < p) problems[o] = {0, kNone, 0};
}

__global__ void CheckHeaderKernel(const unsigned char* block, uint32_t encoding, uint32_t count, DecodeProblems* problem) {
  if (LoadU32(block) != encoding || LoadU32(block + 4) != count) problem->bad_header = 1;
}

__global__ void DecodeRowsKernel(const unsigned char* rows, const unsigned char* values, int64_t count, int64_t n,
                                 uint32_t owner, uint32_t p, uint32_t seed, float divisor, float* out,
                                 DecodeProblems* problem) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const uint32_t row = LoadU32(rows + 4 * j);
  const int64_t index = DeviceRowMember(row, owner, p, seed);
  if (index >= n || (j > 0 && row <= LoadU32(rows + 4 * (j - 1)))) {
    atomicMin(&problem->first_bad_row, static_cast<u64>(j));
    return;
  }
  out[index] = __uint_as_float(LoadU32(values + 4 * j)) / divisor;
}

// The population of each bitmap byte, bits past the partition's rows ignored (as the host does).
__global__ void BytePopulationKernel(const unsigned char* bitmap, int64_t bytes, int64_t rows, int* population) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= bytes) return;
  const int64_t valid = rows - 8 * b < 8 ? rows - 8 * b : 8;
  population[b] = __popc(bitmap[b] & ((1u << valid) - 1));
}

__global__ void DecodeBitmapKernel(const unsigned char* bitmap, int64_t bytes, int64_t rows, const int* population,
                                   const int* first, const unsigned char* values, int64_t count, uint32_t owner,
                                   uint32_t p, uint32_t seed, float divisor, float* out, DecodeProblems* problem) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= bytes) return;
  if (b == bytes - 1) problem->set_bits = static_cast<u64>(first[b]) + population[b];
  const int64_t valid = rows - 8 * b < 8 ? rows - 8 * b : 8;
  uint32_t bits = bitmap[b] & ((1u << valid) - 1);
  int64_t at = first[b];
  while (bits != 0 && at < count) {
    const int t = __ffs(bits) - 1;
    bits &= bits - 1;
    const int64_t index = DeviceRowMember(static_cast<uint32_t>(8 * b + t), owner, p, seed);
    out[index] = __uint_as_float(LoadU32(values + 4 * at)) / divisor;
    ++at;
  }
}

// Device memory that grows on demand, stream-ordered (cudaMallocAsync), so growing never
// waits for the whole device.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (data_ != nullptr) (void)cudaFree(data_);
  }
  template <typename T = std::byte>
  StatusOr<T*> Get(int64_t bytes, cudaStream_t stream) {
    if (bytes > bytes_) {
      const int64_t grown = std::max<int64_t>(bytes, bytes_ + bytes_ / 2);
      if (data_ != nullptr) CUPCAKE_CUDA_RETURN_IF_ERROR(cudaFreeAsync(data_, stream));
      data_ = nullptr;
      bytes_ = 0;
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&data_, static_cast<size_t>(grown), stream));
      bytes_ = grown;
    }
    return static_cast<T*>(data_);
  }
  template <typename T = std::byte>
  T* get() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

class CudaZenSteps final : public zen::DeviceSteps {
 public:
  StatusOr<std::byte*> Reserve(Area area, int64_t bytes, void* stream) override {
    return exchange_[static_cast<int>(area)].Get(std::max<int64_t>(bytes, 1), S(stream));
  }
  Status ToDevice(void* dst, const void* src, int64_t bytes, void* stream) override {
    if (bytes == 0) return Status::Ok();
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, S(stream)));
    return Status::Ok();
  }
  Status ToHost(void* dst, const void* src, int64_t bytes, void* stream) override {
    if (bytes > 0) {
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, S(stream)));
    }
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(S(stream)));
    return Status::Ok();
  }
  Status Copy(void* dst, const void* src, int64_t bytes, void* stream) override {
    if (bytes == 0) return Status::Ok();
    CUPCAKE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, S(stream)));
    return Status::Ok();
  }
  Status Zero(void* dst, int64_t bytes, void* stream) override {
    if (bytes == 0) return Status::Ok();
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), S(stream)));
    return Status::Ok();
  }

  StatusOr<std::vector<int64_t>> Partition(const uint32_t* indices, const float* values, int64_t k, int64_t n,
                                           int world_size, uint32_t seed, const std::string& what,
                                           void* stream_arg) override {
    const cudaStream_t stream = S(stream_arg);
    if (n < 1 || n > zen::kMaxElements || k < 0 || k > zen::kMaxElements) {
      return zen::SparseStatus(what, n, k, k, {});
    }
    const auto p = static_cast<uint32_t>(world_size);
    pending_.clear();
    // The status block: the two problem positions, then the counts.
    CUPCAKE_ASSIGN_OR_RETURN(u64* status, status_.Get<u64>(8 * (2 + world_size), stream));
    counts_ = reinterpret_cast<int64_t*>(status + 2);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(status, 0xff, 16, stream));
    if (k == 0) {
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counts_, 0, 8 * static_cast<size_t>(world_size), stream));
    } else {
      CUPCAKE_ASSIGN_OR_RETURN(uint32_t* keys, keys_.Get<uint32_t>(4 * k, stream));
      CUPCAKE_ASSIGN_OR_RETURN(uint32_t* sorted_keys, keys_out_.Get<uint32_t>(4 * k, stream));
      CUPCAKE_ASSIGN_OR_RETURN(u64* pairs, values_.Get<u64>(8 * k, stream));
      CUPCAKE_ASSIGN_OR_RETURN(u64* sorted, partitioned_.Get<u64>(8 * k, stream));
      OwnerKeysKernel<<<Blocks(k), kThreads, 0, stream>>>(indices, values, k, n, p, seed, keys, pairs, status);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      int end_bit = 1;
      while ((1u << end_bit) < p && end_bit < 32) ++end_bit;
      size_t temp_bytes = 0;
      CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, sorted_keys, pairs, sorted,
                                                                  static_cast<int>(k), 0, end_bit, stream));
      CUPCAKE_ASSIGN_OR_RETURN(void* temp, temp_.Get<void>(static_cast<int64_t>(temp_bytes), stream));
      CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, sorted_keys, pairs, sorted,
                                                                  static_cast<int>(k), 0, end_bit, stream));
      OwnerCountsKernel<<<Blocks(world_size), kThreads, 0, stream>>>(sorted_keys, k, p, counts_);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    }
    std::vector<u64> host(static_cast<size_t>(2 + world_size));
    CUPCAKE_RETURN_IF_ERROR(ToHost(host.data(), status, 8 * (2 + world_size), stream));
    if (host[0] != kNone || host[1] != kNone) {  // the offending indices, for the message
      zen::SparseProblems found;
      uint32_t got[2] = {0, 0};
      if (host[0] != kNone) {
        CUPCAKE_RETURN_IF_ERROR(ToHost(got, indices + host[0] - 1, 8, stream));
        found.not_increasing = static_cast<int64_t>(host[0]);
        found.not_increasing_got = got[1];
        found.not_increasing_previous = got[0];
      }
      if (host[1] != kNone) {
        CUPCAKE_RETURN_IF_ERROR(ToHost(got, indices + host[1], 4, stream));
        found.out_of_range = static_cast<int64_t>(host[1]);
        found.out_of_range_got = got[0];
      }
      return zen::SparseStatus(what, n, k, k, found);
    }
    return std::vector<int64_t>(host.begin() + 2, host.end());
  }
  const Pair* partitioned() const override { return partitioned_.get<Pair>(); }
  const int64_t* device_counts() const override { return counts_; }

  StatusOr<int64_t> MergeSum(const Pair* pairs, int64_t total, void* stream_arg) override {
    const cudaStream_t stream = S(stream_arg);
    merged_ = 0;
    if (total == 0) return merged_;
    if (total > INT_MAX) return InvalidArgumentError("zen merge: total: out of range; got " + std::to_string(total));
    CUPCAKE_ASSIGN_OR_RETURN(uint32_t* keys, keys_.Get<uint32_t>(4 * total, stream));
    CUPCAKE_ASSIGN_OR_RETURN(uint32_t* sorted_keys, keys_out_.Get<uint32_t>(4 * total, stream));
    CUPCAKE_ASSIGN_OR_RETURN(float* values, values_.Get<float>(4 * total, stream));
    CUPCAKE_ASSIGN_OR_RETURN(float* sorted_values, values_out_.Get<float>(4 * total, stream));
    CUPCAKE_ASSIGN_OR_RETURN(int* starts, starts_.Get<int>(4 * total, stream));
    CUPCAKE_ASSIGN_OR_RETURN(int* slots, slots_.Get<int>(4 * total, stream));
    CUPCAKE_ASSIGN_OR_RETURN(uint32_t* out_indices, merged_indices_.Get<uint32_t>(4 * total, stream));
    CUPCAKE_ASSIGN_OR_RETURN(float* out_values, merged_values_.Get<float>(4 * total, stream));
    CUPCAKE_ASSIGN_OR_RETURN(u64* status, status_.Get<u64>(16, stream));
    const int items = static_cast<int>(total);
    SplitPairsKernel<<<Blocks(total), kThreads, 0, stream>>>(pairs, total, keys, values);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    size_t sort_bytes = 0, scan_bytes = 0;
    CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted_keys, values,
                                                                sorted_values, items, 0, 32, stream));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, starts, slots, items, stream));
    CUPCAKE_ASSIGN_OR_RETURN(void* temp, temp_.Get<void>(static_cast<int64_t>(std::max(sort_bytes, scan_bytes)), stream));
    CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted_keys, values,
                                                                sorted_values, items, 0, 32, stream));
    RunStartsKernel<<<Blocks(total), kThreads, 0, stream>>>(sorted_keys, total, starts);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, starts, slots, items, stream));
    auto* size = reinterpret_cast<int64_t*>(status);
    SumRunsKernel<<<Blocks(total), kThreads, 0, stream>>>(sorted_keys, sorted_values, starts, slots, total,
                                                           out_indices, out_values, size);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUPCAKE_RETURN_IF_ERROR(ToHost(&merged_, size, 8, stream));
    return merged_;
  }

  Status EncodeMerged(int owner, int64_t n, int world_size, uint32_t seed, std::byte* out, void* stream_arg) override {
    const cudaStream_t stream = S(stream_arg);
    const auto p = static_cast<uint32_t>(world_size);
    const int64_t count = merged_;
    const int64_t rows = zen::PartitionRows(owner, n, world_size, seed);
    const zen::Encoding encoding = zen::ChooseEncoding(count, rows);
    header_[0] = static_cast<uint32_t>(encoding);
    header_[1] = static_cast<uint32_t>(count);
    CUPCAKE_RETURN_IF_ERROR(ToDevice(out, header_, sizeof(header_), stream));
    std::byte* body = out + zen::kPartitionHeaderBytes;
    int64_t index_bytes = 4 * count;
    if (encoding == zen::Encoding::kRows) {
      if (count > 0) {
        EncodeRowsKernel<<<Blocks(count), kThreads, 0, stream>>>(merged_indices_.get<uint32_t>(), count, p,
                                                                 reinterpret_cast<uint32_t*>(body));
      }
    } else {
      index_bytes = (rows + 7) / 8;
      CUPCAKE_RETURN_IF_ERROR(Zero(body, index_bytes, stream));
      // The last word may reach past the bitmap into the values (a bitmap implies count >= 1,
      // so at least 4 bytes follow); its bits there stay 0 and the values are copied after.
      EncodeBitmapKernel<<<Blocks(count), kThreads, 0, stream>>>(merged_indices_.get<uint32_t>(), count, p,
                                                                 reinterpret_cast<uint32_t*>(body));
    }
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return Copy(body + index_bytes, merged_values_.get<float>(), 4 * count, stream);
  }

  StatusOr<zen::PartitionLayout> DecodeInto(const std::byte* block_arg, int64_t bytes, int owner, int64_t n, int world_size, uint32_t seed,
                    float divisor, float* out, void* stream_arg) override {
    const cudaStream_t stream = S(stream_arg);
    const auto* block = reinterpret_cast<const unsigned char*>(block_arg);
    const auto p = static_cast<uint32_t>(world_size);
    const int64_t rows = zen::PartitionRows(owner, n, world_size, seed);
    StatusOr<zen::PartitionLayout> sized = zen::LayoutOfSize(bytes, rows, Where(owner));
    if (!sized.ok()) {
      pending_.clear();
      return sized.status();
    }
    const zen::PartitionLayout layout = *sized;
    if (!pending_.empty() && world_size != problem_slots_) {
      return InvalidArgumentError("zen decode: world_size: changed between decodes; got " + std::to_string(world_size) +
                                  ", expected " + std::to_string(problem_slots_));
    }
    if (pending_.empty()) {
      CUPCAKE_ASSIGN_OR_RETURN(DecodeProblems * problems,
                               problems_.Get<DecodeProblems>(sizeof(DecodeProblems) * world_size, stream));
      ResetProblemsKernel<<<Blocks(world_size), kThreads, 0, stream>>>(problems, world_size);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      problem_slots_ = world_size;
    }
    pending_.push_back({owner, layout, block, bytes, rows});
    DecodeProblems* problem = problems_.get<DecodeProblems>() + owner;
    CheckHeaderKernel<<<1, 1, 0, stream>>>(block, static_cast<uint32_t>(layout.encoding),
                                           static_cast<uint32_t>(layout.count), problem);
    const unsigned char* body = block + zen::kPartitionHeaderBytes;
    if (layout.encoding == zen::Encoding::kRows) {
      if (layout.count > 0) {
        DecodeRowsKernel<<<Blocks(layout.count), kThreads, 0, stream>>>(
            body, body + 4 * layout.count, layout.count, n, static_cast<uint32_t>(owner), p, seed, divisor, out,
            problem);
      }
    } else {
      const int64_t map_bytes = (rows + 7) / 8;
      CUPCAKE_ASSIGN_OR_RETURN(int* population, starts_.Get<int>(4 * map_bytes, stream));
      CUPCAKE_ASSIGN_OR_RETURN(int* first, slots_.Get<int>(4 * map_bytes, stream));
      size_t scan_bytes = 0;
      const int items = static_cast<int>(map_bytes);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, population, first, items, stream));
      CUPCAKE_ASSIGN_OR_RETURN(void* temp, temp_.Get<void>(static_cast<int64_t>(scan_bytes), stream));
      BytePopulationKernel<<<Blocks(map_bytes), kThreads, 0, stream>>>(body, map_bytes, rows, population);
      CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
      CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, population, first, items, stream));
      DecodeBitmapKernel<<<Blocks(map_bytes), kThreads, 0, stream>>>(body, map_bytes, rows, population, first,
                                                                     body + map_bytes, layout.count,
                                                                     static_cast<uint32_t>(owner), p, seed, divisor,
                                                                     out, problem);
    }
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    return layout;
  }

  Status FinishDecodes(void* stream) override {
    std::vector<Pending> pending;
    pending.swap(pending_);
    std::vector<DecodeProblems> problems(static_cast<size_t>(problem_slots_));
    CUPCAKE_RETURN_IF_ERROR(
        ToHost(problems.data(), problems_.get(), static_cast<int64_t>(sizeof(DecodeProblems)) * problem_slots_, stream));
    std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) { return a.owner < b.owner; });
    for (const Pending& d : pending) {
      const DecodeProblems& found = problems[static_cast<size_t>(d.owner)];
      if (found.bad_header != 0) {  // DecodePartition's text for a header that disagrees with the size
        return DataLossError(Where(d.owner) + ": size: mismatch; got " + std::to_string(d.bytes) + " bytes, expected a header and a body for at most " + std::to_string(d.rows) + " rows");
      }
      if (found.first_bad_row != kNone) {
        uint32_t row = 0;
        CUPCAKE_RETURN_IF_ERROR(
            ToHost(&row, d.block + zen::kPartitionHeaderBytes + 4 * found.first_bad_row, 4, stream));
        return DataLossError(Where(d.owner) + ": rows[" + std::to_string(found.first_bad_row) +
                             "]: not an increasing row of the partition; got " + std::to_string(row) + ", expected < " +
                             std::to_string(d.rows) + " and increasing");
      }
      if (d.layout.encoding == zen::Encoding::kBitmap && static_cast<int64_t>(found.set_bits) != d.layout.count) {
        return DataLossError(Where(d.owner) + ": count: mismatch; got " + std::to_string(found.set_bits) +
                             " set bits, expected " + std::to_string(d.layout.count) + " (the header)");
      }
    }
    return Status::Ok();
  }

 private:
  struct Pending {
    int owner;
    zen::PartitionLayout layout;
    const unsigned char* block;
    int64_t bytes;
    int64_t rows;
  };
  static cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }
  static std::string Where(int owner) { return "zen partition of rank " + std::to_string(owner); }

  Scratch exchange_[5];
  Scratch status_, keys_, keys_out_, values_, values_out_, partitioned_, starts_, slots_, merged_indices_,
      merged_values_, temp_, problems_;
  int64_t* counts_ = nullptr;
  int64_t merged_ = 0;
  uint32_t header_[2] = {0, 0};
  std::vector<Pending> pending_;
  int problem_slots_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<zen::DeviceSteps>> MakeZenDeviceSteps() {
  CUPCAKE_RETURN_IF_ERROR(DeviceAvailable());
  return std::unique_ptr<zen::DeviceSteps>(std::make_unique<CudaZenSteps>());
}

}  // namespace cupcake::kernels::cuda

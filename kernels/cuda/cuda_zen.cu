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
//   - Decode: all partitions in two kernels around one scan, with one wait: the headers and
//     each bitmap byte's population, a scan over all bitmaps' bytes, then one row-list entry
//     or bitmap byte per thread. Blocks arrive at any byte offset (an allgatherv's
//     concatenation), so the decode reads them byte by byte. Problems are counted per
//     partition on the device and reported with DecodePartition's texts.
// Division by the divisor is IEEE (no fast math), as on the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../src/backends.h"
#include "../src/common.h"
#include "../src/zen_checks.h"
#include "cupcake/internal/cuda_status.h"

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

// ---- Decode ----
// One partition of a Decode call: where it is and what its size says it holds.
struct PartitionJob {
  const unsigned char* block;
  int64_t count;
  int64_t rows;
  int64_t map_bytes;  // bitmap bytes; 0 for a row list
  int64_t population_at;  // its bytes' first slot in the population and scan arrays
  uint32_t encoding;
  uint32_t owner;
};

// Per partition: what Decode reports.
struct DecodeProblems {
  u64 bad_header;  // 1 when the header disagrees with the block's size
  u64 first_bad_row;  // the first row-list entry that is not an increasing row below n
  u64 set_bits;  // the bitmap's population (rows of the partition only)
};

__device__ __forceinline__ uint32_t MapByte(const PartitionJob& job, int64_t b) {
  const int64_t valid = job.rows - 8 * b < 8 ? job.rows - 8 * b : 8;  // bits past the rows are ignored
  return job.block[zen::kPartitionHeaderBytes + b] & ((1u << valid) - 1);
}

// Grid: x over the widest bitmap, y over the partitions (looping past gridDim.y). Resets the
// problems, checks each header, counts each bitmap byte's rows.
__global__ void DecodePrepareKernel(const PartitionJob* jobs, int parts, int* population, DecodeProblems* problems) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int i = blockIdx.y; i < parts; i += gridDim.y) {
    const PartitionJob& job = jobs[i];
    if (b == 0) {
      const bool bad = LoadU32(job.block) != job.encoding || LoadU32(job.block + 4) != job.count;
      problems[i] = {bad ? 1ull : 0ull, kNone, 0};
    }
    if (b < job.map_bytes) population[job.population_at + b] = __popc(MapByte(job, b));
  }
}

// Grid: x over the widest row list or bitmap, y over the partitions. A row list: entry j per
// thread; a bitmap: byte b per thread, its values from the scan (`first`, exclusive, over all
// partitions' bytes, so a partition's own count starts at first[population_at]).
__global__ void DecodeScatterKernel(const PartitionJob* jobs, int parts, const int* population, const int* first,
                                    int64_t n, uint32_t p, uint32_t seed, float divisor, float* out,
                                    DecodeProblems* problems) {
  const int64_t x = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int i = blockIdx.y; i < parts; i += gridDim.y) {
    const PartitionJob& job = jobs[i];
    const unsigned char* body = job.block + zen::kPartitionHeaderBytes;
    if (job.map_bytes == 0) {
      if (x >= job.count) continue;
      const uint32_t row = LoadU32(body + 4 * x);
      const int64_t index = DeviceRowMember(row, job.owner, p, seed);
      if (index >= n || (x > 0 && row <= LoadU32(body + 4 * (x - 1)))) {
        atomicMin(&problems[i].first_bad_row, static_cast<u64>(x));
        continue;
      }
      out[index] = __uint_as_float(LoadU32(body + 4 * job.count + 4 * x)) / divisor;
      continue;
    }
    if (x >= job.map_bytes) continue;
    const int base = first[job.population_at];
    if (x == job.map_bytes - 1) {
      problems[i].set_bits = static_cast<u64>(first[job.population_at + x] + population[job.population_at + x] - base);
    }
    const unsigned char* values = body + job.map_bytes;
    uint32_t bits = MapByte(job, x);
    int64_t at = first[job.population_at + x] - base;
    while (bits != 0 && at < job.count) {
      const int t = __ffs(bits) - 1;
      bits &= bits - 1;
      const int64_t index = DeviceRowMember(static_cast<uint32_t>(8 * x + t), job.owner, p, seed);
      out[index] = __uint_as_float(LoadU32(values + 4 * at)) / divisor;
      ++at;
    }
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
    CUPCAKE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, S(stream)));
    return Status::Ok();
  }
  Status ToHost(void* dst, const void* src, int64_t bytes, void* stream) override {
    if (bytes > 0) {
      CUPCAKE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, S(stream)));
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
      CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, sorted_keys, pairs,
                                                                   sorted, static_cast<int>(k), 0, end_bit, stream));
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
    CUPCAKE_ASSIGN_OR_RETURN(void* temp,
                             temp_.Get<void>(static_cast<int64_t>(std::max(sort_bytes, scan_bytes)), stream));
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

  StatusOr<std::vector<zen::PartitionLayout>> Decode(std::span<const zen::DevicePartition> partitions, int64_t n,
                                                     int world_size, uint32_t seed, float divisor, float* out,
                                                     void* stream_arg) override {
    const cudaStream_t stream = S(stream_arg);
    const auto p = static_cast<uint32_t>(world_size);
    const int parts = static_cast<int>(partitions.size());
    std::vector<zen::PartitionLayout> layouts;
    std::vector<PartitionJob> jobs;
    int64_t map_total = 0, widest = 1;
    for (const zen::DevicePartition& part : partitions) {
      const int64_t rows = zen::PartitionRows(part.owner, n, world_size, seed);
      CUPCAKE_ASSIGN_OR_RETURN(const zen::PartitionLayout layout,
                               zen::LayoutOfSize(part.bytes, rows, Where(part.owner)));
      const int64_t map_bytes = layout.encoding == zen::Encoding::kBitmap ? (rows + 7) / 8 : 0;
      jobs.push_back({reinterpret_cast<const unsigned char*>(part.block), layout.count, rows, map_bytes, map_total,
                      static_cast<uint32_t>(layout.encoding), static_cast<uint32_t>(part.owner)});
      layouts.push_back(layout);
      map_total += map_bytes;
      widest = std::max({widest, map_bytes, map_bytes == 0 ? layout.count : int64_t{0}});
    }
    if (parts == 0) return layouts;
    if (map_total > INT_MAX)
      return InvalidArgumentError("zen decode: bitmaps: out of range; got " + std::to_string(map_total) + " bytes");
    CUPCAKE_ASSIGN_OR_RETURN(PartitionJob* device_jobs, jobs_.Get<PartitionJob>(sizeof(PartitionJob) * parts, stream));
    CUPCAKE_ASSIGN_OR_RETURN(DecodeProblems * problems,
                             problems_.Get<DecodeProblems>(sizeof(DecodeProblems) * parts, stream));
    CUPCAKE_ASSIGN_OR_RETURN(int* population, starts_.Get<int>(4 * std::max<int64_t>(map_total, 1), stream));
    CUPCAKE_ASSIGN_OR_RETURN(int* first, slots_.Get<int>(4 * std::max<int64_t>(map_total, 1), stream));
    CUPCAKE_RETURN_IF_ERROR(
        ToDevice(device_jobs, jobs.data(), static_cast<int64_t>(sizeof(PartitionJob)) * parts, stream));
    const dim3 grid(Blocks(widest), static_cast<unsigned>(std::min(parts, 65535)));
    DecodePrepareKernel<<<grid, kThreads, 0, stream>>>(device_jobs, parts, population, problems);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    if (map_total > 0) {
      size_t scan_bytes = 0;
      const int items = static_cast<int>(map_total);
      CUPCAKE_CUDA_RETURN_IF_ERROR(
          cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, population, first, items, stream));
      CUPCAKE_ASSIGN_OR_RETURN(void* temp, temp_.Get<void>(static_cast<int64_t>(scan_bytes), stream));
      CUPCAKE_CUDA_RETURN_IF_ERROR(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, population, first, items, stream));
    }
    DecodeScatterKernel<<<grid, kThreads, 0, stream>>>(device_jobs, parts, population, first, n, p, seed, divisor, out,
                                                       problems);
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    std::vector<DecodeProblems> found(static_cast<size_t>(parts));
    CUPCAKE_RETURN_IF_ERROR(
        ToHost(found.data(), problems, static_cast<int64_t>(sizeof(DecodeProblems)) * parts, stream));
    // The first owner with a problem, in DecodePartition's order of checks.
    std::vector<int> order(static_cast<size_t>(parts));
    for (int i = 0; i < parts; ++i) order[static_cast<size_t>(i)] = i;
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return jobs[static_cast<size_t>(a)].owner < jobs[static_cast<size_t>(b)].owner; });
    for (int i : order) {
      const PartitionJob& job = jobs[static_cast<size_t>(i)];
      const DecodeProblems& f = found[static_cast<size_t>(i)];
      const int owner = static_cast<int>(job.owner);
      if (f.bad_header != 0) {  // DecodePartition's text for a header that disagrees with the size
        return DataLossError(Where(owner) + ": size: mismatch; got " +
                             std::to_string(partitions[static_cast<size_t>(i)].bytes) +
                             " bytes, expected a header and a body for at most " + std::to_string(job.rows) + " rows");
      }
      if (f.first_bad_row != kNone) {
        uint32_t row = 0;
        CUPCAKE_RETURN_IF_ERROR(ToHost(&row, job.block + zen::kPartitionHeaderBytes + 4 * f.first_bad_row, 4, stream));
        return DataLossError(Where(owner) + ": rows[" + std::to_string(f.first_bad_row) +
                             "]: not an increasing row of the partition; got " + std::to_string(row) + ", expected < " +
                             std::to_string(job.rows) + " and increasing");
      }
      if (job.map_bytes > 0 && static_cast<int64_t>(f.set_bits) != job.count) {
        return DataLossError(Where(owner) + ": count: mismatch; got " + std::to_string(f.set_bits) +
                             " set bits, expected " + std::to_string(job.count) + " (the header)");
      }
    }
    return layouts;
  }

 private:
  static cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }
  static std::string Where(int owner) { return "zen partition of rank " + std::to_string(owner); }

  Scratch exchange_[5];
  Scratch status_, keys_, keys_out_, values_, values_out_, partitioned_, starts_, slots_, merged_indices_,
      merged_values_, temp_, problems_, jobs_;
  int64_t* counts_ = nullptr;
  int64_t merged_ = 0;
  uint32_t header_[2] = {0, 0};
};

}  // namespace

StatusOr<std::unique_ptr<zen::DeviceSteps>> MakeZenDeviceSteps() {
  CUPCAKE_RETURN_IF_ERROR(DeviceAvailable());
  return std::unique_ptr<zen::DeviceSteps>(std::make_unique<CudaZenSteps>());
}

}  // namespace cupcake::kernels::cuda

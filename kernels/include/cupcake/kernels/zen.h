// The communication-free pieces of Zen, a balanced-parallelism synchronization for sparse
// gradients (Wang et al., "Zen: Near-Optimal Sparse Tensor Synchronization for Distributed DNN
// Training", 2023): every index has one owner rank chosen by a hash all ranks compute alike;
// ranks send their (index, value) pairs to the owners, owners sum them, and every rank gathers
// the owners' sums. libcomm's ZenAllreduce (cupcake/comm/zen.h) runs the exchange; this header
// holds the steps on either side of it: on host memory (functions) and on GPU memory
// (DeviceSteps, CUDA builds), with the same results bit for bit.
//
// The hierarchical hash. With P ranks, index i lies in row q = i / P at column c = i % P, and
//   owner(i) = (c + h(q)) mod P,   h = a 32-bit integer finalizer of q mixed with a seed.
// Within a row the owner is a rotation of the column, so each row of P consecutive indices has
// exactly one member per owner: a contiguous run of L indices gives every owner floor(L/P) or
// ceil(L/P) members when it starts at a row, at most one more or fewer otherwise (its partial
// first and last rows), which a plain hash of i only achieves on average (top-k indices
// cluster). The hash
// of the row decorrelates which column a rank owns from row to row, so strided patterns do not
// all land on one owner either. Owner r's member of row q is q*P + ((r - h(q)) mod P), so a
// partition is addressed by row number, and a bitmap over its rows encodes it densely.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/status.h"

namespace cupcake::kernels::zen {

// A sparse vector over n elements: strictly increasing indices < n, one value each.
struct SparseView {
  std::span<const uint32_t> indices;
  std::span<const float> values;
};
struct Sparse {
  std::vector<uint32_t> indices;
  std::vector<float> values;
  SparseView view() const { return {indices, values}; }
};

// One (index, value) pair as sent to an owner: 8 bytes, the wire format of the exchange.
struct Pair {
  uint32_t index;
  float value;
};
static_assert(sizeof(Pair) == 8);

// n must lie in [1, kMaxElements] (indices are uint32, counts fit int32).
inline constexpr int64_t kMaxElements = 2147483647;

// InvalidArgument naming `what` unless indices and values have equal sizes and the indices are
// strictly increasing and < n; reports every kind of problem found, each at its first place.
Status ValidateSparse(SparseView input, int64_t n, const std::string& what);

// The topk compressor's payload (compressor.h: k x f32 values, then k x int32 ascending
// indices) as a sparse vector, without copying. payload must hold 8 * k bytes, 4-byte aligned.
StatusOr<SparseView> TopkPayloadView(std::span<const std::byte> payload, int64_t k);

uint32_t RowHash(uint32_t row, uint32_t seed);
int Owner(uint32_t index, int world_size, uint32_t seed);
// Owner `owner`'s member of row `row` (may be >= n in the last row).
int64_t RowMember(uint32_t row, int owner, int world_size, uint32_t seed);
// Rows of owner's partition that have a member below n.
int64_t PartitionRows(int owner, int64_t n, int world_size, uint32_t seed);

// Pairs packed per owner (owner 0 first), increasing index order within each owner.
struct Partitioned {
  std::vector<int64_t> counts;  // world_size entries
  std::vector<Pair> pairs;
};
Partitioned PartitionByOwner(SparseView input, int world_size, uint32_t seed);

// `pairs` holds one sorted list per sender, the lists concatenated in sender rank order.
// Returns their union; the values of an index are summed in sender order, starting from
// the first sender's value, so every owner sums alike.
Sparse MergeSum(std::span<const Pair> pairs);

// An owner's partition on the wire: a header {uint32 encoding, uint32 count}, then either
// count x uint32 row numbers (kRows) or a bitmap of ceil(rows / 8) bytes, bit j of byte b for
// row 8b + j (kBitmap), whichever is smaller (kRows on a tie), then count x f32 values in
// increasing index order. Rows instead of indices: the owner and the hash give the index back.
// The sizes are the catalogue's ZenPartitionBytes (cupcake/proto/catalogue.h), which the
// planner's step sizes read too.
enum class Encoding : uint32_t { kRows = 0, kBitmap = 1 };
const char* EncodingName(Encoding encoding);  // "rows", "bitmap"
inline constexpr int64_t kPartitionHeaderBytes = kZenPartitionHeaderBytes;
int64_t EncodedPartitionBytes(Encoding encoding, int64_t count, int64_t rows);
Encoding ChooseEncoding(int64_t count, int64_t rows);

// The encoding and count of an encoded partition of `bytes` bytes over `rows` rows: the size
// alone determines them, since ChooseEncoding takes the bitmap only where it is smaller (a
// row list of c entries and a bitmap of c' entries of equal size would need c <= B/4 < c',
// B the bitmap's bytes, and 8c = B + 4c'). DataLoss naming `what` when no partition has that
// size.
struct PartitionLayout {
  Encoding encoding;
  int64_t count;
};
StatusOr<PartitionLayout> LayoutOfSize(int64_t bytes, int64_t rows, const std::string& what);

// partition: owner's members only, sorted (MergeSum's output). Appends to `out`.
Encoding EncodePartition(SparseView partition, int owner, int64_t n, int world_size, uint32_t seed,
                         std::vector<std::byte>& out);
// DataLoss naming the owner when the bytes are not a partition of owner over n elements.
StatusOr<Sparse> DecodePartition(std::span<const std::byte> bytes, int owner, int64_t n, int world_size, uint32_t seed);

// The union of disjoint partitions as one sparse vector with increasing indices.
Sparse MergePartitions(std::span<const Sparse> partitions);

// The non-zero entries of a dense vector (naturally sparse gradients: the zen_sparse scheme), in
// increasing index order, into `out` (cleared first; its vectors keep their capacity, so a caller
// that reuses `out` allocates only when a vector holds more non-zeros than before). -0.0 counts
// as zero; NaN does not (it is kept, so a diverged gradient is not hidden). dense.size() must be
// at most kMaxElements.
void CollectNonzeros(std::span<const float> dense, Sparse& out);

// out = 0 except out[indices[j]] = scale * values[j]. InvalidArgument if an index is >= out.size().
Status ScatterDense(SparseView input, float scale, std::span<float> out);

// One owner's encoded partition in device memory, at any alignment (DeviceSteps::Decode).
struct DevicePartition {
  const std::byte* block;
  int64_t bytes;
  int owner;
};

// Zen's steps on GPU memory, results bitwise equal to the host functions above. Pointers are
// device memory, `stream` a cudaStream_t (nullptr: the legacy default stream); every step is
// enqueued on it, and the ones returning host values wait for it. The object keeps its scratch
// and the exchange areas between calls (grown on demand, never shrunk); one caller at a time.
class DeviceSteps {
 public:
  // FailedPrecondition when the build has no CUDA; the CUDA runtime's error without a device.
  static StatusOr<std::unique_ptr<DeviceSteps>> Create();
  virtual ~DeviceSteps() = default;

  // Exchange areas for the caller (ZenAllreduce's device path): at least `bytes` bytes,
  // 256-byte aligned, kept until the same area is asked for more.
  enum class Area { kCounts, kPairs, kSizes, kSend, kReceived };
  virtual StatusOr<std::byte*> Reserve(Area area, int64_t bytes, void* stream) = 0;
  // Stream-ordered copies and fill; ToHost waits for the stream and the copy.
  virtual Status ToDevice(void* dst, const void* src, int64_t bytes, void* stream) = 0;
  virtual Status ToHost(void* dst, const void* src, int64_t bytes, void* stream) = 0;
  virtual Status Copy(void* dst, const void* src, int64_t bytes, void* stream) = 0;
  virtual Status Zero(void* dst, int64_t bytes, void* stream) = 0;

  // ValidateSparse (InvalidArgument naming `what`, the same texts) and PartitionByOwner of the
  // k pairs at (indices, values): the pairs land in partitioned(), their per-owner counts (int64,
  // world_size of them) in device_counts() and are returned. Waits for the stream.
  virtual StatusOr<std::vector<int64_t>> Partition(const uint32_t* indices, const float* values, int64_t k, int64_t n,
                                                   int world_size, uint32_t seed, const std::string& what,
                                                   void* stream) = 0;
  virtual const Pair* partitioned() const = 0;
  virtual const int64_t* device_counts() const = 0;
  // MergeSum of the `total` pairs at `pairs` into the object; returns the union's size. Waits.
  virtual StatusOr<int64_t> MergeSum(const Pair* pairs, int64_t total, void* stream) = 0;
  // EncodePartition of the last MergeSum's union as owner's partition into `out` (4-byte
  // aligned), which holds
  // EncodedPartitionBytes(ChooseEncoding(count, rows), count, rows) bytes (rows: PartitionRows).
  virtual Status EncodeMerged(int owner, int64_t n, int world_size, uint32_t seed, std::byte* out, void* stream) = 0;
  // DecodePartition of each of `partitions` (distinct owners) and out[index] = value / divisor
  // for each of their entries (ScatterDense's writes; the other entries of out untouched), in
  // one launch sequence and one wait. Returns each partition's layout (LayoutOfSize: the size
  // implies it), in the order given. DataLoss before any launch when a size fits no partition,
  // and after the wait naming the first owner whose partition is malformed (DecodePartition's
  // texts; the other writes may have happened).
  virtual StatusOr<std::vector<PartitionLayout>> Decode(std::span<const DevicePartition> partitions, int64_t n,
                                                        int world_size, uint32_t seed, float divisor, float* out,
                                                        void* stream) = 0;
};

}  // namespace cupcake::kernels::zen

// zen::DeviceSteps against the host steps of cupcake/kernels/zen.h, bit for bit: the owner
// partition, the owners' merge-sum (random non-integer values, so a different order of
// additions would show in the last bits), both encodings, the decode at odd byte offsets, and
// the texts of bad inputs and malformed partitions. The host functions are the reference here;
// they are checked against restated definitions in zen_test.cc.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/zen.h"
#include "gpu_test.h"

namespace cupcake::kernels::zen {
namespace {

// A device copy of a host vector, freed on destruction.
template <typename T>
class OnDevice {
 public:
  explicit OnDevice(const std::vector<T>& host, size_t extra_bytes = 0) : bytes_(host.size() * sizeof(T)) {
    EXPECT_EQ(cudaMalloc(&data_, bytes_ + extra_bytes + 1), cudaSuccess);
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~OnDevice() { cudaFree(data_); }
  T* get() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

template <typename T>
std::vector<T> ToHost(const void* device, size_t count) {
  std::vector<T> host(count);
  if (count > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// k sorted distinct indices of [0, n) (selection sampling), with index 0 and n - 1 forced in
// when `ends`, and normal values.
Sparse Random(std::mt19937_64& rng, int64_t n, int64_t k, bool ends) {
  Sparse s;
  for (int64_t i = 0; i < n; ++i) {
    const bool forced = ends && (i == 0 || i == n - 1);
    if (forced || static_cast<int64_t>(rng() % static_cast<uint64_t>(n - i)) < k - static_cast<int64_t>(s.indices.size())) {
      s.indices.push_back(static_cast<uint32_t>(i));
    }
  }
  std::normal_distribution<float> value(0.0f, 1.0f);
  for (size_t j = 0; j < s.indices.size(); ++j) s.values.push_back(value(rng));
  return s;
}

class ZenCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    CUPCAKE_GPU_OR_SKIP(BackendAvailable(Backend::kCuda));
    StatusOr<std::unique_ptr<DeviceSteps>> made = DeviceSteps::Create();
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    steps_ = std::move(*made);
  }
  std::unique_ptr<DeviceSteps> steps_;
};

TEST_F(ZenCuda, PartitionMatchesHost) {
  std::mt19937_64 rng(11);
  for (int p : {1, 2, 3, 8, 64}) {
    for (int64_t k : {0, 1, 300, 20000}) {
      Sparse in = Random(rng, 100003, k, k > 1);
      // A clustered stretch too (top-k indices cluster).
      if (k == 20000) {
        for (uint32_t i = 200000; i < 205000; ++i) {
          in.indices.push_back(i);
          in.values.push_back(static_cast<float>(i) * 0.5f);
        }
      }
      const Partitioned host = PartitionByOwner(in.view(), p, 5);
      OnDevice<uint32_t> idx(in.indices);
      OnDevice<float> val(in.values);
      StatusOr<std::vector<int64_t>> counts = steps_->Partition(idx.get(), val.get(), static_cast<int64_t>(in.indices.size()),
                                                                300000, p, 5, "in", nullptr);
      ASSERT_TRUE(counts.ok()) << counts.status().ToString();
      EXPECT_EQ(*counts, host.counts) << "P=" << p << " k=" << k;
      EXPECT_EQ(ToHost<int64_t>(steps_->device_counts(), static_cast<size_t>(p)), host.counts);
      const std::vector<Pair> pairs = ToHost<Pair>(steps_->partitioned(), host.pairs.size());
      for (size_t j = 0; j < pairs.size(); ++j) {
        ASSERT_EQ(pairs[j].index, host.pairs[j].index) << "P=" << p << " k=" << k << " pair " << j;
        ASSERT_EQ(Bits(pairs[j].value), Bits(host.pairs[j].value)) << "P=" << p << " k=" << k << " pair " << j;
      }
    }
  }
}

// The senders' lists overlap heavily (k of a small range each), so most indices have several
// values, added in sender order on both sides.
TEST_F(ZenCuda, MergeSumMatchesHostBitwise) {
  std::mt19937_64 rng(12);
  for (int senders : {1, 2, 3, 8, 64}) {
    for (int64_t k : {0, 5, 700}) {
      std::vector<Pair> all;
      for (int s = 0; s < senders; ++s) {
        const Sparse list = Random(rng, 1000, k, false);
        for (size_t j = 0; j < list.indices.size(); ++j) all.push_back({list.indices[j], list.values[j]});
      }
      const Sparse host = MergeSum(all);
      OnDevice<Pair> pairs(all);
      StatusOr<int64_t> size = steps_->MergeSum(pairs.get(), static_cast<int64_t>(all.size()), nullptr);
      ASSERT_TRUE(size.ok()) << size.status().ToString();
      ASSERT_EQ(*size, static_cast<int64_t>(host.indices.size())) << senders << " senders, k=" << k;
      // The union reaches the host only encoded: as owner 0 of a world of 1, a row list of the
      // indices themselves (or a bitmap over them), then the values.
      const int64_t rows = PartitionRows(0, 1000, 1, 0);
      std::vector<std::byte> expected;
      EncodePartition(host.view(), 0, 1000, 1, 0, expected);
      OnDevice<std::byte> out(std::vector<std::byte>(expected.size()));
      ASSERT_TRUE(steps_->EncodeMerged(0, 1000, 1, 0, out.get(), nullptr).ok());
      EXPECT_EQ(ToHost<std::byte>(out.get(), expected.size()), expected) << senders << " senders, k=" << k
                                                                         << ", rows " << rows;
    }
  }
}

// Partitions of one owner at several densities, so both encodings occur; the device encodes
// its merge of the partition (one sender) and must produce the host's bytes.
TEST_F(ZenCuda, EncodeMatchesHostInBothEncodings) {
  std::mt19937_64 rng(13);
  int bitmaps = 0, lists = 0;
  for (int p : {1, 3, 8}) {
    for (int owner : {0, p - 1}) {
      for (int64_t every : {1, 2, 20, 1000}) {
        const int64_t n = 50021;
        Sparse part;
        std::normal_distribution<float> value;
        for (int64_t row = 0; row < PartitionRows(owner, n, p, 9); row += every) {
          part.indices.push_back(static_cast<uint32_t>(RowMember(static_cast<uint32_t>(row), owner, p, 9)));
          part.values.push_back(value(rng));
        }
        std::vector<Pair> pairs;
        for (size_t j = 0; j < part.indices.size(); ++j) pairs.push_back({part.indices[j], part.values[j]});
        std::vector<std::byte> expected;
        (EncodePartition(part.view(), owner, n, p, 9, expected) == Encoding::kBitmap ? bitmaps : lists)++;
        OnDevice<Pair> in(pairs);
        ASSERT_TRUE(steps_->MergeSum(in.get(), static_cast<int64_t>(pairs.size()), nullptr).ok());
        OnDevice<std::byte> out(std::vector<std::byte>(expected.size()));
        ASSERT_TRUE(steps_->EncodeMerged(owner, n, p, 9, out.get(), nullptr).ok());
        EXPECT_EQ(ToHost<std::byte>(out.get(), expected.size()), expected)
            << "P=" << p << " owner " << owner << " every " << every;
      }
    }
  }
  EXPECT_GT(bitmaps, 0);
  EXPECT_GT(lists, 0);
}

// Host-encoded partitions, every owner's in one device buffer one after another from byte 0
// or 3 (so most start unaligned, as in an allgatherv), or one owner's alone, decoded in one
// call into the host's entries divided by the divisor; every other element keeps its sentinel.
TEST_F(ZenCuda, DecodeMatchesHostAtAnyOffset) {
  std::mt19937_64 rng(14);
  const float sentinel = -12345.5f;
  const int64_t n = 20011;
  for (int p : {1, 3, 8}) {
    for (int64_t every : {1, 3, 50}) {
      for (size_t offset : {size_t{0}, size_t{3}}) {
        for (bool alone : {false, true}) {
          std::vector<std::byte> bytes(offset);
          std::vector<float> expected(static_cast<size_t>(n), sentinel);
          std::vector<std::pair<size_t, size_t>> spans;  // (start, size) of each partition
          std::vector<int> owners;
          for (int owner = alone ? p / 2 : 0; owner < (alone ? p / 2 + 1 : p); ++owner) {
            Sparse part;
            std::normal_distribution<float> value;
            for (int64_t row = owner % 2; row < PartitionRows(owner, n, p, 4); row += every) {
              part.indices.push_back(static_cast<uint32_t>(RowMember(static_cast<uint32_t>(row), owner, p, 4)));
              part.values.push_back(value(rng));
            }
            const size_t start = bytes.size();
            EncodePartition(part.view(), owner, n, p, 4, bytes);
            spans.push_back({start, bytes.size() - start});
            owners.push_back(owner);
            StatusOr<Sparse> decoded =
                DecodePartition(std::span<const std::byte>(bytes).subspan(start), owner, n, p, 4);
            ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
            for (size_t j = 0; j < decoded->indices.size(); ++j) {
              expected[decoded->indices[j]] = decoded->values[j] / 3.0f;
            }
          }
          OnDevice<std::byte> block(bytes);
          OnDevice<float> out(std::vector<float>(static_cast<size_t>(n), sentinel));
          std::vector<DevicePartition> parts;
          for (size_t i = 0; i < spans.size(); ++i) {
            parts.push_back({block.get() + spans[i].first, static_cast<int64_t>(spans[i].second), owners[i]});
          }
          StatusOr<std::vector<PartitionLayout>> layouts = steps_->Decode(parts, n, p, 4, 3.0f, out.get(), nullptr);
          ASSERT_TRUE(layouts.ok()) << layouts.status().ToString();
          ASSERT_EQ(layouts->size(), parts.size());
          for (size_t i = 0; i < parts.size(); ++i) {
            EXPECT_EQ(static_cast<uint32_t>((*layouts)[i].encoding), static_cast<uint32_t>(bytes[spans[i].first]));
          }
          const std::vector<float> got = ToHost<float>(out.get(), static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(Bits(got[static_cast<size_t>(i)]), Bits(expected[static_cast<size_t>(i)]))
                << "P=" << p << " every " << every << " offset " << offset << (alone ? " alone" : " all")
                << " element " << i;
          }
        }
      }
    }
  }
}

TEST_F(ZenCuda, BadInputGetsTheHostsMessage) {
  const std::vector<std::vector<uint32_t>> inputs = {{3, 9, 9, 20}, {3, 9, 50}, {7, 2, 60}};
  for (const auto& indices : inputs) {
    const std::vector<float> values(indices.size(), 1.0f);
    const Status host = ValidateSparse({indices, values}, 40, "rank 2");
    ASSERT_FALSE(host.ok());
    OnDevice<uint32_t> idx(indices);
    OnDevice<float> val(values);
    StatusOr<std::vector<int64_t>> device =
        steps_->Partition(idx.get(), val.get(), static_cast<int64_t>(indices.size()), 40, 4, 0, "rank 2", nullptr);
    ASSERT_FALSE(device.ok());
    EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(device.status().message(), host.message());
  }
}

// Each corruption of a valid partition gets DecodePartition's DataLoss text.
TEST_F(ZenCuda, MalformedPartitionsGetTheHostsMessage) {
  const int p = 4, owner = 1;
  const int64_t n = 4000;
  auto partition = [&](int64_t every) {
    Sparse part;
    for (int64_t row = 0; row < PartitionRows(owner, n, p, 2); row += every) {
      part.indices.push_back(static_cast<uint32_t>(RowMember(static_cast<uint32_t>(row), owner, p, 2)));
      part.values.push_back(1.0f);
    }
    std::vector<std::byte> bytes;
    EncodePartition(part.view(), owner, n, p, 2, bytes);
    return bytes;
  };
  std::vector<std::vector<std::byte>> bad;
  std::vector<std::byte> rows = partition(50);
  ASSERT_EQ(static_cast<uint32_t>(rows[0]), 0u);  // a row list
  std::vector<std::byte> decreasing = rows;
  std::memset(decreasing.data() + 8 + 4 * 3, 0, 4);  // row 3 becomes 0, not after row 2
  bad.push_back(decreasing);
  std::vector<std::byte> beyond = rows;
  std::memset(beyond.data() + 8 + 4 * 5, 0x7f, 4);  // a row far past the partition
  bad.push_back(beyond);
  std::vector<std::byte> header = rows;
  header[4] = std::byte{1};  // count disagrees with the size
  bad.push_back(header);
  std::vector<std::byte> bitmap = partition(2);
  ASSERT_EQ(static_cast<uint32_t>(bitmap[0]), 1u);
  std::vector<std::byte> extra = bitmap;
  extra[8] |= std::byte{0x02};  // row 1 set too: one more bit than values
  bad.push_back(extra);
  std::vector<std::byte> truncated(rows.begin(), rows.end() - 4);
  bad.push_back(truncated);
  for (size_t c = 0; c < bad.size(); ++c) {
    const StatusOr<Sparse> host = DecodePartition(bad[c], owner, n, p, 2);
    ASSERT_FALSE(host.ok()) << "case " << c;
    OnDevice<std::byte> block(bad[c]);
    OnDevice<float> out(std::vector<float>(static_cast<size_t>(n)));
    const std::vector<DevicePartition> part = {{block.get(), static_cast<int64_t>(bad[c].size()), owner}};
    const Status device = steps_->Decode(part, n, p, 2, 1.0f, out.get(), nullptr).status();
    EXPECT_EQ(device.code(), StatusCode::kDataLoss) << "case " << c;
    EXPECT_EQ(device.message(), host.status().message()) << "case " << c;
  }
  // And a good partition after them decodes cleanly (no stale problem carried over).
  OnDevice<std::byte> block(rows);
  OnDevice<float> out(std::vector<float>(static_cast<size_t>(n)));
  const std::vector<DevicePartition> part = {{block.get(), static_cast<int64_t>(rows.size()), owner}};
  EXPECT_TRUE(steps_->Decode(part, n, p, 2, 1.0f, out.get(), nullptr).ok());
}

}  // namespace
}  // namespace cupcake::kernels::zen

// Zen's host-side steps: the owner hash balances contiguous runs, partitions round-trip through
// both encodings, and bad inputs are named. Expected values are restated from the definitions.
#include "cupcake/kernels/zen.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>

namespace cupcake::kernels::zen {
namespace {

// A run of L indices starting at a row boundary gives every owner floor(L/P) or ceil(L/P)
// members; elsewhere the partial first and last rows allow one more or one fewer.
TEST(ZenOwner, ContiguousRunIsBalanced) {
  for (int p : {1, 2, 3, 4, 8, 64}) {
    for (uint32_t start : {0u, 5u, 1000003u}) {
      for (uint32_t run : {10007u, 64u * 100u}) {
        std::vector<int64_t> members(static_cast<size_t>(p), 0);
        for (uint32_t i = start; i < start + run; ++i) ++members[static_cast<size_t>(Owner(i, p, 7))];
        const int64_t slack = start % static_cast<uint32_t>(p) == 0 ? 0 : 1;
        const int64_t low = run / p - slack, high = (run + p - 1) / p + slack;
        for (int r = 0; r < p; ++r) {
          EXPECT_GE(members[static_cast<size_t>(r)], low) << "P=" << p << " start " << start << " owner " << r;
          EXPECT_LE(members[static_cast<size_t>(r)], high) << "P=" << p << " start " << start << " owner " << r;
        }
      }
    }
  }
}

TEST(ZenOwner, RowMemberIsTheOwnersIndexInTheRow) {
  for (int p : {1, 3, 8}) {
    for (uint32_t row = 0; row < 100; ++row) {
      for (int r = 0; r < p; ++r) {
        const int64_t i = RowMember(row, r, p, 3);
        EXPECT_EQ(i / p, row);
        EXPECT_EQ(Owner(static_cast<uint32_t>(i), p, 3), r);
      }
    }
  }
}

TEST(ZenPartition, PacksPerOwnerKeepingIndexOrder) {
  const std::vector<uint32_t> idx{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<float> val{10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  const Partitioned out = PartitionByOwner({idx, val}, 3, 1);
  size_t at = 0;
  for (int r = 0; r < 3; ++r) {
    std::vector<uint32_t> expected;
    for (uint32_t i : idx)
      if (Owner(i, 3, 1) == r) expected.push_back(i);
    ASSERT_EQ(out.counts[static_cast<size_t>(r)], static_cast<int64_t>(expected.size()));
    for (uint32_t i : expected) {
      EXPECT_EQ(out.pairs[at].index, i);
      EXPECT_EQ(out.pairs[at].value, static_cast<float>(i + 10));
      ++at;
    }
  }
  EXPECT_EQ(at, idx.size());
}

TEST(ZenMergeSum, SumsEqualIndicesInSenderOrder) {
  // 1e8 + 1 - 1e8 in float is 0 in this order (1e8 + 1 rounds to 1e8), 1 in any other.
  const std::vector<Pair> pairs{{2, 1e8f}, {5, 1}, {1, 3}, {2, 1}, {2, -1e8f}};
  const Sparse out = MergeSum(pairs);
  EXPECT_EQ(out.indices, (std::vector<uint32_t>{1, 2, 5}));
  EXPECT_EQ(out.values, (std::vector<float>{3, 0, 1}));
}

TEST(ZenMergeSum, KeepsSenderOrderWhenOneSendersListContinuesAnothers) {
  // Sender 1's list [6] continues sender 0's [1, 4] in increasing order, so the two form one
  // run; index 4 must still be summed as sender 0's 1e8, then sender 2's 1, then sender 3's
  // -1e8 (0 in float), and index 6 as sender 1's 2 then sender 2's -1.
  const std::vector<Pair> pairs{{1, 3}, {4, 1e8f}, {6, 2}, {4, 1}, {6, -1}, {4, -1e8f}};
  const Sparse out = MergeSum(pairs);
  EXPECT_EQ(out.indices, (std::vector<uint32_t>{1, 4, 6}));
  EXPECT_EQ(out.values, (std::vector<float>{3, 0, 1}));
}

TEST(ZenMergeSum, EmptyInputGivesAnEmptyVector) {
  const Sparse out = MergeSum({});
  EXPECT_TRUE(out.indices.empty());
  EXPECT_TRUE(out.values.empty());
}

// A partition of `owner` holding its members of the rows that `take` selects.
Sparse PartitionOf(int owner, int64_t n, int p, uint32_t seed, const std::function<bool(int64_t)>& take) {
  Sparse s;
  for (int64_t row = 0; row * p < n; ++row) {
    const int64_t i = RowMember(static_cast<uint32_t>(row), owner, p, seed);
    if (i < n && take(row)) {
      s.indices.push_back(static_cast<uint32_t>(i));
      s.values.push_back(static_cast<float>(row % 17) - 8);
    }
  }
  return s;
}

TEST(ZenEncoding, RoundTripsBothEncodingsAndPicksTheSmaller) {
  const int64_t n = 1001;
  const int p = 4;
  for (int owner = 0; owner < p; ++owner) {
    const int64_t rows = PartitionRows(owner, n, p, 9);
    int64_t expected_rows = 0;  // restated: rows whose owner member lies below n
    for (int64_t i = 0; i < n; ++i) expected_rows += Owner(static_cast<uint32_t>(i), p, 9) == owner;
    EXPECT_EQ(rows, expected_rows);
    for (const auto& [take, expected] : std::vector<std::pair<std::function<bool(int64_t)>, Encoding>>{
             {[](int64_t row) { return row % 50 == 0; }, Encoding::kRows},
             {[](int64_t row) { return row % 2 == 0; }, Encoding::kBitmap},
             {[](int64_t) { return true; }, Encoding::kBitmap},
             {[](int64_t) { return false; }, Encoding::kRows}}) {
      const Sparse s = PartitionOf(owner, n, p, 9, take);
      std::vector<std::byte> bytes{std::byte{0xAB}};  // appends after what is there
      EXPECT_EQ(EncodePartition(s.view(), owner, n, p, 9, bytes), expected);
      const auto count = static_cast<int64_t>(s.indices.size());
      const int64_t list = 8 + 4 * count + 4 * count, bitmap = 8 + (rows + 7) / 8 + 4 * count;
      EXPECT_EQ(static_cast<int64_t>(bytes.size()) - 1, std::min(list, bitmap));
      auto decoded = DecodePartition(std::span(bytes).subspan(1), owner, n, p, 9);
      ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
      EXPECT_EQ(decoded->indices, s.indices);
      EXPECT_EQ(decoded->values, s.values);
    }
  }
}

TEST(ZenEncoding, FirstAndLastIndexRoundTrip) {
  for (int p : {1, 2, 3, 7}) {
    const int64_t n = 100;
    for (uint32_t i : {0u, 99u}) {
      const int owner = Owner(i, p, 0);
      const std::vector<uint32_t> idx{i};
      const std::vector<float> val{5};
      for (bool full : {false, true}) {
        Sparse s = full ? PartitionOf(owner, n, p, 0, [](int64_t) { return true; }) : Sparse{idx, val};
        std::vector<std::byte> bytes;
        (void)EncodePartition(s.view(), owner, n, p, 0, bytes);
        auto decoded = DecodePartition(bytes, owner, n, p, 0);
        ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
        EXPECT_EQ(decoded->indices, s.indices) << "P=" << p << " i=" << i;
      }
    }
  }
}

TEST(ZenEncoding, LargestNRoundTrips) {
  const int64_t n = kMaxElements;
  const std::vector<uint32_t> idx{0, static_cast<uint32_t>(n - 1)};
  const std::vector<float> val{1, 2};
  for (int p : {1, 3, 8}) {
    for (uint32_t i : idx) {
      const int owner = Owner(i, p, 0);
      const std::vector<uint32_t> one{i};
      std::vector<std::byte> bytes;
      EXPECT_EQ(EncodePartition({one, std::span(val).first(1)}, owner, n, p, 0, bytes), Encoding::kRows);
      auto decoded = DecodePartition(bytes, owner, n, p, 0);
      ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
      EXPECT_EQ(decoded->indices, one);
    }
  }
}

TEST(ZenEncoding, RejectsTruncatedPartition) {
  std::vector<std::byte> bytes;
  const std::vector<uint32_t> idx{0};
  const std::vector<float> val{1};
  (void)EncodePartition({idx, val}, Owner(0, 2, 0), 10, 2, 0, bytes);
  bytes.pop_back();
  auto decoded = DecodePartition(bytes, Owner(0, 2, 0), 10, 2, 0);
  EXPECT_EQ(decoded.status().code(), StatusCode::kDataLoss);
}

TEST(ZenMergePartitions, InterleavesIntoIncreasingOrder) {
  const std::vector<Sparse> parts{{{1, 4}, {10, 40}}, {{0, 2, 3}, {0, 20, 30}}};
  const Sparse out = MergePartitions(parts);
  EXPECT_EQ(out.indices, (std::vector<uint32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(out.values, (std::vector<float>{0, 10, 20, 30, 40}));
}

TEST(ZenScatterDense, WritesScaledValuesAndZeros) {
  const std::vector<uint32_t> idx{0, 3};
  const std::vector<float> val{2, 4};
  std::vector<float> out(4, 7);
  ASSERT_TRUE(ScatterDense({idx, val}, 0.5f, out).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 0, 0, 2}));
  std::vector<float> small(3);
  EXPECT_EQ(ScatterDense({idx, val}, 1, small).message(),
            "zen scatter: indices[1]: out of range; got 3, expected < 3 (the dense size)");
}

TEST(ZenValidate, NamesEveryProblem) {
  const std::vector<uint32_t> idx{1, 5, 5, 12};
  const std::vector<float> val{1, 2, 3};
  EXPECT_EQ(ValidateSparse({idx, val}, 10, "grad").message(),
            "grad: values: size mismatch; got 3, expected 4 (the number of indices); "
            "grad: indices[2]: not increasing; got 5, expected > 5; "
            "grad: indices[3]: out of range; got 12, expected < 10 (n)");
  EXPECT_EQ(ValidateSparse({}, 0, "grad").message(), "grad: n: out of range; got 0, expected 1 <= n <= 2147483647");
  EXPECT_TRUE(ValidateSparse({idx, std::vector<float>(4)}, 10, "grad").code() == StatusCode::kInvalidArgument);
  const std::vector<uint32_t> ok{0, 9};
  EXPECT_TRUE(ValidateSparse({ok, std::vector<float>(2)}, 10, "grad").ok());
}

TEST(ZenTopkPayload, ViewsValuesThenIndices) {
  const std::vector<float> values{1.5f, -2};
  const std::vector<int32_t> indices{3, 8};
  std::vector<uint32_t> storage(4);
  std::memcpy(storage.data(), values.data(), 8);
  std::memcpy(storage.data() + 2, indices.data(), 8);
  auto view = TopkPayloadView(std::as_bytes(std::span(storage)), 2);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(std::vector<uint32_t>(view->indices.begin(), view->indices.end()), (std::vector<uint32_t>{3, 8}));
  EXPECT_EQ(std::vector<float>(view->values.begin(), view->values.end()), values);
  EXPECT_EQ(TopkPayloadView(std::as_bytes(std::span(storage)), 3).status().message(),
            "topk payload: size: mismatch; got 16 bytes, expected 24 (8 k, k = 3)");
}

// The non-zero entries in index order, index 0 and the last included; -0 is zero, NaN is kept;
// a reused output is cleared first.
TEST(ZenCollectNonzeros, KeepsEveryNonzeroInOrder) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> dense{3, 0, -0.0f, 1e-30f, 0, nan, -2};
  Sparse out;
  out.indices = {99};
  out.values = {99};
  CollectNonzeros(dense, out);
  EXPECT_EQ(out.indices, (std::vector<uint32_t>{0, 3, 5, 6}));
  ASSERT_EQ(out.values.size(), 4u);
  EXPECT_EQ(out.values[0], 3);
  EXPECT_EQ(out.values[1], 1e-30f);
  EXPECT_TRUE(std::isnan(out.values[2]));
  EXPECT_EQ(out.values[3], -2);
  CollectNonzeros(std::vector<float>(5, 0.0f), out);
  EXPECT_TRUE(out.indices.empty());
  EXPECT_TRUE(out.values.empty());
}

}  // namespace
}  // namespace cupcake::kernels::zen

// The checks every backend passes, each a function of one rank's communicator that all ranks
// run together (in-process threads, MPI processes, NCCL ranks). Buffers live in the
// communicator's memory and are filled and read through kernels::Buffer, so one case covers
// host and device memory. Expected values come from a plain restatement of each collective's
// definition over small integers, exact in every data type.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cupcake/comm/communicator.h"

namespace cupcake::comm::testing {

struct Case {
  std::string name;
  std::function<void(Communicator&)> run;
};

// A buffer in `c`'s memory holding `bytes` of `host`.
inline kernels::Buffer Upload(Communicator& c, const void* host, int64_t bytes) {
  auto b = c.Allocate(bytes);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (bytes > 0) {
    EXPECT_TRUE(b->CopyFromHost(host, bytes).ok());
  }
  return std::move(b).value();
}

template <typename T>
std::vector<T> Download(Communicator& c, const kernels::Buffer& b, int64_t count) {
  EXPECT_TRUE(c.Synchronize().ok());
  std::vector<T> out(static_cast<size_t>(count));
  if (count > 0) {
    EXPECT_TRUE(b.CopyToHost(out.data(), count * static_cast<int64_t>(sizeof(T))).ok());
  }
  return out;
}

// Small integer values (0..10) of rank r at index i, and their encodings in each type.
inline int Value(int r, int64_t i) { return static_cast<int>((r * 7 + i * 3) % 11); }

inline uint16_t HalfOf(int v) {  // exact for |v| < 2048: sign, exponent, 10-bit mantissa
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  unsigned a = static_cast<unsigned>(v < 0 ? -v : v);
  int e = 31 - __builtin_clz(a);
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | ((a << (10 - e)) & 0x3ff));
}
inline uint16_t BHalfOf(int v) {  // bfloat16: the top half of the float
  float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
std::vector<T> Encoded(int r, int64_t count, T (*encode)(int)) {
  std::vector<T> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = encode(Value(r, i));
  return v;
}

// Allreduce over `type` (sum, and max where given), out of place and in place, on `n`
// elements (1001 and 70001 do not divide by the world size; 70001 crosses the MPI backend's
// chunked-allreduce threshold, 64 KiB, in every type; 1 pads every chunk but the first).
template <typename T>
void CheckAllreduce(Communicator& c, DataType type, T (*encode)(int), bool with_max, int64_t n = 1001) {
  const int w = c.size();
  std::vector<T> mine = Encoded<T>(c.rank(), n, encode);
  std::vector<T> sum(static_cast<size_t>(n)), max(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int s = 0, m = -1000;
    for (int r = 0; r < w; ++r) {
      s += Value(r, i);
      m = std::max(m, Value(r, i));
    }
    sum[static_cast<size_t>(i)] = encode(s);
    max[static_cast<size_t>(i)] = encode(m);
  }
  const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
  kernels::Buffer send = Upload(c, mine.data(), bytes), recv = Upload(c, mine.data(), bytes);
  ASSERT_TRUE(c.Allreduce(send.data(), recv.data(), n, type, ReduceOp::kSum).ok());
  EXPECT_EQ(Download<T>(c, recv, n), sum) << Name(type) << " sum";
  ASSERT_TRUE(c.Allreduce(send.data(), send.data(), n, type, ReduceOp::kSum).ok());  // in place
  EXPECT_EQ(Download<T>(c, send, n), sum) << Name(type) << " sum in place";
  if (!with_max) return;
  kernels::Buffer again = Upload(c, mine.data(), bytes);
  ASSERT_TRUE(c.Allreduce(again.data(), recv.data(), n, type, ReduceOp::kMax).ok());
  EXPECT_EQ(Download<T>(c, recv, n), max) << Name(type) << " max";
}

template <typename T>
void CheckAllreduceSizes(Communicator& c, DataType type, T (*encode)(int), bool with_max) {
  for (int64_t n : {int64_t{1}, int64_t{70001}}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    CheckAllreduce<T>(c, type, encode, with_max, n);
  }
}

inline std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"AllreduceEveryType", [](Communicator& c) {
    CheckAllreduce<float>(c, DataType::kFloat32, [](int v) { return static_cast<float>(v); }, true);
    CheckAllreduce<double>(c, DataType::kFloat64, [](int v) { return static_cast<double>(v); }, true);
    CheckAllreduce<int8_t>(c, DataType::kInt8, [](int v) { return static_cast<int8_t>(v); }, true);
    CheckAllreduce<uint8_t>(c, DataType::kUint8, [](int v) { return static_cast<uint8_t>(v); }, true);
    CheckAllreduce<int32_t>(c, DataType::kInt32, [](int v) { return static_cast<int32_t>(v); }, true);
    CheckAllreduce<int64_t>(c, DataType::kInt64, [](int v) { return static_cast<int64_t>(v); }, true);
    CheckAllreduce<uint16_t>(c, DataType::kFloat16, &HalfOf, false);
    CheckAllreduce<uint16_t>(c, DataType::kBFloat16, &BHalfOf, true);
  }});
  cases.push_back({"AllreduceEveryTypeOneAndManyElements", [](Communicator& c) {
    CheckAllreduceSizes<float>(c, DataType::kFloat32, [](int v) { return static_cast<float>(v); }, true);
    CheckAllreduceSizes<double>(c, DataType::kFloat64, [](int v) { return static_cast<double>(v); }, true);
    CheckAllreduceSizes<int8_t>(c, DataType::kInt8, [](int v) { return static_cast<int8_t>(v); }, true);
    CheckAllreduceSizes<uint8_t>(c, DataType::kUint8, [](int v) { return static_cast<uint8_t>(v); }, true);
    CheckAllreduceSizes<int32_t>(c, DataType::kInt32, [](int v) { return static_cast<int32_t>(v); }, true);
    CheckAllreduceSizes<int64_t>(c, DataType::kInt64, [](int v) { return static_cast<int64_t>(v); }, true);
    CheckAllreduceSizes<uint16_t>(c, DataType::kFloat16, &HalfOf, false);
    CheckAllreduceSizes<uint16_t>(c, DataType::kBFloat16, &BHalfOf, true);
  }});
  cases.push_back({"AllgatherPutsRanksSideBySide", [](Communicator& c) {
    const int64_t per = 37;
    std::vector<uint8_t> mine(per);
    for (int64_t i = 0; i < per; ++i) mine[static_cast<size_t>(i)] = static_cast<uint8_t>(c.rank() * 50 + i);
    std::vector<uint8_t> want;
    for (int r = 0; r < c.size(); ++r)
      for (int64_t i = 0; i < per; ++i) want.push_back(static_cast<uint8_t>(r * 50 + i));
    kernels::Buffer send = Upload(c, mine.data(), per);
    auto recv = c.Allocate(per * c.size());
    ASSERT_TRUE(recv.ok());
    ASSERT_TRUE(c.Allgather(send.data(), recv->data(), per).ok());
    EXPECT_EQ(Download<uint8_t>(c, *recv, per * c.size()), want);
  }});
  cases.push_back({"ReduceScatterGivesEachRankItsBlock", [](Communicator& c) {
    const int64_t per = 9, n = per * c.size();
    std::vector<float> mine(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) mine[static_cast<size_t>(i)] = static_cast<float>(Value(c.rank(), i));
    std::vector<float> want(static_cast<size_t>(per));
    for (int64_t i = 0; i < per; ++i)
      for (int r = 0; r < c.size(); ++r) want[static_cast<size_t>(i)] += static_cast<float>(Value(r, c.rank() * per + i));
    kernels::Buffer send = Upload(c, mine.data(), n * 4);
    auto recv = c.Allocate(per * 4);
    ASSERT_TRUE(recv.ok());
    ASSERT_TRUE(c.ReduceScatter(send.data(), recv->data(), per, DataType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(Download<float>(c, *recv, per), want);
  }});
  cases.push_back({"AlltoallAndAlltoallvRouteEachBlock", [](Communicator& c) {
    const int w = c.size(), me = c.rank();
    // Alltoall: block j of rank i holds i * 16 + j.
    std::vector<uint8_t> mine(static_cast<size_t>(w) * 3), want(mine.size());
    for (int j = 0; j < w; ++j)
      for (int k = 0; k < 3; ++k) {
        mine[static_cast<size_t>(j * 3 + k)] = static_cast<uint8_t>(me * 16 + j);
        want[static_cast<size_t>(j * 3 + k)] = static_cast<uint8_t>(j * 16 + me);
      }
    kernels::Buffer send = Upload(c, mine.data(), w * 3);
    auto recv = c.Allocate(w * 3);
    ASSERT_TRUE(recv.ok());
    ASSERT_TRUE(c.Alltoall(send.data(), recv->data(), 3).ok());
    EXPECT_EQ(Download<uint8_t>(c, *recv, w * 3), want);
    // Alltoallv: rank i sends i + j + 1 bytes of value i * 16 + j to rank j (index 0 too).
    std::vector<int64_t> send_bytes, recv_bytes;
    std::vector<uint8_t> out, expect;
    for (int j = 0; j < w; ++j) {
      send_bytes.push_back(me + j + 1);
      recv_bytes.push_back(j + me + 1);
      out.insert(out.end(), static_cast<size_t>(me + j + 1), static_cast<uint8_t>(me * 16 + j));
      expect.insert(expect.end(), static_cast<size_t>(j + me + 1), static_cast<uint8_t>(j * 16 + me));
    }
    kernels::Buffer vsend = Upload(c, out.data(), static_cast<int64_t>(out.size()));
    auto vrecv = c.Allocate(static_cast<int64_t>(expect.size()));
    ASSERT_TRUE(vrecv.ok());
    ASSERT_TRUE(c.Alltoallv(vsend.data(), send_bytes, vrecv->data(), recv_bytes).ok());
    EXPECT_EQ(Download<uint8_t>(c, *vrecv, static_cast<int64_t>(expect.size())), expect);
  }});
  cases.push_back({"BroadcastAndBarrier", [](Communicator& c) {
    const int root = c.size() - 1;
    std::vector<int32_t> mine(5, c.rank() == root ? 42 : -1);
    kernels::Buffer buf = Upload(c, mine.data(), 20);
    ASSERT_TRUE(c.Broadcast(buf.data(), 20, root).ok());
    EXPECT_EQ(Download<int32_t>(c, buf, 5), std::vector<int32_t>(5, 42));
    EXPECT_TRUE(c.Barrier().ok());
  }});
  cases.push_back({"SplitMakesIntraAndInterGroups", [](Communicator& c) {
    // Colors by parity, keys reversed: the new ranks run backwards through the old ones.
    const int w = c.size(), me = c.rank();
    auto half = c.Split(me % 2, -me);
    ASSERT_TRUE(half.ok()) << half.status().ToString();
    ASSERT_NE(*half, nullptr);
    int members = 0, before_me = 0;
    for (int r = me % 2; r < w; r += 2) {
      ++members;
      if (r > me) ++before_me;
    }
    EXPECT_EQ((*half)->size(), members);
    EXPECT_EQ((*half)->rank(), before_me);
    EXPECT_EQ((*half)->host(), c.host());
    int32_t one = me, sum = 0;
    kernels::Buffer in = Upload(**half, &one, 4), out = Upload(**half, &sum, 4);
    ASSERT_TRUE((*half)->Allreduce(in.data(), out.data(), 1, DataType::kInt32, ReduceOp::kSum).ok());
    int32_t want = 0;
    for (int r = me % 2; r < w; r += 2) want += r;
    EXPECT_EQ(Download<int32_t>(**half, out, 1)[0], want);
    auto none = c.Split(me == 0 ? -1 : 0, me);  // rank 0 joins no group
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(*none == nullptr, me == 0);
    if (*none) {
      EXPECT_EQ((*none)->size(), w - 1);
    }
  }});
  cases.push_back({"WrongArgumentsAreRefusedNamingThem", [](Communicator& c) {
    const std::string tail = " (rank " + std::to_string(c.rank()) + " on " + c.host() + ")";
    std::vector<int64_t> short_counts(static_cast<size_t>(c.size()) + 1, 0);
    Status s = c.Alltoallv(nullptr, short_counts, nullptr, short_counts);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), "Alltoallv: counts of the wrong length; got " + std::to_string(c.size() + 1) + " and " +
                               std::to_string(c.size() + 1) + ", expected " + std::to_string(c.size()) +
                               " (one per rank)" + tail);
    s = c.Allreduce(nullptr, nullptr, 4, DataType::kFloat16, ReduceOp::kMax);
    EXPECT_EQ(s.message(), "Allreduce: max of float16 is not supported; expected sum" + tail);
  }});
  return cases;
}

}  // namespace cupcake::comm::testing

// ZenAllreduce over the in-process group at 1, 2, 3, 4 and 8 ranks (threads): the result
// equals the dense sum (zen_cases.h), on every rank alike, and bad inputs are named.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "zen_cases.h"

namespace cupcake::comm::testing {
namespace {

void RunRanks(int size, const std::function<void(Communicator&)>& fn) {
  InProcessGroup group(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      auto c = group.Rank(r);
      fn(*c);
    });
  for (auto& t : threads) t.join();
}

class ZenInProcess : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(ZenInProcess, EqualsTheDenseSum) {
  const auto [size, index] = GetParam();
  const ZenCase c = ZenCases()[static_cast<size_t>(index)];
  RunRanks(size, [&](Communicator& comm) { RunZenCase(comm, c); });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZenInProcess, ZenRanksAndCases(), ZenRanksCaseName);

// Non-integer values, where the order of additions shows: every rank's bytes are equal.
TEST(ZenAllreduce, AllRanksGetBitwiseIdenticalResults) {
  const int size = 4;
  std::vector<kernels::zen::Sparse> results(size);
  RunRanks(size, [&](Communicator& comm) {
    const std::vector<uint32_t> idx = UniformIndices(comm.rank() % 2, 1000, 300);  // ranks 0, 2 and 1, 3 alike
    std::vector<float> val;
    std::mt19937 rng(static_cast<uint32_t>(comm.rank()));
    std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
    for (size_t j = 0; j < idx.size(); ++j) val.push_back(dist(rng));
    auto out = ZenAllreduce(comm, {idx, val}, {.n = 1000});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    results[static_cast<size_t>(comm.rank())] = std::move(out).value();
  });
  for (int r = 1; r < size; ++r) {
    ASSERT_EQ(results[static_cast<size_t>(r)].indices, results[0].indices);
    ASSERT_EQ(results[static_cast<size_t>(r)].values.size(), results[0].values.size());
    EXPECT_EQ(std::memcmp(results[static_cast<size_t>(r)].values.data(), results[0].values.data(),
                          4 * results[0].values.size()),
              0);
  }
}

TEST(ZenAllreduce, StatsCountTheBytesToOtherRanks) {
  RunRanks(2, [](Communicator& comm) {
    // Indices 0..9: each owner gets 5, so each rank sends 5 pairs and receives 5.
    std::vector<uint32_t> idx(10);
    for (uint32_t i = 0; i < 10; ++i) idx[i] = i;
    const std::vector<float> val(10, 1);
    ZenStats stats;
    ASSERT_TRUE(ZenAllreduce(comm, {idx, val}, {.n = 10}, &stats).ok());
    EXPECT_EQ(stats.counts.sent, 8);
    EXPECT_EQ(stats.pairs.sent, 40);
    EXPECT_EQ(stats.pairs.received, 40);
    EXPECT_EQ(stats.sizes.received, 8);
    // 5 of 5 rows: bitmap (1 byte) beats 20 bytes of rows; header 8, values 20.
    EXPECT_EQ(stats.partitions.sent, 29);
    EXPECT_EQ(stats.partitions.received, 29);
    EXPECT_EQ(stats.encodings, (std::vector<kernels::zen::Encoding>(2, kernels::zen::Encoding::kBitmap)));
    EXPECT_EQ(stats.Total().sent, 8 + 40 + 8 + 29);
  });
}

double PhaseSum(const ZenPhaseTimes& t) {
  return t.partition + t.counts + t.pairs + t.merge + t.encode + t.sizes + t.partitions + t.decode;
}

// The phases are disjoint laps inside the call, each call's own: a rank that enters 20 ms after
// its peer started shows up in the peer's wait for the counts, and nowhere in its own next call.
TEST(ZenAllreduce, StatsTimeEachPhaseOfThisCall) {
  std::atomic<int64_t> started_ns{0};
  RunRanks(2, [&](Communicator& comm) {
    std::vector<uint32_t> idx(100);
    for (uint32_t i = 0; i < 100; ++i) idx[i] = 3 * i;
    const std::vector<float> val(100, 1);
    using Clock = std::chrono::steady_clock;
    auto call = [&](bool late, ZenStats& stats) -> double {
      if (late) {
        while (started_ns.load() == 0) std::this_thread::yield();
        std::this_thread::sleep_until(Clock::time_point(Clock::duration(started_ns.load())) +
                                      std::chrono::milliseconds(20));
      } else {
        started_ns.store(Clock::now().time_since_epoch().count());
      }
      const auto start = Clock::now();
      const auto sum = ZenAllreduce(comm, {idx, val}, {.n = 300}, &stats);
      EXPECT_TRUE(sum.ok()) << sum.status().ToString();
      return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    };
    ZenStats stats;
    // Call 1: rank 1 late; call 2: rank 0 late.
    for (int late_rank : {1, 0}) {
      ASSERT_TRUE(comm.Barrier().ok());
      if (comm.rank() == 0) started_ns.store(0);
      ASSERT_TRUE(comm.Barrier().ok());
      const double wall_us = call(comm.rank() == late_rank, stats);
      EXPECT_LE(PhaseSum(stats.us), wall_us) << "rank " << comm.rank() << ", rank " << late_rank << " late";
      if (comm.rank() != late_rank) {
        EXPECT_GE(stats.us.partition + stats.us.counts, 20000) << "rank " << comm.rank();
      }
    }
  });
}

TEST(ZenAllreduce, RejectsBadInputOnEveryRank) {
  RunRanks(2, [](Communicator& comm) {
    const std::vector<uint32_t> idx{3, 2};
    const std::vector<float> val{1, 1};
    auto out = ZenAllreduce(comm, {idx, val}, {.n = 3});
    EXPECT_EQ(out.status().message(), "ZenAllreduce (rank " + std::to_string(comm.rank()) +
                                          "): indices[1]: not increasing; got 2, expected > 3; ZenAllreduce (rank " +
                                          std::to_string(comm.rank()) +
                                          "): indices[0]: out of range; got 3, expected < 3 (n)");
  });
}

TEST(ZenAllreduce, AllgatherSchemeSendsEveryOtherRanksBlock) {
  EXPECT_EQ(AllgatherSchemeBytes(100, 4).sent, 100 * 8 * 3);
  EXPECT_EQ(AllgatherSchemeBytes(100, 1).received, 0);
}

}  // namespace
}  // namespace cupcake::comm::testing

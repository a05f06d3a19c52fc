// The backend suite over the in-process group: every case at 1, 2, 3 and 4 ranks (threads),
// plus what only threads can check here: a peer that gives up ends the others' collectives.
#include <chrono>
#include <thread>

#include "cases.h"
#include "cupcake/comm/topology.h"

namespace cupcake::comm::testing {
namespace {

// Runs `fn` on every rank of a `size`-rank group, one thread per rank.
void RunRanks(int size, const std::function<void(Communicator&)>& fn, std::vector<std::string> hosts = {}) {
  InProcessGroup group(size, std::move(hosts));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] {
    auto c = group.Rank(r);
    fn(*c);
  });
  for (auto& t : threads) t.join();
}

class InProcessSuite : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(InProcessSuite, PassesTheBackendCase) {
  const auto [size, index] = GetParam();
  const Case c = Cases()[static_cast<size_t>(index)];
  SCOPED_TRACE(c.name + " at " + std::to_string(size) + " ranks");
  RunRanks(size, c.run);
}

INSTANTIATE_TEST_SUITE_P(Ranks, InProcessSuite,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Range(0, static_cast<int>(Cases().size()))),
                         [](const auto& param_info) {
                           return Cases()[static_cast<size_t>(std::get<1>(param_info.param))].name + "_" +
                                  std::to_string(std::get<0>(param_info.param)) + "ranks";
                         });

// Hosts of 3 and 1 ranks, interleaved: local ranks count the ranks before on the same host.
TEST(Topology, LocalRanksAndSizesFollowTheHostNames) {
  const std::vector<std::string> hosts = {"a", "b", "a", "a"};
  const int want_local_rank[] = {0, 0, 1, 2}, want_local_size[] = {3, 1, 3, 3};
  RunRanks(
      4,
      [&](Communicator& c) {
        auto t = DiscoverTopology(c);
        ASSERT_TRUE(t.ok()) << t.status().ToString();
        EXPECT_EQ(t->hosts, (std::vector<std::string>{"a", "b"}));
        EXPECT_EQ(t->host_of_rank, (std::vector<int>{0, 1, 0, 0}));
        EXPECT_EQ(t->local_rank, want_local_rank[c.rank()]) << c.rank();
        EXPECT_EQ(t->local_size, want_local_size[c.rank()]) << c.rank();
        EXPECT_EQ(t->ranks_per_host, 0);
      },
      hosts);
}

TEST(InProcessGroup, HostsNameTheFakeNodes) {
  RunRanks(4, [](Communicator& c) { EXPECT_EQ(c.host(), c.rank() < 2 ? "node-a" : "node-b"); },
           {"node-a", "node-a", "node-b", "node-b"});
}

// As gloo's transport tests: a rank that gives up (Abort) ends every other rank's collective
// with the reason, promptly, instead of leaving them waiting.
TEST(InProcessGroup, APeerThatGivesUpEndsTheOthersCollectives) {
  const auto start = std::chrono::steady_clock::now();
  RunRanks(3, [](Communicator& c) {
    if (c.rank() == 2) {
      c.Abort("rank 2 died");
      return;
    }
    float x = 1;
    Status s = c.Allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), "in-process group aborted: rank 2 died (rank " + std::to_string(c.rank()) + " on localhost)");
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));  // a bound, not a timing
}

TEST(InProcessGroup, AlltoallvCountsThatDisagreeFailEveryRank) {
  RunRanks(2, [](Communicator& c) {
    std::vector<int64_t> send{1, 1}, recv{1, c.rank() == 0 ? 2 : 1};  // rank 0 expects 2 bytes from rank 1
    std::vector<uint8_t> out(2), in(3);
    Status s = c.Alltoallv(out.data(), send, in.data(), recv);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("Alltoallv: rank 1 sends 1 bytes to rank 0, which expects 2"), std::string::npos)
        << s.message();
  });
}

}  // namespace
}  // namespace cupcake::comm::testing

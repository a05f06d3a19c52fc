// The comm sweep over an in-process group of threads: every collective checked and stored,
// intra/inter scopes on fake hosts, wrong results refused, resuming, disagreeing ranks.
#include "cupcake/profile/comm_sweep.h"

#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "cupcake/proto/names.h"

namespace cupcake::profile {
namespace {

// Runs fn(rank's communicator) on `w` threads; returns each rank's result.
std::vector<StatusOr<SweepReport>> RunRanks(int w, std::vector<std::string> hosts,
                                            const std::function<StatusOr<SweepReport>(std::unique_ptr<Communicator>)>& fn) {
  InProcessGroup group(w, std::move(hosts));
  std::vector<StatusOr<SweepReport>> results(static_cast<size_t>(w), Status(StatusCode::kInternal, "not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r)
    threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = fn(group.Rank(r)); });
  for (auto& t : threads) t.join();
  return results;
}

CommSweepOptions Small() {
  CommSweepOptions o;
  o.sizes = {64, 256};
  o.warmup = 1;
  o.iters = 3;
  return o;
}

std::vector<std::string> Keys(const MemorySink& sink) {
  std::vector<std::string> keys;
  for (const auto& c : sink.Curves()) keys.push_back(CurveKey(c) + " " + std::to_string(c.points_size()));
  return keys;
}

TEST(CommSweep, MeasuresEveryCollectiveAndChecksItsResult) {
  MemorySink sink;
  auto results = RunRanks(4, {}, [&](std::unique_ptr<Communicator> comm) {
    FakeClock clock(5.0);
    return SweepComm(*comm, Small(), clock, comm->rank() == 0 ? &sink : nullptr);
  });
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->measured, 10);
    EXPECT_EQ(r->wrong, 0);
  }
  EXPECT_EQ(Keys(sink), (std::vector<std::string>{"comm allgather global 2", "comm allreduce global 2",
                                                  "comm alltoall global 2", "comm broadcast global 2",
                                                  "comm reduce_scatter global 2"}));
  for (const auto& c : sink.Curves()) {
    EXPECT_EQ(c.method(), "wall");
    EXPECT_EQ(c.wrong(), 0);
    for (const auto& p : c.points()) EXPECT_EQ(p.us(), 5.0);
  }
}

TEST(CommSweep, SplitsByHostIntoIntraAndInter) {
  MemorySink sink;
  CommSweepOptions o = Small();
  o.ops = {pb::ALLREDUCE, pb::ALLGATHER};
  auto results = RunRanks(4, {"a", "a", "b", "b"}, [&](std::unique_ptr<Communicator> comm) {
    FakeClock clock;
    return SweepComm(*comm, o, clock, comm->rank() == 0 ? &sink : nullptr);
  });
  for (auto& r : results) ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Keys(sink), (std::vector<std::string>{"comm allgather global 2", "comm allgather inter 2",
                                                  "comm allgather intra 2", "comm allreduce global 2",
                                                  "comm allreduce inter 2", "comm allreduce intra 2"}));
}

TEST(CommSweep, WrongResultsAreCountedAndNotStoredAsCosts) {
  MemorySink sink;
  auto results = RunRanks(2, {}, [&](std::unique_ptr<Communicator> comm) {
    FakeClock clock;
    // Rank 1's allgather results are corrupted; every rank must learn of it.
    if (comm->rank() == 1) comm = MakeWrongResultCommunicator(std::move(comm), pb::ALLGATHER);
    return SweepComm(*comm, Small(), clock, comm->rank() == 0 ? &sink : nullptr);
  });
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->wrong, 2);
    EXPECT_EQ(r->measured, 8);
  }
  for (const auto& p : results[0]->points)
    EXPECT_EQ(p.wrong, p.curve == "comm allgather global" ? 4 : 0) << p.curve;  // warm-up + 3 timed
  for (const auto& c : sink.Curves()) EXPECT_NE(CurveKey(c), "comm allgather global");
}

TEST(CommSweep, ResumesSkippingWhatTheSinkHas) {
  MemorySink sink;
  CommSweepOptions first = Small();
  first.sizes = {64};
  auto run = [&](const CommSweepOptions& o) {
    return RunRanks(2, {}, [&](std::unique_ptr<Communicator> comm) {
      FakeClock clock;
      return SweepComm(*comm, o, clock, comm->rank() == 0 ? &sink : nullptr);
    });
  };
  for (auto& r : run(first)) ASSERT_TRUE(r.ok());
  auto second = run(Small());
  for (auto& r : second) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->skipped, 5);
    EXPECT_EQ(r->measured, 5);
  }
  EXPECT_EQ(sink.added(), 10);
}

TEST(CommSweep, RanksThatDisagreeOnTheConfigurationAllFailNamingTheFlag) {
  auto results = RunRanks(3, {}, [&](std::unique_ptr<Communicator> comm) -> StatusOr<SweepReport> {
    std::string max = comm->rank() == 2 ? "4096" : "1048576";
    CUPCAKE_RETURN_IF_ERROR(AgreeOnConfiguration(*comm, {{"--db", "p.db"}, {"--max-bytes", max}}));
    return SweepReport{};
  });
  for (auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(),
              "--max-bytes: ranks disagree; got 4096 on rank 2, expected 1048576 as on rank 0\n"
              "(every rank must be started with the same flags)");
  }
}

TEST(CommSweep, RejectsAnEmptyOrAbsurdSizeList) {
  MemorySink sink;
  FakeClock clock;
  InProcessGroup group(1);
  auto comm = group.Rank(0);
  CommSweepOptions o = Small();
  o.sizes = {};
  EXPECT_EQ(SweepComm(*comm, o, clock, &sink).status().message(),
            "sizes: empty size range; got no sizes, expected at least one");
  o.sizes = {2};
  EXPECT_EQ(SweepComm(*comm, o, clock, &sink).status().message(),
            "sizes: out of range; got 2, expected 4 <= bytes <= 2^30");
}

}  // namespace
}  // namespace cupcake::profile

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

// A data communicator whose memory holds every float negated, as a stand-in for GPU memory the
// sweep must not touch directly: the collectives are linear, so they work on negated values
// unchanged, and only CopyIn/CopyOut see the true ones. A sweep that wrote or read its buffers
// directly would find every result wrong.
class NegatedMemory final : public Communicator {
 public:
  explicit NegatedMemory(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& host() const override { return inner_->host(); }
  std::string library() const override { return "negated " + inner_->library(); }
  Status Barrier() override { return inner_->Barrier(); }
  Status Broadcast(void* buf, int64_t bytes, int root) override { return inner_->Broadcast(buf, bytes, root); }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    return inner_->Allreduce(send, recv, count, type, op);
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    return inner_->Allgather(send, recv, bytes_per_rank);
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    return inner_->ReduceScatter(send, recv, count_per_rank, type, op);
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    return inner_->Alltoall(send, recv, bytes_per_rank);
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> child, inner_->Split(color, key));
    if (!child) return child;
    return std::unique_ptr<Communicator>(std::make_unique<NegatedMemory>(std::move(child)));
  }
  Status CopyIn(void* dst, const void* host_src, int64_t bytes) override {
    ++copies;
    for (int64_t i = 0; i < bytes / 4; ++i) static_cast<float*>(dst)[i] = -static_cast<const float*>(host_src)[i];
    return Status::Ok();
  }
  Status CopyOut(void* host_dst, const void* src, int64_t bytes) override {
    ++copies;
    for (int64_t i = 0; i < bytes / 4; ++i) static_cast<float*>(host_dst)[i] = -static_cast<const float*>(src)[i];
    return Status::Ok();
  }
  int copies = 0;

 private:
  std::unique_ptr<Communicator> inner_;
};

TEST(CommSweep, MeasuresADataCommunicatorThroughItsOwnMemory) {
  MemorySink sink;
  CommSweepOptions o = Small();
  InProcessGroup data_group(4, {"a", "a", "b", "b"});
  std::vector<int> copies(4);
  auto results = RunRanks(4, {"a", "a", "b", "b"}, [&](std::unique_ptr<Communicator> control) {
    FakeClock clock;
    NegatedMemory data(data_group.Rank(control->rank()));
    CommSweepOptions mine = o;
    mine.data = &data;
    auto r = SweepComm(*control, mine, clock, control->rank() == 0 ? &sink : nullptr);
    copies[static_cast<size_t>(control->rank())] = data.copies;
    return r;
  });
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->wrong, 0);
    EXPECT_GT(r->measured, 0);
  }
  EXPECT_GT(copies[0], 0);
  EXPECT_EQ(sink.Curves().size(), 15u);  // five collectives x global, intra, inter
}

TEST(CommSweep, WrongResultsOfTheDataCommunicatorAreCounted) {
  MemorySink sink;
  CommSweepOptions o = Small();
  o.ops = {pb::ALLREDUCE};
  InProcessGroup data_group(2);
  auto results = RunRanks(2, {}, [&](std::unique_ptr<Communicator> control) {
    FakeClock clock;
    std::unique_ptr<Communicator> data =
        std::make_unique<NegatedMemory>(data_group.Rank(control->rank()));
    if (control->rank() == 1) data = MakeWrongResultCommunicator(std::move(data), pb::ALLREDUCE);
    CommSweepOptions mine = o;
    mine.data = data.get();
    return SweepComm(*control, mine, clock, control->rank() == 0 ? &sink : nullptr);
  });
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->wrong, 2);
    EXPECT_EQ(r->measured, 0);
  }
}

TEST(CommSweep, RefusesADataCommunicatorOfOtherRanks) {
  MemorySink sink;
  FakeClock clock;
  InProcessGroup group(1), other(2);
  auto comm = group.Rank(0);
  auto data = other.Rank(0);
  CommSweepOptions o = Small();
  o.data = data.get();
  EXPECT_EQ(SweepComm(*comm, o, clock, &sink).status().message(),
            "data: not the world's ranks; got rank 0 of 2, expected rank 0 of 1");
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

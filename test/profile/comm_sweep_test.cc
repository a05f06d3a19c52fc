// The comm sweep over an in-process group of threads: every collective checked and stored,
// intra/inter scopes on fake hosts, wrong results refused, resuming, disagreeing ranks.
#include "cupcake/profile/comm_sweep.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <thread>

#include "cupcake/proto/names.h"

namespace cupcake::profile {
namespace {

using comm::Communicator;
using comm::DataType;
using comm::InProcessGroup;
using comm::ReduceOp;

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

// A wrapper whose collectives, when `deferred`, work as a device backend's do: each is only
// enqueued, and runs when Synchronize() is called. A sweep that read a result, or stopped its
// clock, before synchronizing would find every result wrong. `corrupt` adds 1 to the first
// float of every result of that collective, as a broken link would.
class DeferredCommunicator final : public Communicator {
 public:
  DeferredCommunicator(std::unique_ptr<Communicator> inner, pb::CommOp corrupt, bool deferred = true)
      : inner_(std::move(inner)), corrupt_(corrupt), deferred_(deferred) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& host() const override { return inner_->host(); }
  std::string library() const override { return "deferred " + inner_->library(); }
  Status Barrier() override {
    if (observe) observe(false);
    return inner_->Barrier();
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    return Enqueue(pb::BROADCAST, buf, [=, this] { return inner_->Broadcast(buf, bytes, root); });
  }
  Status Allreduce(const void* send, void* recv, int64_t count, DataType type, ReduceOp op) override {
    return Enqueue(pb::ALLREDUCE, recv, [=, this] { return inner_->Allreduce(send, recv, count, type, op); });
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    return Enqueue(pb::ALLGATHER, recv, [=, this] { return inner_->Allgather(send, recv, bytes_per_rank); });
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count_per_rank, DataType type, ReduceOp op) override {
    return Enqueue(pb::REDUCE_SCATTER, recv,
                   [=, this] { return inner_->ReduceScatter(send, recv, count_per_rank, type, op); });
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    return Enqueue(pb::ALLTOALL, recv, [=, this] { return inner_->Alltoall(send, recv, bytes_per_rank); });
  }
  Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                   std::span<const int64_t> recv_bytes) override {
    return inner_->Alltoallv(send, send_bytes, recv, recv_bytes);
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    CUPCAKE_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> child, inner_->Split(color, key));
    if (!child) return child;
    return std::unique_ptr<Communicator>(std::make_unique<DeferredCommunicator>(std::move(child), corrupt_, deferred_));
  }
  Status Synchronize() override {
    ++synchronized;
    if (!pending_) return Status::Ok();
    Status s = pending_();
    pending_ = nullptr;
    return s;
  }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  int synchronized = 0;
  std::function<void(bool collective)> observe;  // called at each barrier (false) and collective run (true)

 private:
  Status Enqueue(pb::CommOp op, void* result, std::function<Status()> run) {
    if (pending_) return InternalError("deferred: a collective enqueued before the last was synchronized");
    pending_ = [this, op, result, run] {
      if (observe) observe(true);
      CUPCAKE_RETURN_IF_ERROR(run());
      if (op == corrupt_) static_cast<float*>(result)[0] += 1.0f;
      return Status::Ok();
    };
    return deferred_ ? Status::Ok() : Synchronize();
  }
  std::unique_ptr<Communicator> inner_;
  pb::CommOp corrupt_;
  bool deferred_;
  std::function<Status()> pending_;
};

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
    EXPECT_EQ(r->measured, 12);  // 2 sizes x (5 collectives + the float16 allreduce)
    EXPECT_EQ(r->wrong, 0);
  }
  EXPECT_EQ(Keys(sink), (std::vector<std::string>{"comm allgather global 2", "comm allreduce global 2",
                                                  "comm allreduce global float16 2", "comm alltoall global 2",
                                                  "comm broadcast global 2", "comm reduce_scatter global 2"}));
  for (const auto& c : sink.Curves()) {
    EXPECT_EQ(c.method(), "wall");
    EXPECT_EQ(c.wrong(), 0);
    for (const auto& p : c.points()) EXPECT_EQ(p.us(), 5.0);
  }
}

// The threads of this process, from /proc/self/status.
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

// A clock that also notes the most threads the process had while a call was timed.
class ThreadCountingClock final : public Clock {
 public:
  double NowUs() override {
    most = std::max(most, ThreadCount());
    return inner_.NowUs();
  }
  int most = 0;

 private:
  FakeClock inner_;
};

// --busy: every rank runs one more thread (the busy core) while it times its calls, the results
// are still checked, and the curves are the busy ones.
TEST(CommSweep, BusyRunsAComputeThreadPerRankAndMarksTheCurves) {
  auto run = [](bool busy, MemorySink& sink) {
    CommSweepOptions o = Small();
    o.ops = {pb::ALLREDUCE};
    o.busy = busy;
    std::vector<int> most(2, 0);
    auto results = RunRanks(2, {}, [&](std::unique_ptr<Communicator> comm) -> StatusOr<SweepReport> {
      ThreadCountingClock clock;
      auto r = SweepComm(*comm, o, clock, comm->rank() == 0 ? &sink : nullptr);
      most[static_cast<size_t>(comm->rank())] = clock.most;
      return r;
    });
    for (auto& r : results) EXPECT_TRUE(r.ok() && r->wrong == 0) << r.status().ToString();
    return std::max(most[0], most[1]);
  };
  MemorySink idle, busy;
  const int idle_threads = run(false, idle);
  const int busy_threads = run(true, busy);
  EXPECT_GE(busy_threads, idle_threads + 2);
  EXPECT_EQ(Keys(busy), (std::vector<std::string>{"comm allreduce global busy 2", "comm allreduce global float16 busy 2"}));
  EXPECT_EQ(Keys(idle), (std::vector<std::string>{"comm allreduce global 2", "comm allreduce global float16 2"}));
}

// A clock that collectives move: 100 us for one after a barrier, 250 us for one that follows
// another back to back, as chained calls on a contended network are slower.
class ChainedCallClock final : public Clock {
 public:
  double NowUs() override { return now_; }
  void Observe(bool collective) {
    if (collective) now_ += follows_ ? 250.0 : 100.0;
    follows_ = collective;
  }

 private:
  double now_ = 0;
  bool follows_ = false;
};

// --chained: a point's time is per call of the calls that follow another in a chain (the first
// call of each chain only starts the clock), its results are still checked, and the curves are
// the chained ones; the spaced sweep of the same clock times the first calls alone.
TEST(CommSweep, ChainedTimesTheCallsThatFollowAnotherAndMarksTheCurves) {
  CommSweepOptions o = Small();
  o.ops = {pb::ALLREDUCE, pb::ALLGATHER};
  auto run = [&o](bool chained, MemorySink& sink) {
    o.chained = chained;
    return RunRanks(2, {}, [&](std::unique_ptr<Communicator> comm) -> StatusOr<SweepReport> {
      ChainedCallClock clock;
      DeferredCommunicator observed(std::move(comm), pb::COMM_OP_UNSPECIFIED, false);
      observed.observe = [&clock](bool collective) { clock.Observe(collective); };
      return SweepComm(observed, o, clock, observed.rank() == 0 ? &sink : nullptr);
    });
  };
  MemorySink spaced, chained;
  for (auto& r : run(false, spaced)) ASSERT_TRUE(r.ok() && r->wrong == 0);
  for (auto& r : run(true, chained)) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->wrong, 0);
    for (const auto& p : r->points) EXPECT_EQ(p.us, 250.0) << p.curve << " " << p.size;
  }
  for (const auto& c : spaced.Curves())
    for (const auto& p : c.points()) EXPECT_EQ(p.us(), 100.0) << CurveKey(c);
  EXPECT_EQ(Keys(chained),
            (std::vector<std::string>{"comm allgather global chained 2", "comm allreduce global chained 2",
                                      "comm allreduce global float16 chained 2"}));

  // Wrong results of chained calls are counted (the data communicator corrupts rank 1's allreduces).
  MemorySink corrupted;
  InProcessGroup data_group(2);
  auto results = RunRanks(2, {}, [&](std::unique_ptr<Communicator> control) {
    FakeClock clock;
    DeferredCommunicator data(data_group.Rank(control->rank()),
                              control->rank() == 1 ? pb::ALLREDUCE : pb::COMM_OP_UNSPECIFIED, false);
    CommSweepOptions mine = o;
    mine.data = &data;
    return SweepComm(*control, mine, clock, control->rank() == 0 ? &corrupted : nullptr);
  });
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->wrong, 4);  // 2 sizes x the float32 and the float16 allreduce
  }
  EXPECT_EQ(Keys(corrupted), (std::vector<std::string>{"comm allgather global chained 2"}));

  CommSweepOptions both = Small();
  both.busy = both.chained = true;
  MemorySink sink;
  FakeClock clock;
  InProcessGroup group(1);
  EXPECT_EQ(SweepComm(*group.Rank(0), both, clock, &sink).status().message(),
            "busy, chained: both set; expected at most one (a sweep measures one condition)");
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
                                                  "comm allreduce global float16 2", "comm allreduce inter 2",
                                                  "comm allreduce inter float16 2", "comm allreduce intra 2",
                                                  "comm allreduce intra float16 2"}));
}

TEST(CommSweep, WrongResultsAreCountedAndNotStoredAsCosts) {
  MemorySink sink;
  auto results = RunRanks(2, {}, [&](std::unique_ptr<Communicator> comm) {
    FakeClock clock;
    // Rank 1's allgather results are corrupted; every rank must learn of it.
    if (comm->rank() == 1) comm = std::make_unique<DeferredCommunicator>(std::move(comm), pb::ALLGATHER, false);
    return SweepComm(*comm, Small(), clock, comm->rank() == 0 ? &sink : nullptr);
  });
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->wrong, 2);
    EXPECT_EQ(r->measured, 10);
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
    EXPECT_EQ(r->skipped, 6);
    EXPECT_EQ(r->measured, 6);
  }
  EXPECT_EQ(sink.added(), 12);
}

// A clock whose calls advance by `slow_us` until `slow_calls` have been made, then by 5 us:
// a transient that covers exactly the first pass of a sweep.
class TransientClock final : public Clock {
 public:
  TransientClock(int64_t slow_calls, double slow_us) : slow_calls_(slow_calls), slow_us_(slow_us) {}
  double NowUs() override {
    const double t = now_;
    now_ += calls_++ < slow_calls_ ? slow_us_ : 5.0;
    return t;
  }

 private:
  int64_t slow_calls_, calls_ = 0;
  double slow_us_, now_ = 0;
};

TEST(CommSweep, RoundsKeepATransientFromOwningAPoint) {
  CommSweepOptions o = Small();  // 2 sizes, warm-up 1 + 3 timed calls per point and round
  o.ops = {pb::ALLREDUCE};
  // The first pass: 4 points (float32 and float16 at 2 sizes) x 4 calls x 2 clock reads.
  constexpr int64_t kFirstPassReads = 4 * 4 * 2;
  for (int rounds : {1, 3}) {
    SCOPED_TRACE(rounds);
    o.rounds = rounds;
    MemorySink sink;
    auto results = RunRanks(2, {}, [&](std::unique_ptr<Communicator> comm) {
      TransientClock clock(kFirstPassReads, 1000.0);
      return SweepComm(*comm, o, clock, comm->rank() == 0 ? &sink : nullptr);
    });
    for (auto& r : results) {
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->measured, 4);  // float32 and float16 allreduce at 2 sizes, each stored once
      for (const auto& p : r->points) EXPECT_EQ(p.us, rounds == 1 ? 1000.0 : 5.0) << p.curve << " " << p.size;
    }
    for (const auto& c : sink.Curves()) EXPECT_EQ(c.iters(), 3 * rounds) << CurveKey(c);
  }
  o.rounds = 0;
  MemorySink sink;
  FakeClock clock;
  InProcessGroup group(1);
  EXPECT_EQ(SweepComm(*group.Rank(0), o, clock, &sink).status().message(),
            "warmup, iters, rounds: out of range; got 1, 3, 0, expected warmup >= 0, iters >= 1 and rounds >= 1");
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

TEST(CommSweep, SynchronizesADeviceStyleDataCommunicatorBeforeReadingOrTiming) {
  MemorySink sink;
  CommSweepOptions o = Small();
  InProcessGroup data_group(4, {"a", "a", "b", "b"});
  std::vector<int> synchronized(4);
  auto results = RunRanks(4, {"a", "a", "b", "b"}, [&](std::unique_ptr<Communicator> control) {
    FakeClock clock;
    DeferredCommunicator data(data_group.Rank(control->rank()), pb::COMM_OP_UNSPECIFIED);
    CommSweepOptions mine = o;
    mine.data = &data;
    auto r = SweepComm(*control, mine, clock, control->rank() == 0 ? &sink : nullptr);
    synchronized[static_cast<size_t>(control->rank())] = data.synchronized;
    return r;
  });
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->wrong, 0);
    EXPECT_GT(r->measured, 0);
  }
  EXPECT_GT(synchronized[0], 0);  // the global points; intra and inter run on the splits
  EXPECT_EQ(sink.Curves().size(), 18u);  // six curves (the float16 allreduce too) x global, intra, inter
}

TEST(CommSweep, WrongResultsOfTheDataCommunicatorAreCounted) {
  MemorySink sink;
  CommSweepOptions o = Small();
  o.ops = {pb::ALLREDUCE};
  InProcessGroup data_group(2);
  auto results = RunRanks(2, {}, [&](std::unique_ptr<Communicator> control) {
    FakeClock clock;
    auto data = std::make_unique<DeferredCommunicator>(data_group.Rank(control->rank()),
                                                       control->rank() == 1 ? pb::ALLREDUCE : pb::COMM_OP_UNSPECIFIED);
    CommSweepOptions mine = o;
    mine.data = data.get();
    return SweepComm(*control, mine, clock, control->rank() == 0 ? &sink : nullptr);
  });
  for (auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->wrong, 4);  // 2 sizes x the float32 and the float16 allreduce
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

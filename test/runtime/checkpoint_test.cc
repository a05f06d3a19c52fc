// Checkpointer (checkpoint.h, docs/CHECKPOINT.md) over in-process ranks: a restart restores the
// newest step every rank holds bitwise; a torn slot and a corrupt one are never restored; the
// agreement picks the newest common step; snapshots of other shapes are refused naming the entry;
// persisted files restore when no segment survives, and a half-written file is never loaded; a
// session's state (error feedback, PowerSGD's padding and Q, the active plan) is part of the
// snapshot (GraVAC's: gravac_test.cc). Segments and
// files are removed after each test (names unique per test and process).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <sstream>
#include <thread>

#include "c_api_internal.h"
#include "checkpoint_format.h"
#include "cupcake/runtime/checkpoint.h"
#include "replica_placement.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using testing::OnEveryRank;
constexpr int kWorld = 2;

// The value element j of an entry holds at step s on rank r: from the definition, not the code.
float Value(int64_t step, int rank, int64_t j) { return static_cast<float>(step * 1000 + rank * 100) + 0.25f * j; }

// One rank's job: a weight vector (copied in the background), a statistic written during the
// step (copied at commit) and a few raw bytes. With `data_parallel` the weights and the raw bytes
// are rank 0's on every rank (as parameters are in data parallelism); the statistic is always
// the rank's own.
struct RankJob {
  std::unique_ptr<comm::Communicator> comm;
  std::unique_ptr<Checkpointer> ckpt;
  std::vector<float> weights = std::vector<float>(300);
  std::vector<float> stats = std::vector<float>(5);
  std::vector<std::byte> raw = std::vector<std::byte>(17);
  bool data_parallel = false;

  void Fill(int64_t step, int rank) {
    const int shared_rank = data_parallel ? 0 : rank;
    for (size_t j = 0; j < weights.size(); ++j) weights[j] = Value(step, shared_rank, static_cast<int64_t>(j));
    for (size_t j = 0; j < stats.size(); ++j) stats[j] = -Value(step, rank, static_cast<int64_t>(j));
    for (size_t j = 0; j < raw.size(); ++j) raw[j] = static_cast<std::byte>(step * 7 + shared_rank * 3 + j);
  }
  // The job holds step `step`'s values exactly.
  bool Holds(int64_t step, int rank) const {
    RankJob want;
    want.data_parallel = data_parallel;
    want.Fill(step, rank);
    return std::memcmp(weights.data(), want.weights.data(), weights.size() * 4) == 0 &&
           std::memcmp(stats.data(), want.stats.data(), stats.size() * 4) == 0 && raw == want.raw;
  }
};

// One rank's job through the C API: the checkpointer of `o` over `comm`, RankJob's three entries,
// restore. Run 0 starts fresh (step 0) and commits steps 1..`steps`; a later run resumes at
// `resumed` holding that step's values. `data_parallel`: the weights and raw bytes are the same
// on every rank and added with CUPCAKE_CHECKPOINT_SHARED.
void RunCJob(const cupcake_checkpoint_options& o, std::unique_ptr<comm::Communicator> comm, int r, int run,
             int64_t steps, int64_t resumed, bool data_parallel = false) {
  RankJob job;
  job.data_parallel = data_parallel;
  const int shared = data_parallel ? CUPCAKE_CHECKPOINT_SHARED : 0;
  cupcake_checkpointer* c = nullptr;
  ASSERT_EQ(internal::CreateCCheckpointer(o, std::move(comm), &c), CUPCAKE_OK) << cupcake_last_error();
  ASSERT_EQ(cupcake_checkpointer_add(c, "weights", job.weights.data(), 1200, shared), CUPCAKE_OK);
  ASSERT_EQ(cupcake_checkpointer_add(c, "stats", job.stats.data(), 20, CUPCAKE_CHECKPOINT_AT_COMMIT), CUPCAKE_OK);
  ASSERT_EQ(cupcake_checkpointer_add(c, "raw", job.raw.data(), 17, shared), CUPCAKE_OK);
  int64_t start = -1;
  ASSERT_EQ(cupcake_checkpointer_restore(c, &start), CUPCAKE_OK) << cupcake_last_error();
  if (run == 0) {
    EXPECT_EQ(start, 0);
    for (int64_t s = 1; s <= steps; ++s) {
      ASSERT_EQ(cupcake_checkpointer_wait(c), CUPCAKE_OK);
      job.Fill(s, r);
      ASSERT_EQ(cupcake_checkpointer_commit(c, s), CUPCAKE_OK) << cupcake_last_error();
    }
  } else {
    EXPECT_EQ(start, resumed);
    EXPECT_TRUE(job.Holds(resumed, r));
  }
  cupcake_checkpointer_destroy(c);
}

// A segment mapped, to tear or corrupt it as a crash or a bad page would.
struct Mapped {
  void* base = nullptr;
  size_t bytes = 0;
  internal::SegmentHeader& header() { return *static_cast<internal::SegmentHeader*>(base); }
  std::byte* slot(int i) { return static_cast<std::byte*>(base) + internal::kHeaderBytes + i * header().slot_capacity; }
  int Newest() { return header().slots[0].step > header().slots[1].step ? 0 : 1; }
  ~Mapped() { ::munmap(base, bytes); }
};
std::unique_ptr<Mapped> MapSegment(const std::string& shm_name) {
  const int fd = ::shm_open(shm_name.c_str(), O_RDWR, 0600);
  EXPECT_GE(fd, 0);
  auto m = std::make_unique<Mapped>();
  m->bytes = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
  m->base = ::mmap(nullptr, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return m;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = std::string("test-") + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "-" +
            std::to_string(::getpid());
    dir_ = std::filesystem::temp_directory_path() / name_;
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    jobs_.clear();
    for (int r = 0; r < world_; ++r) EXPECT_TRUE(Checkpointer::RemoveSegment(name_, r).ok());
    std::filesystem::remove_all(dir_);
    if (!shm_files_.empty()) std::filesystem::remove_all(shm_files_);
  }

  // RunCJob on every rank twice with `o`: a fresh job committing `steps`, then, with rank 1's
  // host memory gone when `lose_rank1` (a replaced machine), one that resumes at `resumed`.
  void RunCJobTwice(cupcake_checkpoint_options o, int64_t steps, int64_t resumed, bool lose_rank1,
                    bool data_parallel = false) {
    o.name = name_.c_str();
    for (int run = 0; run < 2; ++run) {
      if (run == 1 && lose_rank1) {
        ASSERT_TRUE(Checkpointer::RemoveSegment(name_, 1).ok());
      }
      comm::InProcessGroup group(kWorld);
      OnEveryRank(kWorld, [&](int r) { RunCJob(o, group.Rank(r), r, run, steps, resumed, data_parallel); });
    }
  }

  // A (re)started job: a new group and new checkpointers, entries registered, values zeroed.
  // The ranks run on `hosts_` (empty: kWorld ranks on one host). `shared`: the weights and the
  // raw bytes are registered Scope::kShared and filled data-parallel (RankJob).
  void Start(CheckpointOptions options = {}, Scope shared = Scope::kRank) {
    jobs_.clear();
    world_ = hosts_.empty() ? kWorld : static_cast<int>(hosts_.size());
    group_ = std::make_unique<comm::InProcessGroup>(world_, hosts_);
    options.name = name_;
    for (int r = 0; r < world_; ++r) {
      jobs_.emplace_back();
      RankJob& job = jobs_.back();
      job.comm = group_->Rank(r);
      auto made = Checkpointer::Create(options, job.comm.get());
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      job.ckpt = std::move(made).value();
      job.data_parallel = shared == Scope::kShared;
      ASSERT_TRUE(job.ckpt->AddFloats("weights", job.weights, Capture::kInBackground, shared).ok());
      ASSERT_TRUE(job.ckpt->AddFloats("stats", job.stats, Capture::kAtCommit).ok());
      ASSERT_TRUE(job.ckpt->Add("raw", job.raw, Capture::kInBackground, shared).ok());
    }
  }
  // Every step fills the values of that step and commits it (metadata "m<step>").
  void Train(int64_t first, int64_t last) {
    OnEveryRank(world_, [&](int r) {
      RankJob& job = jobs_[static_cast<size_t>(r)];
      for (int64_t s = first; s <= last; ++s) {
        ASSERT_TRUE(job.ckpt->WaitForCopy().ok());  // the job's contract before it writes
        job.Fill(s, r);
        Status c = job.ckpt->Commit(s, "m" + std::to_string(s));
        ASSERT_TRUE(c.ok()) << c.ToString();
      }
      ASSERT_TRUE(job.ckpt->WaitForPersist().ok());  // the job's end: its files written too
    });
  }
  std::vector<StatusOr<RestorePoint>> Restore() {
    std::vector<StatusOr<RestorePoint>> out(static_cast<size_t>(world_), InternalError("not run"));
    OnEveryRank(world_, [&](int r) { out[static_cast<size_t>(r)] = jobs_[static_cast<size_t>(r)].ckpt->Restore(); });
    return out;
  }
  // The persisted tests' run: shared weights, files every 2 steps into dir_, steps 1..last.
  // Returns the options, for the restart.
  CheckpointOptions PersistEveryTwoSteps(int64_t last) {
    CheckpointOptions options;
    options.persist_dir = dir_.string();
    options.persist_every = 2;
    Start(options, Scope::kShared);
    Train(1, last);
    return options;
  }
  // The paced persists' run: files every 2 steps into tmpfs (where a piece's fdatasync costs
  // nothing), in pieces of `piece_bytes` behind gate_; step 1 committed, then a session collective
  // held in the gate. Returns the options, for the restart.
  CheckpointOptions StartPacedPersist(int64_t piece_bytes) {
    shm_files_ = "/dev/shm/" + name_ + "-files";
    std::filesystem::create_directories(shm_files_);
    gate_ = std::make_shared<NetworkGate>();
    CheckpointOptions options;
    options.persist_dir = shm_files_.string();
    options.persist_every = 2;
    options.persist_chunk_bytes = piece_bytes;
    options.gate = gate_;
    Start(options, Scope::kShared);
    Train(1, 1);
    gate_->EnterCollective();
    return options;
  }
  // Every host's memory lost, then a restart with `options` restores `step` bitwise on every rank.
  void ExpectRestartAt(const CheckpointOptions& options, int64_t step) {
    LoseEveryHostsMemory();
    Start(options, Scope::kShared);
    auto points = Restore();
    for (int r = 0; r < world_; ++r) {
      ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
      EXPECT_EQ(points[static_cast<size_t>(r)]->step, step);
      EXPECT_EQ(points[static_cast<size_t>(r)]->metadata, "m" + std::to_string(step));
      EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(step, r)) << "rank " << r;
    }
  }
  // Every rank's process and host memory gone: the jobs ended, every segment removed.
  void LoseEveryHostsMemory() {
    jobs_.clear();
    for (int r = 0; r < world_; ++r) ASSERT_TRUE(Checkpointer::RemoveSegment(name_, r).ok());
  }
  // Rank r's segment mapped, to tear or corrupt it as a crash or a bad page would.
  std::unique_ptr<Mapped> Map(int rank) { return MapSegment(Checkpointer::SegmentName(name_, rank)); }
  std::string Segment(int rank) const { return "/dev/shm" + Checkpointer::SegmentName(name_, rank); }

  std::string name_;
  std::filesystem::path dir_;
  std::filesystem::path shm_files_;  // StartPacedPersist's persist_dir
  std::shared_ptr<NetworkGate> gate_;
  int world_ = kWorld;
  std::vector<std::string> hosts_;
  std::unique_ptr<comm::InProcessGroup> group_;
  std::vector<RankJob> jobs_;
};

TEST_F(CheckpointTest, FreshJobRestoresNothingAndLeavesTheValues) {
  Start();
  jobs_[0].Fill(9, 0);
  auto points = Restore();
  for (auto& p : points) {
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->step, 0);
  }
  EXPECT_TRUE(jobs_[0].Holds(9, 0));
}

TEST_F(CheckpointTest, RestartRestoresTheNewestStepBitwise) {
  Start();
  Train(1, 5);
  EXPECT_EQ(jobs_[0].ckpt->agreed_step(), 4);  // at the last commit, step 4 was every rank's newest
  EXPECT_EQ(jobs_[0].ckpt->local_step(), 5);
  Start();  // the restarted job: values zero
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    const RestorePoint& p = *points[static_cast<size_t>(r)];
    EXPECT_EQ(p.step, 5);
    EXPECT_EQ(p.metadata, "m5");
    EXPECT_TRUE(p.refused.empty());
    ASSERT_EQ(p.entries.size(), 3u);
    EXPECT_EQ(p.entries[0], std::make_pair(std::string("weights"), int64_t{1200}));
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(5, r)) << "rank " << r;
  }
  // Training goes on from the restored step: the next commit must be after it.
  Train(6, 6);
  Start();
  auto again = Restore();
  ASSERT_TRUE(again[1].ok());
  EXPECT_EQ(again[1]->step, 6);
  EXPECT_TRUE(jobs_[1].Holds(6, 1));
}

// A run that commits without restoring starts a new history: an older run's snapshots of the
// same name, at later steps, are dropped at its first commit, never restored after its crash.
TEST_F(CheckpointTest, CommitWithoutRestoreStartsANewHistory) {
  CheckpointOptions options;
  options.persist_dir = dir_.string();
  options.persist_every = 1;
  Start(options);
  Train(1, 5);
  Start(options);  // no restore
  Train(1, 2);
  EXPECT_FALSE(std::filesystem::exists(dir_ / (name_ + "-0-5.ckpt")));
  Start(options);
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok());
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 2);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(2, r));
  }
}

// A process killed mid-copy leaves its slot in state kSlotWriting: never restored; the ranks
// agree on the step before, which every rank holds.
TEST_F(CheckpointTest, TornSnapshotIsNeverRestored) {
  Start();
  Train(1, 3);
  {
    auto m = Map(0);
    const int newest = m->Newest();
    ASSERT_EQ(m->header().slots[newest].step, 3);
    m->header().slots[newest].state = internal::kSlotWriting;
    std::memset(m->slot(newest) + 200, 0xff, 100);  // the half-copied bytes
  }
  Start();
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 2);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(2, r)) << "rank " << r;
  }
  ASSERT_EQ(points[0]->refused.size(), 1u);
  EXPECT_NE(points[0]->refused[0].find(Segment(0) + ": slots["), std::string::npos) << points[0]->refused[0];
  EXPECT_NE(points[0]->refused[0].find("].state: torn (a copy was interrupted); got 1, expected 2 (valid)"),
            std::string::npos)
      << points[0]->refused[0];
  // Rank 1's step 3 was dropped with the restore: it never mixes with the resumed run's.
  auto m1 = Map(1);
  for (const auto& s : m1->header().slots) EXPECT_FALSE(s.state == internal::kSlotValid && s.step > 2);
}

// A valid-looking slot whose bytes changed (fingerprint mismatch) is refused; when no step is
// left that every rank holds, the restore fails on every rank naming what each holds.
// A segment of format 1 (another checksum function) is refused by its version, not by a
// checksum its slots cannot match.
TEST_F(CheckpointTest, SegmentOfAnOlderFormatIsRefusedByItsVersion) {
  Start();
  Train(1, 3);
  Map(1)->header().version = 1;
  Start();
  auto points = Restore();
  ASSERT_FALSE(points[1].ok());
  const std::string msg = points[1].status().message();
  EXPECT_NE(msg.find(Segment(1) + ": version: segment format 1, which this version does not read; got 1, expected 2 "
                                  "(format 1 has another checksum function)"),
            std::string::npos)
      << msg;
}

TEST_F(CheckpointTest, ChecksumMismatchIsRefused) {
  Start();
  Train(1, 3);
  int newest = 0;
  {
    auto m = Map(1);
    newest = m->Newest();
    m->slot(newest)[m->header().slots[newest].payload_bytes - 1] ^= std::byte{1};
  }
  Start();
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok());
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 2);
  }
  ASSERT_EQ(points[1]->refused.size(), 1u);
  const std::string want =
      Segment(1) + ": slots[" + std::to_string(newest) + "].checksum: does not match the contents; got 0x";
  EXPECT_EQ(points[1]->refused[0].substr(0, want.size()), want) << points[1]->refused[0];
  EXPECT_NE(points[1]->refused[0].find(", expected 0x"), std::string::npos);

  // Now both of rank 1's slots are corrupt (step 2's too).
  {
    auto m = Map(1);
    for (int i = 0; i < 2; ++i) m->slot(i)[40] ^= std::byte{0x10};
  }
  Start();
  auto failed = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_FALSE(failed[static_cast<size_t>(r)].ok());
    EXPECT_EQ(failed[static_cast<size_t>(r)].status().code(), StatusCode::kFailedPrecondition);
    const std::string msg = failed[static_cast<size_t>(r)].status().message();
    EXPECT_NE(msg.find("restore: no step is held by every rank; got rank 0 holds 2; rank 1 holds none"),
              std::string::npos)
        << msg;
  }
  EXPECT_NE(failed[1].status().message().find("checksum: does not match the contents"), std::string::npos);
}

// Rank 0 holds {4, 3}, rank 1 only {3} (its slot of step 4 empty, as when it died before the
// copy began): the newest common step, 3, wins over rank 0's newer one, which is then dropped.
TEST_F(CheckpointTest, AgreementPicksTheNewestCommonStep) {
  Start();
  Train(1, 4);
  {
    auto m = Map(1);
    m->header().slots[m->Newest()].state = internal::kSlotEmpty;
  }
  Start();
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok());
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 3);
    EXPECT_TRUE(points[static_cast<size_t>(r)]->refused.empty());
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(3, r));
  }
  auto m0 = Map(0);
  int valid = 0;
  for (const auto& s : m0->header().slots) {
    EXPECT_FALSE(s.state == internal::kSlotValid && s.step > 3);
    valid += s.state == internal::kSlotValid;
  }
  EXPECT_EQ(valid, 1);
}

TEST_F(CheckpointTest, SnapshotOfOtherShapesIsRefusedOnEveryRank) {
  Start();
  Train(1, 2);
  // The restarted job's weights are longer on rank 0.
  jobs_.clear();
  group_ = std::make_unique<comm::InProcessGroup>(kWorld);
  std::vector<std::vector<float>> weights = {std::vector<float>(301, 7.0f), std::vector<float>(300, 7.0f)};
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  std::vector<std::unique_ptr<Checkpointer>> ckpts;
  CheckpointOptions options;
  options.name = name_;
  for (int r = 0; r < kWorld; ++r) {
    comms.push_back(group_->Rank(r));
    ckpts.push_back(Checkpointer::Create(options, comms.back().get()).value());
    ASSERT_TRUE(ckpts.back()->AddFloats(r == 0 ? "weights" : "w", weights[static_cast<size_t>(r)]).ok());
  }
  std::vector<Status> got(kWorld);
  OnEveryRank(kWorld, [&](int r) { got[static_cast<size_t>(r)] = ckpts[static_cast<size_t>(r)]->Restore().status(); });
  const std::string m0 = got[0].message(), m1 = got[1].message();
  EXPECT_NE(m0.find(Segment(0) + " slots["), std::string::npos) << m0;
  EXPECT_NE(m0.find("]: entries: does not match the job; got 3 entries, expected 1 (registered)"), std::string::npos)
      << m0;
  EXPECT_NE(m0.find("]: entries[0].size_bytes: does not match the job; got 1200, expected 1204 ('weights')"),
            std::string::npos)
      << m0;
  EXPECT_NE(m1.find("]: entries[0].name: does not match the job; got 'weights', expected 'w'"), std::string::npos)
      << m1;
  for (float v : weights[0]) ASSERT_EQ(v, 7.0f);  // nothing written
  ckpts.clear();
}

// Replicas (Gemini, groups of two in a ring): rank 1's host loses its memory (both of its
// segments), and rank 1's snapshot comes back from rank 0's replica of it, bitwise, with rank 1's
// own values (they differ from rank 0's). Without replicas the same loss leaves no common step.
// Whole snapshots, one chunk per Commit: Commit(s) sends step s - 1 (the newest complete copy),
// so after commits 1..3 the replicas hold 1 and 2 (step 3's would go at Commit(4)).
TEST_F(CheckpointTest, ReplicaOnThePeerRestoresALostHost) {
  CheckpointOptions options;
  options.replicate = true;
  Start(options);
  Train(1, 3);
  jobs_.clear();
  ASSERT_TRUE(Checkpointer::RemoveSegment(name_, 1).ok());  // rank 1's host rebooted
  Start(options);
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 2);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(2, r)) << "rank " << r;
  }
  EXPECT_EQ(points[1]->source, "rank 0's /dev/shm" + Checkpointer::ReplicaOfSegmentName(name_, 0, 1));
  EXPECT_EQ(points[0]->source.substr(0, Segment(0).size()), Segment(0));
  // Training goes on from step 3. Commit(3) streams rank 0's step 2 and nothing from rank 1
  // (restored from the replica, it holds no copy of its own yet); Commit(4) every rank's 3,
  // Commit(5) every rank's 4: a lost host now restores 4.
  Train(3, 5);
  jobs_.clear();
  ASSERT_TRUE(Checkpointer::RemoveSegment(name_, 0).ok());  // now rank 0's host
  Start(options);
  auto again = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(again[static_cast<size_t>(r)].ok()) << again[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(again[static_cast<size_t>(r)]->step, 4);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(4, r)) << "rank " << r;
  }
  EXPECT_EQ(again[0]->source, "rank 1's /dev/shm" + Checkpointer::ReplicaOfSegmentName(name_, 1, 0));
}

// Chunks of 500 bytes: a snapshot here is 1343 or 1344 bytes (the directory: 40 bytes, 16 per
// entry and the names 'weights', 'stats', 'raw': 103; the metadata "m<step>": 2 or 3; the
// entries: 1200 + 20 + 17), so 3 chunks, one per Commit. Commit 1: nothing complete to send;
// Commits 2, 3, 4: step 1's chunks (complete at 4); Commits 5, 6, 7: step 4's; Commit 8: the
// first chunk of step 7's. A lost host restores 4, the newest step whose replica is complete,
// bitwise; every other rank holds 4 in its outgoing segment (its own slots hold 8 and 7).
TEST_F(CheckpointTest, ReplicaAssembledFromChunksRestoresALostHost) {
  CheckpointOptions options;
  options.replicate = true;
  options.replica_chunk_bytes = 500;
  Start(options);
  Train(1, 8);
  jobs_.clear();
  ASSERT_TRUE(Checkpointer::RemoveSegment(name_, 1).ok());
  Start(options);
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 4);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(4, r)) << "rank " << r;
    EXPECT_EQ(points[static_cast<size_t>(r)]->metadata, "m4");
  }
  EXPECT_EQ(points[1]->source, "rank 0's /dev/shm" + Checkpointer::ReplicaOfSegmentName(name_, 0, 1));
  const std::string outgoing = "/dev/shm" + Checkpointer::OutgoingSegmentName(name_, 0);
  EXPECT_EQ(points[0]->source.substr(0, outgoing.size()), outgoing);
  // The replica of step 7 was one chunk short: its slot is torn, refused, never restored.
  bool torn = false;
  for (const std::string& line : points[0]->refused)
    torn = torn || line.find(Checkpointer::ReplicaOfSegmentName(name_, 0, 1) + ": slots[") != std::string::npos;
  EXPECT_TRUE(torn) << "rank 0 refused: " << points[0]->refused.size();
}

// Data parallelism: 'weights' and 'raw' are the same on every rank and registered kShared,
// 'stats' is each rank's own. A replica carries the snapshot's directory (40 bytes, 16 per entry
// and the names 'weights', 'stats', 'raw'), its metadata "m2", 'stats' (20 bytes) and the
// snapshot's checksum (8): 133 bytes, where the whole snapshot is 1342. Rank 1's host lost after
// commits 1..3 (replicas of 1 and 2): it rebuilds step 2 from rank 0's replica and rank 0's
// 'weights' and 'raw', bitwise its own.
TEST_F(CheckpointTest, ReplicaCarriesOnlyTheRankSpecificEntries) {
  CheckpointOptions options;
  options.replicate = true;
  Start(options, Scope::kShared);
  Train(1, 3);
  {
    auto replica = MapSegment(Checkpointer::ReplicaOfSegmentName(name_, 0, 1));
    const internal::SlotHeader& newest = replica->header().slots[replica->Newest()];
    EXPECT_EQ(newest.state, internal::kSlotValid);
    EXPECT_EQ(newest.step, 2);
    EXPECT_EQ(newest.payload_bytes, 40u + (16 + 7) + (16 + 5) + (16 + 3) + 2 + 20 + 8);
  }
  jobs_.clear();
  ASSERT_TRUE(Checkpointer::RemoveSegment(name_, 1).ok());
  Start(options, Scope::kShared);
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 2);
    EXPECT_EQ(points[static_cast<size_t>(r)]->metadata, "m2");
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(2, r)) << "rank " << r;
  }
  EXPECT_EQ(points[1]->source, "rank 0's /dev/shm" + Checkpointer::ReplicaOfSegmentName(name_, 0, 1) +
                                   ", its shared entries from rank 0");
}

// Data parallelism, and one byte of rank 1's 'weights' (kShared) changed before commit 3: the
// copy of step 3 fingerprints each rank's 'weights', and Commit(4)'s agreement finds them
// different. Commit(4) fails on every rank naming the entry and step 3, with each rank's
// fingerprint (the checksum of its bytes, by definition); step 3 is dropped everywhere (slot and
// file), so agreed_step() and local_step() stay 2 and a restart restores 2.
TEST_F(CheckpointTest, SharedEntriesThatDifferFailTheNextCommit) {
  CheckpointOptions options;
  options.persist_dir = dir_.string();
  options.persist_every = 1;
  Start(options, Scope::kShared);
  Train(1, 2);  // equal: Commit(2) compared step 1's fingerprints
  std::vector<Status> got(kWorld);
  std::vector<uint64_t> fingerprints(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    RankJob& job = jobs_[static_cast<size_t>(r)];
    job.Fill(3, r);
    if (r == 1) std::as_writable_bytes(std::span<float>(job.weights))[41] ^= std::byte{1};
    fingerprints[static_cast<size_t>(r)] =
        internal::Checksum(reinterpret_cast<const std::byte*>(job.weights.data()), job.weights.size() * 4);
    Status c = job.ckpt->Commit(3, "m3");  // compares step 2's: equal
    ASSERT_TRUE(c.ok()) << c.ToString();
    ASSERT_TRUE(job.ckpt->WaitForCopy().ok());
    job.Fill(4, r);
    got[static_cast<size_t>(r)] = job.ckpt->Commit(4, "m4");
    ASSERT_TRUE(job.ckpt->WaitForCopy().ok());
  });
  auto hex = [](uint64_t v) {
    std::ostringstream os;
    os << "0x" << std::hex << v;
    return os.str();
  };
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const Status& c = got[static_cast<size_t>(r)];
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(c.message(), Segment(r) +
                               ": entries[0]: registered Scope::kShared ('weights'), but its bytes differ between "
                               "the ranks at step 3; got fingerprint " +
                               hex(fingerprints[0]) + " on rank 0, " + hex(fingerprints[1]) +
                               " on rank 1, expected the same bytes on every rank (Scope::kRank for state each "
                               "rank keeps its own of); the snapshot of step 3 is dropped on every rank");
    EXPECT_EQ(jobs_[static_cast<size_t>(r)].ckpt->agreed_step(), 2);
    EXPECT_EQ(jobs_[static_cast<size_t>(r)].ckpt->local_step(), 2);
    EXPECT_FALSE(std::filesystem::exists(dir_ / (name_ + "-" + std::to_string(r) + "-3.ckpt")));
  }
  Start(options, Scope::kShared);
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 2);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(2, r)) << "rank " << r;
  }
}

// Ranks that register different entries kShared fail the next Commit on every rank too: a
// different number of them, or the same number at different positions.
TEST_F(CheckpointTest, SharedEntriesRegisteredApartFailTheNextCommit) {
  // Two commits with 'weights' and 'raw' (data parallel) registered with these scopes per rank.
  auto run = [&](std::array<Scope, kWorld> weights, std::array<Scope, kWorld> raw) {
    comm::InProcessGroup group(kWorld);
    std::vector<Status> got(kWorld);
    OnEveryRank(kWorld, [&](int r) {
      RankJob job;
      job.data_parallel = true;
      std::unique_ptr<comm::Communicator> comm = group.Rank(r);
      CheckpointOptions options;
      options.name = name_;
      std::unique_ptr<Checkpointer> ckpt = Checkpointer::Create(options, comm.get()).value();
      ASSERT_TRUE(
          ckpt->AddFloats("weights", job.weights, Capture::kInBackground, weights[static_cast<size_t>(r)]).ok());
      ASSERT_TRUE(ckpt->Add("raw", job.raw, Capture::kInBackground, raw[static_cast<size_t>(r)]).ok());
      for (int64_t s = 1; s <= 2; ++s) {
        ASSERT_TRUE(ckpt->WaitForCopy().ok());
        job.Fill(s, r);
        got[static_cast<size_t>(r)] = ckpt->Commit(s);
      }
    });
    return got;
  };
  const std::string dropped = "; the snapshot of step 1 is dropped on every rank";
  std::vector<Status> counted = run({Scope::kShared, Scope::kShared}, {Scope::kShared, Scope::kRank});
  std::vector<Status> placed = run({Scope::kShared, Scope::kRank}, {Scope::kRank, Scope::kShared});
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(counted[static_cast<size_t>(r)].message(),
              Segment(r) +
                  ": entries: the ranks register different numbers of Scope::kShared entries at step 1; got 2 on "
                  "rank 0, 1 on rank 1, expected the same on every rank" +
                  dropped);
    EXPECT_EQ(placed[static_cast<size_t>(r)].message(),
              Segment(r) +
                  ": entries: the ranks register their Scope::kShared entries at different positions at step 1; got "
                  "entries[0] on rank 0, entries[1] on rank 1, expected the same on every rank" +
                  dropped);
  }
}

// A lost host's snapshot rebuilt with another rank's kShared entries that are not its own fails
// the rebuilt checksum: every rank fails and nothing is written. Commit's check keeps such
// snapshots from being agreed (SharedEntriesThatDifferFailTheNextCommit); this is the restore's
// own defense, for one that escaped it, made here by hand: rank 0's snapshot of step 2 (the one
// that donates the shared entries) with one byte of 'weights' changed and its slot's checksum
// recomputed.
TEST_F(CheckpointTest, SharedEntriesThatDifferFailTheRebuiltChecksum) {
  CheckpointOptions options;
  options.replicate = true;
  Start(options, Scope::kShared);
  Train(1, 3);
  {
    auto m = Map(0);
    int changed = 0;
    for (int i = 0; i < 2; ++i) {
      internal::SlotHeader& slot = m->header().slots[i];
      if (slot.step != 2) continue;
      // 'weights' begins after the directory (40 bytes, 16 per entry and the names 'weights',
      // 'stats', 'raw': 103) and the metadata "m2".
      m->slot(i)[103 + 2 + 40] ^= std::byte{1};
      slot.checksum = internal::Checksum(m->slot(i), slot.payload_bytes);
      ++changed;
    }
    ASSERT_EQ(changed, 1);
  }
  jobs_.clear();
  ASSERT_TRUE(Checkpointer::RemoveSegment(name_, 1).ok());
  Start(options, Scope::kShared);
  auto points = Restore();
  ASSERT_FALSE(points[1].ok());
  EXPECT_EQ(points[1].status().message().find("rank 0's /dev/shm" + Checkpointer::ReplicaOfSegmentName(name_, 0, 1) +
                                              ", its shared entries from rank 0: checksum: the snapshot rebuilt "
                                              "with another rank's shared entries is not this rank's; got 0x"),
            0u)
      << points[1].status().message();
  EXPECT_NE(points[1].status().message().find("(the entries registered Scope::kShared differ between the ranks)"),
            std::string::npos);
  ASSERT_FALSE(points[0].ok());
  EXPECT_EQ(points[0].status().message(),
            Segment(0) + ": restore: another rank could not restore step 2 (see its message); nothing restored");
  for (const RankJob& job : jobs_) EXPECT_EQ(job.weights, std::vector<float>(300, 0.0f));
}

// Gemini's group placement (replica_placement.h), worked by hand.
TEST(ReplicaPlacement, GroupsOfHostsBackEachOtherUp) {
  using Ranks = std::vector<std::vector<int>>;
  // 4 hosts x 2 ranks, m = 2: groups {h0, h1}, {h2, h3}; local index l to local index l.
  internal::ReplicaPlacement p = internal::PlaceReplicas({0, 0, 1, 1, 2, 2, 3, 3}, 2);
  EXPECT_EQ(p.holders, (Ranks{{2}, {3}, {0}, {1}, {6}, {7}, {4}, {5}}));
  EXPECT_EQ(p.sources, (Ranks{{2}, {3}, {0}, {1}, {6}, {7}, {4}, {5}}));
  // 6 hosts x 1 rank, m = 3: groups {0, 1, 2}, {3, 4, 5}, each host to both others of its group.
  p = internal::PlaceReplicas({0, 1, 2, 3, 4, 5}, 3);
  EXPECT_EQ(p.holders, (Ranks{{1, 2}, {0, 2}, {0, 1}, {4, 5}, {3, 5}, {3, 4}}));
  // 3 hosts, m = 2: the odd host joins the one group of 3, a ring of m - 1 = 1 successor.
  p = internal::PlaceReplicas({0, 1, 2}, 2);
  EXPECT_EQ(p.holders, (Ranks{{1}, {2}, {0}}));
  EXPECT_EQ(p.sources, (Ranks{{2}, {0}, {1}}));
  // 4 hosts, m = 3: one group of 4 (4 / 3 = 1 group), a ring of 2 successors.
  p = internal::PlaceReplicas({0, 1, 2, 3}, 3);
  EXPECT_EQ(p.holders, (Ranks{{1, 2}, {2, 3}, {0, 3}, {0, 1}}));
  // 2 hosts, m = 3: fewer hosts than m, one group of both.
  p = internal::PlaceReplicas({0, 0, 1, 1}, 3);
  EXPECT_EQ(p.holders, (Ranks{{2}, {3}, {0}, {1}}));
}

TEST(ReplicaPlacement, UnevenHostsAndOneHost) {
  using Ranks = std::vector<std::vector<int>>;
  // Host 0 has ranks 0, 1, 2, host 1 rank 3: local indices 0, 1, 2 map to 3's index 0 (l mod 1);
  // rank 3 to host 0's index 0.
  internal::ReplicaPlacement p = internal::PlaceReplicas({0, 0, 0, 1}, 2);
  EXPECT_EQ(p.holders, (Ranks{{3}, {3}, {3}, {0}}));
  EXPECT_EQ(p.sources, (Ranks{{3}, {}, {}, {0, 1, 2}}));
  // Ranks alternating between two hosts: each to the same local index on the other host.
  p = internal::PlaceReplicas({0, 1, 0, 1}, 2);
  EXPECT_EQ(p.holders, (Ranks{{1}, {0}, {3}, {2}}));
  // One host, m = 3: the next two ranks (mod 4); m = 2: the ring of successors.
  p = internal::PlaceReplicas({0, 0, 0, 0}, 3);
  EXPECT_EQ(p.holders, (Ranks{{1, 2}, {2, 3}, {0, 3}, {0, 1}}));
  p = internal::PlaceReplicas({0, 0}, 2);
  EXPECT_EQ(p.holders, (Ranks{{1}, {0}}));
}

// Two hosts of two ranks: each rank's replica goes to the other host (rank 0 -> 2, 1 -> 3), so a
// lost host (ranks 0 and 1, with all their segments) restores from the other. The ring of ranks
// (0 -> 1) would have lost rank 0's replica with its host.
TEST_F(CheckpointTest, ReplicasGoToAnotherHost) {
  hosts_ = {"a", "a", "b", "b"};
  CheckpointOptions options;
  options.replicate = true;
  Start(options);
  Train(1, 3);  // replicas of 1 (Commit 2) and 2 (Commit 3)
  jobs_.clear();
  for (int r : {0, 1}) ASSERT_TRUE(Checkpointer::RemoveSegment(name_, r).ok());
  Start(options);
  auto points = Restore();
  for (int r = 0; r < world_; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 2);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(2, r)) << "rank " << r;
  }
  EXPECT_EQ(points[0]->source, "rank 2's /dev/shm" + Checkpointer::ReplicaOfSegmentName(name_, 2, 0));
  EXPECT_EQ(points[1]->source, "rank 3's /dev/shm" + Checkpointer::ReplicaOfSegmentName(name_, 3, 1));
}

// Three hosts of two ranks. With m = 3 (one group) every rank's replicas are on both other
// hosts: two lost hosts (ranks 0-3) restore from host c's ranks 4 and 5 (rank 0's holders are 2
// and 4; 2 is lost, so 4 provides). With m = 2 (the three hosts a ring of one successor each:
// a -> b -> c -> a) the same loss leaves ranks 0 and 1 (host a, held on b only) without a copy:
// no common step, named. Each snapshot is two chunks of at most 700 bytes (about 1343 bytes):
// the replicas of step 1 complete at Commit 3, of step 3 at Commit 5.
TEST_F(CheckpointTest, GroupsOfThreeHostsSurviveTwoLostHosts) {
  hosts_ = {"a", "a", "b", "b", "c", "c"};
  for (int m : {3, 2}) {
    SCOPED_TRACE("m = " + std::to_string(m));
    CheckpointOptions options;
    options.replicate = true;
    options.replica_group_hosts = m;
    options.replica_chunk_bytes = 700;
    Start(options);
    Train(1, 5);
    jobs_.clear();
    for (int r : {0, 1, 2, 3}) ASSERT_TRUE(Checkpointer::RemoveSegment(name_, r).ok());
    Start(options);
    auto points = Restore();
    if (m == 2) {
      for (const auto& p : points) {
        ASSERT_FALSE(p.ok());
        EXPECT_NE(p.status().message().find("no step is held by every rank; got rank 0 holds none; rank 1 holds none; "
                                            "rank 2 holds none; rank 3 holds none; rank 4 holds 5, 4, 3, 1"),
                  std::string::npos)
            << p.status().message();
      }
      continue;
    }
    for (int r = 0; r < world_; ++r) {
      ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
      EXPECT_EQ(points[static_cast<size_t>(r)]->step, 3);
      EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(3, r)) << "rank " << r;
    }
    for (int r : {0, 1, 2, 3}) {
      const int provider = 4 + r % 2;  // host c's rank of the same local index
      EXPECT_EQ(points[static_cast<size_t>(r)]->source, "rank " + std::to_string(provider) + "'s /dev/shm" +
                                                            Checkpointer::ReplicaOfSegmentName(name_, provider, r));
    }
    jobs_.clear();
    for (int r = 0; r < world_; ++r) ASSERT_TRUE(Checkpointer::RemoveSegment(name_, r).ok());
  }
}

TEST_F(CheckpointTest, WithoutReplicasALostHostLeavesNoCommonStep) {
  Start();
  Train(1, 3);
  jobs_.clear();
  ASSERT_TRUE(Checkpointer::RemoveSegment(name_, 1).ok());
  Start();
  auto points = Restore();
  for (auto& p : points) {
    ASSERT_FALSE(p.ok());
    EXPECT_NE(p.status().message().find("no step is held by every rank; got rank 0 holds 3, 2; rank 1 holds none"),
              std::string::npos)
        << p.status().message();
  }
}

// A rank that could not prepare its entries passes its error to Apply: it still joins the
// collective, so the others fail too instead of waiting, and nobody's values change.
TEST_F(CheckpointTest, ARankThatCannotPrepareFailsEveryRank) {
  Start();
  Train(1, 2);
  Start();
  std::vector<Status> got(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    Checkpointer& c = *jobs_[static_cast<size_t>(r)].ckpt;
    auto point = c.Find();
    ASSERT_TRUE(point.ok());
    ASSERT_EQ(point->step, 2);
    got[static_cast<size_t>(r)] = c.Apply(r == 1 ? InvalidArgumentError("job: optimizer: no state") : Status::Ok());
  });
  EXPECT_EQ(got[1].message(), "job: optimizer: no state");
  EXPECT_EQ(got[0].message(), Segment(0) +
                                  ": restore: another rank could not restore step 2 (see its message); "
                                  "nothing restored");
  for (const RankJob& job : jobs_) EXPECT_EQ(job.weights, std::vector<float>(300, 0.0f));  // as Start() made them
}

TEST_F(CheckpointTest, RanksCommittingDifferentStepsAllFail) {
  Start();
  std::vector<Status> got(kWorld);
  OnEveryRank(kWorld, [&](int r) { got[static_cast<size_t>(r)] = jobs_[static_cast<size_t>(r)].ckpt->Commit(1 + r); });
  for (const Status& s : got)
    EXPECT_EQ(s.message(), Segment(static_cast<int>(&s - got.data())) +
                               ": step: the ranks commit different steps; got 1 on rank 0, 2 on rank 1, expected the "
                               "same step on every rank");
}

TEST_F(CheckpointTest, PersistedFilesRestoreWhenNoSegmentSurvives) {
  CheckpointOptions options;
  options.persist_dir = dir_.string();
  options.persist_every = 2;
  Start(options);
  Train(1, 5);  // persisted: 2 and 4 (5 only in memory)
  EXPECT_EQ(jobs_[0].ckpt->local_step(), 5);
  EXPECT_EQ(jobs_[0].ckpt->persisted_step(), 4);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(std::filesystem::exists(dir_ / (name_ + "-" + std::to_string(r) + "-4.ckpt")));
    EXPECT_TRUE(std::filesystem::exists(dir_ / (name_ + "-" + std::to_string(r) + "-2.ckpt")));
  }
  jobs_.clear();
  for (int r = 0; r < kWorld; ++r) ASSERT_TRUE(Checkpointer::RemoveSegment(name_, r).ok());  // the hosts rebooted
  // A newer file cut short on rank 0 (a crash while writing, had it not been renamed) and a
  // temporary that was never renamed: neither is loaded.
  {
    std::string whole;
    std::ifstream in(dir_ / (name_ + "-0-4.ckpt"), std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(in), {});
    std::ofstream(dir_ / (name_ + "-0-6.ckpt"), std::ios::binary) << whole.substr(0, whole.size() / 2);
    std::ofstream(dir_ / (name_ + "-0-8.ckpt.tmp.1234"), std::ios::binary) << whole;
  }
  Start(options);
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 4);
    EXPECT_EQ(points[static_cast<size_t>(r)]->source, (dir_ / (name_ + "-" + std::to_string(r) + "-4.ckpt")).string());
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(4, r));
  }
  ASSERT_EQ(points[0]->refused.size(), 1u);
  EXPECT_NE(points[0]->refused[0].find(name_ + "-0-6.ckpt: trailer: not a complete snapshot"), std::string::npos)
      << points[0]->refused[0];
  EXPECT_FALSE(std::filesystem::exists(dir_ / (name_ + "-0-6.ckpt")));  // newer than the restored step: dropped
}

// A persist killed before its rename leaves <file>.tmp.<pid>. A restarted rank removes its own
// whose writer is gone, at its restore or, when it has none, at its first commit. A live
// process's temporary, this process's own, another rank's and another job's stay.
TEST_F(CheckpointTest, StaleTemporariesAreRemovedAtStart) {
  const pid_t gone = ::fork();  // a writer that has ended: a child, exited and reaped
  ASSERT_GE(gone, 0);
  if (gone == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t live = ::fork();  // a writer still at work: a child that waits for its pipe to close
  ASSERT_GE(live, 0);
  if (live == 0) {
    char c;
    ::close(fds[1]);
    while (::read(fds[0], &c, 1) > 0) {
    }
    ::_exit(0);
  }
  ::close(fds[0]);
  auto tmp = [&](const std::string& job, int rank, pid_t pid) {
    return dir_ / (job + "-" + std::to_string(rank) + "-8.ckpt.tmp." + std::to_string(pid));
  };
  const std::vector<std::filesystem::path> stale = {tmp(name_, 0, gone), tmp(name_, 1, gone)};
  const std::vector<std::filesystem::path> kept = {tmp(name_, 0, live), tmp(name_, 1, ::getpid()),
                                                   tmp(name_, 7, gone), tmp("other-" + name_, 0, gone)};
  CheckpointOptions options;
  options.persist_dir = dir_.string();
  options.persist_every = 2;
  for (int run = 0; run < 2; ++run) {
    for (const auto& list : {stale, kept})
      for (const auto& path : list) std::ofstream(path, std::ios::binary) << "half a snapshot";
    Start(options);
    if (run == 0) {
      Train(1, 1);  // a fresh job: its first commit
    } else {
      for (const auto& point : Restore()) {
        ASSERT_TRUE(point.ok()) << point.status().ToString();
        EXPECT_EQ(point->step, 1);
      }
    }
    for (const auto& path : stale) EXPECT_FALSE(std::filesystem::exists(path)) << "run " << run << ": " << path;
    for (const auto& path : kept) EXPECT_TRUE(std::filesystem::exists(path)) << "run " << run << ": " << path;
  }
  ::close(fds[1]);
  EXPECT_EQ(::waitpid(live, nullptr, 0), live);
}

// A persisted file holds the rank's own entries and 1/W of the shared entries' bytes
// (docs/CHECKPOINT.md, "Persisted checkpoints"). The files and the shares, restated by hand.
std::string ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void WriteBytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}
std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};  // NOLINT: file bytes
}
// A persisted file's trailer made to match its payload again after a test changed the payload
// (the trailer's checksum is the format's: a file whose bytes were changed and sealed anew).
void Reseal(std::string* file) {
  const size_t payload = file->size() - sizeof(internal::Trailer);
  const uint64_t sum = internal::Checksum(AsBytes(*file).data(), payload);
  std::memcpy(file->data() + payload, &sum, 8);
}
constexpr size_t kShareHeaderBytes = 8 + 4 + 4 + 4 + 4 + 5 * 8;  // ShareHeader, by its fields

// floor(r T / W) with 128-bit arithmetic (a GCC and Clang extension): the definition of a
// share's start.
__extension__ typedef __int128 Int128;
int64_t ShareStart(int64_t total, int world, int rank) {
  return static_cast<int64_t>(static_cast<Int128>(total) * rank / world);
}

TEST(PersistedShares, SplitIsContiguousInRankOrder) {
  // By hand: 10 bytes among 3 ranks: [0, 3), [3, 6), [6, 10); 2 bytes among 4: [0, 0), [0, 1),
  // [1, 1), [1, 2).
  const std::vector<std::pair<int64_t, int64_t>> ten = {{0, 3}, {3, 3}, {6, 4}};
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(internal::ShareOf(10, 3, r).offset, ten[static_cast<size_t>(r)].first);
    EXPECT_EQ(internal::ShareOf(10, 3, r).bytes, ten[static_cast<size_t>(r)].second);
  }
  const std::vector<std::pair<int64_t, int64_t>> two = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(internal::ShareOf(2, 4, r).offset, two[static_cast<size_t>(r)].first);
    EXPECT_EQ(internal::ShareOf(2, 4, r).bytes, two[static_cast<size_t>(r)].second);
  }
  // Against the definition: every size up to 300 among 1..9 ranks, and sizes near the int64
  // limit, where r T overflows 64 bits.
  std::vector<int64_t> totals;
  for (int64_t t = 0; t <= 300; ++t) totals.push_back(t);
  for (int64_t t : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 5, int64_t{1} << 62,
                    (int64_t{1} << 40) + 3})
    totals.push_back(t);
  for (int64_t total : totals)
    for (int world = 1; world <= 9; ++world) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const internal::ByteRange got = internal::ShareOf(total, world, r);
        ASSERT_EQ(got.offset, ShareStart(total, world, r)) << total << " " << world << " " << r;
        ASSERT_EQ(got.offset, next) << total << " " << world << " " << r;
        ASSERT_EQ(got.offset + got.bytes, ShareStart(total, world, r + 1)) << total << " " << world << " " << r;
        next = got.offset + got.bytes;
      }
      ASSERT_EQ(next, total);
    }
}

// Rank `rank`'s snapshot of step 6 in a world of 3, laid out by hand (checkpoint_format.h's
// layout): entries a (own, 10 bytes), b (shared, 7), c (shared, 0), d (own, 3), e (shared, 12).
// Its shared bytes, b then e, are 19 and the same on every rank: among 3 ranks [0, 6), [6, 12),
// [12, 19): rank 0 b[0..6), rank 1 b[6] and e[0..5), rank 2 e[5..12).
struct HandSnapshot {
  std::vector<std::byte> bytes;
  std::vector<std::byte> shared;  // b then e
};
HandSnapshot LayOutByHand(int32_t rank) {
  struct E {
    std::string name;
    uint32_t flags;
    int size;
    int first;  // its bytes are first, first + 1, ...
  };
  const std::vector<E> entries = {
      {"a", 0, 10, 1 + 20 * rank}, {"b", 1, 7, 70}, {"c", 1, 0, 0}, {"d", 0, 3, 90 + 5 * rank}, {"e", 1, 12, 120}};
  HandSnapshot out;
  auto put = [&](const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.bytes.insert(out.bytes.end(), b, b + n);
  };
  const int64_t step = 6;
  const int32_t world = 3;
  const std::string metadata = "meta";
  const uint64_t metadata_bytes = metadata.size();
  const uint32_t count = static_cast<uint32_t>(entries.size()), zero = 0;
  put(internal::kSnapshotMagic, 8);
  put(&step, 8);
  put(&rank, 4);
  put(&world, 4);
  put(&metadata_bytes, 8);
  put(&count, 4);
  put(&zero, 4);
  for (const E& e : entries) {
    const uint32_t name_bytes = static_cast<uint32_t>(e.name.size());
    const uint64_t size = static_cast<uint64_t>(e.size);
    put(&name_bytes, 4);
    put(&e.flags, 4);
    put(&size, 8);
    put(e.name.data(), e.name.size());
  }
  put(metadata.data(), metadata.size());
  for (const E& e : entries)
    for (int j = 0; j < e.size; ++j) {
      const auto b = static_cast<std::byte>(e.first + j);
      out.bytes.push_back(b);
      if (e.flags == 1) out.shared.push_back(b);
    }
  return out;
}

// Each rank's file holds its replica and exactly its share; the three shares laid back at their
// offsets, with each rank's replica, rebuild each rank's snapshot byte for byte.
TEST(PersistedShares, SharesReassembleTheSnapshots) {
  const std::vector<std::pair<size_t, size_t>> want = {{0, 6}, {6, 6}, {12, 7}};  // by hand, above
  std::vector<HandSnapshot> hand;
  std::vector<std::vector<std::byte>> files(3);
  std::vector<std::byte> assembled(19);
  uint64_t print = 0;
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    hand.push_back(LayOutByHand(r));
    ASSERT_EQ(hand[r].shared.size(), 19u);
    auto parsed = internal::ParseSnapshot(hand[r].bytes, "hand");
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    const uint64_t checksum = internal::Checksum(hand[r].bytes.data(), hand[r].bytes.size());
    print = internal::SharedFingerprint(*parsed, hand[r].shared);
    internal::ShareFile file;
    internal::MakeShare(hand[r].bytes, *parsed, checksum, print, r, 3, &file);
    for (const auto& piece : file.pieces) files[r].insert(files[r].end(), piece.begin(), piece.end());
    // Header, replica (directory 8 + 32 + 5 x 16 + 5 names + 4 metadata = 129, a and d 13, the
    // checksum 8), share.
    EXPECT_EQ(files[r].size(), kShareHeaderBytes + 150 + want[static_cast<size_t>(r)].second);
    auto share = internal::ParseShare(files[r], "file" + std::to_string(r));
    ASSERT_TRUE(share.ok()) << share.status().ToString();
    EXPECT_EQ(share->shared_bytes, 19);
    EXPECT_EQ(share->shared_print, print);
    EXPECT_EQ(share->parsed.snapshot_checksum, checksum);
    const auto from = hand[r].shared.begin() + static_cast<ptrdiff_t>(want[static_cast<size_t>(r)].first);
    const std::vector<std::byte> expected(from, from + static_cast<ptrdiff_t>(want[static_cast<size_t>(r)].second));
    EXPECT_EQ(std::vector<std::byte>(share->share.begin(), share->share.end()), expected);
    std::copy(share->share.begin(), share->share.end(), assembled.begin() + share->range.offset);
  }
  EXPECT_EQ(assembled, hand[0].shared);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    auto share = internal::ParseShare(files[r], "file" + std::to_string(r));
    ASSERT_TRUE(share.ok());
    EXPECT_EQ(internal::SharedFingerprint(share->parsed, assembled), print);
    auto rebuilt = internal::RebuildSnapshot(share->rank_part, share->parsed, assembled, "file");
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
    EXPECT_EQ(*rebuilt, hand[r].bytes);
  }
}

// Headers that do not describe the file are refused naming the file and the field; a file of
// format 1 (each rank's whole snapshot) is refused by name.
TEST(PersistedShares, ParseRefusesWhatIsNotAShare) {
  const HandSnapshot hand = LayOutByHand(1);
  auto parsed = internal::ParseSnapshot(hand.bytes, "hand");
  ASSERT_TRUE(parsed.ok());
  internal::ShareFile file;
  internal::MakeShare(hand.bytes, *parsed, 7, 9, 1, 3, &file);
  std::vector<std::byte> good;
  for (const auto& piece : file.pieces) good.insert(good.end(), piece.begin(), piece.end());
  auto message = [](std::span<const std::byte> payload) {
    auto got = internal::ParseShare(payload, "/ckpt/job-1-6.ckpt");
    return got.ok() ? std::string("ok") : got.status().message();
  };
  EXPECT_EQ(message(hand.bytes),
            "/ckpt/job-1-6.ckpt: magic: a whole snapshot of persisted format 1, which this version does not read; "
            "got 'CUPCKSN1', expected 'CUPCKPER' (format 3: each rank's share; restore with the Cupcake that wrote "
            "it, or remove the files to start afresh)");
  std::vector<std::byte> bad = good;
  bad[8] = std::byte{2};  // version
  EXPECT_EQ(message(bad),
            "/ckpt/job-1-6.ckpt: version: persisted format 2, which this version does not read; got 2, expected 3 "
            "(format 2 has another checksum function; restore with the Cupcake that wrote it, or remove the files "
            "to start afresh)");
  bad[8] = std::byte{4};
  EXPECT_EQ(message(bad),
            "/ckpt/job-1-6.ckpt: version: persisted format 4, which this version does not read; got 4, expected 3 "
            "(restore with the Cupcake that wrote it, or remove the files to start afresh)");
  bad = good;
  bad[40] = std::byte{5};  // share_offset: 5 where rank 1's share of 19 bytes among 3 begins at 6
  EXPECT_EQ(message(bad),
            "/ckpt/job-1-6.ckpt: share_offset, share_bytes: not rank 1's share; got [5, +6), expected [6, +6) of 19 "
            "bytes split among 3 ranks");
  bad = good;
  bad.pop_back();
  EXPECT_EQ(message(bad),
            "/ckpt/job-1-6.ckpt: rank_part_bytes, share_bytes: do not match the file; got 150 + 6, expected 155 (the "
            "bytes after the header)");
}

// Data parallelism on 3 ranks, persisted every 2 steps: each rank's file holds the header, its
// replica (the directory: 40 bytes, 16 per entry and the names 'weights', 'stats', 'raw': 103;
// the metadata "m4": 2; 'stats': 20; the snapshot's checksum: 8) and its third of the 1217 shared
// bytes ('weights' and 'raw': 405, 406, 406), then the trailer (24): where a whole snapshot is
// 1342 bytes. With every segment gone, the three shares restore step 4 bitwise.
TEST_F(CheckpointTest, PersistedFilesHoldOneShareOfTheSharedEntries) {
  hosts_ = {"a", "b", "c"};
  const CheckpointOptions options = PersistEveryTwoSteps(4);
  const std::vector<size_t> share = {405, 406, 406};
  for (int r = 0; r < 3; ++r) {
    const auto path = dir_ / (name_ + "-" + std::to_string(r) + "-4.ckpt");
    EXPECT_EQ(std::filesystem::file_size(path), kShareHeaderBytes + (103 + 2 + 20 + 8) + share[r] + 24) << path;
  }
  LoseEveryHostsMemory();
  Start(options, Scope::kShared);
  auto points = Restore();
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 4);
    EXPECT_EQ(points[static_cast<size_t>(r)]->metadata, "m4");
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(4, r));
    EXPECT_EQ(points[static_cast<size_t>(r)]->source, (dir_ / (name_ + "-" + std::to_string(r) + "-4.ckpt")).string() +
                                                          ", its shared entries from every rank's persisted share");
  }
}

// persist_chunk_bytes: while a session collective is in flight (the test holds the gate) no
// piece goes out and the persist of step 2 waits; once the network is idle the pieces go out,
// one per byte with 1-byte pieces: the two persists (steps 2 and 4) of the three shares of
// PersistedFilesHoldOneShareOfTheSharedEntries, whose files are unchanged and restore. The files
// go to tmpfs, where each piece's fdatasync costs nothing.
TEST_F(CheckpointTest, PersistPiecesGoOutOnlyWhileTheNetworkIsIdle) {
  hosts_ = {"a", "b", "c"};
  const CheckpointOptions options = StartPacedPersist(1);
  OnEveryRank(world_, [&](int r) {
    RankJob& job = jobs_[static_cast<size_t>(r)];
    ASSERT_TRUE(job.ckpt->WaitForCopy().ok());
    job.Fill(2, r);
    ASSERT_TRUE(job.ckpt->Commit(2, "m2").ok());
    ASSERT_TRUE(job.ckpt->WaitForCopy().ok());  // the copy is done; its persist has begun
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(gate_->idle_transfers(), 0);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(jobs_[static_cast<size_t>(r)].ckpt->persisted_step(), 0) << "rank " << r;
  gate_->LeaveCollective();
  Train(3, 4);
  const std::vector<int64_t> share = {405, 406, 406};
  int64_t bytes = 0;
  for (int r = 0; r < 3; ++r) {
    const int64_t body = static_cast<int64_t>(kShareHeaderBytes) + (103 + 2 + 20 + 8) + share[static_cast<size_t>(r)];
    const auto path = shm_files_ / (name_ + "-" + std::to_string(r) + "-4.ckpt");
    EXPECT_EQ(std::filesystem::file_size(path), static_cast<uintmax_t>(body + 24)) << path;
    bytes += body;
  }
  EXPECT_EQ(gate_->idle_transfers(), 2 * bytes);
  EXPECT_EQ(gate_->transfers(), 0);
  ExpectRestartAt(options, 4);
}

// The slot a persist reads is not written again until the persist has ended: step 2's persist,
// held at its first piece by a collective in flight, still reads its slot when commit(4)'s copy
// targets that slot (commit(3)'s took the other); that copy waits, so WaitForCopy does not
// return while the persist is held. Once released, step 2's file holds step 2: with step 4's
// files removed and every segment gone, the ranks restore step 2 bitwise.
TEST_F(CheckpointTest, ACopyWaitsForThePersistReadingItsSlot) {
  const CheckpointOptions options = StartPacedPersist(64);
  std::vector<std::atomic<bool>> committed(static_cast<size_t>(world_)), copied(static_cast<size_t>(world_));
  std::thread ranks([&] {
    OnEveryRank(world_, [&](int r) {
      RankJob& job = jobs_[static_cast<size_t>(r)];
      for (int64_t step = 2; step <= 4; ++step) {
        ASSERT_TRUE(job.ckpt->WaitForCopy().ok());
        job.Fill(step, r);
        ASSERT_TRUE(job.ckpt->Commit(step, "m" + std::to_string(step)).ok());
      }
      committed[static_cast<size_t>(r)] = true;
      ASSERT_TRUE(job.ckpt->WaitForCopy().ok());
      copied[static_cast<size_t>(r)] = true;
      ASSERT_TRUE(job.ckpt->WaitForPersist().ok());
    });
  });
  for (int r = 0; r < world_; ++r)
    while (!committed[static_cast<size_t>(r)]) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int r = 0; r < world_; ++r) EXPECT_FALSE(copied[static_cast<size_t>(r)]) << "rank " << r;
  EXPECT_EQ(gate_->idle_transfers(), 0);
  gate_->LeaveCollective();
  ranks.join();
  for (int r = 0; r < world_; ++r) {
    EXPECT_EQ(jobs_[static_cast<size_t>(r)].ckpt->persisted_step(), 4) << "rank " << r;
    std::filesystem::remove(shm_files_ / (name_ + "-" + std::to_string(r) + "-4.ckpt"));
  }
  ExpectRestartAt(options, 2);
}

// A piece never passes a collective that waits to enter: with an exchange in flight and a
// collective waiting for it, a piece asked for waits until that collective has entered and left.
TEST(NetworkGate, APieceWaitsForTheCollectivesAlreadyWaiting) {
  NetworkGate gate;
  std::atomic<int> order{0};
  int entered = 0, pieced = 0;
  gate.BeginTransfer();  // a replica exchange in flight
  std::thread collective([&] {
    gate.EnterCollective();
    entered = ++order;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gate.LeaveCollective();
  });
  while (gate.collectives_waited() == 0) std::this_thread::yield();  // the collective waits
  std::thread piece([&] {
    gate.BeginTransferWhenIdle();
    pieced = ++order;
    gate.EndTransfer();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(order.load(), 0);  // neither passes the exchange
  gate.EndTransfer();
  collective.join();
  piece.join();
  EXPECT_EQ(entered, 1);
  EXPECT_EQ(pieced, 2);
  EXPECT_EQ(gate.idle_transfers(), 1);
  EXPECT_EQ(gate.transfers(), 1);
}

// Rank 1's host lost, rank 0's memory intact: rank 1 rebuilds step 4 from its own file and the
// shared entries of rank 0's slot of step 4 (rank 0's slots hold 5 and 4).
TEST_F(CheckpointTest, PersistedShareAndAPeersMemoryRestoreALostHost) {
  const CheckpointOptions options = PersistEveryTwoSteps(5);
  jobs_.clear();
  ASSERT_TRUE(Checkpointer::RemoveSegment(name_, 1).ok());
  Start(options, Scope::kShared);
  auto points = Restore();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 4);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(4, r)) << "rank " << r;
  }
  EXPECT_EQ(points[0]->source.substr(0, Segment(0).size()), Segment(0));
  EXPECT_EQ(points[1]->source, (dir_ / (name_ + "-1-4.ckpt")).string() + ", its shared entries from rank 0");
}

// A share missing: the ranks restore the newest step whose shares are all there; with none left,
// every rank fails naming the missing file.
TEST_F(CheckpointTest, AMissingShareFailsNamingTheFile) {
  hosts_ = {"a", "b", "c"};
  const CheckpointOptions options = PersistEveryTwoSteps(4);
  LoseEveryHostsMemory();
  std::filesystem::remove(dir_ / (name_ + "-1-4.ckpt"));
  Start(options, Scope::kShared);
  for (const auto& point : Restore()) {
    ASSERT_TRUE(point.ok()) << point.status().ToString();
    EXPECT_EQ(point->step, 2);
  }
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(2, r)) << "rank " << r;
  std::filesystem::remove(dir_ / (name_ + "-1-2.ckpt"));
  Start(options, Scope::kShared);
  const auto failed = Restore();
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_FALSE(failed[static_cast<size_t>(r)].ok());
    EXPECT_EQ(failed[static_cast<size_t>(r)].status().message(),
              Segment(r) +
                  ": restore: no step is held by every rank; got rank 0 holds none (persisted shares of 2); rank 1 "
                  "holds none; rank 2 holds none (persisted shares of 2), expected a common step; step 2 lacks the "
                  "persisted share of rank 1 (" +
                  (dir_ / (name_ + "-1-2.ckpt")).string() +
                  ": missing or refused there) (snapshots refused on this rank: 0)");
  }
}

// A share whose bytes changed on disk is refused naming the file (its trailer's checksum); the
// ranks restore the step before, and with that share corrupt too every rank fails, naming it.
TEST_F(CheckpointTest, ACorruptShareIsRefusedNamingTheFile) {
  hosts_ = {"a", "b", "c"};
  const CheckpointOptions options = PersistEveryTwoSteps(4);
  LoseEveryHostsMemory();
  auto corrupt = [&](int64_t step) {
    const auto path = dir_ / (name_ + "-2-" + std::to_string(step) + ".ckpt");
    std::string file = ReadBytes(path);
    file[file.size() - sizeof(internal::Trailer) - 3] ^= 0x20;  // a byte of the share
    WriteBytes(path, file);
    return path.string();
  };
  const std::string four = corrupt(4);
  Start(options, Scope::kShared);
  auto points = Restore();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(points[static_cast<size_t>(r)].ok()) << points[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(points[static_cast<size_t>(r)]->step, 2);
    EXPECT_TRUE(jobs_[static_cast<size_t>(r)].Holds(2, r)) << "rank " << r;
  }
  ASSERT_EQ(points[2]->refused.size(), 1u);
  const std::string want = four + ": trailer.checksum: does not match the contents; got 0x";
  EXPECT_EQ(points[2]->refused[0].substr(0, want.size()), want) << points[2]->refused[0];
  const std::string two = corrupt(2);
  Start(options, Scope::kShared);
  const auto failed = Restore();
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_FALSE(failed[static_cast<size_t>(r)].ok());
    const std::string msg = failed[static_cast<size_t>(r)].status().message();
    EXPECT_NE(msg.find("expected a common step; step 2 lacks the persisted share of rank 2 (" + two +
                       ": missing or refused there)"),
              std::string::npos)
        << msg;
  }
  EXPECT_NE(failed[2].status().message().find("(snapshots refused on this rank: 1)\n" + two +
                                              ": trailer.checksum: does not match the contents"),
            std::string::npos)
      << failed[2].status().message();
}

// Shares that each verify but do not fit together (a file of another run sealed anew): every rank
// fails in Apply naming the shares, and nothing is written. Shares recording different shared
// entries (their fingerprints); then shares that record the same, whose bytes assembled do not.
TEST_F(CheckpointTest, SharesThatDoNotFitFailEveryRank) {
  const CheckpointOptions options = PersistEveryTwoSteps(2);
  LoseEveryHostsMemory();
  const auto path = dir_ / (name_ + "-1-2.ckpt");
  const std::string original = ReadBytes(path);
  auto restore_with = [&](size_t at, char flip) {
    std::string file = original;
    file[at] ^= flip;
    Reseal(&file);
    WriteBytes(path, file);
    Start(options, Scope::kShared);
    return Restore();
  };
  auto file = [&](int r) { return (dir_ / (name_ + "-" + std::to_string(r) + "-2.ckpt")).string(); };
  const auto prints = restore_with(56, 1);  // shared_print's first byte
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_FALSE(prints[static_cast<size_t>(r)].ok());
    const std::string msg = prints[static_cast<size_t>(r)].status().message();
    const std::string want = file(r) +
                             ": shared_bytes, shared_print: the ranks' shares of step 2 are not of the same shared "
                             "entries; got 1217 bytes 0x";
    EXPECT_EQ(msg.substr(0, want.size()), want);
    EXPECT_NE(msg.find(" (" + file(0) + "), 1217 bytes 0x"), std::string::npos) << msg;
    EXPECT_NE(msg.find(" (" + file(1) + "), expected the same on every rank"), std::string::npos) << msg;
    EXPECT_EQ(jobs_[static_cast<size_t>(r)].weights, std::vector<float>(300, 0.0f));
  }
  // A job that could not prepare its entries (Find gave it no metadata) still gets the shares'
  // error from Apply, not its own.
  Start(options, Scope::kShared);
  std::vector<Status> applied(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    Checkpointer& c = *jobs_[static_cast<size_t>(r)].ckpt;
    auto point = c.Find();
    ASSERT_TRUE(point.ok()) << point.status().ToString();
    EXPECT_EQ(point->step, 2);
    EXPECT_EQ(point->metadata, "");
    applied[static_cast<size_t>(r)] = c.Apply(InvalidArgumentError("job: metadata: not JSON"));
  });
  for (int r = 0; r < kWorld; ++r) {
    const std::string want = file(r) + ": shared_bytes, shared_print: the ranks' shares of step 2";
    EXPECT_EQ(applied[static_cast<size_t>(r)].message().substr(0, want.size()), want)
        << applied[static_cast<size_t>(r)].message();
  }
  const auto bytes = restore_with(original.size() - sizeof(internal::Trailer) - 1, 1);  // the share's last byte
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_FALSE(bytes[static_cast<size_t>(r)].ok());
    const std::string msg = bytes[static_cast<size_t>(r)].status().message();
    EXPECT_EQ(msg.substr(0, msg.find(" do not match it;")),
              file(r) + ": shared_print: the shared entries assembled from the ranks' shares of step 2")
        << msg;
    EXPECT_NE(msg.find("(the shares: " + file(0) + ", " + file(1) + ")"), std::string::npos) << msg;
    EXPECT_EQ(jobs_[static_cast<size_t>(r)].weights, std::vector<float>(300, 0.0f));
  }
}

// Shares persisted by 2 ranks fit only a world of 2: a restore on 3 ranks fails on every rank
// (ranks 0 and 1 naming their files) instead of starting afresh, which would drop them. So does
// a file of persisted format 1 (a rank's whole snapshot).
TEST_F(CheckpointTest, SharesOfAnotherWorldOrFormatAreRefused) {
  const CheckpointOptions options = PersistEveryTwoSteps(2);
  std::string whole;  // rank 0's snapshot of step 2 as format 1 wrote it: the payload, a trailer
  {
    auto m = Map(0);
    const internal::SlotHeader& slot = m->header().slots[m->Newest()];
    ASSERT_EQ(slot.step, 2);
    whole.assign(reinterpret_cast<const char*>(m->slot(m->Newest())), slot.payload_bytes);  // NOLINT: bytes
    internal::Trailer t{slot.checksum, slot.payload_bytes, {}};
    std::memcpy(t.magic, internal::kTrailerMagic, 8);
    whole.append(reinterpret_cast<const char*>(&t), sizeof(t));  // NOLINT: bytes
  }
  LoseEveryHostsMemory();
  hosts_ = {"a", "b", "c"};
  Start(options, Scope::kShared);
  auto points = Restore();
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_FALSE(points[static_cast<size_t>(r)].ok());
    const std::string file = (dir_ / (name_ + "-" + std::to_string(r) + "-2.ckpt")).string();
    EXPECT_EQ(points[static_cast<size_t>(r)].status().message(),
              r == 2 ? Segment(2) + ": restore: failed on rank 0 (see its message)"
                     : file + ": world_size: written by a job of another world size; got rank " + std::to_string(r) +
                           " of 2, expected rank " + std::to_string(r) +
                           " of 3 (the ranks' shares fit only the world that wrote them: restore with 2 ranks, or "
                           "remove the files to start afresh)");
  }
  EXPECT_TRUE(std::filesystem::exists(dir_ / (name_ + "-0-2.ckpt")));
  hosts_ = {};
  WriteBytes(dir_ / (name_ + "-0-2.ckpt"), whole);
  Start(options, Scope::kShared);
  points = Restore();
  ASSERT_FALSE(points[0].ok());
  EXPECT_EQ(points[0].status().message(),
            (dir_ / (name_ + "-0-2.ckpt")).string() +
                ": magic: a whole snapshot of persisted format 1, which this version does not read; got 'CUPCKSN1', "
                "expected 'CUPCKPER' (format 3: each rank's share; restore with the Cupcake that wrote it, or remove "
                "the files to start afresh)");
  ASSERT_FALSE(points[1].ok());
  EXPECT_EQ(points[1].status().message(), Segment(1) + ": restore: failed on rank 0 (see its message)");
  // A share of format 2 (its trailer's checksum from format 2's function, which a restore cannot
  // verify): refused by its version before the checksum.
  std::string share = ReadBytes(dir_ / (name_ + "-1-2.ckpt"));
  share[8] = 2;  // ShareHeader.version
  WriteBytes(dir_ / (name_ + "-1-2.ckpt"), share);
  Start(options, Scope::kShared);
  points = Restore();
  ASSERT_FALSE(points[1].ok());
  EXPECT_EQ(points[1].status().message(),
            (dir_ / (name_ + "-1-2.ckpt")).string() +
                ": version: persisted format 2, which this version does not read; got 2, expected 3 (format 2 has "
                "another checksum function; restore with the Cupcake that wrote it, or remove the files to start "
                "afresh)");
}

// The session's residuals are this rank's own state: written into the snapshot at commit and
// back into a new session's memory by the restore.
TEST_F(CheckpointTest, SessionErrorFeedbackIsPartOfTheSnapshot) {
  const pb::Model model = testing::SmallModel();
  const pb::Plan plan = testing::MakePlan(model, testing::Planned(), "topk", kWorld);
  int64_t elements = 0;
  for (const auto& t : model.tensors()) elements += t.numel();
  auto residual = [&](int64_t step, int r) {
    std::vector<float> v(static_cast<size_t>(elements));
    for (int64_t e = 0; e < elements; ++e) v[static_cast<size_t>(e)] = Value(step, r, e) * 1e-3f;
    return v;
  };
  CheckpointOptions options;
  options.name = name_;
  for (int64_t run = 0; run < 2; ++run) {
    comm::InProcessGroup group(kWorld);
    auto sessions = testing::CreateOnEveryRank(
        group, kWorld, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
    comm::InProcessGroup ckpt_group(kWorld);
    OnEveryRank(kWorld, [&](int r) {
      ASSERT_TRUE(sessions[static_cast<size_t>(r)].ok());
      Session& s = **sessions[static_cast<size_t>(r)];
      auto comm = ckpt_group.Rank(r);
      auto ckpt = Checkpointer::Create(options, comm.get()).value();
      ASSERT_TRUE(ckpt->AttachSession(&s).ok());
      if (run == 0) {
        ASSERT_TRUE(s.WriteState(residual(1, r)).ok());
        ASSERT_TRUE(ckpt->Commit(1).ok());
        ASSERT_TRUE(ckpt->WaitForCopy().ok());
      } else {
        auto point = ckpt->Restore();
        ASSERT_TRUE(point.ok()) << point.status().ToString();
        EXPECT_EQ(point->step, 1);
        // Each plane's floats, none for the momentum topk does not keep.
        const std::vector<std::pair<std::string, int64_t>> entries = {
            {"session.error_feedback", 4 * elements}, {"session.momentum", 0}, {"session.iteration", 8}};
        EXPECT_EQ(point->entries, entries);
        EXPECT_EQ(s.ReadState().value(), residual(1, r));
      }
    });
  }
}

// A restored session continues the lost run bitwise: its state and its iteration counter (which
// keys randk's shared random indices) are in the snapshot. Run 0 runs iterations 0..3,
// committing step it + 1 after each; run 1 restores step 3 into new sessions and runs iteration
// 3, whose gradients on every rank must be the uninterrupted run's. Plans: randk and topk
// (residuals); a session of an fp32 plan and a topk one added, switched to topk before run 0
// (the restore makes topk active again: "session.plan"; its residuals would be lost in the fp32
// plan, which keeps none); PowerSGD per tensor and batched (its error feedback over the
// elements, the padding's and the warm-started Q, the runner's own); and PowerSGD per tensor and
// batched replicated with rank 1's host lost: Commit(3) sent step 2, so rank 1 restores step 2
// from rank 0's replica of its memory and rank 0's Q and padding (kShared), and the snapshot so
// rebuilt matches rank 1's own checksum only when those are bitwise the same on both ranks.
// PowerSGD's entries, from
// ShapedModel at rank 2 (kernels/powersgd.h): per tensor no padding (the memory is the 534
// elements', in session.error_feedback) and Q 12 x 2 + 9 x 2 + 10 x 2 = 62 floats (tensors 0, 2
// and 5 compressed); batched, the groups of 197, 72 and 265 elements padded to 15^2, 9^2 and
// 17^2: 28 + 9 + 24 = 61 floats of padding, and Q 15 x 2 + 9 x 2 + 17 x 2 = 82 floats.
TEST_F(CheckpointTest, RestoredSessionContinuesBitwise) {
  struct Case {
    std::string name;
    pb::Plan plan;
    int64_t padding_floats = 0, q_floats = 0;  // PowerSGD's entries; 0: none
    bool lose_rank1 = false;
    std::vector<pb::Plan> added = {};  // AddPlan'd; run 0 switches to the last
  };
  const pb::Model small = testing::SmallModel(), shaped = testing::ShapedModel();
  const pb::Plan powersgd = testing::PowerSgdPlan(shaped, testing::Planned(), kWorld, "powersgd");
  const std::vector<Case> cases = {
      {"randk", testing::MakePlan(small, testing::Planned(), "randk", kWorld)},
      {"topk", testing::MakePlan(small, testing::Planned(), "topk", kWorld)},
      {"switched", testing::MakePlan(small, testing::OneGroup(small), "fp32", kWorld), 0, 0, false,
       {testing::MakePlan(small, testing::Planned(), "topk", kWorld)}},
      {"powersgd", powersgd, 0, 62},
      {"powersgd_batched", testing::PowerSgdPlan(shaped, testing::Planned(), kWorld, "powersgd_batched"), 61, 82},
      {"powersgd-replica", powersgd, 0, 62, /*lose_rank1=*/true},
      {"powersgd_batched-replica", testing::PowerSgdPlan(shaped, testing::Planned(), kWorld, "powersgd_batched"), 61,
       82, /*lose_rank1=*/true},
  };
  constexpr int kLast = 3;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const pb::Model& model = c.plan.model().model();
    CheckpointOptions options;
    options.name = name_ + "-" + c.name;
    options.replicate = c.lose_rank1;
    const int64_t restored = c.lose_rank1 ? 2 : 3;
    std::vector<std::vector<std::vector<float>>> want(kWorld);
    for (int run = 0; run < 2; ++run) {
      if (run == 1 && c.lose_rank1) {
        ASSERT_TRUE(Checkpointer::RemoveSegment(options.name, 1).ok());
      }
      comm::InProcessGroup group(kWorld), ckpt_group(kWorld);
      auto sessions = testing::CreateOnEveryRank(group, kWorld, [&](int, std::unique_ptr<comm::Communicator> comm) {
        return Session::Create(c.plan, std::move(comm));
      });
      OnEveryRank(kWorld, [&](int r) {
        ASSERT_TRUE(sessions[static_cast<size_t>(r)].ok()) << sessions[static_cast<size_t>(r)].status().ToString();
        Session& s = **sessions[static_cast<size_t>(r)];
        testing::Gradients grads(model, testing::Layout::kSeparate);
        ASSERT_TRUE(testing::RegisterAll(s, model, grads).ok());
        for (const pb::Plan& added : c.added) ASSERT_TRUE(s.AddPlan(added).ok());
        const int active = static_cast<int>(c.added.size());
        if (run == 0 && active > 0) {
          ASSERT_TRUE(s.SwitchPlan(active).ok());
        }
        auto comm = ckpt_group.Rank(r);
        auto ckpt = Checkpointer::Create(options, comm.get()).value();
        ASSERT_TRUE(ckpt->AttachSession(&s).ok());
        int64_t first = 0;
        if (run == 1) {
          auto point = ckpt->Restore();
          ASSERT_TRUE(point.ok()) << point.status().ToString();
          ASSERT_EQ(point->step, restored);
          EXPECT_EQ(s.iteration(), static_cast<uint64_t>(restored));
          EXPECT_EQ(s.active_plan(), active);
          std::map<std::string, int64_t> sizes(point->entries.begin(), point->entries.end());
          EXPECT_EQ(sizes.count("session.plan"), c.added.empty() ? 0u : 1u);
          if (!c.added.empty()) {
            EXPECT_EQ(sizes["session.plan"], 8);  // the index, a double
          }
          EXPECT_EQ(sizes.count("session.powersgd.padding"), c.padding_floats > 0 ? 1u : 0u);
          EXPECT_EQ(sizes.count("session.powersgd.q"), c.q_floats > 0 ? 1u : 0u);
          if (c.padding_floats > 0) {
            EXPECT_EQ(sizes["session.powersgd.padding"], 4 * c.padding_floats);
          }
          if (c.q_floats > 0) {
            EXPECT_EQ(sizes["session.powersgd.q"], 4 * c.q_floats);
          }
          first = restored;
        }
        for (int64_t it = first; it <= kLast; ++it) {
          testing::FillGradients(grads, r, static_cast<int>(it));
          for (int i = 0; i < static_cast<int>(grads.size()); ++i) ASSERT_TRUE(s.GradientReady(i).ok());
          ASSERT_TRUE(s.Synchronize().ok());
          if (run == 0 && it < kLast) {
            Status committed = ckpt->Commit(it + 1);
            ASSERT_TRUE(committed.ok()) << committed.ToString();
            ASSERT_TRUE(ckpt->WaitForCopy().ok());
          }
        }
        std::vector<std::vector<float>> got;
        for (auto g : grads) got.emplace_back(g.begin(), g.end());
        if (run == 0)
          want[static_cast<size_t>(r)] = got;
        else
          EXPECT_EQ(testing::FirstDifference(grads, want[static_cast<size_t>(r)]), "") << "rank " << r;
      });
    }
    for (int r = 0; r < kWorld; ++r) EXPECT_TRUE(Checkpointer::RemoveSegment(options.name, r).ok());
  }
}

// One rank's network as the test sees it: which collectives are in flight on the session's
// communicator and on the checkpointer's (and every communicator split off them); the allgathers
// and alltoallvs on communicators split off the checkpointer's (its replica exchanges').
struct NetworkTracker {
  std::atomic<int> session{0}, checkpoint{0};
  std::atomic<int64_t> overlaps{0}, checkpoint_calls{0};
  std::atomic<int64_t> replica_allgathers{0}, replica_alltoallvs{0};
};

// Forwards to `inner`, counting its collectives on `tracker` as the session's or the
// checkpointer's; a collective that starts while one of the other side is in flight is an overlap.
class TrackedCommunicator final : public comm::Communicator {
 public:
  TrackedCommunicator(std::unique_ptr<comm::Communicator> inner, NetworkTracker* tracker, bool checkpoint,
                      bool split = false)
      : inner_(std::move(inner)), tracker_(tracker), checkpoint_(checkpoint), split_(checkpoint && split) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& host() const override { return inner_->host(); }
  std::string library() const override { return inner_->library(); }
  Status Barrier() override {
    return Track([&] { return inner_->Barrier(); });
  }
  Status Broadcast(void* buf, int64_t bytes, int root) override {
    return Track([&] { return inner_->Broadcast(buf, bytes, root); });
  }
  Status Allreduce(const void* send, void* recv, int64_t count, comm::DataType type, comm::ReduceOp op) override {
    return Track([&] { return inner_->Allreduce(send, recv, count, type, op); });
  }
  Status Allgather(const void* send, void* recv, int64_t bytes_per_rank) override {
    if (split_) ++tracker_->replica_allgathers;
    return Track([&] { return inner_->Allgather(send, recv, bytes_per_rank); });
  }
  Status ReduceScatter(const void* send, void* recv, int64_t count, comm::DataType type, comm::ReduceOp op) override {
    return Track([&] { return inner_->ReduceScatter(send, recv, count, type, op); });
  }
  Status Alltoall(const void* send, void* recv, int64_t bytes_per_rank) override {
    return Track([&] { return inner_->Alltoall(send, recv, bytes_per_rank); });
  }
  Status Alltoallv(const void* send, std::span<const int64_t> send_bytes, void* recv,
                   std::span<const int64_t> recv_bytes) override {
    if (split_) ++tracker_->replica_alltoallvs;
    return Track([&] { return inner_->Alltoallv(send, send_bytes, recv, recv_bytes); });
  }
  StatusOr<std::unique_ptr<comm::Communicator>> Split(int color, int key) override {
    auto split = inner_->Split(color, key);
    if (!split.ok() || *split == nullptr) return split;
    return std::unique_ptr<comm::Communicator>(
        std::make_unique<TrackedCommunicator>(std::move(split).value(), tracker_, checkpoint_, /*split=*/true));
  }
  void Abort(const std::string& reason) override { inner_->Abort(reason); }

 private:
  template <typename F>
  Status Track(F&& call) {
    std::atomic<int>& mine = checkpoint_ ? tracker_->checkpoint : tracker_->session;
    std::atomic<int>& other = checkpoint_ ? tracker_->session : tracker_->checkpoint;
    ++mine;
    if (other.load() > 0) ++tracker_->overlaps;
    if (checkpoint_) ++tracker_->checkpoint_calls;
    Status s = call();
    --mine;
    return s;
  }
  std::unique_ptr<comm::Communicator> inner_;
  NetworkTracker* tracker_;
  bool checkpoint_, split_;
};

// A topk session's residuals replicated in chunks between its collectives (options: the
// chunks; name and gate set here), killed after 8 commits, rank 1's host lost, restarted: the
// restart must restore `restored` (rank 1 from rank 0's replica and rank 0's weights) and run on
// to iteration 9, whose gradients on every rank must be bitwise the uninterrupted 10-iteration
// run's, and each rank's replicated_step() at the crash must be `restored`. The snapshot: a
// 'weights' entry of 1e6 floats, the same on every rank (kShared), and
// the session's state (SmallModel: 435 elements), whose momentum topk does not keep (an empty
// entry, shared). The snapshot is 4001914 bytes: the directory (40, 16 per entry, the names
// 'weights', 'session.error_feedback', 'session.momentum', 'session.iteration': 166) + 4000000 +
// 1740 + 8. Its replica is 1922 bytes: the directory, the residual (1740), the iteration (8)
// and the snapshot's checksum (8). Per rank: `transfers` adds the gate's transfers, `during` its
// transfers_during_collectives, `skipped` the checkpointer's replica_gaps_skipped; `trackers`
// count both sides' collectives. With `idle_gaps` the job makes each group's gradients ready
// only once the gap before it has been requested (the gate's transfers grew; from the first
// Commit of a run on, where options.replica_gaps has a gap after the previous group), so that
// gap's network is idle there (no collective of the next group waits), as in a job whose
// backward outlasts its collectives. Without it the job holds the gate (a transfer of its own)
// until every group is encoded, so after each group's collective but the last the next one is
// already waiting, on every rank (a job running behind its plan).
void RunSessionReplicas(const std::string& name, CheckpointOptions options, int64_t restored,
                        std::array<NetworkTracker, kWorld>& trackers, std::vector<int64_t>& transfers,
                        std::vector<int64_t>& during, bool idle_gaps = true, std::vector<int64_t>* skipped = nullptr) {
  const pb::Model model = testing::SmallModel();
  const pb::Plan plan = testing::MakePlan(model, testing::Planned(), "topk", kWorld);
  constexpr int kIterations = 10, kCrashAfter = 8;
  std::vector<std::vector<std::vector<float>>> want(kWorld);
  transfers.assign(kWorld, 0);
  during.assign(kWorld, 0);
  options.name = name;
  options.replicate = true;
  // run 0: uninterrupted, no checkpointer; run 1: checkpoints every iteration until the crash;
  // run 2: rank 1's segments gone, restore, the rest.
  for (int run = 0; run < 3; ++run) {
    if (run == 2) {
      auto replica = MapSegment(Checkpointer::ReplicaOfSegmentName(name, 0, 1));
      const internal::SlotHeader& newest = replica->header().slots[replica->Newest()];
      EXPECT_EQ(newest.state, internal::kSlotValid);
      EXPECT_EQ(newest.step, restored);
      EXPECT_EQ(newest.payload_bytes, 166u + 1740 + 8 + 8);
      ASSERT_TRUE(Checkpointer::RemoveSegment(name, 1).ok());
    }
    comm::InProcessGroup group(kWorld), ckpt_group(kWorld);
    std::vector<std::shared_ptr<NetworkGate>> gates;
    for (int r = 0; r < kWorld; ++r) gates.push_back(std::make_shared<NetworkGate>());
    auto sessions = testing::CreateOnEveryRank(group, kWorld, [&](int r, std::unique_ptr<comm::Communicator> c) {
      auto tracked = std::make_unique<TrackedCommunicator>(std::move(c), &trackers[static_cast<size_t>(r)], false);
      return Session::Create(plan, GateCommunicator(gates[static_cast<size_t>(r)], std::move(tracked)));
    });
    OnEveryRank(kWorld, [&](int r) {
      ASSERT_TRUE(sessions[static_cast<size_t>(r)].ok()) << sessions[static_cast<size_t>(r)].status().ToString();
      Session& s = **sessions[static_cast<size_t>(r)];
      testing::Gradients grads(model, testing::Layout::kSeparate);
      ASSERT_TRUE(testing::RegisterAll(s, model, grads).ok());
      std::vector<float> weights(1'000'000);
      std::unique_ptr<comm::Communicator> comm =
          std::make_unique<TrackedCommunicator>(ckpt_group.Rank(r), &trackers[static_cast<size_t>(r)], true);
      CheckpointOptions o = options;
      o.gate = gates[static_cast<size_t>(r)];
      std::unique_ptr<Checkpointer> ckpt;
      int first = 0, last = kIterations - 1;
      if (run > 0) {
        ckpt = Checkpointer::Create(o, comm.get()).value();
        ASSERT_TRUE(ckpt->AddFloats("weights", weights, Capture::kInBackground, Scope::kShared).ok());
        ASSERT_TRUE(ckpt->AttachSession(&s).ok());
        auto point = ckpt->Restore();
        ASSERT_TRUE(point.ok()) << point.status().ToString();
        if (run == 1) {
          ASSERT_EQ(point->step, 0);
          last = kCrashAfter - 1;
        } else {
          ASSERT_EQ(point->step, restored);
          EXPECT_EQ(weights, std::vector<float>(weights.size(), static_cast<float>(restored)));
          if (r == 1) {
            EXPECT_EQ(point->source, "rank 0's /dev/shm" + Checkpointer::ReplicaOfSegmentName(name, 0, 1) +
                                         ", its shared entries from rank 0");
          }
          first = static_cast<int>(restored);
        }
      }
      const auto gap_after = [&](int after) {
        return std::ranges::any_of(o.replica_gaps, [&](const ReplicaGap& g) { return g.after_group == after; });
      };
      NetworkGate& gate = *gates[static_cast<size_t>(r)];
      for (int it = first; it <= last; ++it) {
        testing::FillGradients(grads, r, it);
        if (!idle_gaps) gate.BeginTransfer();
        const bool paced = idle_gaps && ckpt != nullptr && it > first;  // the gaps armed by a Commit
        ASSERT_TRUE(testing::ReadyGroupByGroup(s, plan, paced ? ckpt.get() : nullptr, gap_after).ok());
        if (!idle_gaps) gate.EndTransfer();
        ASSERT_TRUE(s.Synchronize().ok());
        if (ckpt == nullptr) continue;
        ASSERT_TRUE(ckpt->WaitForCopy().ok());  // the job's contract before it writes `weights`
        std::fill(weights.begin(), weights.end(), static_cast<float>(it + 1));
        Status c = ckpt->Commit(it + 1);
        ASSERT_TRUE(c.ok()) << c.ToString();
      }
      if (ckpt != nullptr) {
        ASSERT_TRUE(ckpt->WaitForPersist().ok());  // the exchanges too
        // At the crash: the newest replica sent in full, the step the restart takes.
        if (run == 1) {
          EXPECT_EQ(ckpt->replicated_step(), restored) << "rank " << r;
        }
      }
      transfers[static_cast<size_t>(r)] += gates[static_cast<size_t>(r)]->transfers();
      if (skipped != nullptr && ckpt != nullptr) (*skipped)[static_cast<size_t>(r)] += ckpt->replica_gaps_skipped();
      during[static_cast<size_t>(r)] += gates[static_cast<size_t>(r)]->transfers_during_collectives();
      if (run == 0) {
        for (auto g : grads) want[static_cast<size_t>(r)].emplace_back(g.begin(), g.end());
      }
      if (run == 2) {
        EXPECT_EQ(testing::FirstDifference(grads, want[static_cast<size_t>(r)]), "") << "rank " << r;
      }
    });
  }
}

// Chunks of 700 bytes, one per Commit: 3 per replica. A run of 8 iterations commits 1..8: the
// replicas complete step 1 at Commit 4 and step 4 at Commit 7 (as in
// ReplicaAssembledFromChunksRestoresALostHost), so the restart restores 4.
// No collective of the checkpointer (agreement or replica exchange) ever runs while one of the
// session's does, on either rank (count, not time); without the gate they do (checked by hand:
// options.gate = nullptr and the session's communicator not gated make `overlaps` > 0).
TEST_F(CheckpointTest, ChunkedReplicaOfASessionRestoresBitwiseBetweenItsCollectives) {
  std::array<NetworkTracker, kWorld> trackers;
  std::vector<int64_t> transfers, during;
  CheckpointOptions options;
  options.replica_chunk_bytes = 700;
  RunSessionReplicas(name_, options, 4, trackers, transfers, during);
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // Run 1 committed 8 times, run 2 6 times: one exchange per Commit.
    EXPECT_EQ(transfers[static_cast<size_t>(r)], 8 + 6);
    EXPECT_GT(trackers[static_cast<size_t>(r)].checkpoint_calls.load(), 2 * (8 + 6));
    EXPECT_EQ(trackers[static_cast<size_t>(r)].overlaps.load(), 0);
    EXPECT_EQ(during[static_cast<size_t>(r)], 0);
  }
}

// The same job with its replica in the idle gaps of the plan (Planned(): groups 0, 1 and 2), 300
// bytes in each: before the first collective (Commit's) and after each group's. A replica of
// 1922 bytes then takes 7 chunks, 4 per iteration: Commit(s) starts step s - 1's stream (300),
// iteration s's gaps add 900, Commit(s + 1) 300, and iteration s + 1's gap after group 1 ends it
// (1800 + 122): every 2 commits, where one chunk of 300 per commit takes 7. Commits 2, 4, 6, 8
// start steps 1, 3, 5, 7; step 5's replica completes in iteration 7, step 7's is 300 bytes in
// when the job is killed: the restart restores 5 (with 300 per Commit: step 1, sent by Commits 2
// to 8). Exchanges (the gate's transfers): one per Commit, and one per gap after a group from the
// step after the first Commit on while a stream has bytes left (run 1: 8 + 7 x 3 less iteration
// 1's 3 gaps, after Commit 1's empty streams, and the last gap of iterations 3, 5 and 7, after
// the stream ended in the gap before; run 2, commits 6..10: 5 + 4 x 3 less iteration 6's 3, after
// Commit 6's empty streams, and iteration 8's last). None of them ran beside a session
// collective. Fails without the session's hook (the gaps after groups send nothing: step 1 at
// best).
TEST_F(CheckpointTest, ReplicaInTheGapsBetweenCollectivesCompletesInFewerCommits) {
  std::array<NetworkTracker, kWorld> trackers;
  std::vector<int64_t> transfers, during;
  CheckpointOptions gaps;
  gaps.replica_gaps = {{-1, 300}, {0, 300}, {1, 300}, {2, 300}};
  RunSessionReplicas(name_, gaps, 5, trackers, transfers, during);
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(transfers[static_cast<size_t>(r)], (8 + 7 * 3 - 6) + (5 + 4 * 3 - 4));
    EXPECT_EQ(trackers[static_cast<size_t>(r)].overlaps.load(), 0);
    EXPECT_EQ(during[static_cast<size_t>(r)], 0);
  }
  // A job behind its plan: the gaps after groups 0 and 1 (whose next collective waits) carry no
  // chunk, so a replica takes Commit's 300 bytes and the last gap's 300 per iteration, 4 commits:
  // Commit 2 starts step 1's, Commit 5 completes it, Commit 6 starts step 5's, still partial at the
  // crash, and the restart restores step 1.
  std::array<NetworkTracker, kWorld> behind_trackers;
  std::vector<int64_t> skipped(kWorld, 0);
  const std::string behind = name_ + "-behind";
  RunSessionReplicas(behind, gaps, 1, behind_trackers, transfers, during, /*idle_gaps=*/false, &skipped);
  for (int r = 0; r < kWorld; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    // Skipped: two gaps in each iteration while a stream has bytes left (with none left the gaps
    // make no exchange): run 1's iterations 2-4 and 6-7 (streams from Commits 2 and 6), run 2's
    // 3-5 and 7-9 (streams from Commits 3 and 7: its first Commit's streams are empty, as the
    // restored step is not among its own snapshots).
    EXPECT_EQ(skipped[static_cast<size_t>(r)], 2 * 5 + 2 * 6);
    // Of those, the agreement ran (an allgather, no alltoallv) in the gap's first request with
    // bytes left and then after each rest (1, then 3 requests, with or without bytes left): run
    // 1's iterations 2 and 4, run 2's 3, 5 and 9; 2 x 5 in all. The other exchanges make both
    // collectives: the gap after group 2 (run 1: 5, run 2: 6) and every Commit's (8 and 9), but
    // for each run's first Commit, whose streams are empty: an allgather alone.
    const NetworkTracker& t = behind_trackers[static_cast<size_t>(r)];
    EXPECT_EQ(t.replica_allgathers.load(), 2 * 5 + (5 + 6) + (8 + 9));
    EXPECT_EQ(t.replica_alltoallvs.load(), (5 + 6) + (8 + 9) - 2);
    EXPECT_EQ(behind_trackers[static_cast<size_t>(r)].overlaps.load(), 0);
    EXPECT_TRUE(Checkpointer::RemoveSegment(behind, r).ok());
  }
  // The same job behind its plan with replica_max_commits 3: a stream's third Commit sends all it
  // has left, so Commit 4 completes step 1's replica (Commit 5 without the bound: 300 bytes short)
  // and Commit 7 step 4's (Commit 5 starts it); the restart restores 4. Run 2's streams start at
  // Commits 6 and 9 (Commit 5's are empty, after the restore): step 5's completes at Commit 8.
  std::array<NetworkTracker, kWorld> bounded_trackers;
  CheckpointOptions bounded = gaps;
  bounded.replica_max_commits = 3;
  const std::string bounded_name = name_ + "-bounded";
  RunSessionReplicas(bounded_name, bounded, 4, bounded_trackers, transfers, during, /*idle_gaps=*/false);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(bounded_trackers[static_cast<size_t>(r)].overlaps.load(), 0) << "rank " << r;
    EXPECT_TRUE(Checkpointer::RemoveSegment(bounded_name, r).ok());
  }
  // One chunk of 300 bytes per Commit: 7 commits per replica.
  std::array<NetworkTracker, kWorld> per_commit_trackers;
  CheckpointOptions per_commit;
  per_commit.replica_chunk_bytes = 300;
  const std::string name = name_ + "-per-commit";
  RunSessionReplicas(name, per_commit, 1, per_commit_trackers, transfers, during);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(transfers[static_cast<size_t>(r)], 8 + 9) << "rank " << r;
    EXPECT_TRUE(Checkpointer::RemoveSegment(name, r).ok());
  }
}

// The gaps are the plan's that is active at AttachSession (plan 0: Planned(), 3 groups). With
// plan 1 active (one group) no gap is used: the session's hook requests nothing and Commit sends
// replica_chunk_bytes (0: the whole replica), so each Commit(s) completes step s - 1's replica:
// after commits 1..3 the newest is 2, with one transfer per Commit. Back on plan 0 the gaps are
// used again: commits 4 and 5 and the 3 gaps of iteration 4 (in iteration 3's, every stream had
// ended at Commit 3, so they make no exchange).
TEST_F(CheckpointTest, ReplicaGapsApplyOnlyWhileTheirPlanIsActive) {
  const pb::Model model = testing::SmallModel();
  const pb::Plan plan = testing::MakePlan(model, testing::Planned(), "topk", kWorld);
  const pb::Plan one_group = testing::MakePlan(model, testing::OneGroup(model), "topk", kWorld);
  comm::InProcessGroup group(kWorld), ckpt_group(kWorld);
  std::vector<std::shared_ptr<NetworkGate>> gates;
  for (int r = 0; r < kWorld; ++r) gates.push_back(std::make_shared<NetworkGate>());
  auto sessions = testing::CreateOnEveryRank(group, kWorld, [&](int r, std::unique_ptr<comm::Communicator> c) {
    return Session::Create(plan, GateCommunicator(gates[static_cast<size_t>(r)], std::move(c)));
  });
  std::vector<int64_t> transfers(kWorld, 0);
  OnEveryRank(kWorld, [&](int r) {
    ASSERT_TRUE(sessions[static_cast<size_t>(r)].ok());
    Session& s = **sessions[static_cast<size_t>(r)];
    testing::Gradients grads(model, testing::Layout::kSeparate);
    ASSERT_TRUE(testing::RegisterAll(s, model, grads).ok());
    ASSERT_TRUE(s.AddPlan(one_group).ok());
    auto comm = ckpt_group.Rank(r);
    CheckpointOptions o;
    o.name = name_;
    o.replicate = true;
    o.replica_gaps = {{-1, 300}, {0, 300}, {1, 300}, {2, 300}};
    o.gate = gates[static_cast<size_t>(r)];
    auto ckpt = Checkpointer::Create(o, comm.get()).value();
    ASSERT_TRUE(ckpt->AttachSession(&s).ok());
    auto steps = [&](int first, int last) {
      for (int it = first; it <= last; ++it) {
        testing::FillGradients(grads, r, it);
        for (int i = 0; i < static_cast<int>(grads.size()); ++i) ASSERT_TRUE(s.GradientReady(i).ok());
        ASSERT_TRUE(s.Synchronize().ok());
        Status c = ckpt->Commit(it + 1);
        ASSERT_TRUE(c.ok()) << c.ToString();
      }
      ASSERT_TRUE(ckpt->WaitForCopy().ok());
    };
    ASSERT_TRUE(s.SwitchPlan(1).ok());
    steps(0, 2);
    transfers[static_cast<size_t>(r)] = gates[static_cast<size_t>(r)]->transfers();
    EXPECT_EQ(transfers[static_cast<size_t>(r)], 3) << "rank " << r;
    ASSERT_TRUE(s.SwitchPlan(0).ok());
    steps(3, 4);
    EXPECT_EQ(gates[static_cast<size_t>(r)]->transfers(), 3 + 2 + 3) << "rank " << r;
    EXPECT_EQ(gates[static_cast<size_t>(r)]->transfers_during_collectives(), 0) << "rank " << r;
  });
  // Rank 0 keeps rank 1's replicas: step 2's, whole, complete at Commit 3 (step 3's, 300 bytes
  // per Commit and gap on plan 0, is still partial).
  auto replica = MapSegment(Checkpointer::ReplicaOfSegmentName(name_, 0, 1));
  int64_t newest = 0;
  for (const internal::SlotHeader& slot : replica->header().slots)
    if (slot.state == internal::kSlotValid) newest = std::max(newest, slot.step);
  EXPECT_EQ(newest, 2);
}

// persist_chunk_bytes refused naming the field: below 0; without persist_every; without a gate.
TEST_F(CheckpointTest, BadPersistChunkBytesAreRefusedNamingTheField) {
  comm::InProcessGroup one(1);
  auto comm = one.Rank(0);
  CheckpointOptions bad;
  bad.name = name_;
  bad.persist_chunk_bytes = -1;
  auto made = Checkpointer::Create(bad, comm.get());
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().message(),
            "Checkpointer: persist_chunk_bytes: out of range; got -1, expected >= 0 (0: the whole file in one write)");
  bad.persist_chunk_bytes = 64;
  made = Checkpointer::Create(bad, comm.get());
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().message(),
            "Checkpointer: persist_chunk_bytes: given without persist_every; got 64, expected persist_every > 0 (the "
            "pieces are a persist's)");
  bad.persist_dir = dir_.string();
  bad.persist_every = 2;
  made = Checkpointer::Create(bad, comm.get());
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().message(),
            "Checkpointer: persist_chunk_bytes: given without a gate; got 64, expected the gate of the session's "
            "communicator (GateCommunicator), whose idle time the pieces take");
  bad.gate = std::make_shared<NetworkGate>();
  EXPECT_TRUE(Checkpointer::Create(bad, comm.get()).ok());
}

// The gaps refused, each naming the field: at Create (out of range, out of order, without
// replicate, several together), at AttachSession (a group the session's plan does not have), at
// Commit (no session attached: every rank; ranks with different gaps: every rank, before any
// exchange).
TEST_F(CheckpointTest, BadReplicaGapsAreRefusedNamingTheField) {
  comm::InProcessGroup one(1), two(kWorld);
  auto comm = one.Rank(0);
  CheckpointOptions bad;
  bad.name = name_;
  bad.replica_gaps = {{-2, 10}, {3, -1}, {3, 5}};
  auto made = Checkpointer::Create(bad, comm.get());
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().message(),
            "Checkpointer: replica_gaps[0].after_group: out of range; got -2, expected >= -1 (-1: the gap before the "
            "first collective)\n"
            "Checkpointer: replica_gaps[1].bytes: out of range; got -1, expected >= 0 (0: none)\n"
            "Checkpointer: replica_gaps[2].after_group: not after the previous gap's; got 3 after 3, expected "
            "increasing (one entry per gap)\n"
            "Checkpointer: replica_gaps: given without replicate; got 3 gaps, expected replicate (the gaps carry "
            "replica chunks)");

  // Planned(): 3 groups; gap after group 3 is not one of them.
  const pb::Model model = testing::SmallModel();
  const pb::Plan plan = testing::MakePlan(model, testing::Planned(), "topk", kWorld);
  auto sessions = testing::CreateOnEveryRank(
      two, kWorld, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
  comm::InProcessGroup ckpt_group(kWorld);
  OnEveryRank(kWorld, [&](int r) {
    ASSERT_TRUE(sessions[static_cast<size_t>(r)].ok());
    Session& s = **sessions[static_cast<size_t>(r)];
    auto c = ckpt_group.Rank(r);
    CheckpointOptions o;
    o.name = name_;
    o.replicate = true;
    o.replica_gaps = {{0, 100}, {3, 100}};
    auto ckpt = Checkpointer::Create(o, c.get()).value();
    const Status attached = ckpt->AttachSession(&s);
    EXPECT_EQ(attached.message(),
              "Checkpointer: replica_gaps[1].after_group: not a group of the session's plan; got 3, expected < 3 (the "
              "groups of plan 0, active at AttachSession)");
    // Not attached: the gaps have no plan; every rank's Commit fails.
    const Status committed = ckpt->Commit(1);
    EXPECT_EQ(committed.message(), Segment(r) +
                                       ": replica_gaps: no session attached; got 2 gaps, expected "
                                       "AttachSession first (the gaps are its plan's)");
    // Rank 1's gaps differ from rank 0's: every rank fails its first Commit.
    o.replica_gaps = {{-1, 100}, {r == 0 ? 1 : 2, 100}};
    ckpt = Checkpointer::Create(o, c.get()).value();
    ASSERT_TRUE(ckpt->AttachSession(&s).ok());
    const Status differ = ckpt->Commit(1);
    EXPECT_NE(differ.message().find(Segment(r) + ": replica_gaps: the ranks pass different gaps; got fingerprint 0x"),
              std::string::npos)
        << differ.ToString();
    EXPECT_NE(differ.message().find(" on rank 1, expected the same gaps (and the same plan active at AttachSession) "
                                    "on every rank"),
              std::string::npos)
        << differ.ToString();
  });
}

// The C API over in-process ranks: commit, restart, restore bitwise; a NULL handle and a bad name
// are errors with messages.
TEST_F(CheckpointTest, CApiCommitsAndRestores) {
  RunCJobTwice({}, 3, 3, /*lose_rank1=*/false);
  EXPECT_EQ(cupcake_checkpointer_commit(nullptr, 1), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_checkpointer_commit: checkpointer is NULL; expected one from cupcake_checkpointer_create");
  cupcake_checkpoint_options bad = {};
  bad.name = "a/b";
  cupcake_checkpointer* c = nullptr;
  comm::InProcessGroup one(1);
  EXPECT_EQ(internal::CreateCCheckpointer(bad, one.Rank(0), &c), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_checkpointer_create: Checkpointer: name: not a segment name; got 'a/b', expected 1 to 100 "
               "letters, digits, '.', '_' or '-'");
  cupcake_checkpoint_options chunks = {};
  chunks.replicate = 1;
  chunks.replica_chunk_bytes = -1;
  chunks.replica_group_hosts = 1;
  chunks.replica_max_commits = -2;
  comm::InProcessGroup two(2);
  EXPECT_EQ(internal::CreateCCheckpointer(chunks, two.Rank(0), &c), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_checkpointer_create: Checkpointer: replica_chunk_bytes: out of range; got -1, expected >= 0 "
               "(0: whole replicas)\nCheckpointer: replica_max_commits: out of range; got -2, expected >= 0 (0: no "
               "bound)\nCheckpointer: replica_group_hosts: out of range; got 1, expected >= 2 (a host and at least "
               "one that keeps its replicas)");
}

// CUPCAKE_CHECKPOINT_SHARED reaches the Checkpointer: a data-parallel job's lost host (rank 1's,
// after 3 commits) rebuilds step 2 from rank 0's replica of its 'stats' and rank 0's shared
// entries. Flags other than the two are refused naming the entry.
TEST_F(CheckpointTest, CApiSharedEntriesComeFromAPeer) {
  cupcake_checkpoint_options replicated = {};
  replicated.replicate = 1;
  RunCJobTwice(replicated, 3, 2, /*lose_rank1=*/true, /*data_parallel=*/true);
  comm::InProcessGroup one(1);
  cupcake_checkpoint_options o = {};
  o.name = name_.c_str();
  cupcake_checkpointer* c = nullptr;
  ASSERT_EQ(internal::CreateCCheckpointer(o, one.Rank(0), &c), CUPCAKE_OK);
  float x = 0;
  EXPECT_EQ(cupcake_checkpointer_add(c, "x", &x, 4, 4), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_checkpointer_add: flags: unknown bits; got 4 for 'x', expected CUPCAKE_CHECKPOINT_AT_COMMIT "
               "(1) and CUPCAKE_CHECKPOINT_SHARED (2) or'ed");
  cupcake_checkpointer_destroy(c);
}

// The C API's replica options reach the Checkpointer: chunks of 500 bytes (3 per snapshot, as in
// ReplicaAssembledFromChunksRestoresALostHost), 8 commits, rank 1's host lost: step 4 restored.
TEST_F(CheckpointTest, CApiReplicatesInChunks) {
  cupcake_checkpoint_options o = {};
  o.replicate = 1;
  o.replica_chunk_bytes = 500;
  RunCJobTwice(o, 8, 4, /*lose_rank1=*/true);
}

// The C API's gaps reach the Checkpointer (its message for a gap out of range); an array that
// is not there is refused naming the field.
TEST_F(CheckpointTest, CApiReplicaGapsReachTheCheckpointer) {
  comm::InProcessGroup two(kWorld);
  cupcake_checkpointer* c = nullptr;
  const cupcake_replica_gap gaps[] = {{-1, 100}, {-2, 100}};
  cupcake_checkpoint_options o = {};
  o.replicate = 1;
  o.replica_gaps = gaps;
  o.replica_gap_count = 2;
  EXPECT_EQ(internal::CreateCCheckpointer(o, two.Rank(0), &c), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_checkpointer_create: Checkpointer: replica_gaps[1].after_group: out of range; got -2, "
               "expected >= -1 (-1: the gap before the first collective)");
  o.replica_gaps = nullptr;
  EXPECT_EQ(internal::CreateCCheckpointer(o, two.Rank(1), &c), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_checkpointer_create: options.replica_gaps: not an array of replica_gap_count gaps; got NULL "
               "and replica_gap_count 2, expected replica_gap_count >= 0 gaps there");
}

}  // namespace
}  // namespace cupcake::runtime

// The backend suite over gloo: every case at 1, 2, 3 and 4 ranks, each rank a thread with a gloo
// communicator of its own over TCP on loopback, the ranks meeting through a file store in a
// fresh directory (as gloo's own tests run N ranks as N threads). Also: the file store, the sum
// in rank order (the bits the MPI backend's chunked allreduce gives), a peer that aborts, a
// peer that never arrives, and the arguments refused.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cases.h"
#include "cupcake/comm/gloo.h"
#include "cupcake/comm/store.h"

namespace cupcake::comm::testing {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system's temporary directory, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = fs::temp_directory_path() /
            ("cupcake-gloo-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

GlooOptions Loopback(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.timeout = timeout;
  return options;
}

// Runs `fn` on every rank of a `size`-rank gloo group, one thread per rank.
void RunRanks(int size, const std::function<void(Communicator&)>& fn,
              const GlooOptions& options = Loopback()) {
  TempDir dir;
  auto store = MakeFileStore(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&, r] {
    auto c = MakeGlooCommunicator(*store, r, size, options);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    fn(**c);
  });
  for (auto& t : threads) t.join();
}

class GlooSuite : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GlooSuite, PassesTheBackendCase) {
  const auto [size, index] = GetParam();
  const Case c = Cases()[static_cast<size_t>(index)];
  SCOPED_TRACE(c.name + " at " + std::to_string(size) + " ranks");
  RunRanks(size, c.run);
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooSuite,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Range(0, static_cast<int>(Cases().size()))),
                         [](const auto& param_info) {
                           return Cases()[static_cast<size_t>(std::get<1>(param_info.param))].name + "_" +
                                  std::to_string(std::get<0>(param_info.param)) + "ranks";
                         });

TEST(GlooCommunicator, NamesTheLibraryAndTheHost) {
  RunRanks(2, [](Communicator& c) {
    EXPECT_EQ(c.library(), "gloo 0.5.0 (tcp)");
    char name[256] = {};
    ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
    EXPECT_EQ(c.host(), name);
    EXPECT_EQ(c.memory(), MemoryKind::kHost);
  });
}

// Non-integer float32 values at 3 ranks (the order of additions shows in the bits): every rank
// gets (x0 + x1) + x2, element by element, worked out here by a plain loop.
TEST(GlooCommunicator, AllreduceSumsFloatsInRankOrder) {
  constexpr int kRanks = 3;
  constexpr int64_t kCount = 3001;
  auto input = [](int r, int64_t i) { return 0.1f * static_cast<float>((i * 7 + r * 13) % 101) - 3.3f + 1e-3f * r; };
  std::vector<float> want(kCount);
  for (int64_t i = 0; i < kCount; ++i) {
    float s = input(0, i);
    for (int r = 1; r < kRanks; ++r) s += input(r, i);
    want[static_cast<size_t>(i)] = s;
  }
  RunRanks(kRanks, [&](Communicator& c) {
    std::vector<float> x(kCount);
    for (int64_t i = 0; i < kCount; ++i) x[static_cast<size_t>(i)] = input(c.rank(), i);
    ASSERT_TRUE(c.Allreduce(x.data(), x.data(), kCount, DataType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(std::memcmp(x.data(), want.data(), sizeof(float) * kCount), 0) << "rank " << c.rank();
  });
}

// A rank that gives up (Abort) ends the others' collectives with an error, promptly.
TEST(GlooCommunicator, APeerThatGivesUpEndsTheOthersCollectives) {
  const auto start = std::chrono::steady_clock::now();
  RunRanks(3, [](Communicator& c) {
    if (c.rank() == 2) {
      c.Abort("rank 2 died");
      float x = 1;
      Status s = c.Allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum);
      EXPECT_EQ(s.code(), StatusCode::kUnavailable);
      EXPECT_EQ(s.message(), "Allreduce: the group was aborted: rank 2 died (rank 2 on " + c.host() + ")");
      return;
    }
    std::vector<float> x(1000, 1.0f);
    Status s = c.Allreduce(x.data(), x.data(), 1000, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_TRUE(s.message().starts_with("Allreduce: gloo: ")) << s.message();
    EXPECT_TRUE(s.message().ends_with(" (rank " + std::to_string(c.rank()) + " on " + c.host() + ")")) << s.message();
  }, Loopback(std::chrono::seconds(20)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));  // a bound, not a timing
}

// gloo's TCP writes to a peer that died raise SIGPIPE: a process that left it at its default
// ignores it once it has a gloo communicator (else the write kills it before the collective can
// return UNAVAILABLE, as the test above can under load); a handler the process installed is kept.
void NoteSigpipe(int) {}
sighandler_t SigpipeAfterACommunicator(sighandler_t before) {
  std::signal(SIGPIPE, before);
  RunRanks(1, [](Communicator&) {});
  return std::signal(SIGPIPE, SIG_DFL);
}
TEST(GlooCommunicator, IgnoresSigpipeUnlessTheProcessHandlesIt) {
  EXPECT_EQ(SigpipeAfterACommunicator(SIG_DFL), SIG_IGN);
  EXPECT_EQ(SigpipeAfterACommunicator(NoteSigpipe), &NoteSigpipe);
}

// A rank whose communicator goes away (its process died: its sockets close) ends the others'
// collectives with gloo's error, promptly, not at their timeout.
TEST(GlooCommunicator, APeerThatDiesEndsTheOthersCollectives) {
  const auto start = std::chrono::steady_clock::now();
  RunRanks(3, [](Communicator& c) {
    if (c.rank() == 2) return;  // RunRanks destroys its communicator
    std::vector<float> x(1000, 1.0f);
    Status s = c.Allreduce(x.data(), x.data(), 1000, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_TRUE(s.message().starts_with("Allreduce: gloo: ")) << s.message();
  }, Loopback(std::chrono::seconds(20)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));  // a bound, not a timing
}

// Rank 1 of 2 never comes: rank 0 gives up after its timeout, naming the key it waited for.
TEST(GlooCommunicator, APeerThatNeverArrivesIsATimeoutNamingTheKeyAndTheWorld) {
  TempDir dir;
  auto store = MakeFileStore(dir.path());
  ASSERT_TRUE(store.ok());
  auto c = MakeGlooCommunicator(*store, 0, 2, Loopback(std::chrono::milliseconds(200)));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded);
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  EXPECT_EQ(c.status().message(), "gloo communicator: rendezvous: file store: " + dir.path() +
                                      ": timed out after 200 ms waiting for key 'world/1' (rank 0 of 2 on " + name +
                                      ")");
}

TEST(GlooCommunicator, BadArgumentsAreRefusedNamingEachField) {
  GlooOptions options;
  options.timeout = std::chrono::milliseconds(0);
  auto c = MakeGlooCommunicator(nullptr, 2, 2, options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "gloo communicator: store: null; expected a KeyValueStore shared by the ranks\n"
            "gloo communicator: rank: out of range; got 2, expected 0 <= rank < 2\n"
            "gloo communicator: timeout: out of range; got 0 ms, expected > 0");
  c = MakeGlooCommunicator(nullptr, 0, 0);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("gloo communicator: size: out of range; got 0, expected >= 1"),
            std::string::npos)
      << c.status().message();
}

TEST(FileStore, SetsGetsAndWaitsAcrossStoresOnOneDirectory) {
  TempDir dir;
  auto a = MakeFileStore(dir.path()), b = MakeFileStore(dir.path());
  ASSERT_TRUE(a.ok() && b.ok());
  const std::string binary("x\0y/z", 5);
  ASSERT_TRUE((*a)->Set("job/key one", binary).ok());
  const std::string keys[] = {"job/key one"};
  EXPECT_TRUE((*b)->Wait(keys, std::chrono::milliseconds(1000)).ok());
  auto v = (*b)->Get("job/key one");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, binary);
  // The prefixed view sees the same key under the rest of its name.
  auto view = PrefixStore(*b, "job/");
  auto w = view->Get("key one");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, binary);
  EXPECT_EQ((*b)->Get("job/other").status().message(),
            "file store: " + dir.path() + ": key 'job/other' is not set");
}

TEST(FileStore, WaitTimesOutNamingTheMissingKey) {
  TempDir dir;
  auto s = MakeFileStore(dir.path());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->Set("here", "1").ok());
  const std::string keys[] = {"here", "absent"};
  Status w = (*s)->Wait(keys, std::chrono::milliseconds(50));
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(w.message(), "file store: " + dir.path() + ": timed out after 50 ms waiting for key 'absent'");
}

TEST(FileStore, RefusesADirectoryItCannotMake) {
  TempDir dir;
  const std::string file = dir.path() + "/a-file";
  ASSERT_TRUE(MakeFileStore(dir.path()).ok());
  { std::ofstream(file) << "x"; }
  auto s = MakeFileStore(file + "/sub");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(s.status().message().starts_with("file store: " + file + "/sub: cannot make the directory"))
      << s.status().message();
}

}  // namespace
}  // namespace cupcake::comm::testing

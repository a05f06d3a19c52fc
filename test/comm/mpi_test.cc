// The backend suite over MPI: run under mpirun (ctest: comm_mpi_np2..4), each process one rank
// of MPI_COMM_WORLD, every case on the world and on its splits, with the default wait (spin,
// then yield between tests) and with sleeps between tests (MpiWait in mpi.h); and ZenAllreduce's
// cases (zen_cases.h) on the world. A failing check on any rank fails that rank's process, so
// mpirun exits non-zero.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "cases.h"
#include "cupcake/comm/mpi.h"
#include "zen_cases.h"

namespace cupcake::comm::testing {
namespace {

Communicator* world = nullptr;           // set by main, for the tests of this process
Communicator* sleeping_world = nullptr;  // the same ranks, MpiWait{.spin_us = 0, .sleep_us = 20}

class MpiSuite : public ::testing::TestWithParam<int> {};

TEST_P(MpiSuite, PassesTheBackendCase) {
  ASSERT_NE(world, nullptr);
  const Case c = Cases()[static_cast<size_t>(GetParam())];
  c.run(*world);
  EXPECT_TRUE(world->Barrier().ok());  // no rank runs ahead into the next case
}

TEST_P(MpiSuite, PassesTheBackendCaseSleepingBetweenTests) {
  ASSERT_NE(sleeping_world, nullptr);
  const Case c = Cases()[static_cast<size_t>(GetParam())];
  c.run(*sleeping_world);
  EXPECT_TRUE(sleeping_world->Barrier().ok());
}

INSTANTIATE_TEST_SUITE_P(World, MpiSuite, ::testing::Range(0, static_cast<int>(Cases().size())),
                         [](const auto& param_info) { return Cases()[static_cast<size_t>(param_info.param)].name; });

class ZenMpi : public ::testing::TestWithParam<int> {};

TEST_P(ZenMpi, EqualsTheDenseSum) {
  ASSERT_NE(world, nullptr);
  RunZenCase(*world, ZenCases()[static_cast<size_t>(GetParam())]);
  EXPECT_TRUE(world->Barrier().ok());
}

INSTANTIATE_TEST_SUITE_P(World, ZenMpi, ::testing::Range(0, static_cast<int>(ZenCases().size())),
                         [](const auto& test) { return ZenCases()[static_cast<size_t>(test.param)].name; });

TEST(MpiWorld, NamesTheLibraryAndTheHost) {
  EXPECT_TRUE(world->library().starts_with("Open MPI") || world->library().starts_with("MPICH")) << world->library();
  EXPECT_FALSE(world->host().empty());
  EXPECT_EQ(world->memory(), MemoryKind::kHost);
}

TEST(MpiWait, OutOfRangeTimesAreRefusedNamingTheField) {
  auto c = MpiCommunicatorFromHandle(nullptr, MpiWait{.spin_us = -1, .sleep_us = 2e6});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.status().message(),
            "MpiWait: spin_us: out of range; got -1.000000, expected 0 <= t <= 1e6 (us)\n"
            "MpiWait: sleep_us: out of range; got 2000000.000000, expected 0 <= t <= 1e6 (us)");
  EXPECT_FALSE(MpiCommunicatorFromHandle(nullptr, MpiWait{.spin_us = std::nan("")}).ok());
}

TEST(MpiWait, AnEmulatedStartUpDelaysEachDataCollectiveOnce) {
  constexpr double kStartUpUs = 20000;
  auto c = MpiCommunicatorFromHandle(nullptr, MpiWait{.startup_us = kStartUpUs});
  ASSERT_TRUE(c.ok()) << c.status().message();
  Communicator& comm = **c;
  EXPECT_TRUE(comm.library().ends_with(" (emulated start-up 20000 us per collective)")) << comm.library();
  const int n = comm.size();
  std::vector<float> send(2 * static_cast<size_t>(n), static_cast<float>(comm.rank() + 1)), recv(send.size());
  using Clock = std::chrono::steady_clock;
  auto timed = [&](const char* what, auto call) {
    ASSERT_TRUE(comm.Barrier().ok());
    const auto t0 = Clock::now();
    const Status s = call();
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    ASSERT_TRUE(s.ok()) << what << ": " << s.message();
    EXPECT_GE(us, kStartUpUs) << what;
  };
  timed("Allreduce", [&] { return comm.Allreduce(send.data(), recv.data(), 2 * n, DataType::kFloat32, ReduceOp::kSum); });
  EXPECT_EQ(recv[0], static_cast<float>(n * (n + 1) / 2));  // the result is untouched by the wait
  timed("Allgather", [&] { return comm.Allgather(send.data(), recv.data(), 8); });
  timed("Alltoall", [&] { return comm.Alltoall(send.data(), recv.data(), 8); });
  timed("ReduceScatter",
        [&] { return comm.ReduceScatter(send.data(), recv.data(), 2, DataType::kFloat32, ReduceOp::kSum); });
  timed("Broadcast", [&] { return comm.Broadcast(send.data(), 8, 0); });
  std::vector<int64_t> bytes(static_cast<size_t>(n), 8);
  timed("Alltoallv", [&] { return comm.Alltoallv(send.data(), bytes, recv.data(), bytes); });
}

TEST(MpiWait, TheEmulatedStartUpComesFromTheEnvironment) {
  ASSERT_EQ(setenv(kEmulatedStartupVariable, "1500", 1), 0);
  auto c = MpiCommunicatorFromHandle(nullptr);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE((*c)->library().ends_with(" (emulated start-up 1500 us per collective)")) << (*c)->library();
  ASSERT_EQ(setenv(kEmulatedStartupVariable, "1ms", 1), 0);
  auto bad = MpiCommunicatorFromHandle(nullptr);
  ASSERT_EQ(unsetenv(kEmulatedStartupVariable), 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "CUPCAKE_EMULATED_STARTUP_US: got '1ms', expected a time in microseconds, 0 <= t <= 1e6 (an emulated "
            "start-up per collective, scripts/testbed.sh --startup-us)");
  auto plain = MpiCommunicatorFromHandle(nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ((*plain)->library().find("emulated"), std::string::npos) << (*plain)->library();
}

}  // namespace
}  // namespace cupcake::comm::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto mpi = cupcake::comm::InitMpi(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "comm_mpi_test: %s\n", mpi.status().message().c_str());
    return 1;
  }
  auto w = (*mpi)->World();
  if (!w.ok()) {
    std::fprintf(stderr, "comm_mpi_test: %s\n", w.status().message().c_str());
    return 1;
  }
  cupcake::comm::testing::world = w->get();
  auto sleeping = cupcake::comm::MpiCommunicatorFromHandle(nullptr, cupcake::comm::MpiWait{.spin_us = 0, .sleep_us = 20});
  if (!sleeping.ok()) {
    std::fprintf(stderr, "comm_mpi_test: %s\n", sleeping.status().message().c_str());
    return 1;
  }
  cupcake::comm::testing::sleeping_world = sleeping->get();
  const int failed = RUN_ALL_TESTS();
  sleeping->reset();
  w->reset();
  return failed;
}

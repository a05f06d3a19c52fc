// ZenAllreduce under mpirun (ctest: comm_zen_mpi_np2..4): the cases of zen_cases.h on
// MPI_COMM_WORLD. A failing check on any rank fails that process, so mpirun exits non-zero.
#include "cupcake/comm/mpi.h"
#include "zen_cases.h"

namespace cupcake::comm::testing {
namespace {

Communicator* world = nullptr;  // set by main

class ZenMpi : public ::testing::TestWithParam<int> {};

TEST_P(ZenMpi, EqualsTheDenseSum) {
  ASSERT_NE(world, nullptr);
  RunZenCase(*world, ZenCases()[static_cast<size_t>(GetParam())]);
  EXPECT_TRUE(world->Barrier().ok());
}

INSTANTIATE_TEST_SUITE_P(World, ZenMpi, ::testing::Range(0, static_cast<int>(ZenCases().size())),
                         [](const auto& test) { return ZenCases()[static_cast<size_t>(test.param)].name; });

}  // namespace
}  // namespace cupcake::comm::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto mpi = cupcake::comm::InitMpi(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "comm_zen_mpi_test: %s\n", mpi.status().message().c_str());
    return 1;
  }
  auto w = (*mpi)->World();
  if (!w.ok()) {
    std::fprintf(stderr, "comm_zen_mpi_test: %s\n", w.status().message().c_str());
    return 1;
  }
  cupcake::comm::testing::world = w->get();
  const int failed = RUN_ALL_TESTS();
  w->reset();
  return failed;
}

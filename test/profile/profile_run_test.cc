// ProfileKernels, the kernels run behind `cupcake-profile kernels`: rank 0's DB and its cluster,
// the world size from the DB, the kernel-only DB beside it, ranks in step with rank 0 reporting
// the failures all ranks share.
#include "cupcake/profile/profile_run.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "cupcake/profile/store.h"
#include "test_files.h"

namespace cupcake::profile {
namespace {

// fp32 on two sizes: encode, decode, pack, unpack = 4 curves x 2 sizes = 8 points.
ProfileKernelsOptions Tiny(const std::string& db) {
  ProfileKernelsOptions o;
  o.db = db;
  o.world_size = 2;
  o.meta = {{"kernels.command", "profile_run_test"}};
  o.sweep.elements = {256, 512};
  o.sweep.compressors = {"fp32"};
  o.sweep.warmup = 0;
  o.sweep.iters = 1;
  return o;
}

pb::Profile Load(const std::string& db) {
  auto store = ProfileStore::Open(db, /*create=*/false);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return {};
  auto p = store->Load();
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : pb::Profile();
}

TEST(ProfileKernels, SweepsIntoANewDbWithItsClusterThenSkipsWhatIsThere) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  FakeClock clock(1.0);
  auto first = ProfileKernels(Tiny(db), nullptr, nullptr, clock);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->world_size, 2);
  EXPECT_FALSE(first->assumed_world);
  EXPECT_FALSE(first->kernel_only);
  EXPECT_EQ(first->report.event.measured, 8);
  EXPECT_EQ(first->report.event.skipped, 0);
  const pb::Profile p = Load(db);
  EXPECT_EQ(p.cluster().name(), "local");
  EXPECT_EQ(p.cluster().nodes(), 1);
  EXPECT_EQ(p.cluster().devices_per_node(), 2);
  EXPECT_EQ(p.cluster().meta().at("kernels.command"), "profile_run_test");
  EXPECT_EQ(p.curves_size(), 4);

  auto again = ProfileKernels(Tiny(db), nullptr, nullptr, clock);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->report.event.measured, 0);
  EXPECT_EQ(again->report.event.skipped, 8);
}

// No cluster in a new DB and no world size: W = 1, said so; afterwards the DB's cluster decides,
// and a world size that disagrees with it is refused, naming the DB.
TEST(ProfileKernels, TakesTheWorldSizeFromTheDb) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  FakeClock clock(1.0);
  ProfileKernelsOptions o = Tiny(db);
  o.world_size = 0;
  auto first = ProfileKernels(o, nullptr, nullptr, clock);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->assumed_world);
  EXPECT_EQ(first->world_size, 1);
  auto second = ProfileKernels(o, nullptr, nullptr, clock);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_FALSE(second->assumed_world);
  EXPECT_EQ(second->world_size, 1);
  o.world_size = 3;
  EXPECT_EQ(ProfileKernels(o, nullptr, nullptr, clock).status().message(),
            db + ": --world-size: disagrees with the DB's cluster 'local'; got 3, expected 1 (1 node x 1 device)");
}

// A device sweep with an activity source: event time into the DB, kernel-only time into the
// kernel DB, made with the same cluster.
TEST(ProfileKernels, GpuSweepWritesKernelOnlyCurvesToTheirOwnDb) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db"), kernel_db = dir.File("k.db");
  FakeKernelDevice device({8.0});
  FakeActivitySource activity(std::vector<std::vector<KernelActivity>>(100, {{"k", 0, 2000, 1}}));
  ProfileKernelsOptions o = Tiny(db);
  o.kernel_db = kernel_db;
  o.sweep.device = pb::GPU;
  FakeClock clock(1.0);
  auto result = ProfileKernels(o, &device, &activity, clock);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_TRUE(result->kernel_only);
  // fp32 encode, decode + pack, unpack, h2d, d2h = 6 curves x 2 sizes.
  EXPECT_EQ(result->report.event.measured, 12);
  EXPECT_EQ(result->report.kernel.measured, 12);
  const pb::Profile event = Load(db), kernel = Load(kernel_db);
  EXPECT_EQ(event.cluster().meta().at("kernels.gpu"), "fake device");
  EXPECT_EQ(kernel.cluster().name(), "local");
  EXPECT_EQ(kernel.cluster().devices_per_node(), 2);
  EXPECT_EQ(kernel.cluster().meta().count("kernels.kernel_time"), 1u);
  ASSERT_EQ(event.curves_size(), 6);
  ASSERT_EQ(kernel.curves_size(), 6);
  EXPECT_EQ(event.curves(0).method(), "event");
  EXPECT_EQ(event.curves(0).points(0).us(), 8.0);
  EXPECT_EQ(kernel.curves(0).method(), "kernel");
  EXPECT_EQ(kernel.curves(0).points(0).us(), 2.0);
}

// Ranks in step (an in-process group, as under mpirun): rank 0 alone writes the DB; a failure
// every rank shares (a DB that cannot be made, a bad sweep option) is rank 0's to report.
TEST(ProfileKernels, RanksSweepInStepAndRankZeroReportsForAll) {
  constexpr int kRanks = 2;
  testing::TempDir dir;
  comm::InProcessGroup group(kRanks);
  std::vector<std::unique_ptr<comm::Communicator>> peers;
  for (int r = 0; r < kRanks; ++r) peers.push_back(group.Rank(r));
  auto run_all = [&](const ProfileKernelsOptions& o) {
    std::vector<StatusOr<ProfileKernelsResult>> results(kRanks, InternalError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r)
      threads.emplace_back([&, r] {
        FakeClock clock(1.0);
        results[static_cast<size_t>(r)] = ProfileKernels(o, nullptr, nullptr, clock, nullptr, peers[r].get());
      });
    for (auto& t : threads) t.join();
    return results;
  };
  const std::string db = dir.File("p.db");
  auto results = run_all(Tiny(db));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(results[static_cast<size_t>(r)].ok()) << r << ": " << results[r].status().ToString();
    EXPECT_EQ(results[static_cast<size_t>(r)]->world_size, 2) << r;
  }
  EXPECT_EQ(results[0]->report.event.measured, 8);
  const pb::Profile p = Load(db);
  EXPECT_EQ(p.curves_size(), 4);
  EXPECT_EQ(p.cluster().meta().at("kernels.ranks"), "2 in step, the slowest rank's median");

  ProfileKernelsOptions one = Tiny(dir.File("one.db"));
  one.world_size = 1;
  one.sweep.compressors = {"zen"};
  results = run_all(one);
  // Every rank returns the failure it finds alike; rank 0 reports it (Status::reporter).
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(results[static_cast<size_t>(r)].status().message(),
              "kernels: compressors: zen needs several ranks; got W = 1, expected W >= 2 (--world-size, or a DB with "
              "a cluster)")
        << r;
    EXPECT_EQ(results[static_cast<size_t>(r)].status().reporter(), 0) << r;
  }

  // Rank 0's DB failed to open: the others learn its message, reported by rank 0.
  results = run_all(Tiny(dir.File("missing/p.db")));
  EXPECT_FALSE(results[0].ok());
  EXPECT_NE(results[0].status().message().find(dir.File("missing/p.db")), std::string::npos)
      << results[0].status().message();
  EXPECT_EQ(results[1].status().message(), results[0].status().message());
  EXPECT_EQ(results[1].status().code(), results[0].status().code());
  EXPECT_EQ(results[1].status().reporter(), 0);
  EXPECT_FALSE(std::filesystem::exists(dir.File("missing")));
}

}  // namespace
}  // namespace cupcake::profile

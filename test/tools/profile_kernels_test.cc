// cupcake-profile kernels: a quick CPU sweep into a new DB, a re-run that skips everything,
// and the errors a user can cause.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <tuple>

#include "commands.h"
#include "profiling.h"
#include "cupcake/profile/activity.h"
#include "cupcake/profile/kernel_sweep.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/host_load.h"
#include "cupcake/proto/names.h"
#include "test_files.h"

namespace cupcake::profile_cli {
namespace {

KernelsOptions Tiny(const std::string& db) {
  KernelsOptions o;
  o.db = db;
  o.min_elements = 256;
  o.max_elements = 1024;
  o.warmup = 0;
  o.iters = 1;
  o.compressors = {"fp32", "topk"};
  o.world_size = 2;
  return o;
}

CpuSample Sample(const char* machine, int pid, double busy_s, double own_s, double wall_s) {
  CpuSample s;
  std::strncpy(s.machine, machine, sizeof s.machine - 1);
  s.pid = pid;
  s.busy_s = busy_s;
  s.own_s = own_s;
  s.wall_s = wall_s;
  s.valid = 1;
  s.cores = 2;
  return s;
}

// The other work is the busiest machine's busy time less its ranks' own, per second of the
// longest wall time: machine a (two ranks, two processes) 10 - (4 + 3.5) = 2.5 s over 5.0 s;
// machine b 3 - 2.9 = 0.1 s over 5 s. Ranks that are threads of one process count its time once;
// a machine whose ranks used more than its busy time (clock granularity) counts as 0.
TEST(OtherWork, IsTheBusiestMachinesTimeLessTheSweepsOwn) {
  EXPECT_DOUBLE_EQ(OtherWorkCores({Sample("a", 1, 10, 4, 4.9), Sample("a", 2, 9.8, 3.5, 5.0),
                                   Sample("b", 1, 3, 2.9, 5)}),
                   0.5);
  EXPECT_DOUBLE_EQ(OtherWorkCores({Sample("a", 7, 6, 4, 4), Sample("a", 7, 6, 4, 4)}), 0.5);
  EXPECT_DOUBLE_EQ(OtherWorkCores({Sample("a", 1, 4, 4.5, 4)}), 0);
}

// --max-elements auto: the largest model in the DB as one group, rounded up to a power of two
// (a model of 600 + 100 elements: 1024), so no plan reads the curves past their last point.
TEST(KernelsCommand, MaxElementsAutoCoversTheLargestModel) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  KernelsOptions o = Tiny(db);
  o.max_elements_auto = true;
  std::ostringstream out;
  EXPECT_EQ(RunKernels(o, out).message(), "--max-elements auto: " + db + ": no such profile DB");
  o.max_elements_auto = false;
  o.max_elements = 256;
  ASSERT_TRUE(RunKernels(o, out).ok());  // makes the DB
  o.max_elements_auto = true;
  EXPECT_EQ(RunKernels(o, out).message(),
            "--max-elements auto: " + db + " holds no model; expected one (cupcake-profile import MODEL.json, or "
            "compute), or a size such as --max-elements 16777216");
  {
    auto store = profile::ProfileStore::Open(db, false);
    ASSERT_TRUE(store.ok());
    pb::Model m;
    m.set_name("m");
    for (int64_t n : {600, 100}) {
      pb::Tensor* t = m.add_tensors();
      t->set_name("t" + std::to_string(n));
      t->set_numel(n);
      t->set_dtype(pb::FLOAT32);
    }
    ASSERT_TRUE(store->ImportModel(m, false).ok());
  }
  ASSERT_TRUE(RunKernels(o, out).ok()) << out.str();
  auto store = profile::ProfileStore::Open(db, false);
  pb::Curve key;
  key.set_kind(pb::ENCODE);
  key.set_compressor("topk");
  key.set_device(pb::CPU);
  key.set_ratio(kDefaultRatio);
  EXPECT_EQ(*store->PointSizes(key), (std::vector<int64_t>{256, 512, 1024}));
}

TEST(KernelsCommand, SaysWhenItAssumesOneRank) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  KernelsOptions o = Tiny(db);
  o.world_size = 0;  // a new DB: no cluster to take W from
  std::ostringstream out;
  ASSERT_TRUE(RunKernels(o, out).ok());
  EXPECT_NE(out.str().find("\nkernels: W=1: " + db + " has no cluster (no comm profile) and no --world-size was "
                           "given, so decode was timed for 1 rank's payloads; run comm first or give --world-size W\n"),
            std::string::npos)
      << out.str();
  std::ostringstream again;  // now the DB has a cluster (of 1 rank): nothing assumed
  ASSERT_TRUE(RunKernels(o, again).ok());
  EXPECT_EQ(again.str().find("kernels: W=1: "), std::string::npos) << again.str();
}

TEST(KernelsCommand, SweepsIntoANewDbThenSkipsWhatIsThere) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  std::ostringstream out;
  ASSERT_TRUE(RunKernels(Tiny(db), out).ok());
  EXPECT_NE(out.str().find("measured 18 points, skipped 0"), std::string::npos) << out.str();
  std::ostringstream again;
  KernelsOptions o = Tiny(db);
  o.world_size = 0;  // taken from the DB's cluster
  ASSERT_TRUE(RunKernels(o, again).ok());
  EXPECT_NE(again.str().find("W=2, 3 sizes"), std::string::npos) << again.str();
  EXPECT_NE(again.str().find("measured 0 points, skipped 18"), std::string::npos) << again.str();
  auto store = profile::ProfileStore::Open(db, false);
  ASSERT_TRUE(store.ok());
  auto p = store->Load();
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->cluster().name(), "local");
  EXPECT_EQ(p->cluster().devices_per_node(), 2);
  EXPECT_EQ(p->curves_size(), 6);
  EXPECT_TRUE(p->cluster().meta().contains("kernels.date"));
  EXPECT_EQ(p->cluster().meta().at("kernels.cache"), "cold");  // the cpu's default
  EXPECT_NE(out.str().find(", cold caches"), std::string::npos) << out.str();
  // The other work on the machine during the sweep, as plans read it (BusyNote).
  ASSERT_TRUE(p->cluster().meta().contains("kernels.load"));
  const std::optional<HostLoad> load = ParseHostLoad(p->cluster().meta().at("kernels.load"));
  ASSERT_TRUE(load.has_value()) << p->cluster().meta().at("kernels.load");
  EXPECT_FALSE(load->load_average) << p->cluster().meta().at("kernels.load");
  EXPECT_EQ(load->cores, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
}

// Started as several ranks (here an in-process group of 3, as under mpirun): all sweep, rank 0
// alone writes the DB and prints, the DB records the ranks; a second run finds every point in
// rank 0's DB, so no rank measures; a gpu sweep is refused by every rank, rank 0 saying why.
TEST(KernelsCommand, RanksSweepInStepAndRankZeroWritesTheDb) {
  constexpr int kRanks = 3;
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  comm::InProcessGroup group(kRanks);
  std::vector<std::unique_ptr<comm::Communicator>> peers;
  for (int r = 0; r < kRanks; ++r) peers.push_back(group.Rank(r));
  auto run_all = [&](const KernelsOptions& base) {
    std::vector<Status> status(kRanks);
    std::vector<std::ostringstream> out(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        KernelsOptions o = base;
        o.peers = peers[static_cast<size_t>(r)].get();
        status[static_cast<size_t>(r)] = RunKernels(o, out[static_cast<size_t>(r)]);
      });
    }
    for (auto& t : threads) t.join();
    std::vector<std::string> text;
    for (auto& o : out) text.push_back(o.str());
    return std::pair{status, text};
  };
  auto [status, out] = run_all(Tiny(db));
  for (int r = 0; r < kRanks; ++r)
    ASSERT_TRUE(status[static_cast<size_t>(r)].ok()) << r << ": " << status[r].ToString();
  EXPECT_NE(out[0].find("3 ranks in step (the slowest rank's median): measured 18 points, skipped 0"),
            std::string::npos)
      << out[0];
  EXPECT_EQ(out[1], "");
  EXPECT_EQ(out[2], "");
  auto store = profile::ProfileStore::Open(db, false);
  ASSERT_TRUE(store.ok());
  auto p = store->Load();
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->curves_size(), 6);
  EXPECT_EQ(p->cluster().meta().at("kernels.ranks"), "3 in step, the slowest rank's median");
  std::tie(status, out) = run_all(Tiny(db));
  for (int r = 0; r < kRanks; ++r)
    ASSERT_TRUE(status[static_cast<size_t>(r)].ok()) << r << ": " << status[r].ToString();
  EXPECT_NE(out[0].find("measured 0 points, skipped 18"), std::string::npos) << out[0];
  KernelsOptions gpu = Tiny(db);
  gpu.device = "gpu";
  std::tie(status, out) = run_all(gpu);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(status[static_cast<size_t>(r)].message(),
              "--device: gpu under a launcher with 3 ranks; expected cpu (ranks sweep in step on the host; a GPU "
              "is swept by one process)")
        << r;
    EXPECT_EQ(status[static_cast<size_t>(r)].reporter(), 0) << r;
  }
  // A bad sweep option (zen with a cluster of one rank) is found by every rank alike: every rank
  // returns it, reported by rank 0.
  KernelsOptions one = Tiny(dir.File("one.db"));
  one.world_size = 1;
  one.compressors = {"zen"};
  std::tie(status, out) = run_all(one);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(status[static_cast<size_t>(r)].message(),
              "kernels: compressors: zen needs several ranks; got W = 1, expected W >= 2 (--world-size, or a DB with "
              "a cluster)")
        << r;
    EXPECT_EQ(status[static_cast<size_t>(r)].reporter(), 0) << r;
  }
}

TEST(KernelsCommand, ErrorsNameTheFlag) {
  testing::TempDir dir;
  std::ostringstream out;
  KernelsOptions o = Tiny(dir.File("p.db"));
  o.min_elements = 4096;
  EXPECT_EQ(RunKernels(o, out).message(),
            "--max-elements: empty size range; got 1024, expected >= --min-elements (4096)");
  o = Tiny(dir.File("p.db"));
  o.device = "tpu";
  EXPECT_EQ(RunKernels(o, out).message(), "--device: unknown device; got 'tpu', expected cpu or gpu");
  o = Tiny(dir.File("p.db"));
  o.cache = "lukewarm";
  EXPECT_EQ(RunKernels(o, out).message(), "--cache: unknown; got 'lukewarm', expected cold or warm");
  ASSERT_TRUE(RunKernels(Tiny(dir.File("p.db")), out).ok());
  o = Tiny(dir.File("p.db"));
  o.world_size = 8;
  EXPECT_EQ(RunKernels(o, out).message(), dir.File("p.db") +
                                              ": --world-size: disagrees with the DB's cluster 'local'; got 8, "
                                              "expected 2 (1 node x 2 devices)");
}

// --ratios: a curve per ratio for the ratio compressors (and zen), sorted and deduplicated;
// anything that is not a ratio in (0, 1] is a usage error naming the flag, before the DB exists.
TEST(KernelsCommand, RatiosFlagMeasuresACurvePerRatio) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  std::ostringstream sout, serr;
  tools::Invocation inv{"cupcake-profile",
                        "kernels",
                        {"--db", db, "--quick", "--max-elements", "1024", "--world-size", "2", "--compressors",
                         "topk,fp16,zen", "--ratios", "0.01,0.001,0.01"},
                        sout,
                        serr};
  ASSERT_EQ(KernelsMain(inv), 0) << serr.str();
  auto store = profile::ProfileStore::Open(db, false);
  ASSERT_TRUE(store.ok());
  auto p = store->Load();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<std::string> keys;
  for (const auto& c : p->curves()) keys.push_back(CurveKey(c));
  EXPECT_EQ(keys, (std::vector<std::string>{"encode topk cpu ratio 0.001", "decode topk cpu ratio 0.001",
                                            "encode topk cpu ratio 0.01", "decode topk cpu ratio 0.01",
                                            "encode fp16 cpu", "decode fp16 cpu", "encode zen cpu ratio 0.001",
                                            "decode zen cpu ratio 0.001", "encode zen cpu ratio 0.01",
                                            "decode zen cpu ratio 0.01", "copy pack cpu", "copy unpack cpu"}));
  for (const char* bad : {"0.01,x", "0", "1.5", ",0.1"}) {
    std::ostringstream o, e;
    const std::string fresh = dir.File(std::string("bad") + std::to_string(std::strlen(bad)) + ".db");
    tools::Invocation b{"cupcake-profile", "kernels", {"--db", fresh, "--quick", "--ratios", bad}, o, e};
    EXPECT_EQ(KernelsMain(b), tools::kExitUsage) << bad;
    EXPECT_NE(e.str().find("--ratios: "), std::string::npos) << bad << ": " << e.str();
    EXPECT_FALSE(std::filesystem::exists(fresh)) << bad;
  }
}

// The --device gpu wiring on a fake device and replayed activity: event curves into the DB,
// kernel-only curves into p.kernel.db (same cluster), both resumed, --kernel-db none.
TEST(KernelsCommand, GpuSweepWritesEventCurvesAndKernelOnlyCurvesToTheirDbs) {
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  profile::FakeKernelDevice device({8.0});
  std::vector<std::vector<profile::KernelActivity>> batches(100, {{"k", 0, 2000, 1}});
  profile::FakeActivitySource activity(batches);
  KernelsOptions o = Tiny(db);
  o.device = "gpu";
  o.device_for_test = &device;
  o.activity_for_test = &activity;
  std::ostringstream out;
  ASSERT_TRUE(RunKernels(o, out).ok());
  // fp32, topk x (encode, decode) + pack, unpack, h2d, d2h = 8 curves x 3 sizes.
  EXPECT_NE(out.str().find("kernels: gpu (fake device), W=2, 3 sizes"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("measured 24 points, skipped 0"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("kernel-only (CUPTI): measured 24 points, skipped 0 already in " + dir.File("p.kernel.db")),
            std::string::npos)
      << out.str();
  // A gpu's default is cold: the device's caches evicted before each of the 24 event-timed and
  // 24 kernel-timed calls (no warm-up here), recorded in the meta.
  EXPECT_NE(out.str().find(", cold caches"), std::string::npos) << out.str();
  EXPECT_EQ(device.evictions(), 2 * 24);
  // --cache warm: nothing evicted.
  KernelsOptions warm = o;
  warm.db = dir.File("warm.db");
  warm.cache = "warm";
  profile::FakeKernelDevice warm_device({8.0});
  profile::FakeActivitySource warm_activity(batches);
  warm.device_for_test = &warm_device;
  warm.activity_for_test = &warm_activity;
  std::ostringstream warm_out;
  ASSERT_TRUE(RunKernels(warm, warm_out).ok()) << warm_out.str();
  EXPECT_NE(warm_out.str().find(", warm caches"), std::string::npos) << warm_out.str();
  EXPECT_NE(warm_out.str().find("measured 24 points, skipped 0"), std::string::npos) << warm_out.str();
  EXPECT_EQ(warm_device.evictions(), 0);
  for (const auto& [file, cache] : {std::pair<std::string, std::string>{db, "cold"}, {dir.File("warm.db"), "warm"}}) {
    auto store = profile::ProfileStore::Open(file, false);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto p = store->Load();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->cluster().meta().at("kernels.cache"), cache) << file;
  }
  for (const auto& [file, method, us] :
       {std::tuple<std::string, std::string, double>{db, "event", 8.0}, {dir.File("p.kernel.db"), "kernel", 2.0}}) {
    auto store = profile::ProfileStore::Open(file, false);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto p = store->Load();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->cluster().name(), "local");
    EXPECT_EQ(p->cluster().devices_per_node(), 2);
    EXPECT_EQ(p->cluster().meta().at("kernels.gpu"), "fake device");
    ASSERT_EQ(p->curves_size(), 8) << file;
    for (const auto& c : p->curves()) {
      EXPECT_EQ(c.method(), method);
      EXPECT_EQ(c.device(), pb::GPU);
      ASSERT_EQ(c.points_size(), 3);
      EXPECT_EQ(c.points(0).us(), us) << file;
    }
  }
  // Resumed: nothing left in either DB.
  std::ostringstream again;
  ASSERT_TRUE(RunKernels(o, again).ok());
  EXPECT_NE(again.str().find("measured 0 points, skipped 24"), std::string::npos) << again.str();
  EXPECT_NE(again.str().find("kernel-only (CUPTI): measured 0 points, skipped 24"), std::string::npos) << again.str();
  // --kernel-db none: event time only, said so.
  KernelsOptions none = Tiny(dir.File("q.db"));
  none.device = "gpu";
  none.device_for_test = &device;
  none.kernel_db = "none";
  std::ostringstream third;
  ASSERT_TRUE(RunKernels(none, third).ok());
  EXPECT_NE(third.str().find("kernel-only (CUPTI): not measured: --kernel-db none"), std::string::npos) << third.str();
  EXPECT_FALSE(std::filesystem::exists(dir.File("q.kernel.db")));
}

// Here (no GPU, or a build without CUDA) --device gpu must fail clearly, before any DB exists.
TEST(KernelsCommand, GpuWithoutADeviceFailsClearlyBeforeTouchingTheDb) {
  if (profile::OpenCudaKernelDevice(0).ok()) GTEST_SKIP() << "a CUDA device is present (profile_gpu_test sweeps it)";
  testing::TempDir dir;
  const std::string db = dir.File("p.db");
  KernelsOptions o = Tiny(db);
  o.device = "gpu";
  std::ostringstream out;
  Status s = RunKernels(o, out);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  if (profile::BuiltWithCuda())
    EXPECT_TRUE(s.message().starts_with("kernels: --device gpu: no CUDA device found; got "))
        << s.message();
  else
    EXPECT_EQ(s.message(),
              "kernels: --device gpu: this build has no CUDA; build on a machine with the CUDA toolkit with "
              "-DCUPCAKE_WITH_CUDA=ON");
  EXPECT_EQ(out.str(), "");
  EXPECT_FALSE(std::filesystem::exists(db));
  EXPECT_FALSE(std::filesystem::exists(dir.File("p.kernel.db")));

  // Through the command's flag parsing: exit status 1, the message on stderr, nothing on stdout.
  std::ostringstream cmd_out, cmd_err;
  tools::Invocation inv{"cupcake-profile", "kernels", {"--db", db, "--device", "gpu", "--quick"}, cmd_out, cmd_err};
  EXPECT_EQ(KernelsMain(inv), 1);
  EXPECT_EQ(cmd_err.str(), s.message() + "\n");
  EXPECT_EQ(cmd_out.str(), "");
  EXPECT_FALSE(std::filesystem::exists(db));
}

}  // namespace
}  // namespace cupcake::profile_cli

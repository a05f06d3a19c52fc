// The kernels sweep on a fake clock and an in-memory sink: what it measures, resuming an
// interrupted sweep without re-measuring, --force, bad ranges.
#include "cupcake/profile/kernel_sweep.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "cupcake/profile/store.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/names.h"
#include "test_files.h"

namespace cupcake::profile {
namespace {

KernelSweepOptions Small() {
  KernelSweepOptions o;
  o.elements = {16, 64, 256};
  o.compressors = {"topk", "efsignsgd", "fp16"};
  o.world_size = 4;
  o.warmup = 1;
  o.iters = 3;
  return o;
}

// 3 compressors x (encode, decode) + pack + unpack = 8 curves of 3 sizes.
constexpr int64_t kSmallPoints = 8 * 3;

TEST(KernelSweep, MeasuresEveryCurveAtEverySizeWithItsMethod) {
  FakeClock clock(2.0);  // every timed call spans exactly one step
  MemorySink sink;
  auto report = SweepKernels(Small(), clock, sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->measured, kSmallPoints);
  EXPECT_EQ(report->skipped, 0);
  std::vector<pb::Curve> curves = sink.Curves();
  ASSERT_EQ(curves.size(), 8u);
  std::vector<std::string> keys;
  for (const auto& c : curves) {
    keys.push_back(CurveKey(c));
    EXPECT_EQ(c.method(), "wall");
    EXPECT_EQ(c.warmup(), 1);
    EXPECT_EQ(c.iters(), 3);
    ASSERT_EQ(c.points_size(), 3) << CurveKey(c);
    for (const auto& p : c.points()) EXPECT_EQ(p.us(), 2.0);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"copy pack cpu", "copy unpack cpu", "decode efsignsgd cpu",
                                            "decode fp16 cpu", "decode topk cpu ratio 0.01", "encode efsignsgd cpu",
                                            "encode fp16 cpu", "encode topk cpu ratio 0.01"}));
  // Copies are in bytes (4n), encode/decode in elements.
  EXPECT_EQ(curves[0].points(2).size(), 1024);
  EXPECT_EQ(curves[2].points(2).size(), 256);
  // Two clock reads per timed call, none for warm-up calls.
  EXPECT_EQ(clock.calls(), kSmallPoints * 3 * 2);
}

TEST(KernelSweep, InterruptedSweepResumesWithoutRemeasuring) {
  FakeClock clock;
  MemorySink sink;
  sink.fail_after = 10;  // the 11th commit fails, as if the run were killed there
  auto first = SweepKernels(Small(), clock, sink);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(sink.added(), 10);
  const int64_t calls_before = clock.calls();

  sink.fail_after = -1;
  std::vector<std::pair<int64_t, int64_t>> progress;
  auto second = SweepKernels(Small(), clock, sink, [&](int64_t d, int64_t t) { progress.emplace_back(d, t); });
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->skipped, 10);
  EXPECT_EQ(second->measured, kSmallPoints - 10);
  EXPECT_EQ(sink.added(), kSmallPoints);
  // Only the missing points were timed: the interrupted one (timed, not stored) again, and the rest.
  EXPECT_EQ(clock.calls() - calls_before, (kSmallPoints - 10) * 3 * 2);
  ASSERT_EQ(progress.size(), static_cast<size_t>(kSmallPoints));
  EXPECT_EQ(progress.back(), std::make_pair(kSmallPoints, kSmallPoints));

  // Complete: nothing to do. --force re-measures everything, replacing the points.
  auto third = SweepKernels(Small(), clock, sink);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->measured, 0);
  EXPECT_EQ(third->skipped, kSmallPoints);
  KernelSweepOptions force = Small();
  force.force = true;
  auto fourth = SweepKernels(force, clock, sink);
  ASSERT_TRUE(fourth.ok()) << fourth.status().ToString();
  EXPECT_EQ(fourth->measured, kSmallPoints);
  EXPECT_EQ(sink.Curves().front().points_size(), 3);
}

// Ranks sweeping in step (an in-process group of 3): rank r's clock makes every call last
// r + 1 us, so the slowest rank's median is 3; rank 0's sink, which already holds the points
// at 16 elements (5 us, from a sweep alone), decides for all: nobody times them again.
TEST(KernelSweep, RanksInStepStoreTheSlowestMedianWhereRankZeroLacksIt) {
  constexpr int kRanks = 3;
  KernelSweepOptions o = Small();
  o.elements = {16};
  std::vector<MemorySink> sinks(kRanks);
  FakeClock alone(5.0);
  ASSERT_TRUE(SweepKernels(o, alone, sinks[0]).ok());
  o.elements = {16, 64};
  comm::InProcessGroup group(kRanks);
  std::vector<std::unique_ptr<comm::Communicator>> peers;
  for (int r = 0; r < kRanks; ++r) peers.push_back(group.Rank(r));
  std::vector<FakeClock> clocks;
  for (int r = 0; r < kRanks; ++r) clocks.emplace_back(1.0 + r);
  std::vector<StatusOr<SweepReport>> reports(kRanks, StatusOr<SweepReport>(SweepReport{}));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back(
        [&, r] { reports[r] = SweepKernels(o, clocks[r], sinks[r], nullptr, peers[static_cast<size_t>(r)].get()); });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(reports[r].ok()) << "rank " << r << ": " << reports[r].status().ToString();
    // 8 curves at one size each, 3 timed calls of 2 clock reads.
    EXPECT_EQ(clocks[r].calls(), 8 * 3 * 2) << "rank " << r;
  }
  EXPECT_EQ(reports[0]->measured, 8);
  EXPECT_EQ(reports[0]->skipped, 8);
  for (const auto& c : sinks[0].Curves()) {
    ASSERT_EQ(c.points_size(), 2) << CurveKey(c);
    EXPECT_EQ(c.points(0).size() * (c.kind() == pb::COPY ? 1 : 4), 64) << CurveKey(c);
    EXPECT_EQ(c.points(0).us(), 5.0) << CurveKey(c);
    EXPECT_EQ(c.points(1).us(), 3.0) << CurveKey(c);
  }
  for (const auto& c : sinks[1].Curves()) {
    ASSERT_EQ(c.points_size(), 1) << CurveKey(c);
    EXPECT_EQ(c.points(0).us(), 3.0) << CurveKey(c);
  }
}

TEST(KernelSweep, ResumesFromTheStoreAcrossRuns) {
  testing::TempDir dir;
  auto store = ProfileStore::Open(dir.File("p.db"), true);
  ASSERT_TRUE(store.ok());
  pb::Profile p;
  p.mutable_cluster()->set_name("c");
  p.mutable_cluster()->set_nodes(1);
  p.mutable_cluster()->set_devices_per_node(4);
  ASSERT_TRUE(store->ImportProfile(p, false).ok());
  FakeClock clock;
  StoreSink sink(*store);
  KernelSweepOptions o = Small();
  o.elements = {16, 64};
  ASSERT_TRUE(SweepKernels(o, clock, sink).ok());
  o.elements = {16, 64, 256};  // a wider range measures only the new size
  auto report = SweepKernels(o, clock, sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->skipped, 16);
  EXPECT_EQ(report->measured, 8);
  auto loaded = store->Load();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->curves_size(), 8);
  for (const auto& c : loaded->curves()) EXPECT_EQ(c.points_size(), 3) << CurveKey(c);
}

// Ratio compressors and Zen's host work get a curve per ratio, each recording it; the others one.
TEST(KernelSweep, MeasuresRatioCurvesPerRatioAndZensHostWork) {
  FakeClock clock(1.0);
  MemorySink sink;
  KernelSweepOptions o = Small();
  o.compressors = {"topk", "fp16", "zen"};
  o.ratios = {0.001, 0.25};
  auto report = SweepKernels(o, clock, sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::vector<std::string> keys;
  for (const auto& c : sink.Curves()) keys.push_back(CurveKey(c));
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "copy pack cpu", "copy unpack cpu", "decode fp16 cpu", "decode topk cpu ratio 0.001",
                      "decode topk cpu ratio 0.25", "decode zen cpu ratio 0.001", "decode zen cpu ratio 0.25",
                      "encode fp16 cpu", "encode topk cpu ratio 0.001", "encode topk cpu ratio 0.25",
                      "encode zen cpu ratio 0.001", "encode zen cpu ratio 0.25"}));
  EXPECT_EQ(report->measured, 12 * 3);

  // By default zen is measured on the CPU with several ranks, and not with one.
  o.compressors = {};
  o.ratios = {0.01};
  MemorySink all, one;
  ASSERT_TRUE(SweepKernels(o, clock, all).ok());
  o.world_size = 1;
  ASSERT_TRUE(SweepKernels(o, clock, one).ok());
  auto has_zen = [](MemorySink& s) {
    for (const auto& c : s.Curves())
      if (c.compressor() == "zen") return true;
    return false;
  };
  EXPECT_TRUE(has_zen(all));
  EXPECT_FALSE(has_zen(one));
}

// The zen_sparse scheme's scan ("nonzero"): an encode curve per ratio, on the CPU only, measured
// only when named.
TEST(KernelSweep, MeasuresTheNonzeroScanPerRatioWhenNamed) {
  FakeClock clock(1.0);
  MemorySink sink;
  KernelSweepOptions o = Small();
  o.compressors = {"nonzero"};
  o.ratios = {0.001, 0.25};
  auto report = SweepKernels(o, clock, sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::vector<std::string> keys;
  for (const auto& c : sink.Curves()) keys.push_back(CurveKey(c));
  EXPECT_EQ(keys, (std::vector<std::string>{"copy pack cpu", "copy unpack cpu", "encode nonzero cpu ratio 0.001",
                                            "encode nonzero cpu ratio 0.25"}));
  EXPECT_EQ(report->measured, 4 * 3);
  o.compressors = {};
  MemorySink all;
  ASSERT_TRUE(SweepKernels(o, clock, all).ok());
  for (const auto& c : all.Curves()) EXPECT_NE(c.compressor(), "nonzero") << CurveKey(c);
  o.compressors = {"nonzero"};
  o.device = pb::GPU;
  FakeKernelDevice device;
  auto g = SweepKernelsOnDevice(o, device, nullptr, sink, nullptr);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message(),
            "compressors: nonzero (the zen_sparse scheme's scan) runs on the cpu only; got device gpu");
}

// PowerSGD's steps ("powersgd", only when named): an encode and a decode curve at the sweep's
// rank, each point at its work (one product's multiply-adds plus the elements). Rank 2: n = 16 is
// 4 x 4 and n = 64 is 8 x 8, neither worth compressing ((r + c) 2 x 2 >= r c): work 16 and 64;
// n = 256 is 16 x 16, compressed: 256 + 256 x 2 = 768. A second run measures nothing again.
TEST(KernelSweep, MeasuresPowerSgdAtItsWorkWhenNamed) {
  FakeClock clock;
  MemorySink sink;
  KernelSweepOptions o = Small();
  o.compressors = {"powersgd"};
  o.rank = 2;
  auto report = SweepKernels(o, clock, sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->measured, 4 * 3);
  std::vector<std::string> keys;
  for (const auto& c : sink.Curves()) {
    keys.push_back(CurveKey(c));
    if (c.compressor() != "powersgd") continue;
    std::vector<int64_t> sizes;
    for (const auto& pt : c.points()) sizes.push_back(pt.size());
    EXPECT_EQ(sizes, (std::vector<int64_t>{16, 64, 768})) << CurveKey(c);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"copy pack cpu", "copy unpack cpu", "decode powersgd cpu",
                                            "encode powersgd cpu"}));
  auto again = SweepKernels(o, clock, sink);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->measured, 0);
  EXPECT_EQ(again->skipped, 4 * 3);
  o.rank = 0;
  EXPECT_EQ(SweepKernels(o, clock, sink).status().message(),
            "rank: out of range; got 0, expected 1 <= rank <= 65536 (powersgd's curves)");
}

TEST(KernelSweep, RejectsZenWhereItCannotRunAndBadRatios) {
  FakeClock clock;
  MemorySink sink;
  KernelSweepOptions o = Small();
  o.compressors = {"zen"};
  o.world_size = 1;
  o.ratios = {0.1, 0.01, 0, 2};
  auto r = SweepKernels(o, clock, sink);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "compressors: zen needs several ranks; got W = 1, expected W >= 2 (--world-size, or a DB with a cluster)\n"
            "ratios[1]: not ascending; got 0.01 after 0.1, expected increasing ratios\n"
            "ratios[2]: ratio out of range; got 0, expected 0 < ratio <= 1\n"
            "ratios[3]: ratio out of range; got 2, expected 0 < ratio <= 1");
  o.ratios = {};
  o.world_size = 2;
  o.device = pb::GPU;
  FakeKernelDevice device;
  auto g = SweepKernelsOnDevice(o, device, nullptr, sink, nullptr);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message(),
            "compressors: zen runs on the cpu or a CUDA device; got device gpu without CUDA\n"
            "ratios: empty; got no ratio, expected at least one");
  EXPECT_EQ(sink.added(), 0);
}

TEST(KernelSweep, RejectsBadOptionsNamingEachField) {
  FakeClock clock;
  MemorySink sink;
  KernelSweepOptions o = Small();
  o.elements = {};
  o.world_size = 0;
  o.iters = 0;
  o.compressors = {"topq"};
  auto r = SweepKernels(o, clock, sink);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "elements: empty size range; got no sizes, expected at least one\n"
            "world_size: out of range; got 0, expected 1 <= W <= 65536\n"
            "iters: out of range; got 0, expected >= 1\n" +
                UnknownCompressorError("compressors", "topq").message());
  EXPECT_EQ(sink.added(), 0);
}

TEST(KernelSweep, GpuGoesThroughADevice) {
  FakeClock clock;
  MemorySink sink;
  KernelSweepOptions o = Small();
  o.device = pb::GPU;
  auto r = SweepKernels(o, clock, sink);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(
      r.status().message(),
      "device: not a host sweep; got gpu, expected cpu (a gpu sweep runs on a KernelDevice: SweepKernelsOnDevice)");
  EXPECT_EQ(sink.added(), 0);
  EXPECT_EQ(clock.calls(), 0);
}

// The GPU sweep on a fake device (CPU compressors, scripted event times) and replayed activity.
KernelSweepOptions SmallGpu() {
  KernelSweepOptions o = Small();
  o.device = pb::GPU;
  return o;
}

// 3 compressors x (encode, decode) + pack, unpack, h2d, d2h = 10 curves of 3 sizes.
constexpr int64_t kGpuPoints = 10 * 3;

// One batch per timed call: kernel-only times 2, 7, 3 us in turn (two kernels with a gap each,
// so the gap must not count), so each point's median of 3 is 3 us.
std::vector<std::vector<KernelActivity>> Batches(int64_t calls) {
  std::vector<std::vector<KernelActivity>> batches;
  const uint64_t busy_us[] = {2, 7, 3};
  for (int64_t j = 0; j < calls; ++j) {
    const uint64_t half = busy_us[j % 3] * 500;  // ns per kernel
    const auto id = static_cast<uint32_t>(j);
    batches.push_back({{"k1", 1000, 1000 + half, id}, {"k2", 90000, 90000 + half, id}});
  }
  return batches;
}

TEST(KernelSweepOnDevice, StoresEventMediansAndKernelOnlyMediansInTheirSinks) {
  FakeKernelDevice device({5.0, 1.0, 6.0});  // median 5, mean 4
  FakeActivitySource activity(Batches(kGpuPoints * 3));
  MemorySink sink, kernel_sink;
  std::vector<std::pair<int64_t, int64_t>> progress;
  auto report = SweepKernelsOnDevice(SmallGpu(), device, &activity, sink, &kernel_sink,
                                     [&](int64_t d, int64_t t) { progress.emplace_back(d, t); });
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->event.measured, kGpuPoints);
  EXPECT_EQ(report->kernel.measured, kGpuPoints);
  EXPECT_EQ(report->activity_error, "");
  EXPECT_TRUE(report->kernel_problems.empty());
  std::vector<std::string> keys;
  for (const auto& c : sink.Curves()) {
    keys.push_back(CurveKey(c));
    EXPECT_EQ(c.method(), "event");
    EXPECT_EQ(c.warmup(), 1);
    EXPECT_EQ(c.iters(), 3);
    ASSERT_EQ(c.points_size(), 3);
    for (const auto& p : c.points()) EXPECT_EQ(p.us(), 5.0) << CurveKey(c);
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"copy d2h gpu", "copy h2d gpu", "copy pack gpu", "copy unpack gpu",
                                            "decode efsignsgd gpu", "decode fp16 gpu", "decode topk gpu ratio 0.01",
                                            "encode efsignsgd gpu", "encode fp16 gpu", "encode topk gpu ratio 0.01"}));
  std::vector<pb::Curve> kernel = kernel_sink.Curves();
  ASSERT_EQ(kernel.size(), 10u);
  for (const auto& c : kernel) {
    EXPECT_EQ(c.method(), "kernel");
    ASSERT_EQ(c.points_size(), 3);
    for (const auto& p : c.points()) EXPECT_DOUBLE_EQ(p.us(), 3.0) << CurveKey(c);
  }
  // Copies in bytes (4n), encode/decode in elements.
  EXPECT_EQ(sink.Curves()[2].points(2).size(), 1024);
  EXPECT_EQ(sink.Curves()[4].points(2).size(), 256);
  // One event pair per timed call, one Start/Flush per kernel-timed call; no warm-up is timed.
  EXPECT_EQ(device.timed(), kGpuPoints * 3);
  EXPECT_EQ(activity.started(), kGpuPoints * 3);
  // Copy points: 1 warm-up + 3 event-timed + 3 kernel-timed copies each; pinned memory freed.
  EXPECT_EQ(device.copies(), 4 * 3 * 7);
  EXPECT_EQ(device.pinned_live(), 0);
  EXPECT_EQ(device.evictions(), 0);  // warm
  ASSERT_EQ(progress.size(), static_cast<size_t>(kGpuPoints));
  EXPECT_EQ(progress.back(), std::make_pair(kGpuPoints, kGpuPoints));
}

TEST(KernelSweepOnDevice, ResumesEachSinkOnItsOwnAndForceRemeasuresBoth) {
  FakeKernelDevice device({4.0});
  MemorySink sink, kernel_sink;
  // First without kernel-only time: event points only.
  auto first = SweepKernelsOnDevice(SmallGpu(), device, nullptr, sink, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->event.measured, kGpuPoints);
  EXPECT_EQ(first->kernel.measured, 0);
  EXPECT_EQ(device.timed(), kGpuPoints * 3);

  // Then with it, interrupted after 7 kernel points: no event point is timed again.
  FakeActivitySource activity(Batches(kGpuPoints * 3 * 3));
  kernel_sink.fail_after = 7;
  auto second = SweepKernelsOnDevice(SmallGpu(), device, &activity, sink, &kernel_sink);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(kernel_sink.added(), 7);
  EXPECT_EQ(device.timed(), kGpuPoints * 3);

  // Resumed: the remaining kernel points only.
  kernel_sink.fail_after = -1;
  const int started = activity.started();
  auto third = SweepKernelsOnDevice(SmallGpu(), device, &activity, sink, &kernel_sink);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  EXPECT_EQ(third->event.measured, 0);
  EXPECT_EQ(third->event.skipped, kGpuPoints);
  EXPECT_EQ(third->kernel.measured, kGpuPoints - 7);
  EXPECT_EQ(third->kernel.skipped, 7);
  EXPECT_EQ(activity.started() - started, (kGpuPoints - 7) * 3);
  EXPECT_EQ(device.timed(), kGpuPoints * 3);
  EXPECT_EQ(sink.added(), kGpuPoints);

  // --force: both again.
  KernelSweepOptions force = SmallGpu();
  force.force = true;
  auto fourth = SweepKernelsOnDevice(force, device, &activity, sink, &kernel_sink);
  ASSERT_TRUE(fourth.ok()) << fourth.status().ToString();
  EXPECT_EQ(fourth->event.measured, kGpuPoints);
  EXPECT_EQ(fourth->kernel.measured, kGpuPoints);
  EXPECT_EQ(device.timed(), 2 * kGpuPoints * 3);
}

TEST(KernelSweepOnDevice, AnActivityErrorEndsKernelTimeButNotTheSweep) {
  FakeKernelDevice device;
  FakeActivitySource activity({});
  activity.start_error = UnavailableError("cupti: cuptiActivityEnable(kind): CUPTI_ERROR_INSUFFICIENT_PRIVILEGES");
  MemorySink sink, kernel_sink;
  auto report = SweepKernelsOnDevice(SmallGpu(), device, &activity, sink, &kernel_sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->activity_error,
            "encode topk gpu ratio 0.01 at 16: cupti: cuptiActivityEnable(kind): CUPTI_ERROR_INSUFFICIENT_PRIVILEGES");
  EXPECT_EQ(report->event.measured, kGpuPoints);
  EXPECT_EQ(report->kernel.measured, 0);
  EXPECT_EQ(kernel_sink.added(), 0);
}

TEST(KernelSweepOnDevice, ACallWithoutRecordsStoresNoKernelPoint) {
  FakeKernelDevice device;
  FakeActivitySource activity({});  // every Flush() returns nothing
  MemorySink sink, kernel_sink;
  auto report = SweepKernelsOnDevice(SmallGpu(), device, &activity, sink, &kernel_sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->activity_error, "");
  ASSERT_EQ(report->kernel_problems.size(), static_cast<size_t>(kGpuPoints));
  EXPECT_EQ(report->kernel_problems[0],
            "encode topk gpu ratio 0.01 at 16: no kernel, memcpy or memset record for timed call 0; kernel-only point "
            "not stored");
  EXPECT_EQ(kernel_sink.added(), 0);
  EXPECT_EQ(sink.added(), kGpuPoints);
}

TEST(KernelSweepOnDevice, ADeviceErrorStopsTheSweepNamingThePoint) {
  FakeKernelDevice device;
  device.end_error =
      InternalError("cuda: cudaEventSynchronize(stop_): cudaErrorLaunchFailure: unspecified launch failure");
  MemorySink sink;
  auto report = SweepKernelsOnDevice(SmallGpu(), device, nullptr, sink, nullptr);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(
      report.status().message(),
      "encode topk gpu ratio 0.01 at 16: cuda: cudaEventSynchronize(stop_): cudaErrorLaunchFailure: unspecified launch "
      "failure");
  EXPECT_EQ(sink.added(), 0);
}

TEST(KernelSweepOnDevice, RefusesACpuSweepAndBadOptions) {
  FakeKernelDevice device;
  MemorySink sink;
  EXPECT_EQ(SweepKernelsOnDevice(Small(), device, nullptr, sink, nullptr).status().message(),
            "device: not a device sweep; got cpu, expected gpu (a cpu sweep runs on a clock: SweepKernels)");
  KernelSweepOptions o = SmallGpu();
  o.warmup = -1;
  EXPECT_EQ(SweepKernelsOnDevice(o, device, nullptr, sink, nullptr).status().message(),
            "warmup: out of range; got -1, expected >= 0");
  EXPECT_EQ(device.timed(), 0);
}

// Replays a FakeActivitySource and marks its windows in the device's call log: '[' at Start(),
// ']' at Flush().
class LoggedActivity final : public ActivitySource {
 public:
  LoggedActivity(FakeKernelDevice& device, std::vector<std::vector<KernelActivity>> batches)
      : device_(device), fake_(std::move(batches)) {}
  Status Start() override {
    device_.calls += '[';
    return fake_.Start();
  }
  StatusOr<std::vector<KernelActivity>> Flush() override {
    device_.calls += ']';
    return fake_.Flush();
  }
  Status SetMark(uint64_t mark) override { return fake_.SetMark(mark); }
  Status ClearMark() override { return fake_.ClearMark(); }

 private:
  FakeKernelDevice& device_;
  FakeActivitySource fake_;
};

// A cold GPU sweep evicts the device's caches, and waits for that, before every call: each
// warm-up, each event-timed call (before BeginTimed) and each kernel-timed call (before the
// activity window opens), never inside a window; the measured values are the warm sweep's. A
// warm sweep never evicts.
TEST(KernelSweepOnDevice, ColdSweepsEvictTheCachesBeforeEveryCallOutsideEveryWindow) {
  KernelSweepOptions o = SmallGpu();
  o.cold = true;
  FakeKernelDevice device({5.0, 1.0, 6.0});
  LoggedActivity activity(device, Batches(kGpuPoints * 3));
  MemorySink sink, kernel_sink;
  auto report = SweepKernelsOnDevice(o, device, &activity, sink, &kernel_sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->event.measured, kGpuPoints);
  EXPECT_EQ(report->kernel.measured, kGpuPoints);
  for (const auto& c : sink.Curves())
    for (const auto& p : c.points()) EXPECT_EQ(p.us(), 5.0) << CurveKey(c);
  for (const auto& c : kernel_sink.Curves())
    for (const auto& p : c.points()) EXPECT_DOUBLE_EQ(p.us(), 3.0) << CurveKey(c);
  // Per point: 1 warm-up + 3 event-timed + 3 kernel-timed calls, one eviction each.
  EXPECT_EQ(device.evictions(), kGpuPoints * 7);
  const std::string& calls = device.calls;
  ASSERT_EQ(std::count(calls.begin(), calls.end(), 'E'), device.evictions());
  int64_t windows = 0, copies = 0;
  bool evicted = false;  // since the last copy
  for (size_t i = 0; i < calls.size(); ++i) {
    const char c = calls[i];
    if (c == 'B' || c == '[') {
      ++windows;
      // The eviction, then the wait for it, right before the window opens.
      ASSERT_GE(i, 2u) << calls;
      EXPECT_EQ(calls.substr(i - 2, 2), "ES") << "window at " << i << " in " << calls;
      const size_t close = calls.find(c == 'B' ? 'T' : ']', i);
      ASSERT_NE(close, std::string::npos) << calls;
      EXPECT_EQ(calls.substr(i, close - i).find('E'), std::string::npos) << "eviction inside a window: " << calls;
    } else if (c == 'C') {
      ++copies;  // the copy points' calls: each (warm-up too) after an eviction of its own
      EXPECT_TRUE(evicted) << "copy " << copies << " without an eviction before it: " << calls;
      evicted = false;
    } else if (c == 'E') {
      evicted = true;
    }
  }
  EXPECT_EQ(windows, kGpuPoints * 6);
  EXPECT_EQ(copies, 4 * 3 * 7);

  // Warm (the same sweep, forced): no eviction.
  KernelSweepOptions warm = SmallGpu();
  warm.force = true;
  FakeKernelDevice warm_device({5.0, 1.0, 6.0});
  FakeActivitySource warm_activity(Batches(kGpuPoints * 3));
  auto warm_report = SweepKernelsOnDevice(warm, warm_device, &warm_activity, sink, &kernel_sink);
  ASSERT_TRUE(warm_report.ok()) << warm_report.status().ToString();
  EXPECT_EQ(warm_report->event.measured, kGpuPoints);
  EXPECT_EQ(warm_device.evictions(), 0);
  EXPECT_EQ(warm_device.calls.find('E'), std::string::npos);
}

// The fake device refuses an eviction inside an event window (what the test above relies on).
TEST(KernelSweepOnDevice, FakeDeviceRefusesAnEvictionInsideATimedWindow) {
  FakeKernelDevice device;
  ASSERT_TRUE(device.EvictCaches().ok());
  ASSERT_TRUE(device.BeginTimed().ok());
  EXPECT_EQ(device.EvictCaches().message(), "fake device: EvictCaches() between BeginTimed() and EndTimed()");
  ASSERT_TRUE(device.EndTimed().ok());
  EXPECT_EQ(device.evictions(), 1);
  EXPECT_EQ(device.calls, "EBT");
}

// A cold sweep flushes every host point's buffers before each call (what that costs in time is
// not visible on a fake clock): every kind of point is measured as in a warm sweep, and the
// clock is read only around the calls, so the flushes stay outside the timed span.
TEST(KernelSweep, ColdSweepsMeasureEveryKindOfPointOutsideTheFlush) {
  ASSERT_TRUE(CacheFlushSupported());  // x86-64 and AArch64: every machine this project builds on
  KernelSweepOptions o = Small();
  o.compressors = {"topk", "efsignsgd", "zen", "nonzero", "powersgd"};
  o.cold = true;
  FakeClock cold_clock(2.0), warm_clock(2.0);
  MemorySink cold, warm;
  auto report = SweepKernels(o, cold_clock, cold);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  o.cold = false;
  ASSERT_TRUE(SweepKernels(o, warm_clock, warm).ok());
  const std::vector<pb::Curve> cold_curves = cold.Curves(), warm_curves = warm.Curves();
  EXPECT_EQ(report->measured, static_cast<int64_t>(warm_curves.size()) * 3);
  ASSERT_EQ(cold_curves.size(), warm_curves.size());
  for (size_t i = 0; i < cold_curves.size(); ++i) {
    EXPECT_EQ(CurveKey(cold_curves[i]), CurveKey(warm_curves[i]));
    ASSERT_EQ(cold_curves[i].points_size(), 3);
    for (const auto& p : cold_curves[i].points()) EXPECT_EQ(p.us(), 2.0);
  }
  EXPECT_EQ(cold_clock.calls(), warm_clock.calls());
}

TEST(PowerOfTwoSizes, ListsTheRangeAndRejectsEmptyOrAbsurdOnes) {
  auto all = PowerOfTwoSizes("--min", 4, "--max", 64, 1 << 20);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, (std::vector<int64_t>{4, 8, 16, 32, 64}));
  auto stepped = PowerOfTwoSizes("--min", 4, "--max", 32, 1 << 20, 2);
  ASSERT_TRUE(stepped.ok());
  EXPECT_EQ(*stepped, (std::vector<int64_t>{4, 16, 32}));
  EXPECT_EQ(PowerOfTwoSizes("--min", 64, "--max", 4, 1 << 20).status().message(),
            "--max: empty size range; got 4, expected >= --min (64)");
  EXPECT_EQ(PowerOfTwoSizes("--min", 1000, "--max", int64_t{1} << 50, 1 << 20).status().message(),
            "--min: not a power of two; got 1000, expected a power of two such as 512\n"
            "--max: out of range; got 1125899906842624, expected a power of two in [1, 1048576]");
  EXPECT_EQ(PowerOfTwoSizes("--min", 0, "--max", 4, 1 << 20).status().message(),
            "--min: out of range; got 0, expected a power of two in [1, 1048576]");
  EXPECT_EQ(Median({3, 1, 2}), 2);
  EXPECT_EQ(Median({4, 1, 2, 3}), 2.5);
}

}  // namespace
}  // namespace cupcake::profile

namespace cupcake::profile {
namespace {

TEST(StoreSink, ReplacesPointsOnlyWhenAskedAndUpdatesMetadata) {
  testing::TempDir dir;
  auto store = ProfileStore::Open(dir.File("p.db"), true);
  ASSERT_TRUE(store.ok());
  pb::Profile p;
  p.mutable_cluster()->set_name("c");
  p.mutable_cluster()->set_nodes(1);
  p.mutable_cluster()->set_devices_per_node(2);
  ASSERT_TRUE(store->ImportProfile(p, false).ok());
  pb::Curve key;
  key.set_kind(pb::COMM);
  key.set_comm_op(pb::ALLREDUCE);
  key.set_scope(pb::GLOBAL);
  StoreSink sink(*store);
  EXPECT_EQ(sink.UpdateCurveMetadata(key).code(), StatusCode::kNotFound);
  ASSERT_TRUE(sink.AddPoint(key, 64, 5.0, false).ok());
  EXPECT_EQ(sink.AddPoint(key, 64, 6.0, false).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(sink.AddPoint(key, 64, 7.0, true).ok());
  pb::Curve meta = key;
  meta.set_wrong(3);
  ASSERT_TRUE(sink.UpdateCurveMetadata(meta).ok());
  auto loaded = store->Load();
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(loaded->curves_size(), 1);
  EXPECT_EQ(loaded->curves(0).points(0).us(), 7.0);
  EXPECT_EQ(loaded->curves(0).wrong(), 3);
}

}  // namespace
}  // namespace cupcake::profile

// The GPU side of the kernels sweep on a real device (label gpu; every case skips itself with
// the reason when there is no CUDA device or the build has no CUPTI, and fails when present
// hardware fails or CUPCAKE_REQUIRE_GPU=1: gpu_test.h): CUDA event timing, CUPTI activity
// records, and a small sweep of every compressor into memory sinks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "cupcake/kernels/compressor.h"
#include "cupcake/profile/activity.h"
#include "cupcake/profile/kernel_sweep.h"
#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/names.h"
#include "gpu_test.h"

namespace cupcake::profile {
namespace {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto device = OpenCudaKernelDevice(0);
    CUPCAKE_GPU_OR_SKIP(device.status());
    device_ = std::move(device).value();
  }
  std::unique_ptr<KernelDevice> device_;
};

constexpr int64_t kBytes = int64_t{64} << 20;

TEST_F(GpuTest, EventsTimeACopyAtAPlausibleBandwidth) {
  EXPECT_NE(device_->Describe().find("sm_"), std::string::npos) << device_->Describe();
  auto host = device_->AllocatePinned(kBytes);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  std::memset(*host, 1, kBytes);
  auto a = kernels::Buffer::Allocate(kernels::Backend::kCuda, kBytes);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(device_->CopyAsync(a->data(), *host, kBytes).ok());  // warm-up
  ASSERT_TRUE(device_->BeginTimed().ok());
  ASSERT_TRUE(device_->CopyAsync(a->data(), *host, kBytes).ok());
  auto us = device_->EndTimed();
  ASSERT_TRUE(us.ok()) << us.status().ToString();
  // Pinned host to device over PCIe or NVLink-C2C: between 1 GB/s and 1 TB/s.
  const double gb_per_s = static_cast<double>(kBytes) / (*us * 1e3);
  EXPECT_GT(gb_per_s, 1.0) << *us << " us";
  EXPECT_LT(gb_per_s, 1000.0) << *us << " us";
  // An empty bracket costs next to nothing.
  ASSERT_TRUE(device_->BeginTimed().ok());
  auto empty = device_->EndTimed();
  ASSERT_TRUE(empty.ok());
  EXPECT_LT(*empty, 100.0);
  device_->FreePinned(*host);
}

TEST_F(GpuTest, CuptiRecordsTheCopiesAndKernelsOfACall) {
  auto opened = OpenCuptiActivitySource();
  CUPCAKE_GPU_OR_SKIP(opened.status());  // a build without CUPTI skips; CUPTI that fails here fails
  std::unique_ptr<ActivitySource> cupti = std::move(opened).value();
  EXPECT_EQ(OpenCuptiActivitySource().status().code(), StatusCode::kFailedPrecondition);  // one per process
  EXPECT_EQ(cupti->Flush().status().message(), "activity source: Flush() without Start()");

  auto a = kernels::Buffer::Allocate(kernels::Backend::kCuda, kBytes);
  auto b = kernels::Buffer::Allocate(kernels::Backend::kCuda, kBytes);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Zero().ok());
  ASSERT_TRUE(cupti->Start().ok());
  ASSERT_TRUE(device_->CopyAsync(b->data(), a->data(), kBytes).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  auto records = cupti->Flush();
  ASSERT_TRUE(records.ok()) << records.status().ToString();
  ASSERT_EQ(records->size(), 1u);
  EXPECT_EQ((*records)[0].name, "memcpy DtoD");
  auto busy = KernelBusyUs(*records);
  ASSERT_TRUE(busy.ok());
  EXPECT_GT(*busy, 1.0);  // 64 MiB device to device: tens of us

  // Nothing is collected outside Start()..Flush().
  ASSERT_TRUE(device_->CopyAsync(b->data(), a->data(), kBytes).ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  ASSERT_TRUE(cupti->Start().ok());
  auto none = cupti->Flush();
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty()) << none->size() << " records";

  // A cold sweep's eviction (a memset over twice the L2), queued and waited for before Start(),
  // is not collected; inside the window it would be, as one memset record.
  ASSERT_TRUE(device_->EvictCaches().ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  ASSERT_TRUE(cupti->Start().ok());
  auto before = cupti->Flush();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  EXPECT_TRUE(before->empty()) << before->size() << " records";
  ASSERT_TRUE(cupti->Start().ok());
  ASSERT_TRUE(device_->EvictCaches().ok());
  auto inside = cupti->Flush();
  ASSERT_TRUE(inside.ok()) << inside.status().ToString();
  ASSERT_EQ(inside->size(), 1u);
  EXPECT_EQ((*inside)[0].name, "memset");

  // A compressor's encode: its kernels, with names.
  kernels::CompressorConfig config;
  config.name = "topk";
  config.n = 1 << 20;
  auto comp = kernels::MakeCompressor(config, kernels::Backend::kCuda);
  ASSERT_TRUE(comp.ok()) << comp.status().ToString();
  auto state = kernels::Buffer::Allocate(kernels::Backend::kCuda, 4 * (*comp)->state_floats());
  auto payload = kernels::Buffer::Allocate(kernels::Backend::kCuda, (*comp)->payload_bytes());
  ASSERT_TRUE(state.ok() && payload.ok() && state->Zero().ok());
  ASSERT_TRUE(cupti->Start().ok());
  ASSERT_TRUE((*comp)
                  ->Encode({a->as<float>(), static_cast<size_t>(config.n)},
                           {state->as<float>(), static_cast<size_t>((*comp)->state_floats())}, 0,
                           {payload->as<std::byte>(), static_cast<size_t>((*comp)->payload_bytes())},
                           device_->stream())
                  .ok());
  ASSERT_TRUE(device_->Synchronize().ok());
  auto enc = cupti->Flush();
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  ASSERT_FALSE(enc->empty());
  for (const KernelActivity& r : *enc) {
    EXPECT_FALSE(r.name.empty());
    EXPECT_GE(r.end_ns, r.start_ns) << r.name;
  }
}

TEST_F(GpuTest, SweepsEveryCompressorWithEventAndKernelTime) {
  auto opened = OpenCuptiActivitySource();
  CUPCAKE_GPU_OR_SKIP(opened.status());  // a build without CUPTI skips; CUPTI that fails here fails
  std::unique_ptr<ActivitySource> cupti = std::move(opened).value();
  KernelSweepOptions o;
  o.device = pb::GPU;
  o.elements = {1024, 1 << 18};
  o.world_size = 4;
  o.warmup = 2;
  o.iters = 5;
  MemorySink sink, kernel_sink;
  auto report = SweepKernelsOnDevice(o, *device_, cupti.get(), sink, &kernel_sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  // Encode and decode of every compressor and of zen (W >= 2, one ratio), and four copies.
  const int64_t points = static_cast<int64_t>((CompressorNames().size() * 2 + 2 + 4) * o.elements.size());
  EXPECT_EQ(report->event.measured, points);
  EXPECT_EQ(report->activity_error, "");
  for (const std::string& p : report->kernel_problems) ADD_FAILURE() << p;
  EXPECT_EQ(report->kernel.measured, points);
  std::map<std::string, pb::Curve> kernel;
  for (const pb::Curve& c : kernel_sink.Curves()) kernel[CurveKey(c)] = c;
  for (const pb::Curve& c : sink.Curves()) {
    SCOPED_TRACE(CurveKey(c));
    EXPECT_EQ(c.method(), "event");
    ASSERT_EQ(c.points_size(), 2);
    ASSERT_TRUE(kernel.contains(CurveKey(c)));
    const pb::Curve& k = kernel[CurveKey(c)];
    ASSERT_EQ(k.points_size(), 2);
    for (int i = 0; i < 2; ++i) {
      EXPECT_GT(c.points(i).us(), 0.0);
      EXPECT_GT(k.points(i).us(), 0.0);
      // Kernel-only time leaves out launch gaps: not above the event time, give or take noise.
      EXPECT_LE(k.points(i).us(), 1.5 * c.points(i).us() + 5.0) << "size " << c.points(i).size();
    }
  }
}

// A cold sweep (the L2 evicted before every call) measures every point of two compressors and
// the copies, event and kernel-only.
TEST_F(GpuTest, ColdSweepsEvictTheL2AndMeasureEveryPoint) {
  auto opened = OpenCuptiActivitySource();
  CUPCAKE_GPU_OR_SKIP(opened.status());
  std::unique_ptr<ActivitySource> cupti = std::move(opened).value();
  KernelSweepOptions o;
  o.device = pb::GPU;
  o.elements = {1024, 1 << 18};
  o.compressors = {"efsignsgd", "topk"};
  o.warmup = 1;
  o.iters = 3;
  o.cold = true;
  MemorySink sink, kernel_sink;
  auto report = SweepKernelsOnDevice(o, *device_, cupti.get(), sink, &kernel_sink);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const int64_t points = static_cast<int64_t>((2 * 2 + 4) * o.elements.size());
  EXPECT_EQ(report->event.measured, points);
  EXPECT_EQ(report->activity_error, "");
  for (const std::string& p : report->kernel_problems) ADD_FAILURE() << p;
  EXPECT_EQ(report->kernel.measured, points);
  for (const pb::Curve& c : sink.Curves())
    for (const auto& p : c.points()) EXPECT_GT(p.us(), 0.0) << CurveKey(c) << " at " << p.size();
}

}  // namespace
}  // namespace cupcake::profile

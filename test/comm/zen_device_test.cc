// ZenAllreduceDevice on one GPU: several ranks (threads) share the device through a staging
// communicator (device memory to the in-process group and back, on each rank's own stream),
// so the device steps meet real multi-rank exchanges; and one NCCL rank. The result must be
// the dense mean computed here from the inputs (zen_cases.h: integer values, exact sums), and
// equal, with the same bytes per phase, to the host path (ZenAllreduce) on the same inputs.
#include <cuda_runtime.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "comm/staging_communicator.h"
#include "cupcake/comm/nccl.h"
#include "gpu_test.h"
#include "zen_cases.h"

namespace cupcake::comm::testing {
namespace {

template <typename T>
T* Upload(const std::vector<T>& host) {
  void* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, host.size() * sizeof(T) + 4), cudaSuccess);
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return static_cast<T*>(device);
}

struct RankResult {
  std::vector<float> host_mean;  // the host path's sums / P, scattered (ScatterMean's arithmetic)
  std::vector<float> device_mean;
  ZenStats host_stats, device_stats;
  int64_t host_union = 0, device_union = 0;
};

// Runs both paths on this rank's inputs: the host one on `host`, the device one on `device`.
void RunBoth(Communicator& host, Communicator& device, int64_t n, const std::vector<uint32_t>& indices,
             const std::vector<float>& values, RankResult& out) {
  const int p = host.size();
  StatusOr<kernels::zen::Sparse> sum = ZenAllreduce(host, {indices, values}, {.n = n, .seed = 0}, &out.host_stats);
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  out.host_union = static_cast<int64_t>(sum->indices.size());
  out.host_mean.assign(static_cast<size_t>(n), 0.0f);
  for (size_t j = 0; j < sum->indices.size(); ++j) out.host_mean[sum->indices[j]] = sum->values[j] / static_cast<float>(p);

  StatusOr<std::unique_ptr<kernels::zen::DeviceSteps>> steps = kernels::zen::DeviceSteps::Create();
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  uint32_t* d_indices = Upload(indices);
  float* d_values = Upload(values);
  float* d_out = Upload(std::vector<float>(static_cast<size_t>(n), 7.0f));  // must be overwritten everywhere
  // Twice, so the second call reuses the first one's areas.
  for (int call = 0; call < 2; ++call) {
    out.device_stats = {};
    StatusOr<int64_t> size = ZenAllreduceDevice(device, d_indices, d_values, static_cast<int64_t>(indices.size()),
                                                {.n = n, .seed = 0}, static_cast<float>(p), d_out, **steps,
                                                &out.device_stats);
    ASSERT_TRUE(size.ok()) << size.status().ToString();
    out.device_union = *size;
  }
  out.device_mean.resize(static_cast<size_t>(n));
  EXPECT_EQ(cudaMemcpy(out.device_mean.data(), d_out, 4 * n, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_indices);
  cudaFree(d_values);
  cudaFree(d_out);
}

void ExpectSamePhases(const ZenPhaseBytes& a, const ZenPhaseBytes& b, const char* phase) {
  EXPECT_EQ(a.sent, b.sent) << phase;
  EXPECT_EQ(a.received, b.received) << phase;
}

// Runs `size` ranks, each with an in-process rank for the host path and a staging one for the
// device path; `inputs(rank)` gives the rank's pairs.
std::vector<RankResult> RunRanks(int size, int64_t n,
                                 const std::function<std::pair<std::vector<uint32_t>, std::vector<float>>(int)>& inputs) {
  InProcessGroup host_group(size), device_group(size);
  std::vector<RankResult> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> host = host_group.Rank(r);
      StagingCommunicator device(device_group.Rank(r));
      const auto [indices, values] = inputs(r);
      RunBoth(*host, device, n, indices, values, results[static_cast<size_t>(r)]);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

class ZenDevice : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  void SetUp() override { CUPCAKE_GPU_OR_SKIP(kernels::BackendAvailable(kernels::Backend::kCuda)); }
};

TEST_P(ZenDevice, EqualsTheDenseMeanAndTheHostPath) {
  const auto [size, index] = GetParam();
  const ZenCase c = ZenCases()[static_cast<size_t>(index)];
  std::vector<double> dense(static_cast<size_t>(c.n), 0);
  for (int r = 0; r < size; ++r) {
    for (uint32_t i : c.indices(r, size, c.n)) dense[i] += ZenValue(r, i);
  }
  const std::vector<RankResult> results = RunRanks(size, c.n, [&](int r) {
    std::vector<uint32_t> idx = c.indices(r, size, c.n);
    std::vector<float> val;
    for (uint32_t i : idx) val.push_back(ZenValue(r, i));
    return std::make_pair(idx, val);
  });
  for (int r = 0; r < size; ++r) {
    const RankResult& got = results[static_cast<size_t>(r)];
    ASSERT_EQ(got.device_mean.size(), static_cast<size_t>(c.n));
    for (int64_t i = 0; i < c.n; ++i) {
      // Integer sums are exact in float; 0 + 0 where no rank has the index.
      const float expected = static_cast<float>(dense[static_cast<size_t>(i)]) / static_cast<float>(size);
      ASSERT_EQ(got.device_mean[static_cast<size_t>(i)], expected) << "rank " << r << " element " << i;
    }
    EXPECT_EQ(std::memcmp(got.device_mean.data(), got.host_mean.data(), 4 * got.host_mean.size()), 0) << "rank " << r;
    EXPECT_EQ(got.device_union, got.host_union);
    ExpectSamePhases(got.device_stats.counts, got.host_stats.counts, "counts");
    ExpectSamePhases(got.device_stats.pairs, got.host_stats.pairs, "pairs");
    ExpectSamePhases(got.device_stats.sizes, got.host_stats.sizes, "sizes");
    ExpectSamePhases(got.device_stats.partitions, got.host_stats.partitions, "partitions");
    EXPECT_EQ(got.device_stats.encodings, got.host_stats.encodings) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZenDevice, ZenRanksAndCases(), ZenRanksCaseName);

// Non-integer values, where the order of additions shows in the last bits: the device path
// equals the host path bitwise on every rank, and the ranks equal each other.
TEST(ZenDeviceBitwise, NonIntegerSumsEqualTheHostPath) {
  CUPCAKE_GPU_OR_SKIP(kernels::BackendAvailable(kernels::Backend::kCuda));
  const int size = 4;
  const int64_t n = 200003;
  const std::vector<RankResult> results = RunRanks(size, n, [&](int r) {
    std::vector<uint32_t> idx = UniformIndices(static_cast<uint64_t>(r % 2), n, 4000);  // ranks overlap pairwise
    std::vector<float> val;
    std::mt19937 rng(static_cast<uint32_t>(r));
    std::uniform_real_distribution<float> dist(-1e4f, 1e4f);
    for (size_t j = 0; j < idx.size(); ++j) val.push_back(dist(rng));
    return std::make_pair(idx, val);
  });
  for (int r = 0; r < size; ++r) {
    const RankResult& got = results[static_cast<size_t>(r)];
    EXPECT_EQ(std::memcmp(got.device_mean.data(), got.host_mean.data(), 4 * n), 0) << "rank " << r;
    EXPECT_EQ(std::memcmp(got.device_mean.data(), results[0].device_mean.data(), 4 * n), 0) << "rank " << r;
  }
}

// One NCCL rank: the device path on NCCL's own stream and collectives.
TEST(ZenDeviceNccl, OneRankGivesItsInputDivided) {
  StatusOr<std::unique_ptr<Communicator>> nccl = MakeNcclCommunicator(nullptr);
  CUPCAKE_GPU_OR_SKIP(nccl.status());
  StatusOr<std::unique_ptr<kernels::zen::DeviceSteps>> steps = kernels::zen::DeviceSteps::Create();
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  const int64_t n = 100000;
  const std::vector<uint32_t> idx = UniformIndices(5, n, 2500);
  std::vector<float> val;
  for (uint32_t i : idx) val.push_back(static_cast<float>(i % 97) - 40.0f);
  uint32_t* d_indices = Upload(idx);
  float* d_values = Upload(val);
  float* d_out = Upload(std::vector<float>(static_cast<size_t>(n), 7.0f));
  StatusOr<int64_t> size = ZenAllreduceDevice(**nccl, d_indices, d_values, static_cast<int64_t>(idx.size()),
                                              {.n = n, .seed = 1}, 2.0f, d_out, **steps);
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(*size, static_cast<int64_t>(idx.size()));
  std::vector<float> got(static_cast<size_t>(n));
  ASSERT_EQ(cudaMemcpy(got.data(), d_out, 4 * n, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> expected(static_cast<size_t>(n), 0.0f);
  for (size_t j = 0; j < idx.size(); ++j) expected[idx[j]] = val[j] / 2.0f;
  EXPECT_EQ(got, expected);
  cudaFree(d_indices);
  cudaFree(d_values);
  cudaFree(d_out);
}

TEST(ZenDeviceNccl, HostMemoryCommunicatorIsRefused) {
  InProcessGroup group(1);
  std::unique_ptr<Communicator> host = group.Rank(0);
  StatusOr<std::unique_ptr<kernels::zen::DeviceSteps>> steps = kernels::zen::DeviceSteps::Create();
  CUPCAKE_GPU_OR_SKIP(steps.status());
  StatusOr<int64_t> size = ZenAllreduceDevice(*host, nullptr, nullptr, 0, {.n = 10}, 1.0f, nullptr, **steps);
  ASSERT_FALSE(size.ok());
  EXPECT_EQ(size.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(size.status().message().find("host memory; expected device memory"), std::string::npos)
      << size.status().ToString();
}

}  // namespace
}  // namespace cupcake::comm::testing

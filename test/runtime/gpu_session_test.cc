// The Session on GPU memory over NCCL (label gpu; built with NCCL, skips itself without a GPU).
// NCCL refuses two ranks on one GPU, so these run one rank (a NCCL communicator of one, its id
// made locally); multi-rank semantics are the CPU suites' (in-process and mpirun). Every
// compressor x grouping x layout (slices of one flat device buffer, or one cudaMalloc per
// tensor) over 4 iterations with error feedback, bitwise against the CUDA kernels' reference
// from the same payloads; fp32 exactly the average; the job's stream ordered before the encode;
// host memory refused; GraVAC's gain probe on the device against the host's, and an adapting
// session deciding and averaging as the same session on host memory.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/staging_communicator.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/proto/plan_io.h"
#include "cupcake/runtime/session.h"
#include "gpu_test.h"
#include "gravac.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using comm::MakeNcclCommunicator;
using comm::NcclCommunicatorFromHandle;

#define SKIP_WITHOUT_GPU() CUPCAKE_GPU_OR_SKIP(kernels::BackendAvailable(kernels::Backend::kCuda))

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

pb::Plan OnGpu(pb::Plan plan) {
  plan.set_device(pb::GPU);
  for (auto& g : *plan.mutable_groups()) g.mutable_options()->set_device(pb::GPU);
  return plan;
}

pb::Plan GpuPlan(const pb::Model& model, const testing::Grouping& grouping, const std::string& compressor,
                 double ratio = 0.25) {
  return OnGpu(testing::MakePlan(model, grouping, compressor, 1, ratio));
}

// The job's gradients in device memory: one cudaMalloc (flat, tensors adjacent in plan order)
// or one per tensor (separate).
class DeviceGradients {
 public:
  DeviceGradients(const pb::Model& m, testing::Layout layout) {
    int64_t total = 0;
    for (const auto& t : m.tensors()) total += t.numel();
    if (layout == testing::Layout::kFlat) allocations_.push_back(Malloc(total));
    int64_t at = 0;
    for (const auto& t : m.tensors()) {
      if (layout == testing::Layout::kSeparate) allocations_.push_back(Malloc(t.numel()));
      ptrs_.push_back(layout == testing::Layout::kSeparate ? allocations_.back() : allocations_[0] + at);
      numels_.push_back(t.numel());
      at += t.numel();
    }
  }
  ~DeviceGradients() {
    for (float* p : allocations_) (void)cudaFree(p);
  }
  DeviceGradients(const DeviceGradients&) = delete;
  DeviceGradients& operator=(const DeviceGradients&) = delete;

  Status RegisterAll(Session& s, const pb::Model& m) const {
    for (int i = 0; i < m.tensors_size(); ++i)
      CUPCAKE_RETURN_IF_ERROR(s.RegisterDevice(m.tensors(i).name(), ptrs_[static_cast<size_t>(i)], numels_[static_cast<size_t>(i)]));
    return Status::Ok();
  }
  // TestGradient values of `rank` at `iteration`, copied on `stream` (asynchronously, as a
  // job's backward writes its gradients).
  void Fill(int rank, int iteration, cudaStream_t stream) {
    host_.clear();
    for (size_t t = 0; t < ptrs_.size(); ++t) {
      host_.emplace_back(static_cast<size_t>(numels_[t]));
      for (int64_t j = 0; j < numels_[t]; ++j)
        host_.back()[static_cast<size_t>(j)] = testing::TestGradient(rank, iteration, static_cast<int>(t), j);
      EXPECT_EQ(cudaMemcpyAsync(ptrs_[t], host_.back().data(), 4 * static_cast<size_t>(numels_[t]),
                                cudaMemcpyHostToDevice, stream),
                cudaSuccess);
    }
  }
  std::vector<std::vector<float>> Download() const {
    std::vector<std::vector<float>> out;
    for (size_t t = 0; t < ptrs_.size(); ++t) {
      out.emplace_back(static_cast<size_t>(numels_[t]));
      EXPECT_EQ(cudaMemcpy(out.back().data(), ptrs_[t], 4 * static_cast<size_t>(numels_[t]), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return out;
  }
  const std::vector<std::vector<float>>& filled() const { return host_; }

 private:
  static float* Malloc(int64_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, 4 * static_cast<size_t>(n)), cudaSuccess);
    return static_cast<float*>(p);
  }
  std::vector<float*> allocations_;
  std::vector<float*> ptrs_;
  std::vector<int64_t> numels_;
  std::vector<std::vector<float>> host_;  // pinned by the async copies until the next Fill
};

struct Case {
  std::string compressor;
  std::string grouping;
  testing::Layout layout;
  bool graphs = true;  // SessionOptions::device_graphs
};
std::string CaseName(const Case& c) {
  return c.compressor + "_" + c.grouping + "_" + testing::LayoutName(c.layout) + (c.graphs ? "" : "_nographs");
}
void PrintTo(const Case& c, std::ostream* os) { *os << CaseName(c); }

class GpuMatchesCudaReference : public ::testing::TestWithParam<Case> {};

TEST_P(GpuMatchesCudaReference, OverSeveralIterationsWithErrorFeedback) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const pb::Model model = testing::SmallModel();
  const testing::Grouping grouping = c.grouping == "layerwise"   ? testing::LayerWise(model)
                                     : c.grouping == "one_group" ? testing::OneGroup(model)
                                                                 : testing::Planned();
  const pb::Plan plan = GpuPlan(model, grouping, c.compressor);
  auto comm = MakeNcclCommunicator(nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  // The job computes its gradients on a stream of its own; the session orders after it.
  cudaStream_t job = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&job, cudaStreamNonBlocking));
  SessionOptions options;
  options.job_stream = job;
  options.device_graphs = c.graphs;
  auto session = Session::Create(plan, std::move(comm).value(), options);
  ASSERT_TRUE(session.ok()) << session.status().message();
  {
    DeviceGradients grads(model, c.layout);
    ASSERT_TRUE(grads.RegisterAll(**session, model).ok());
    EXPECT_EQ((*session)->fusion_bytes() == 0, c.layout == testing::Layout::kFlat || c.grouping == "layerwise");
    testing::Reference reference(plan, 1, kernels::Backend::kCuda);
    for (int it = 0; it < 4; ++it) {
      grads.Fill(0, it, job);
      for (int i = 0; i < model.tensors_size(); ++i) ASSERT_TRUE((*session)->GradientReady(i).ok());
      Status s = (*session)->Synchronize();
      ASSERT_TRUE(s.ok()) << s.message();
      const auto got = grads.Download();
      EXPECT_EQ(testing::FirstDifference(got, reference.Step(it)), "") << "iteration " << it;
      if (c.compressor == "fp32") {  // the average over one rank: the gradient itself, exactly
        EXPECT_EQ(testing::FirstDifference(got, grads.filled()), "") << "iteration " << it;
      }
    }
  }
  session->reset();
  ASSERT_CUDA(cudaStreamDestroy(job));
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (std::string_view name : CompressorNames())
    for (const char* grouping : {"layerwise", "one_group", "planned"})
      for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat})
        cases.push_back({std::string(name), grouping, layout});
  // Graphs are captured in the first step and replayed after; the same steps queued directly:
  for (std::string_view name : CompressorNames())
    cases.push_back({std::string(name), "planned", testing::Layout::kSeparate, /*graphs=*/false});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCompressors, GpuMatchesCudaReference, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return CaseName(p.param); });

// Sessions at several ranks on one GPU: NCCL refuses two ranks on one GPU, so the ranks are
// threads over the staging communicator (device memory through the in-process group; Split
// gives parts on streams of their own, as NCCL's does). Each rank fills its gradients with its
// own TestGradient values on its job stream, runs `iterations` steps and must end each with
// `want[it]` bit for bit.
void RunStagedRanks(const pb::Plan& plan, int world, testing::Layout layout, bool graphs,
                    const std::vector<std::vector<std::vector<float>>>& want) {
  const pb::Model& model = plan.model().model();
  comm::InProcessGroup group(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      cudaStream_t job = nullptr;
      ASSERT_CUDA(cudaStreamCreateWithFlags(&job, cudaStreamNonBlocking));
      SessionOptions options;
      options.job_stream = job;
      options.device_graphs = graphs;
      auto session =
          Session::Create(plan, std::make_unique<comm::testing::StagingCommunicator>(group.Rank(r)), options);
      ASSERT_TRUE(session.ok()) << session.status().message();
      {
        DeviceGradients grads(model, layout);
        ASSERT_TRUE(grads.RegisterAll(**session, model).ok());
        for (size_t it = 0; it < want.size(); ++it) {
          grads.Fill(r, static_cast<int>(it), job);
          for (int i = 0; i < model.tensors_size(); ++i) ASSERT_TRUE((*session)->GradientReady(i).ok());
          Status s = (*session)->Synchronize();
          ASSERT_TRUE(s.ok()) << s.message();
          EXPECT_EQ(testing::FirstDifference(grads.Download(), want[it]), "") << "rank " << r << ", iteration " << it;
        }
      }
      session->reset();
      ASSERT_CUDA(cudaStreamDestroy(job));
    });
  }
  for (auto& t : ranks) t.join();
}

struct SchemeCase {
  std::string compressor;
  std::string scheme;
  int world;
  testing::Layout layout;
  bool graphs;
};
std::string SchemeCaseName(const SchemeCase& c) {
  return c.compressor + "_" + c.scheme + "_w" + std::to_string(c.world) + "_" + testing::LayoutName(c.layout) +
         (c.graphs ? "" : "_nographs");
}
void PrintTo(const SchemeCase& c, std::ostream* os) { *os << SchemeCaseName(c); }

// Zen groups on GPU memory (docs/ZEN.md): every rank's result equals the CUDA reference of the
// same plan without the scheme (the allgather scheme: each rank's payload decoded, values added
// in rank order, divided by W) bit for bit over iterations with error feedback, as on host
// memory (session_test.cc, ZenMatchesFlat: the integer gradients give exact sums).
class GpuZenMatchesFlat : public ::testing::TestWithParam<SchemeCase> {};

TEST_P(GpuZenMatchesFlat, BitForBitOverIterations) {
  SKIP_WITHOUT_GPU();
  const SchemeCase c = GetParam();
  const pb::Model model = testing::SmallModel();
  const pb::Plan flat = OnGpu(testing::MakePlan(model, testing::Planned(), c.compressor, c.world));
  const pb::Plan plan = OnGpu(testing::WithScheme(flat, "zen", 1));
  ASSERT_TRUE(cupcake::ValidatePlan(plan, "plan").ok()) << cupcake::ValidatePlan(plan, "plan").ToString();
  testing::Reference reference(flat, c.world, kernels::Backend::kCuda);
  std::vector<std::vector<std::vector<float>>> want;
  for (int it = 0; it < 3; ++it) want.push_back(reference.Step(it));
  RunStagedRanks(plan, c.world, c.layout, c.graphs, want);
}

INSTANTIATE_TEST_SUITE_P(SparseCompressors, GpuZenMatchesFlat,
                         ::testing::Values(SchemeCase{"topk", "zen", 1, testing::Layout::kSeparate, true},
                                           SchemeCase{"topk", "zen", 2, testing::Layout::kSeparate, true},
                                           SchemeCase{"topk", "zen", 3, testing::Layout::kFlat, true},
                                           SchemeCase{"topk", "zen", 4, testing::Layout::kSeparate, false},
                                           SchemeCase{"dgc", "zen", 3, testing::Layout::kSeparate, true},
                                           SchemeCase{"dgc", "zen", 4, testing::Layout::kFlat, true}),
                         [](const ::testing::TestParamInfo<SchemeCase>& p) { return SchemeCaseName(p.param); });

// Hierarchical schemes on GPU memory (docs/MODEL.md, v2): 4 ranks as 2 nodes of 2 (the intra and
// inter parts split from the staging communicator, each on its own stream), over iterations with
// error feedback; every rank ends with the restatement's result (runtime_test_util.h,
// HierarchicalReference with the codec's CUDA kernels), bit for bit, as on host memory.
class GpuHierarchicalMatchesReference : public ::testing::TestWithParam<SchemeCase> {};

TEST_P(GpuHierarchicalMatchesReference, OnTwoNodesOfTwoRanks) {
  SKIP_WITHOUT_GPU();
  const SchemeCase c = GetParam();
  constexpr int kDevices = 2;
  const pb::Model model = testing::SmallModel();
  const pb::Plan plan =
      OnGpu(testing::WithScheme(testing::MakePlan(model, testing::Planned(), c.compressor, c.world), c.scheme, kDevices));
  ASSERT_TRUE(cupcake::ValidatePlan(plan, "plan").ok()) << cupcake::ValidatePlan(plan, "plan").ToString();
  testing::HierarchicalReference reference(plan, c.world, kDevices, kernels::Backend::kCuda);
  std::vector<std::vector<std::vector<float>>> want;
  for (int it = 0; it < 3; ++it) want.push_back(reference.Step(it));
  RunStagedRanks(plan, c.world, c.layout, c.graphs, want);
}

INSTANTIATE_TEST_SUITE_P(
    Schemes, GpuHierarchicalMatchesReference,
    ::testing::Values(SchemeCase{"fp32", "hier_fp32", 4, testing::Layout::kSeparate, true},
                      SchemeCase{"efsignsgd", "hier_fp32", 4, testing::Layout::kFlat, true},
                      SchemeCase{"efsignsgd", "hier", 4, testing::Layout::kSeparate, true},
                      SchemeCase{"efsignsgd", "hier", 4, testing::Layout::kFlat, false},
                      SchemeCase{"topk", "hier", 4, testing::Layout::kSeparate, true},
                      SchemeCase{"randk", "hier", 4, testing::Layout::kFlat, true},
                      SchemeCase{"fp16", "hier", 4, testing::Layout::kSeparate, true},
                      SchemeCase{"topk", "hier_fp16", 4, testing::Layout::kSeparate, true},
                      SchemeCase{"onebit", "hier", 4, testing::Layout::kFlat, true},
                      SchemeCase{"efsignsgd", "hier", 8, testing::Layout::kSeparate, true}),
    [](const ::testing::TestParamInfo<SchemeCase>& p) { return SchemeCaseName(p.param); });

// Groups offloaded to the CPU (docs/MODEL.md v2: a cpu option in a plan for the GPU): the
// tensors copied to pinned host memory, encoded by the CPU worker with the CPU kernels, the
// payload exchanged over the device communicator, decoded on the host and copied back. Every
// rank ends each step with the CPU kernels' reference for the offloaded groups and the CUDA
// kernels' for the others (the same plan's groups, flat scheme), bit for bit, over iterations
// with error feedback, at 3 ranks over the staging communicator.
struct OffloadCase {
  std::string compressor;
  std::vector<int> offloaded;  // groups of testing::Planned() on the cpu
  testing::Layout layout;
};
std::string OffloadCaseName(const OffloadCase& c) {
  std::string groups;
  for (int k : c.offloaded) groups += std::to_string(k);
  return c.compressor + "_cpu" + groups + "_" + testing::LayoutName(c.layout);
}
void PrintTo(const OffloadCase& c, std::ostream* os) { *os << OffloadCaseName(c); }

class GpuOffloadMatchesReference : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(GpuOffloadMatchesReference, CpuKernelsForOffloadedGroups) {
  SKIP_WITHOUT_GPU();
  const OffloadCase c = GetParam();
  constexpr int kWorld = 3;
  const pb::Model model = testing::SmallModel();
  const pb::Plan flat = OnGpu(testing::MakePlan(model, testing::Planned(), c.compressor, kWorld));
  pb::Plan plan = OnGpu(testing::WithScheme(flat, "flat", 1));
  for (int k : c.offloaded) plan.mutable_groups(k)->mutable_options()->set_device(pb::CPU);
  ASSERT_TRUE(cupcake::ValidatePlan(plan, "plan").ok()) << cupcake::ValidatePlan(plan, "plan").ToString();
  testing::Reference on_cpu(flat, kWorld, kernels::Backend::kCpu), on_gpu(flat, kWorld, kernels::Backend::kCuda);
  std::vector<std::vector<std::vector<float>>> want;
  for (int it = 0; it < 3; ++it) {
    std::vector<std::vector<float>> cpu = on_cpu.Step(it), gpu = on_gpu.Step(it);
    for (int k = 0; k < plan.groups_size(); ++k) {
      const bool offloaded = std::find(c.offloaded.begin(), c.offloaded.end(), k) != c.offloaded.end();
      for (int t = plan.groups(k).first_tensor(); t <= plan.groups(k).last_tensor(); ++t) {
        if (offloaded) gpu[static_cast<size_t>(t)] = cpu[static_cast<size_t>(t)];
      }
    }
    want.push_back(std::move(gpu));
  }
  RunStagedRanks(plan, kWorld, c.layout, /*graphs=*/true, want);
}

INSTANTIATE_TEST_SUITE_P(Compressors, GpuOffloadMatchesReference,
                         ::testing::Values(OffloadCase{"efsignsgd", {0, 1, 2}, testing::Layout::kSeparate},
                                           OffloadCase{"efsignsgd", {0, 2}, testing::Layout::kFlat},
                                           OffloadCase{"topk", {1}, testing::Layout::kSeparate},
                                           OffloadCase{"topk", {0, 2}, testing::Layout::kFlat},
                                           OffloadCase{"fp16", {2}, testing::Layout::kSeparate},
                                           OffloadCase{"qsgd", {0, 1}, testing::Layout::kSeparate},
                                           OffloadCase{"fp32", {0, 1, 2}, testing::Layout::kFlat}),
                         [](const ::testing::TestParamInfo<OffloadCase>& p) { return OffloadCaseName(p.param); });

// A session destroyed with an offloaded group still being encoded, or never synchronized,
// stops its CPU worker and returns (no hang, no crash).
TEST(GpuOffload, DestroyedMidStepReturns) {
  SKIP_WITHOUT_GPU();
  const pb::Model model = testing::SmallModel();
  pb::Plan plan = OnGpu(testing::WithScheme(testing::MakePlan(model, testing::Planned(), "efsignsgd", 1), "flat", 1));
  plan.mutable_groups(0)->mutable_options()->set_device(pb::CPU);
  auto comm = MakeNcclCommunicator(nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  auto session = Session::Create(plan, std::move(comm).value());
  ASSERT_TRUE(session.ok()) << session.status().message();
  DeviceGradients grads(model, testing::Layout::kSeparate);
  ASSERT_TRUE(grads.RegisterAll(**session, model).ok());
  grads.Fill(0, 0, nullptr);
  for (int i = 0; i <= plan.groups(0).last_tensor(); ++i) ASSERT_TRUE((*session)->GradientReady(i).ok());
  session->reset();
}

TEST(GpuSession, RefusesHostMemoryAndCpuPlans) {
  SKIP_WITHOUT_GPU();
  const pb::Model model = testing::SmallModel("tiny", {4, 4});
  auto comm = MakeNcclCommunicator(nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  auto session = Session::Create(GpuPlan(model, testing::OneGroup(model), "fp32"), std::move(comm).value());
  ASSERT_TRUE(session.ok()) << session.status().message();
  std::vector<float> host(4);
  EXPECT_EQ((*session)->Register("t0", host).message(),
            "Register: gradient 0 ('t0'): host memory for a session on GPU memory; expected RegisterDevice (the "
            "communicator works on GPU memory)");
  const std::string message = (*session)->RegisterDevice("t0", host.data(), 4).message();
  EXPECT_EQ(message.rfind("RegisterDevice: gradient 0 ('t0'): not device memory; got ", 0), 0u) << message;

  auto other = MakeNcclCommunicator(nullptr);
  ASSERT_TRUE(other.ok());
  auto cpu = Session::Create(testing::MakePlan(model, testing::OneGroup(model), "fp32", 1), std::move(other).value());
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.status().message(),
            "plan: device: does not match the communicator; got cpu, expected gpu (the communicator works on GPU memory)");
}

// A job that owns a NCCL communicator hands it over: the session runs on a split of it, and the
// job's communicator still works afterwards.
TEST(GpuSession, RunsOnTheJobsNcclCommunicator) {
  SKIP_WITHOUT_GPU();
  int device = 0;
  ASSERT_CUDA(cudaGetDevice(&device));
  ncclComm_t job = nullptr;
  ASSERT_EQ(ncclCommInitAll(&job, 1, &device), ncclSuccess);
  const pb::Model model = testing::SmallModel();
  {
    auto comm = NcclCommunicatorFromHandle(&job);
    ASSERT_TRUE(comm.ok()) << comm.status().message();
    EXPECT_EQ((*comm)->rank(), 0);
    EXPECT_EQ((*comm)->size(), 1);
    auto session = Session::Create(GpuPlan(model, testing::OneGroup(model), "fp32"), std::move(comm).value());
    ASSERT_TRUE(session.ok()) << session.status().message();
    DeviceGradients grads(model, testing::Layout::kSeparate);
    ASSERT_TRUE(grads.RegisterAll(**session, model).ok());
    for (int it = 0; it < 2; ++it) {
      grads.Fill(0, it, nullptr);
      for (int i = 0; i < model.tensors_size(); ++i) ASSERT_TRUE((*session)->GradientReady(i).ok());
      Status st = (*session)->Synchronize();
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(testing::FirstDifference(grads.Download(), grads.filled()), "") << "iteration " << it;
    }
  }
  float* x = nullptr;
  ASSERT_CUDA(cudaMalloc(&x, sizeof(float)));
  EXPECT_EQ(ncclAllReduce(x, x, 1, ncclFloat32, ncclSum, job, nullptr), ncclSuccess);
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_CUDA(cudaFree(x));
  EXPECT_EQ(ncclCommDestroy(job), ncclSuccess);
}


// ---- GraVAC on GPU memory ----

class StillClock final : public Clock {
 public:
  double NowUs() override { return 0; }
};

float* ToDevice(const std::vector<float>& v) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 4 * v.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), 4 * v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<float*>(p);
}

// One group through the host probe and through the device probe (UseDevice); the sums.
struct ProbePair {
  internal::GainSums host, device;
};
ProbePair ProbeBoth(internal::Selection selection, const std::vector<float>& g, const std::vector<float>* memory,
                    double ratio_min, double ratio_c) {
  StillClock clock;
  const auto n = static_cast<int64_t>(g.size());
  internal::GainProbe host(selection, n, 42, &clock), device(selection, 0, 42, &clock);
  EXPECT_TRUE(device.UseDevice().ok());
  host.SetRatios(ratio_min, ratio_c);
  device.SetRatios(ratio_min, ratio_c);
  EXPECT_TRUE(host.Observe(g, memory ? memory->data() : nullptr, 3, 7).ok());
  float* dg = ToDevice(g);
  float* dm = memory ? ToDevice(*memory) : nullptr;
  const Status observed =
      device.Observe({dg, g.size()}, dm, 3, 7, kernels::Backend::kCuda, nullptr);
  EXPECT_TRUE(observed.ok()) << observed.ToString();
  double cost = 0;
  ProbePair out{host.Take(&cost).value(), device.Take(&cost).value()};
  (void)cudaFree(dg);
  (void)cudaFree(dm);
  return out;
}

// Integer-valued data with many ties (sums exact in any order: equal) and spread floats (equal
// to 1e-12 relative: only the order of the double additions differs), with and without memory,
// at ratios that keep one element, a tenth, and every element.
TEST(GpuGainProbe, MatchesTheHostProbe) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 300007;
  std::vector<float> ties(n), spread(n), memory(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    ties[static_cast<size_t>(i)] = testing::TestGradient(0, 1, 2, i);
    spread[static_cast<size_t>(i)] = normal(rng) * std::exp(normal(rng));
    memory[static_cast<size_t>(i)] = static_cast<float>(i % 5) - 2.0f;
  }
  struct Ratios {
    double min, c;
  };
  for (internal::Selection selection : {internal::Selection::kMagnitude, internal::Selection::kRandom})
    for (const std::vector<float>* g : {&ties, &spread})
      for (const std::vector<float>* m : {static_cast<std::vector<float>*>(nullptr), &memory})
        for (Ratios r : {Ratios{0.1, 0.01}, Ratios{1.0, 1e-9}, Ratios{0.5, 0.5}}) {
          const bool exact = g == &ties;
          const ProbePair p = ProbeBoth(selection, *g, m, r.min, r.c);
          SCOPED_TRACE(std::string(selection == internal::Selection::kRandom ? "random" : "magnitude") +
                       (exact ? " ties" : " spread") + (m ? " with memory" : "") + " ratios " +
                       std::to_string(r.min) + "/" + std::to_string(r.c));
          ASSERT_GT(p.host.cand, 0);
          for (auto [h, d] : {std::pair{p.host.input, p.device.input}, std::pair{p.host.min, p.device.min},
                              std::pair{p.host.cand, p.device.cand}}) {
            if (exact)
              EXPECT_EQ(d, h);
            else
              EXPECT_NEAR(d, h, 1e-12 * h);
          }
        }
}

// Sums add over groups and steps until Take, which zeroes them; a group that is not finite is
// left out and counted (GainSums::skipped, from the device's totals); the window's sums survive
// ReadState and WriteState (a restored session), whose count starts at its restore.
TEST(GpuGainProbe, AddsUntilTakeLeavesOutWhatIsNotFiniteAndRestores) {
  SKIP_WITHOUT_GPU();
  StillClock clock;
  internal::GainProbe probe(internal::Selection::kMagnitude, 0, 0, &clock);
  ASSERT_TRUE(probe.UseDevice().ok());
  probe.SetRatios(0.4, 0.2);  // of 5 elements: 2, then 1
  float* g = ToDevice({3, -4, 1, 0, 2});
  float* bad = ToDevice({1, NAN, 2, 3, 4});
  for (float* x : {g, bad, g})
    ASSERT_TRUE(probe.Observe({x, 5}, nullptr, 0, 0, kernels::Backend::kCuda, nullptr).ok());
  std::vector<double> state(static_cast<size_t>(probe.StateSize()));
  ASSERT_TRUE(probe.ReadState(state).ok());
  EXPECT_EQ(state[0], 60);  // 2 x (9 + 16 + 1 + 0 + 4)
  EXPECT_EQ(state[1], 50);  // 2 x (16 + 9)
  EXPECT_EQ(state[2], 32);
  internal::GainProbe restored(internal::Selection::kMagnitude, 0, 0, &clock);
  ASSERT_TRUE(restored.UseDevice().ok());
  ASSERT_TRUE(restored.Observe({g, 5}, nullptr, 0, 0, kernels::Backend::kCuda, nullptr).ok());  // overwritten
  ASSERT_TRUE(restored.WriteState(state).ok());
  double cost = 0;
  for (internal::GainProbe* p : {&probe, &restored}) {
    const internal::GainSums s = p->Take(&cost).value();
    EXPECT_EQ(s.input, 60);
    EXPECT_EQ(s.min, 50);
    EXPECT_EQ(s.cand, 32);
    EXPECT_EQ(s.skipped, p == &probe ? 1 : 0);  // `bad`, observed by `probe` alone
    EXPECT_EQ(p->Take(&cost).value().input, 0);
  }
  (void)cudaFree(g);
  (void)cudaFree(bad);
}

// A ladder of topk rungs (fp32, then 0.5, 0.25 and 0.05 in different groupings) adapting on
// GPU memory and on host memory over the same gradients (one rank each): every step's average
// is bitwise the host's (the CUDA kernels are the CPU's bit for bit), and the decisions are the
// same (integer gradients: the gain sums are exact in any order). Measured times differ between
// the two, so the rungs' predictions decide (measured_tolerance out of reach). Probing every
// second step, the other steps' encodes replay their CUDA graphs. Offloaded (the parameter):
// the compressed rungs' group 0 on the cpu, probed on the host beside the device's groups.
class GpuGravacSession : public ::testing::TestWithParam<bool> {};

TEST_P(GpuGravacSession, DecidesAndAveragesAsTheSessionOnHostMemory) {
  SKIP_WITHOUT_GPU();
  const bool offload = GetParam();
  const pb::Model m = testing::SmallModel();
  const std::vector<pb::Plan> host_plans = {
      testing::MakePlan(m, testing::OneGroup(m), "fp32", 1), testing::MakePlan(m, testing::Planned(), "topk", 1, 0.5),
      testing::MakePlan(m, testing::LayerWise(m), "topk", 1, 0.25),
      testing::MakePlan(m, testing::Planned(), "topk", 1, 0.05)};
  GravacOptions o;
  o.window = 2;
  o.epsilon = 0.3;
  o.omega = 0;
  o.measured_tolerance = 1e9;
  o.probe_every = 2;

  comm::InProcessGroup group(1);
  auto host = Session::Create(host_plans[0], group.Rank(0));
  ASSERT_TRUE(host.ok()) << host.status().message();
  testing::Gradients host_grads(m, testing::Layout::kSeparate);
  ASSERT_TRUE(testing::RegisterAll(**host, m, host_grads).ok());
  auto comm = MakeNcclCommunicator(nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  auto device = Session::Create(OnGpu(host_plans[0]), std::move(comm).value());
  ASSERT_TRUE(device.ok()) << device.status().message();
  DeviceGradients grads(m, testing::Layout::kSeparate);
  ASSERT_TRUE(grads.RegisterAll(**device, m).ok());
  for (size_t p = 1; p < host_plans.size(); ++p) {
    ASSERT_TRUE((*host)->AddPlan(host_plans[p]).ok());
    pb::Plan on_gpu = OnGpu(host_plans[p]);
    if (offload) {
      on_gpu = OnGpu(testing::WithScheme(on_gpu, "flat", 1));
      on_gpu.mutable_groups(0)->mutable_options()->set_device(pb::CPU);
    }
    const StatusOr<int> added = (*device)->AddPlan(on_gpu);
    ASSERT_TRUE(added.ok()) << added.status().ToString();
  }
  ASSERT_TRUE((*host)->EnableGravac(o).ok());
  const Status enabled = (*device)->EnableGravac(o);
  ASSERT_TRUE(enabled.ok()) << enabled.ToString();

  int compressed_switches = 0;
  for (int it = 0; it < 16; ++it) {
    testing::FillGradients(host_grads, 0, it);
    grads.Fill(0, it, nullptr);
    for (int i = 0; i < m.tensors_size(); ++i) {
      ASSERT_TRUE((*host)->GradientReady(i).ok());
      ASSERT_TRUE((*device)->GradientReady(i).ok());
    }
    ASSERT_TRUE((*host)->Synchronize().ok());
    const Status synced = (*device)->Synchronize();
    ASSERT_TRUE(synced.ok()) << synced.ToString();
    std::vector<std::vector<float>> want;
    for (const auto& t : host_grads) want.emplace_back(t.begin(), t.end());
    ASSERT_EQ(testing::FirstDifference(grads.Download(), want), "") << "step " << it;
    EXPECT_EQ((*device)->active_plan(), (*host)->active_plan()) << "step " << it;
  }
  const std::vector<GravacDecision>& h = (*host)->decisions();
  const std::vector<GravacDecision>& d = (*device)->decisions();
  ASSERT_EQ(d.size(), h.size());
  ASSERT_EQ(h.size(), 8u);
  for (size_t i = 0; i < h.size(); ++i) {
    SCOPED_TRACE("decision " + std::to_string(i));
    EXPECT_EQ(d[i].ratio, h[i].ratio);
    EXPECT_EQ(d[i].ratio_min, h[i].ratio_min);
    EXPECT_EQ(d[i].ratio_c, h[i].ratio_c);
    EXPECT_EQ(d[i].gain_min, h[i].gain_min);
    EXPECT_EQ(d[i].gain_c, h[i].gain_c);
    EXPECT_EQ(d[i].bytes_sent, h[i].bytes_sent);
    EXPECT_EQ(d[i].next_ratio, h[i].next_ratio);
    EXPECT_GT(d[i].gain_min, 0);
    if (h[i].ratio < 1 && h[i].next_ratio < 1 && h[i].ratio != h[i].next_ratio) ++compressed_switches;
  }
  EXPECT_GT(compressed_switches, 0) << "the test needs a switch between two topk rungs";
  device->reset();
}

INSTANTIATE_TEST_SUITE_P(Offload, GpuGravacSession, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "offloaded" : "on_device"; });

// PowerSGD rungs have no gain probe on the device: refused, naming what would be accepted.
TEST(GpuGravacRefusal, PowerSgdRungs) {
  SKIP_WITHOUT_GPU();
  const pb::Model m = testing::ShapedModel();
  auto comm = MakeNcclCommunicator(nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status().message();
  auto session = Session::Create(OnGpu(testing::MakePlan(m, testing::Planned(), "fp32", 1)), std::move(comm).value());
  ASSERT_TRUE(session.ok()) << session.status().message();
  ASSERT_TRUE((*session)->AddPlan(OnGpu(testing::PowerSgdPlan(m, testing::Planned(), 1, "powersgd", 2))).ok());
  EXPECT_EQ((*session)->EnableGravac(GravacOptions{}).message(),
            "EnableGravac: the gain probe of PowerSGD rungs is not built for GPU memory; expected a ladder of topk, "
            "randk or dgc ratios, or a session on host memory");
}

}  // namespace
}  // namespace cupcake::runtime

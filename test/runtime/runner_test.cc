// Each scheme's runner (libruntime/src/runner.h) on its own: every rank a thread over the
// in-process communicator, host memory, each group's Encode, Exchange and Decode called in
// group order with no engine, over several iterations (error feedback carried by the runner),
// against the references the session tests use (runtime_test_util.h).
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "layout.h"
#include "runner.h"
#include "runtime_test_util.h"

namespace cupcake::runtime::internal {
namespace {

using testing::MakePlan;
using testing::SmallModel;
using Floats = std::vector<float>;
using Fill = std::function<float(int rank, int iteration, int tensor, int64_t j, int64_t n)>;

constexpr int kIterations = 3;

float Dense(int rank, int iteration, int tensor, int64_t j, int64_t) {
  return testing::TestGradient(rank, iteration, tensor, j);
}

// results[it][r]: rank r's floats in model element order after step `it`, every group through
// its runner. `devices` > 0 splits the node communicators (hierarchical groups).
std::vector<std::vector<Floats>> RunRanks(const pb::Plan& plan, int world, int devices, const Fill& fill) {
  comm::InProcessGroup group(world);
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  for (int r = 0; r < world; ++r) comms.push_back(group.Rank(r));
  std::vector<std::vector<Floats>> results(kIterations, std::vector<Floats>(static_cast<size_t>(world)));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      comm::Communicator& comm = *comms[static_cast<size_t>(r)];
      auto layout = PlanLayout(plan, {"plan", world, r, false, "", ""});
      ASSERT_TRUE(layout.ok()) << layout.status().ToString();
      std::unique_ptr<comm::Communicator> intra, inter;
      if (devices > 0) {
        intra = comm.Split(r / devices, r % devices).value();
        inter = comm.Split(r % devices, r / devices).value();
      }
      std::vector<std::unique_ptr<SchemeRunner>> runners;
      for (const GroupLayout& g : layout->groups) {
        auto runner = MakeRunner(g, kernels::Backend::kCpu, nullptr);
        ASSERT_TRUE(runner.ok()) << runner.status().ToString();
        runners.push_back(std::move(runner).value());
      }
      const StepContext base{&comm, intra.get(), inter.get(), nullptr, nullptr, -1, 0};
      Floats floats(static_cast<size_t>(layout->total_elements));
      for (int it = 0; it < kIterations; ++it) {
        for (const TensorLayout& t : layout->tensors)
          for (int64_t j = 0; j < t.numel; ++j)
            floats[static_cast<size_t>(t.offset + j)] =
                fill(r, it, static_cast<int>(&t - layout->tensors.data()), j, t.numel);
        StepContext step = base;
        step.iteration = static_cast<uint64_t>(it);
        for (size_t k = 0; k < runners.size(); ++k) {
          const GroupLayout& g = layout->groups[k];
          const Work work{floats.data() + g.offset, g.numel, nullptr};
          Status s = runners[k]->Encode(work, step, nullptr);
          if (s.ok()) s = runners[k]->Exchange(work, step);
          if (s.ok()) s = runners[k]->Decode(work, step, nullptr);
          ASSERT_TRUE(s.ok()) << s.ToString();
        }
        results[static_cast<size_t>(it)][static_cast<size_t>(r)] = floats;
      }
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

Floats Joined(const std::vector<Floats>& per_tensor) {
  Floats out;
  for (const Floats& t : per_tensor) out.insert(out.end(), t.begin(), t.end());
  return out;
}

void ExpectEveryRankBitwise(const std::vector<std::vector<Floats>>& got, int it, const Floats& want) {
  for (size_t r = 0; r < got[static_cast<size_t>(it)].size(); ++r)
    ASSERT_EQ(testing::FirstDifference(std::vector<Floats>{got[static_cast<size_t>(it)][r]}, {want}), "")
        << "rank " << r << ", iteration " << it;
}

class FlatRunnerTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(FlatRunnerTest, MatchesTheReferenceOverIterations) {
  const auto& [compressor, world] = GetParam();
  const pb::Plan plan = MakePlan(SmallModel(), testing::Planned(), compressor, world);
  const auto got = RunRanks(plan, world, 0, Dense);
  testing::Reference reference(plan, world);
  for (int it = 0; it < kIterations; ++it) ExpectEveryRankBitwise(got, it, Joined(reference.Step(it)));
}

INSTANTIATE_TEST_SUITE_P(Compressors, FlatRunnerTest,
                         ::testing::Combine(::testing::Values("fp32", "fp16", "topk", "randk", "dgc", "qsgd",
                                                              "efsignsgd", "signum", "terngrad", "onebit"),
                                            ::testing::Values(2, 3)));

class HierarchicalRunnerTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(HierarchicalRunnerTest, MatchesTheRestatementOnTwoNodesOfTwo) {
  const auto& [compressor, scheme] = GetParam();
  const pb::Plan plan = testing::WithScheme(MakePlan(SmallModel(), testing::Planned(), compressor, 4), scheme, 2);
  const auto got = RunRanks(plan, 4, 2, Dense);
  testing::HierarchicalReference reference(plan, 4, 2);
  for (int it = 0; it < kIterations; ++it) ExpectEveryRankBitwise(got, it, Joined(reference.Step(it)));
}

INSTANTIATE_TEST_SUITE_P(Schemes, HierarchicalRunnerTest,
                         ::testing::Values(std::tuple("fp32", "hier_fp32"), std::tuple("efsignsgd", "hier"),
                                           std::tuple("topk", "hier"), std::tuple("randk", "hier"),
                                           std::tuple("topk", "hier_fp16")));

// Zen sums the same pairs the allgather scheme gathers (small integers: exact), and divides the
// same sums by W: the flat reference of the plan without the scheme, bit for bit.
TEST(ZenRunner, MatchesTheAllgatherReference) {
  for (const char* compressor : {"topk", "dgc"}) {
    for (int world : {2, 3}) {
      const pb::Plan flat = MakePlan(SmallModel(), testing::Planned(), compressor, world);
      const auto got = RunRanks(testing::WithScheme(flat, "zen", 1), world, 0, Dense);
      testing::Reference reference(flat, world);
      for (int it = 0; it < kIterations; ++it) ExpectEveryRankBitwise(got, it, Joined(reference.Step(it)));
    }
  }
}

TEST(ZenSparseRunner, GivesTheExactMeanOfTheRanksNonzeros) {
  for (int world : {2, 4}) {
    const pb::Model model = testing::SparseModel();
    const pb::Plan plan = testing::WithScheme(MakePlan(model, testing::Planned(), "fp32", world), "zen_sparse", 1);
    const auto got = RunRanks(plan, world, 0, testing::SparseTestGradient);
    for (int it = 0; it < kIterations; ++it)
      ExpectEveryRankBitwise(got, it, Joined(testing::SparseMean(model, world, it)));
  }
}

// PowerSGD per tensor and batched: every rank's group bitwise equal, within float rounding of
// the restatement over iterations (warm start and error feedback carried by the runner).
TEST(PowerSgdRunner, MatchesTheRestatementAndIsBitwiseEqualOnEveryRank) {
  for (const char* scheme : {"powersgd", "powersgd_batched"}) {
    for (int world : {2, 3}) {
      SCOPED_TRACE(std::string(scheme) + " W=" + std::to_string(world));
      const pb::Plan plan = testing::PowerSgdPlan(testing::ShapedModel(), testing::Planned(), world, scheme);
      const auto got = RunRanks(plan, world, 0, Dense);
      testing::PowerSgdReference reference(plan, world);
      for (int it = 0; it < kIterations; ++it) {
        for (int r = 1; r < world; ++r)
          ASSERT_EQ(testing::FirstDifference(std::vector<Floats>{got[it][r]}, {got[it][0]}), "") << "rank " << r;
        const std::vector<std::vector<double>> want = reference.Step(it);
        std::vector<double> joined;
        for (const auto& t : want) joined.insert(joined.end(), t.begin(), t.end());
        ASSERT_EQ(testing::FirstFarFrom(std::vector<Floats>{got[it][0]}, {joined}), "") << "iteration " << it;
      }
    }
  }
}

}  // namespace
}  // namespace cupcake::runtime::internal

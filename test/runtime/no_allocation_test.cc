// The step path (GradientReady, Synchronize) allocates nothing, for every compressor with fused
// and single groups: operator new is counted on the calling thread while a step of one rank
// runs, and on every thread (the ranks', each session's communication thread, the in-process
// collectives) while a step of two ranks runs. Zen groups allocate only in their collective.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/runtime/session.h"
#include "runtime_test_util.h"

namespace {
thread_local bool counting = false;
thread_local long allocations = 0;
// Every thread but the ones marked `not_counted` (the test's own, which starts and joins the
// rank threads) while `counting_everywhere` is set.
std::atomic<bool> counting_everywhere{false};
std::atomic<long> allocations_everywhere{0};
thread_local bool not_counted = false;
}  // namespace

void* operator new(std::size_t size) {
  if (counting) ++allocations;
  if (counting_everywhere.load(std::memory_order_relaxed) && !not_counted)
    allocations_everywhere.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// The replacement operator new above returns malloc's memory, so free is the matching call; GCC
// (-Wmismatched-new-delete) sees only the default pairing once it inlines the test's threads.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace cupcake::runtime {
namespace {

using comm::InProcessGroup;

TEST(SessionStep, DoesNotAllocate) {
  const pb::Model model = testing::SmallModel();
  for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
    for (std::string_view name : CompressorNames()) {
      const std::string what = std::string(name) + ", " + testing::LayoutName(layout);
      const pb::Plan plan = testing::MakePlan(model, testing::Planned(), std::string(name), 1);
      InProcessGroup group(1);
      auto session = Session::Create(plan, group.Rank(0));
      ASSERT_TRUE(session.ok()) << session.status().ToString();
      testing::Gradients grads(model, layout);
      ASSERT_TRUE(testing::RegisterAll(**session, model, grads).ok());
      for (int it = 0; it < 3; ++it) {
        testing::FillGradients(grads, 0, it);
        allocations = 0;
        counting = true;
        bool ok = true;
        for (int i = 0; i < model.tensors_size(); ++i) ok = ok && (*session)->GradientReady(i).ok();
        ok = ok && (*session)->Synchronize().ok();
        counting = false;
        ASSERT_TRUE(ok) << what;
        EXPECT_EQ(allocations, 0) << what << ", iteration " << it;
      }
    }
  }
}

bool Step(Session& session, const pb::Model& model) {
  bool ok = true;
  for (int i = 0; i < model.tensors_size(); ++i) ok = ok && session.GradientReady(i).ok();
  return ok && session.Synchronize().ok();
}

TEST(SessionStep, DoesNotAllocateOnAnyThreadWithTwoRanks) {
  const pb::Model model = testing::SmallModel();
  not_counted = true;  // this thread creates and joins the rank threads (std::thread allocates)
  for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
    for (std::string_view name : CompressorNames()) {
      const std::string what = std::string(name) + ", " + testing::LayoutName(layout);
      const pb::Plan plan = testing::MakePlan(model, testing::Planned(), std::string(name), 2);
      InProcessGroup group(2);
      std::vector<std::unique_ptr<Session>> sessions;
      std::vector<testing::Gradients> grads;
      auto made = testing::CreateOnEveryRank(
          group, 2, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
      for (int r = 0; r < 2; ++r) {
        auto& session = made[static_cast<size_t>(r)];
        ASSERT_TRUE(session.ok()) << session.status().ToString();
        sessions.push_back(std::move(session).value());
        grads.emplace_back(model, layout);
        ASSERT_TRUE(testing::RegisterAll(*sessions.back(), model, grads.back()).ok());
      }
      for (int it = 0; it < 3; ++it) {
        for (int r = 0; r < 2; ++r) testing::FillGradients(grads[static_cast<size_t>(r)], r, it);
        bool ok[2] = {false, false};
        allocations_everywhere = 0;
        counting_everywhere = true;
        std::thread rank0([&] { ok[0] = Step(*sessions[0], model); });
        std::thread rank1([&] { ok[1] = Step(*sessions[1], model); });
        rank0.join();
        rank1.join();
        counting_everywhere = false;
        ASSERT_TRUE(ok[0] && ok[1]) << what;
        EXPECT_EQ(allocations_everywhere.load(), 0) << what << ", iteration " << it;
      }
    }
  }
  not_counted = false;
}

// Zen groups (docs/ZEN.md): the ranks' own threads (encode, the decode's scatter and unpack)
// allocate nothing; the communication threads do, inside ZenAllreduce (its exchange buffers, the
// partitions, the result), which is what docs/ZEN.md notes.
TEST(SessionStep, ZenAllocatesOnlyInItsCollective) {
  const pb::Model model = testing::SmallModel();
  not_counted = true;
  for (const char* name : {"topk", "dgc"}) {
    const pb::Plan plan = testing::WithScheme(testing::MakePlan(model, testing::Planned(), name, 2), "zen", 1);
    InProcessGroup group(2);
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<testing::Gradients> grads;
    auto made = testing::CreateOnEveryRank(
        group, 2, [&](int, std::unique_ptr<comm::Communicator> c) { return Session::Create(plan, std::move(c)); });
    for (int r = 0; r < 2; ++r) {
      auto& session = made[static_cast<size_t>(r)];
      ASSERT_TRUE(session.ok()) << session.status().ToString();
      sessions.push_back(std::move(session).value());
      grads.emplace_back(model, testing::Layout::kSeparate);
      ASSERT_TRUE(testing::RegisterAll(*sessions.back(), model, grads.back()).ok());
    }
    for (int it = 0; it < 3; ++it) {
      for (int r = 0; r < 2; ++r) testing::FillGradients(grads[static_cast<size_t>(r)], r, it);
      bool ok[2] = {false, false};
      long on_rank[2] = {-1, -1};
      allocations_everywhere = 0;
      counting_everywhere = true;
      auto run = [&](int r) {
        allocations = 0;
        counting = true;
        ok[r] = Step(*sessions[static_cast<size_t>(r)], model);
        counting = false;
        on_rank[r] = allocations;
      };
      std::thread rank0(run, 0);
      std::thread rank1(run, 1);
      rank0.join();
      rank1.join();
      counting_everywhere = false;
      ASSERT_TRUE(ok[0] && ok[1]) << name;
      EXPECT_EQ(on_rank[0], 0) << name << ", iteration " << it;
      EXPECT_EQ(on_rank[1], 0) << name << ", iteration " << it;
      EXPECT_GT(allocations_everywhere.load(), 0) << name << ": ZenAllreduce allocates its buffers";
    }
  }
  not_counted = false;
}

}  // namespace
}  // namespace cupcake::runtime

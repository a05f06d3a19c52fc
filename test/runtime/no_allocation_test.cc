// The step path (GradientReady, Synchronize) allocates nothing: operator new is counted on the
// calling thread while a step runs, for every compressor with fused and single groups.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/runtime/session.h"
#include "runtime_test_util.h"

namespace {
thread_local bool counting = false;
thread_local long allocations = 0;
}  // namespace

void* operator new(std::size_t size) {
  if (counting) ++allocations;
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

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

}  // namespace
}  // namespace cupcake::runtime

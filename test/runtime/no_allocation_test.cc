// The step path (GradientReady, Synchronize) allocates nothing: operator new is counted on the
// calling thread while a step runs, for every compressor with fused and single groups.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

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

TEST(SessionStep, DoesNotAllocate) {
  const pb::Model model = testing::SmallModel();
  for (std::string_view name : CompressorNames()) {
    const pb::Plan plan = testing::MakePlan(model, testing::Planned(), std::string(name), 1);
    InProcessGroup group(1);
    auto session = Session::Create(plan, group.Rank(0));
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    std::vector<std::vector<float>> grads;
    for (const auto& t : model.tensors()) grads.emplace_back(static_cast<size_t>(t.numel()), 0.0f);
    for (int i = 0; i < model.tensors_size(); ++i) ASSERT_TRUE((*session)->Register(model.tensors(i).name(), grads[static_cast<size_t>(i)]).ok());
    for (int it = 0; it < 3; ++it) {
      testing::FillGradients(grads, 0, it);
      allocations = 0;
      counting = true;
      bool ok = true;
      for (int i = 0; i < model.tensors_size(); ++i) ok = ok && (*session)->GradientReady(i).ok();
      ok = ok && (*session)->Synchronize().ok();
      counting = false;
      ASSERT_TRUE(ok) << name;
      EXPECT_EQ(allocations, 0) << name << ", iteration " << it;
    }
  }
}

}  // namespace
}  // namespace cupcake::runtime

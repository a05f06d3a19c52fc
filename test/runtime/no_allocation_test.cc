// The step path (GradientReady, Synchronize) allocates nothing of its own: operator new is
// counted on the calling thread while a step runs, for every compressor with fused and single
// groups, and must equal what the kernels' Encode and Decode allocate by themselves for the same
// groups (today they build their error-message prefixes eagerly; once they stop, both are 0).
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

// Allocations of one Encode and one Decode per group, on compressors of the same shapes.
long KernelAllocationsPerStep(const pb::Plan& plan) {
  long total = 0;
  for (int k = 0; k < plan.groups_size(); ++k) {
    kernels::CompressorConfig c;
    c.name = plan.compressor().name();
    c.memory = plan.compressor().memory();
    c.n = plan.groups(k).numel();
    c.ratio = plan.compressor().ratio() > 0 ? plan.compressor().ratio() : kDefaultRatio;
    auto comp = std::move(kernels::MakeCompressor(c, kernels::Backend::kCpu)).value();
    std::vector<float> grad(static_cast<size_t>(c.n), 1.0f), state(static_cast<size_t>(comp->state_floats()));
    std::vector<std::byte> payload(static_cast<size_t>(comp->decode_input_bytes()));
    allocations = 0;
    counting = true;
    bool ok = comp->Encode(grad, state, 0, std::span(payload).first(static_cast<size_t>(comp->payload_bytes()))).ok();
    ok = ok && comp->Decode(payload, grad, 0).ok();
    counting = false;
    if (!ok) std::abort();
    total += allocations;
  }
  return total;
}

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
    const long kernel_allocations = KernelAllocationsPerStep(plan);
    for (int it = 0; it < 3; ++it) {
      testing::FillGradients(grads, 0, it);
      allocations = 0;
      counting = true;
      bool ok = true;
      for (int i = 0; i < model.tensors_size(); ++i) ok = ok && (*session)->GradientReady(i).ok();
      ok = ok && (*session)->Synchronize().ok();
      counting = false;
      ASSERT_TRUE(ok) << name;
      EXPECT_EQ(allocations, kernel_allocations) << name << ", iteration " << it;
    }
  }
}

}  // namespace
}  // namespace cupcake::runtime

// One PowerSGD step equals torch's: data/powersgd_hook.json holds what
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook (and batched_powerSGD_hook) computed
// over two gloo ranks (powersgd_hook_reference.py: the inputs, the hook's seeded initial Q, its
// outputs and error memories for two steps, the second warm-started). The codec starts from the
// hook's Q, laid out in the hook's order (so a different order of P and Q fails here), and must
// give the hook's outputs and error memories within float tolerance, on the CPU and, when a GPU
// is present, on CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cupcake/kernels/powersgd.h"
#include "gpu_test.h"
#include "harness.h"
#include "powersgd_harness.h"

namespace cupcake::kernels::testing {
namespace {

nlohmann::json LoadHookCases() {
  std::ifstream in(CUPCAKE_POWERSGD_HOOK_JSON);
  EXPECT_TRUE(in.good()) << "cannot read " << CUPCAKE_POWERSGD_HOOK_JSON;
  return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
}

// |got - want| within 2e-5 of the step's largest magnitude: the hook and the codec sum their
// products and norms in different orders (and for rank > 2 the hook uses Householder QR).
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float scale = 1;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-5f * scale) << what << " [" << i << "]";
}

template <typename B>
class PowerSgdHook : public PowerSgdBackend<B> {};
TYPED_TEST_SUITE(PowerSgdHook, Backends, BackendNames);

TYPED_TEST(PowerSgdHook, TwoStepsEqualTorchsHook) {
  const nlohmann::json doc = LoadHookCases();
  ASSERT_TRUE(doc.contains("cases"));
  ASSERT_EQ(doc["cases"].size(), 5u);
  for (const nlohmann::json& c : doc["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    powersgd::Config config;
    config.shapes = c["shapes"].get<std::vector<std::vector<int64_t>>>();
    config.rank = c["rank"].get<int>();
    config.batched = c["batched"].get<bool>();
    config.min_compression_rate = c["min_compression_rate"].get<double>();
    const int world = c["world_size"].get<int>();
    PowerSgdRanks ranks(config, world, this->kBackend);
    ASSERT_TRUE(ranks.ok());
    const powersgd::Layout& l = ranks.layout();
    const auto q0 = c["q0"].get<std::vector<float>>();
    ASSERT_EQ(static_cast<int64_t>(q0.size()), l.q_floats);
    for (int r = 0; r < world; ++r) {
      std::vector<float> state(static_cast<size_t>(l.matrix_floats), 0.0f);
      state.insert(state.end(), q0.begin(), q0.end());
      ranks.SetState(r, state);
    }
    for (size_t step = 0; step < c["steps"].size(); ++step) {
      const nlohmann::json& s = c["steps"][step];
      const auto grads = s["grads"].get<std::vector<std::vector<float>>>();
      const std::vector<std::vector<float>> out = ranks.Step(grads);
      for (int r = 0; r < world; ++r) {
        const std::string at = "step " + std::to_string(step) + " rank " + std::to_string(r);
        ExpectClose(out[r], s["outputs"][r].get<std::vector<float>>(), at + " output");
        std::vector<float> e = ranks.State(r);
        e.resize(static_cast<size_t>(l.matrix_floats));
        ExpectClose(e, s["errors"][r].get<std::vector<float>>(), at + " error");
      }
    }
  }
}

}  // namespace
}  // namespace cupcake::kernels::testing

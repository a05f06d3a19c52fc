// Planning time: the exact search (bounds, greedy incumbent, branch and bound) for every
// shipped model with the sample profile and several compressors, and for synthetic models
// of 1000 and 5000 tensors made by repeating a shipped model's tensor list.
// Counters: groups, nodes, states, optimal (1 = proven), predicted iteration in ms.
// Run: build/bench/planner/planner_bench [--benchmark_filter=...]
// CUPCAKE_BENCH_PROFILE=FILE (a profile DB or JSON) plans against that profile instead of the
// sample one (examples/profiles/v100-8x8-pcie-25g.json), e.g. one measured on the testbed.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "cupcake/planner/options.h"
#include "cupcake/planner/planner.h"
#include "cupcake/profile/load.h"

namespace {

using namespace cupcake;

const pb::Profile& SampleProfile() {
  static const pb::Profile* profile = [] {
    const char* chosen = std::getenv("CUPCAKE_BENCH_PROFILE");
    const std::string path = chosen != nullptr && *chosen != '\0'
                                 ? std::string(chosen)
                                 : std::string(CUPCAKE_SOURCE_DIR) + "/examples/profiles/v100-8x8-pcie-25g.json";
    auto p = profile::LoadProfileFile(path);
    if (!p.ok()) {
      std::fprintf(stderr, "%s\n", p.status().ToString().c_str());
      std::abort();
    }
    return new pb::Profile(*p);
  }();
  return *profile;
}

pb::Model LoadModel(const std::string& name, int tensors) {
  auto m = profile::LoadModelFile(std::string(CUPCAKE_SOURCE_DIR) + "/examples/models/" + name + ".json");
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", m.status().ToString().c_str());
    std::abort();
  }
  if (tensors <= 0) return *m;
  pb::Model big;
  big.set_name(name + "x" + std::to_string(tensors));
  for (int i = 0; i < tensors; ++i) {
    pb::Tensor t = m->tensors(i % m->tensors_size());
    t.set_name(t.name() + "#" + std::to_string(i / m->tensors_size()));
    *big.add_tensors() = t;
  }
  return big;
}

void BM_Plan(benchmark::State& state, const std::string& model_name, int tensors, const std::string& compressor) {
  const pb::Model model = LoadModel(model_name, tensors);
  planner::PlanRequest request;
  request.compressor = compressor;
  auto problem = planner::MakeProblem(model, SampleProfile(), request);
  if (!problem.ok()) {
    state.SkipWithError(problem.status().message().c_str());
    return;
  }
  planner::SearchResult result;
  for (auto _ : state) {
    auto r = planner::Search(*problem, planner::SearchOptions{});
    benchmark::DoNotOptimize(r);
    result = *r;
  }
  state.counters["tensors"] = model.tensors_size();
  state.counters["groups"] = static_cast<double>(result.group_ends.size());
  state.counters["nodes"] = static_cast<double>(result.stats.transitions);
  state.counters["states"] = static_cast<double>(result.stats.states);
  state.counters["optimal"] = result.stats.optimal ? 1 : 0;
  state.counters["iter_ms"] = result.iteration_us / 1000.0;
}

// The search over groups and options (docs/MODEL.md, v2) with its incumbents: counters give the
// fusion-only optimum, Espresso's plan and the default's predicted iteration (ms), whether the
// default proved optimality, and otherwise its gap to its lower bound (%).
void BM_PlanOptions(benchmark::State& state, const std::string& model_name, int tensors,
                    const std::string& compressor) {
  const pb::Model model = LoadModel(model_name, tensors);
  planner::PlanRequest request;
  request.compressor = compressor;
  auto problem = planner::MakeOptionProblem(model, SampleProfile(), request);
  if (!problem.ok()) {
    state.SkipWithError(problem.status().message().c_str());
    return;
  }
  planner::SearchOptions options;
  options.space = planner::SearchSpace::kOptions;
  options.node_budget = planner::DefaultNodeBudget(options.space);  // cupcake-plan's
  planner::OptionSearchResult result;
  for (auto _ : state) {
    auto r = planner::SearchWithOptions(*problem, options);
    benchmark::DoNotOptimize(r);
    result = *r;
  }
  state.counters["tensors"] = model.tensors_size();
  state.counters["options"] = problem->option_count();
  state.counters["groups"] = static_cast<double>(result.group_ends.size());
  state.counters["nodes"] = static_cast<double>(result.stats.transitions);
  state.counters["states"] = static_cast<double>(result.stats.states);
  state.counters["optimal"] = result.stats.optimal ? 1 : 0;
  state.counters["gap_pct"] = (result.iteration_us - result.lower_bound_us) / result.iteration_us * 100.0;
  state.counters["fusion_ms"] = result.fusion_us / 1000.0;
  state.counters["espresso_ms"] = result.espresso_us / 1000.0;
  state.counters["iter_ms"] = result.iteration_us / 1000.0;
  state.counters["gain_pct"] = (result.fusion_us - result.iteration_us) / result.fusion_us * 100.0;
}

const char* const kModels[] = {"resnet50", "vgg16", "bert_base", "gpt2", "ncf"};
const char* const kCompressors[] = {"fp32", "fp16", "topk", "dgc", "randk", "qsgd", "efsignsgd", "onebit"};

int Register() {
  for (const char* m : kModels)
    for (const char* c : kCompressors)
      benchmark::RegisterBenchmark((std::string("plan/") + m + "/" + c).c_str(), BM_Plan, m, 0, c)
          ->Unit(benchmark::kMillisecond);
  for (const char* m : kModels)
    for (const char* c : {"efsignsgd", "dgc", "topk", "fp16"})
      benchmark::RegisterBenchmark((std::string("options/") + m + "/" + c).c_str(), BM_PlanOptions, m, 0, c)
          ->Unit(benchmark::kMillisecond);
  for (const char* c : {"efsignsgd", "dgc", "topk", "fp16"})
    benchmark::RegisterBenchmark((std::string("options/resnet50x400/") + c).c_str(), BM_PlanOptions, "resnet50", 400, c)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  for (int n : {1000, 5000})
    for (const char* c : kCompressors)
      benchmark::RegisterBenchmark(("plan/resnet50x" + std::to_string(n) + "/" + c).c_str(), BM_Plan, "resnet50", n, c)
          ->Unit(benchmark::kMillisecond)
          ->Iterations(1);
  return 0;
}
const int registered = Register();

}  // namespace

BENCHMARK_MAIN();

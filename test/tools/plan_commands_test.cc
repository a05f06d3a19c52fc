// cupcake-plan's commands in process: search, show, simulate, trace, diff.
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "commands.h"
#include "cupcake/planner/planner.h"
#include "cupcake/planner/replica_schedule.h"
#include "cupcake/profile/json_io.h"
#include "cupcake/profile/load.h"
#include "cupcake/profile/store.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/names.h"
#include "cupcake/proto/plan_io.h"
#include "test_files.h"

namespace cupcake::plan_cli {
namespace {

using testing::ExamplePath;
using testing::ReadExample;

class PlanCommandsTest : public ::testing::Test {
 protected:
  SearchOptions Search(const std::string& compressor, const std::string& output,
                       const std::string& model = "resnet50") {
    SearchOptions o;
    o.model = ExamplePath("models/" + model + ".json");
    o.profile = profile_;
    o.request.compressor = compressor;
    o.output = dir_.File(output);
    return o;
  }
  // The hand case of the PowerSGD tests: one [100, 100] tensor; allreduce 0.25 us per byte;
  // PowerSGD's kernels 10 and 20 us: powersgd (about 540 us) beats flat_fp32 (about 10100 us),
  // as OptionsPowerSgd works out by hand. An fp32 search writing `output`.
  SearchOptions PowerSgdHandCase(const std::string& output) {
    SearchOptions o = Search("fp32", output);
    o.model = Write("m.json", R"({"format": "cupcake.model.v1", "name": "m", "tensors": [
        {"name": "w", "numel": 10000, "shape": [100, 100], "dtype": "float32", "backward_us": 100}]})");
    o.profile = Write("p.json", R"({"format": "cupcake.profile.v1",
        "cluster": {"name": "hand", "nodes": 1, "devices_per_node": 2}, "curves": [
        {"kind": "comm", "op": "allreduce", "scope": "global", "points": [[8, 2], [80000, 20000]]},
        {"kind": "encode", "compressor": "powersgd", "device": "cpu", "points": [[1, 10], [1000000, 10]]},
        {"kind": "decode", "compressor": "powersgd", "device": "cpu", "points": [[1, 20], [1000000, 20]]}]})");
    return o;
  }
  // Runs search and returns its stdout; fails the test on an error.
  std::string RunOk(const SearchOptions& o) {
    std::ostringstream out, err;
    Status s = RunSearch(o, out, err);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(err.str(), "");
    return out.str();
  }
  Status RunFails(const SearchOptions& o) {
    std::ostringstream out, err;
    Status s = RunSearch(o, out, err);
    EXPECT_EQ(out.str(), "");
    EXPECT_FALSE(std::filesystem::exists(o.output)) << "a failed search wrote " << o.output;
    return s;
  }
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_.File(name);
    std::ofstream(path) << text;
    return path;
  }
  static std::string Ms(double us) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", us / 1000);
    return buf;
  }

  testing::TempDir dir_;
  std::string profile_ = ExamplePath("profiles/v100-8x8-pcie-25g.json");
};

TEST_F(PlanCommandsTest, SearchWritesAPlanAndPrintsItsSummary) {
  for (const std::string compressor : {"efsignsgd", "topk"}) {
    SCOPED_TRACE(compressor);
    const SearchOptions o = Search(compressor, compressor + ".pb");
    const std::string out = RunOk(o);
    auto plan = ReadPlanFile(o.output);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->compressor().name(), compressor);
    EXPECT_EQ(plan->model().model().name(), "resnet50");
    EXPECT_EQ(plan->world_size(), 64);
    EXPECT_TRUE(plan->search().optimal());
    EXPECT_GE(plan->groups_size(), 2);
    EXPECT_LT(plan->groups_size(), 161);

    // The summary is made from the plan: its lines show the plan's own numbers.
    EXPECT_TRUE(out.starts_with("wrote plan " + o.output +
                                "\nmodel       resnet50: 161 tensors, 25557032 parameters "
                                "(97.5 MiB of gradients)\nprofile     v100-8x8-pcie-25g: world size 64\n"))
        << out;
    EXPECT_NE(out.find("\ngroups      " + std::to_string(plan->groups_size()) + "\n"), std::string::npos) << out;
    const double t = plan->predicted().iteration_us();
    EXPECT_NE(out.find("\npredicted   " + Ms(t) + " ms per iteration"), std::string::npos) << out;
    ASSERT_EQ(plan->baselines_size(), 5);
    for (const auto& b : plan->baselines()) {
      char line[128];
      std::snprintf(line, sizeof line, "%.2fx over %s (%s ms, ", b.iteration_us() / t, b.name().c_str(),
                    Ms(b.iteration_us()).c_str());
      EXPECT_NE(out.find(line), std::string::npos) << line << "\n" << out;
      EXPECT_GE(b.iteration_us(), t - 1e-6) << b.name() << ": the optimum is no slower than any baseline";
    }
    EXPECT_NE(out.find("\nsearch      branch_and_bound: " + std::to_string(plan->search().nodes()) + " nodes, "),
              std::string::npos);
    EXPECT_NE(out.find(", proven optimal\ntook        "), std::string::npos) << out;
    EXPECT_NE(out.find(" s (wall clock of the search; not stored in the plan)\n"), std::string::npos) << out;
  }
  EXPECT_NE(SerializePlan(*ReadPlanFile(dir_.File("efsignsgd.pb"))),
            SerializePlan(*ReadPlanFile(dir_.File("topk.pb"))));
}

TEST_F(PlanCommandsTest, SearchSummaryAsJson) {
  SearchOptions o = Search("topk", "topk.pb");
  o.format = tools::OutputFormat::kJson;
  const auto j = nlohmann::json::parse(RunOk(o));
  const pb::Plan plan = *ReadPlanFile(o.output);
  EXPECT_EQ(j["plan"], o.output);
  EXPECT_EQ(j["compressor"], "topk");
  EXPECT_EQ(j["ratio"], 0.01);
  EXPECT_EQ(j["groups"], plan.groups_size());
  EXPECT_EQ(j["iteration_us"], plan.predicted().iteration_us());
  EXPECT_EQ(j["baselines"].size(), 5u);
  EXPECT_EQ(j["baselines"][0]["name"], "layerwise");
  EXPECT_DOUBLE_EQ(j["baselines"][0]["speedup"].get<double>(),
                   plan.baselines(0).iteration_us() / plan.predicted().iteration_us());
  EXPECT_EQ(j["search"]["optimal"], true);
  EXPECT_EQ(j["search"]["nodes"], plan.search().nodes());
}

TEST_F(PlanCommandsTest, PlansAreByteIdenticalAcrossRuns) {
  RunOk(Search("efsignsgd", "a.pb"));
  RunOk(Search("efsignsgd", "b.pb"));
  auto a = ReadFile(dir_.File("a.pb")), b = ReadFile(dir_.File("b.pb"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
}

TEST_F(PlanCommandsTest, ModelByNameFromTheProfileDb) {
  const std::string db = dir_.File("profile.db");
  {
    auto store = profile::ProfileStore::Open(db, /*create=*/true);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto p = profile::ParseProfileJson(ReadExample("profiles/v100-8x8-pcie-25g.json"), "p");
    auto m = profile::ParseModelJson(ReadExample("models/resnet50.json"), "m");
    ASSERT_TRUE(p.ok() && m.ok());
    ASSERT_TRUE(store->ImportProfile(*p, false).ok());
    ASSERT_TRUE(store->ImportModel(*m, false).ok());
  }
  SearchOptions o = Search("efsignsgd", "by-name.pb");
  o.model.clear();
  o.model_name = "resnet50";
  o.profile = db;
  EXPECT_TRUE(RunOk(o).starts_with("wrote plan " + o.output + "\nmodel       resnet50: 161 tensors")) << o.output;
  // The DB and the JSON files it was imported from give the very same plan.
  RunOk(Search("efsignsgd", "from-files.pb"));
  EXPECT_EQ(*ReadFile(o.output), *ReadFile(dir_.File("from-files.pb")));

  o.model_name = "resnet5";
  o.output = dir_.File("none.pb");
  EXPECT_EQ(RunFails(o).message(),
            db + ": models: no such model; got \"resnet5\" (did you mean 'resnet50'?), expected one of resnet50");
  o.profile = profile_;  // a profile JSON without models
  EXPECT_EQ(RunFails(o).message(), profile_ +
                                       ": models: no such model; got \"resnet5\", expected a model the profile "
                                       "carries (it has none: import one with \"cupcake-profile import\")");
}

TEST_F(PlanCommandsTest, RequireOptimalRefusesAPlanThatRanOutOfBudget) {
  SearchOptions o = Search("topk", "budget.pb");
  o.search.node_budget = 1;
  o.require_optimal = true;
  EXPECT_EQ(RunFails(o).message(),
            "--require-optimal: search: stopped at --budget 1 (nodes); the plan is the best found, not proven "
            "optimal; raise --budget (no plan written)");

  // Without --require-optimal: the best plan found, written, with a warning.
  o.require_optimal = false;
  std::ostringstream out, err;
  ASSERT_TRUE(RunSearch(o, out, err).ok());
  EXPECT_EQ(err.str(),
            "warning: search: stopped at --budget 1 (nodes); the plan is the best found, not proven "
            "optimal (raise --budget to prove it)\n");
  EXPECT_NE(out.str().find(", budget 1 nodes, NOT proven optimal (budget exhausted)\n"), std::string::npos)
      << out.str();
  auto plan = ReadPlanFile(o.output);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->search().optimal());
}

// A fixed strategy (what users run today) is planned without a search, says so, and warns
// about no budget; resnet50's four 25 MiB buckets are the bucket_25mib baseline.
TEST_F(PlanCommandsTest, FixedStrategiesArePlannedAndSaySo) {
  SearchOptions o = Search("efsignsgd", "bucket.pb");
  o.search.algorithm = planner::Algorithm::kBucket;
  const std::string out = RunOk(o);  // no warning on stderr
  EXPECT_NE(out.find("search      bucket: 0 nodes, 0 states, 0 pruned, a fixed strategy (no search)\n"),
            std::string::npos)
      << out;
  auto plan = ReadPlanFile(o.output);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->groups_size(), 4);
  EXPECT_EQ(plan->baselines(2).name(), "bucket_25mib");
  EXPECT_EQ(plan->predicted().iteration_us(), plan->baselines(2).iteration_us());
}

// --search-space options (docs/MODEL.md, v2) on resnet50 and the sample profile: with
// efsignsgd every group is best sent as an fp16 allreduce, so the optimum is v1's fp16 fusion
// optimum (planned here independently, with --compressor fp16 in the fusion space).
TEST_F(PlanCommandsTest, OptionsSearchChoosesEachGroupsOption) {
  SearchOptions o = Search("efsignsgd", "options.pb");
  o.search.space = planner::SearchSpace::kOptions;
  const std::string out = RunOk(o);
  EXPECT_NE(out.find(", proven optimal\nspace       options: 5 x flat_fp16 gpu (groups per option)\n"),
            std::string::npos)
      << out;
  auto plan = ReadPlanFile(o.output);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const SearchOptions fp16 = Search("fp16", "fp16.pb");
  RunOk(fp16);
  auto v1 = ReadPlanFile(fp16.output);
  ASSERT_TRUE(v1.ok());
  EXPECT_NEAR(plan->predicted().iteration_us(), v1->predicted().iteration_us(), 1e-9 * v1->predicted().iteration_us());
  EXPECT_EQ(plan->search().search_space(), "options");

  o.search.algorithm = planner::Algorithm::kEspresso;
  EXPECT_NE(RunOk(o).find("search      espresso: "), std::string::npos);
  EXPECT_NE(RunOk(o).find(", a heuristic (not proven optimal)\n"), std::string::npos);

  // Out of budget: the gap to the lower bound is printed.
  o.search.algorithm = planner::Algorithm::kBranchAndBound;
  o.search.node_budget = 1;
  std::ostringstream text, err;
  ASSERT_TRUE(RunSearch(o, text, err).ok());
  EXPECT_NE(text.str().find(", budget 1 nodes, NOT proven optimal (budget exhausted): within "), std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("% of the optimum (lower bound "), std::string::npos) << text.str();
}

TEST_F(PlanCommandsTest, SearchErrorsNameTheirCause) {
  SearchOptions o = Search("efsignsdg", "x.pb");
  EXPECT_EQ(RunFails(o).message(),
            "--compressor: unknown compressor 'efsignsdg' (did you mean 'efsignsgd'?); expected one of fp32, fp16, "
            "topk, randk, dgc, qsgd, signsgd, efsignsgd, signum, terngrad, onebit");
  o = Search("topk", "x.pb");
  o.request.ratio = 0;
  EXPECT_EQ(RunFails(o).message(), "--ratio: ratio out of range; got 0, expected 0 < ratio <= 1");
  o.request.ratio = 1.5;
  EXPECT_EQ(RunFails(o).message(), "--ratio: ratio out of range; got 1.5, expected 0 < ratio <= 1");

  // A profile without the global allgather curve that topk's collective needs.
  auto profile = nlohmann::ordered_json::parse(ReadExample("profiles/v100-8x8-pcie-25g.json"));
  auto& curves = profile["curves"];
  for (size_t i = 0; i < curves.size(); ++i) {
    if (curves[i]["kind"] == "comm" && curves[i]["op"] == "allgather" && curves[i]["scope"] == "global") {
      curves.erase(i);
      break;
    }
  }
  o = Search("topk", "x.pb");
  o.profile = Write("no-allgather.json", profile.dump());
  Status s = RunFails(o);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_TRUE(
      s.message().starts_with("profile v100-8x8-pcie-25g: curve \"comm allgather global\" not found; the "
                              "profile has comm curves for: "))
      << s.message();

  // A model with no tensors: the JSON loader refuses it; made in code, the planner does.
  o = Search("topk", "x.pb");
  o.model = Write("empty.json", R"({"format": "cupcake.model.v1", "name": "empty", "tensors": []})");
  EXPECT_EQ(RunFails(o).message(), o.model + ": tensors: empty tensor list; got 0 tensors, expected at least 1");
  pb::Model empty;
  empty.set_name("empty");
  auto p = profile::ParseProfileJson(ReadExample("profiles/v100-8x8-pcie-25g.json"), "p");
  planner::PlanRequest request;
  request.compressor = "topk";
  EXPECT_EQ(planner::MakePlan(empty, *p, request, {}).status().message(),
            "model empty: tensors: empty; expected at least one tensor");

  o = Search("topk", "x.pb");
  o.profile = dir_.File("missing.db");
  EXPECT_EQ(RunFails(o).message(), o.profile + ": no such file");
}

// A profile whose recorded load says the machine was busy when it was measured: search warns and
// the plan's source says so (show prints it); a quiet load adds nothing.
TEST_F(PlanCommandsTest, ABusyProfileIsNamedInTheWarningAndThePlansSource) {
  auto sample = profile::ParseProfileJson(ReadExample("profiles/v100-8x8-pcie-25g.json"), profile_);
  ASSERT_TRUE(sample.ok()) << sample.status().ToString();
  pb::Profile busy = *sample;
  (*busy.mutable_cluster()->mutable_meta())["comm.load"] = "other work 1.60 of 2 cores";
  (*busy.mutable_cluster()->mutable_meta())["kernels.load"] = "other work 0.20 of 2 cores";
  SearchOptions o = Search("efsignsgd", "busy.pb");
  o.profile = dir_.File("busy.json");
  Write("busy.json", profile::ProfileToJson(busy));
  std::ostringstream out, err;
  ASSERT_TRUE(RunSearch(o, out, err).ok());
  EXPECT_EQ(err.str(), "warning: profile " + o.profile +
                           ": measured busy (comm: other work 1.60 of 2 cores): its times, and predictions from "
                           "them, carry that load\n");
  EXPECT_EQ(ReadPlanFile(o.output)->profile_source(),
            "alpha-beta model with the constants of the Espresso paper's testbed; not a measurement; measured busy "
            "(comm: other work 1.60 of 2 cores): its times, and predictions from them, carry that load");
  (*busy.mutable_cluster()->mutable_meta())["comm.load"] = "other work 0.50 of 2 cores";
  Write("busy.json", profile::ProfileToJson(busy));
  RunOk(o);
  EXPECT_EQ(ReadPlanFile(o.output)->profile_source(),
            "alpha-beta model with the constants of the Espresso paper's testbed; not a measurement");
}

// A PowerSGD plan (an fp32 plan whose options search may choose powersgd, --schemes powersgd):
// its header says that those groups keep error feedback although the fp32 plan's memory is none,
// and `show --profile` sizes its replica by that memory.
TEST_F(PlanCommandsTest, APowerSgdPlanSaysItsGroupsKeepErrorFeedback) {
  SearchOptions o = PowerSgdHandCase("powersgd.pb");
  o.request.rank = 2;
  o.request.schemes = {"powersgd"};
  o.search.space = planner::SearchSpace::kOptions;
  const std::string out = RunOk(o);
  EXPECT_NE(out.find("\ncompressor  fp32 (powersgd rank 2), memory none (powersgd groups: residual), on cpu; chosen: "
                     "1 x powersgd cpu\n"),
            std::string::npos)
      << out;
  // Its replica holds that error feedback once, a float per element in the per-element plane (a
  // group per tensor has no padding; docs/CHECKPOINT.md; Q, the same on every rank, stays home),
  // and the 8-byte iteration counter.
  ShowOptions show{o.output, tools::OutputFormat::kJson};
  show.profile = o.profile;
  std::ostringstream json;
  ASSERT_TRUE(RunShow(show, json).ok());
  EXPECT_EQ(nlohmann::json::parse(json.str())["replica_schedule"]["state_bytes"], 4 * 10000 + 8);
}

// A ladder of PowerSGD ranks through the commands (search --ranks, on the hand model and profile
// above): the fp32 rung and one rung per rank, each rung's ratio the bytes it sends over the
// dense gradient's (100 x r floats of P and of Q of the [100, 100] tensor's 10000: 0.02 r); show
// lists them, simulate takes --rung, diff compares rung by rung.
TEST_F(PlanCommandsTest, RankLadderSearchShowSimulateAndDiff) {
  SearchOptions o = PowerSgdHandCase("ranks.pb");
  o.ranks = {1, 4, 2};
  o.request.schemes = {"powersgd"};
  o.search.space = planner::SearchSpace::kOptions;
  const std::string out = RunOk(o);
  EXPECT_TRUE(out.starts_with("wrote ladder " + o.output + " (4 rungs, each searched on its own)\n")) << out;
  auto plans = ReadPlansFile(o.output);
  ASSERT_TRUE(plans.ok()) << plans.status().ToString();
  ASSERT_EQ(plans->ladder.rungs_size(), 4);
  EXPECT_EQ(RungRatios(plans->ladder), "1 (fp32), 0.08 (rank 4), 0.04 (rank 2), 0.02 (rank 1)");

  std::ostringstream shown;
  ASSERT_TRUE(RunShow({.plan = o.output}, shown).ok());
  EXPECT_NE(shown.str().find("\n      1 fp32 "), std::string::npos) << shown.str();
  EXPECT_NE(shown.str().find("\n   0.08 fp32, powersgd rank 4 "), std::string::npos) << shown.str();
  EXPECT_NE(shown.str().find("\n   0.02 fp32, powersgd rank 1 "), std::string::npos) << shown.str();
  std::ostringstream one;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kText, .rung = 0.04}, one).ok());
  EXPECT_NE(one.str().find("\ncompressor  fp32 (powersgd rank 2)"), std::string::npos) << one.str();

  std::ostringstream sink;
  SimulateOptions sim{.plan = o.output, .model = o.model, .profile = o.profile};
  EXPECT_EQ(RunSimulate(sim, sink).message(),
            o.output +
                ": a ladder of 4 plans; expected --rung RATIO, one of 1 (fp32), 0.08 (rank 4), 0.04 (rank 2), "
                "0.02 (rank 1)");
  sim.rung = 0.02;
  ASSERT_TRUE(RunSimulate(sim, sink).ok());

  SearchOptions other = o;
  other.output = dir_.File("other.pb");
  other.ranks = {4, 2};
  RunOk(other);
  std::ostringstream diff;
  auto d = RunDiff({o.output, other.output, 0, tools::OutputFormat::kText}, diff);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(*d);
  EXPECT_EQ(diff.str(), "rung 0.02: only in A\n");
}

TEST_F(PlanCommandsTest, ShowPrintsTheSummaryAndOneRowPerGroup) {
  const SearchOptions o = Search("efsignsgd", "plan.pb");
  RunOk(o);
  const pb::Plan plan = *ReadPlanFile(o.output);
  std::ostringstream out;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kText}, out).ok());
  const std::string text = out.str();
  EXPECT_TRUE(text.starts_with("plan        " + o.output + " (cupcake.plan.v1)\nmodel       resnet50: ")) << text;
  EXPECT_NE(
      text.find("\nfingerprint model " + plan.model().fingerprint() + ", profile " + plan.profile_fingerprint() + "\n"),
      std::string::npos);
  // The sample profile is a model, not a measurement: the plan carries its source and says so.
  EXPECT_EQ(plan.profile_source(), "alpha-beta model with the constants of the Espresso paper's testbed; not a measurement");
  EXPECT_NE(text.find("\nsource      alpha-beta model with the constants of the Espresso paper's testbed; not a "
                      "measurement\n"),
            std::string::npos)
      << text;
  const std::string header = "groups (times in ms from the start of backward):\n";
  const size_t table = text.find(header);
  ASSERT_NE(table, std::string::npos) << text;
  std::istringstream rows(text.substr(table + header.size()));
  std::string line;
  std::getline(rows, line);
  EXPECT_TRUE(line.starts_with("  group tensors")) << line;
  EXPECT_TRUE(line.ends_with(" payload     encode ms       comm ms     decode ms names")) << line;
  const auto& tensors = plan.model().model().tensors();
  for (int k = 0; k < plan.groups_size(); ++k) {
    ASSERT_TRUE(std::getline(rows, line)) << "row " << k;
    const pb::Group& g = plan.groups(k);
    std::istringstream cells(line);
    std::string group, range, count, numel;
    cells >> group >> range >> count >> numel;
    EXPECT_EQ(group, std::to_string(k));
    EXPECT_EQ(range, std::to_string(g.first_tensor()) + ".." + std::to_string(g.last_tensor()));
    EXPECT_EQ(count, std::to_string(g.last_tensor() - g.first_tensor() + 1));
    EXPECT_EQ(numel, std::to_string(g.numel()));
    EXPECT_NE(line.find(" " + Ms(g.comm_start_us()) + "-" + Ms(g.comm_end_us()) + " "), std::string::npos) << line;
    std::string names = tensors[g.first_tensor()].name();
    if (g.last_tensor() != g.first_tensor()) names += " .. " + tensors[g.last_tensor()].name();
    EXPECT_TRUE(line.ends_with(" " + names)) << line;
  }
  EXPECT_FALSE(std::getline(rows, line)) << "extra line: " << line;

  std::ostringstream json;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kJson}, json).ok());
  // The proto3 JSON mapping, summary first and the model (its tensor list) last, with 64-bit
  // integers as numbers (the mapping's strings); it still parses back into the same plan.
  pb::Plan parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.str(), &parsed).ok());
  EXPECT_EQ(SerializePlan(parsed), SerializePlan(plan));
  EXPECT_NE(PlanToJson(plan).find("\"numel\": \""), std::string::npos) << "the mapping's strings";
  const auto ordered = nlohmann::ordered_json::parse(json.str());
  std::vector<std::string> keys;
  for (const auto& [key, value] : ordered.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"format", "profile_name", "profile_source", "profile_fingerprint", "world_size",
                                            "devices_per_node", "device", "compressor", "predicted", "baselines",
                                            "search", "extrapolations", "groups", "model"}));
  EXPECT_EQ(ordered["device"], "GPU");
  EXPECT_EQ(ordered["model"]["model"]["name"], "resnet50");
  const auto j = nlohmann::json::parse(json.str());
  EXPECT_EQ(j["format"], "cupcake.plan.v1");
  EXPECT_EQ(j["groups"].size(), static_cast<size_t>(plan.groups_size()));
  EXPECT_EQ(j["groups"][0]["first_tensor"], 0);
  EXPECT_EQ(j["groups"][0]["numel"], plan.groups(0).numel());
  EXPECT_EQ(j["groups"][0]["payload_bytes"], plan.groups(0).payload_bytes());
  EXPECT_EQ(j["search"]["nodes"], plan.search().nodes());
  EXPECT_EQ(j["model"]["fingerprint"], plan.model().fingerprint());
  EXPECT_EQ(j["predicted"]["iteration_us"], plan.predicted().iteration_us());
}

// A profile whose allreduce was measured up to 400 bytes and a model of one 1200-byte tensor:
// every plan reads the curve at 3x its last point.
TEST_F(PlanCommandsTest, SearchWarnsOnceAboutExtrapolatedCurvesAndShowPrintsThem) {
  pb::Profile profile;
  profile.mutable_cluster()->set_name("short");
  profile.mutable_cluster()->set_nodes(1);
  profile.mutable_cluster()->set_devices_per_node(2);
  pb::Curve* ar = profile.add_curves();
  ar->set_kind(pb::COMM);
  ar->set_comm_op(pb::ALLREDUCE);
  ar->set_scope(pb::GLOBAL);
  for (auto [size, us] : {std::pair{100, 20.0}, std::pair{400, 24.0}}) {
    pb::Point* p = ar->add_points();
    p->set_size(size);
    p->set_us(us);
  }
  pb::Model model;
  model.set_name("one");
  pb::Tensor* t = model.add_tensors();
  t->set_name("w");
  t->set_numel(300);
  t->set_dtype(pb::FLOAT32);
  t->set_backward_us(10);
  SearchOptions o = Search("fp32", "short.pb");
  o.profile = Write("short.json", profile::ProfileToJson(profile));
  o.model = Write("one.json", profile::ModelToJson(model));
  std::ostringstream out, err;
  ASSERT_TRUE(RunSearch(o, out, err).ok());
  const std::string curves = "\"comm allreduce global\" read at 1.2 KiB, 3.0x its last measured point (400 B)";
  EXPECT_EQ(err.str(),
            "warning: the plan relies on curves beyond their last measured point by more than 2x, or at a ratio "
            "the profile did not measure, where their times are extrapolated: " +
                curves +
                "; measure larger sizes (cupcake-profile comm --max-bytes auto, kernels --max-elements auto) and the "
                "plan's ratio (kernels --ratios) to plan on measured times\n");
  std::ostringstream text;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kText}, text).ok());
  EXPECT_NE(text.str().find("\nextrapolated " + curves + " (times beyond a curve's last point are extrapolated)\n"),
            std::string::npos)
      << text.str();
  o.format = tools::OutputFormat::kJson;
  std::ostringstream json_out, json_err;
  ASSERT_TRUE(RunSearch(o, json_out, json_err).ok());
  EXPECT_EQ(nlohmann::json::parse(json_out.str())["extrapolations"],
            nlohmann::json::parse(R"([{"curve": "comm allreduce global", "last_size": 400.0, "max_size": 1200.0,
                                       "unit": "bytes"}])"));
}

TEST_F(PlanCommandsTest, ShowPrintsALegendAndNoExtrapolationsForOldPlans) {
  const SearchOptions o = Search("efsignsgd", "plan.pb");
  RunOk(o);  // the sample profile covers resnet50's groups: no warning
  std::ostringstream out;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kText}, out).ok());
  EXPECT_EQ(out.str().find("\nextrapolated "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("\nlegend      backward: the sum of the tensors' backward times (encodes share the "
                           "compute stream, so backward ends later); states: prefix labels the search expanded "
                           "(docs/MODEL.md)\n"),
            std::string::npos)
      << out.str();
}

TEST_F(PlanCommandsTest, CommandLineMessages) {
  auto run = [&](std::vector<std::string> args) {
    std::ostringstream out, err;
    const int code = tools::Dispatch(kTool, Commands(), args, out, err);
    return std::pair{code, err.str()};
  };
  const std::string plan = dir_.File("ratio.pb");
  auto [code, err] = run({"search", "--model", ExamplePath("models/resnet50.json"), "--profile", profile_,
                          "--compressor", "efsignsgd", "--ratio", "0.5", "-o", plan});
  EXPECT_EQ(code, tools::kExitOk);
  EXPECT_EQ(err,
            "warning: --ratio: does not apply to efsignsgd (only topk, randk and dgc keep a fraction of the "
            "elements); ignored\n");
  std::tie(code, err) = run({"search", "--model", ExamplePath("models/ncf.json"), "--profile", profile_, "--compressor",
                             "efsignsgd", "--zen-union", "0.5", "-o", plan});
  EXPECT_EQ(code, tools::kExitOk);
  EXPECT_EQ(err,
            "warning: --zen-union: only zen groups use it, and zen needs a compressor whose payload is sparse pairs; "
            "got efsignsgd, expected topk or dgc; ignored unless the model records sparse gradients (zen_sparse)\n");
  auto ignored = ReadPlanFile(plan);
  ASSERT_TRUE(ignored.ok()) << ignored.status().ToString();
  EXPECT_EQ(ignored->compressor().zen_union(), 0);
  // --rank: PowerSGD is a per-group option; resnet50's example model was recorded before shapes.
  std::tie(code, err) = run({"search", "--model", ExamplePath("models/resnet50.json"), "--profile", profile_,
                             "--compressor", "efsignsgd", "--rank", "2", "-o", plan});
  EXPECT_EQ(code, tools::kExitOk);
  EXPECT_EQ(err,
            "warning: --rank: only --search-space options offers the powersgd schemes; ignored\n"
            "note: --rank: 161 of model resnet50's 161 tensors record no shape (a model recorded before shapes "
            "were); PowerSGD treats them as vectors and sends them uncompressed (record the model again to compress "
            "them)\n");
  std::tie(code, err) = run({"search", "--model", ExamplePath("models/resnet50.json"), "--profile", profile_,
                             "--compressor", "efsignsgd", "--rank=-1", "-o", plan});
  EXPECT_EQ(code, tools::kExitUsage);
  EXPECT_EQ(err,
            "cupcake-plan search: --rank: out of range; got -1, expected 1 <= rank <= 65536 (PowerSGD's rank), or "
            "none\n"
            "run 'cupcake-plan search --help' for its options\n");
  // --schemes: names checked before any search (exit 2); only the options search reads them.
  std::tie(code, err) = run({"search", "--model", ExamplePath("models/resnet50.json"), "--profile", profile_,
                             "--compressor", "fp32", "--search-space", "options", "--schemes", "powersgd,fp16", "-o",
                             plan});
  EXPECT_EQ(code, tools::kExitUsage);
  EXPECT_EQ(err,
            "cupcake-plan search: --schemes: unknown scheme; got \"fp16\", expected some of flat_fp32, flat_fp16, "
            "flat, hier_fp32, hier_fp16, hier, zen, zen_sparse, powersgd, powersgd_batched\n"
            "run 'cupcake-plan search --help' for its options\n");
  std::tie(code, err) = run({"search", "--model", ExamplePath("models/resnet50.json"), "--profile", profile_,
                             "--compressor", "efsignsgd", "--schemes", "flat_fp16", "-o", plan});
  EXPECT_EQ(code, tools::kExitOk);
  EXPECT_EQ(err, "warning: --schemes: only --search-space options chooses schemes; ignored\n");
  std::tie(code, err) = run({"search", "--ratoi", "0.5"});
  EXPECT_EQ(code, tools::kExitUsage);
  EXPECT_EQ(err,
            "cupcake-plan search: unknown option; got '--ratoi' (did you mean '--ratio'?); run 'cupcake-plan "
            "search --help' for its options\n");
  std::tie(code, err) = run({"show"});
  EXPECT_EQ(code, tools::kExitUsage);
  EXPECT_TRUE(err.starts_with(
      "cupcake-plan show: PLAN: missing; expected the plan file (.pb)\n"
      "usage: cupcake-plan show PLAN.pb [--rung RATIO] [--format text|json] [--profile P [--state-bytes N]]\n"))
      << err;
}

TEST_F(PlanCommandsTest, ShowRefusesATruncatedPlan) {
  const SearchOptions o = Search("efsignsgd", "plan.pb");
  RunOk(o);
  const std::string bytes = *ReadFile(o.output);
  for (size_t len : {size_t{0}, size_t{1}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    const std::string cut = dir_.File("cut.pb");
    ASSERT_TRUE(WriteFileAtomic(cut, bytes.substr(0, len)).ok());
    std::ostringstream out;
    Status s = RunShow({.plan = cut, .format = tools::OutputFormat::kText}, out);
    EXPECT_FALSE(s.ok()) << len;
    EXPECT_EQ(out.str(), "");
    if (len == 0) {
      EXPECT_EQ(s.message(), cut + ": empty file; expected a cupcake.plan.v1 plan");
    }
    if (len == 100) {
      EXPECT_EQ(s.message(), cut +
                                 ": not a valid plan: corrupt or truncated protobuf; got 100 bytes, expected a "
                                 "cupcake.plan.v1 plan");
    }
  }
}

TEST_F(PlanCommandsTest, SimulateReproducesThePlansPrediction) {
  const SearchOptions o = Search("topk", "plan.pb");
  RunOk(o);
  const pb::Plan plan = *ReadPlanFile(o.output);
  SimulateOptions so{.plan = o.output, .model = o.model, .profile = profile_};
  std::ostringstream out;
  ASSERT_TRUE(RunSimulate(so, out).ok());
  const std::string text = out.str();
  EXPECT_TRUE(text.starts_with("simulate " + o.output +
                               " for model resnet50 on profile v100-8x8-pcie-25g (the plan's "
                               "profile)\n  group tensors "))
      << text;
  std::string header = text.substr(text.find('\n') + 1);
  header = header.substr(0, header.find('\n'));
  for (const char* column : {" enc us ", " com us ", " dec us ", " encode ms ", " comm ms ", " decode ms "})
    EXPECT_NE(header.find(column), std::string::npos) << column << " in " << header;
  const std::string t = Ms(plan.predicted().iteration_us());
  EXPECT_TRUE(
      text.ends_with("\niteration   " + t + " ms (plan predicted " + t + " ms; difference +0.000 ms, +0.000%)\n"))
      << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), plan.groups_size() + 3);

  so.format = tools::OutputFormat::kJson;
  std::ostringstream json;
  ASSERT_TRUE(RunSimulate(so, json).ok());
  const auto j = nlohmann::json::parse(json.str());
  EXPECT_EQ(j["iteration_us"], plan.predicted().iteration_us());
  EXPECT_EQ(j["difference_us"], 0.0);
  EXPECT_EQ(j["same_profile_as_plan"], true);
  ASSERT_EQ(j["groups"].size(), static_cast<size_t>(plan.groups_size()));
  for (int k = 0; k < plan.groups_size(); ++k) {
    EXPECT_EQ(j["groups"][k]["first_tensor"], plan.groups(k).first_tensor());
    EXPECT_EQ(j["groups"][k]["comm_end_us"], plan.groups(k).comm_end_us());
    EXPECT_GT(j["groups"][k]["com_us"].get<double>(), 0);
  }
}

TEST_F(PlanCommandsTest, SimulateRefusesAModelThePlanWasNotMadeFor) {
  const SearchOptions o = Search("topk", "plan.pb");
  RunOk(o);
  const pb::Plan plan = *ReadPlanFile(o.output);
  auto vgg = profile::ParseModelJson(ReadExample("models/vgg16.json"), "vgg16");
  ASSERT_TRUE(vgg.ok());
  SimulateOptions so{.plan = o.output, .model = ExamplePath("models/vgg16.json"), .profile = profile_};
  std::ostringstream out;
  EXPECT_EQ(RunSimulate(so, out).message(), "model vgg16: model fingerprint differs; got " + ModelFingerprint(*vgg) +
                                                ", expected " + plan.model().fingerprint() +
                                                " (the plan was made for model resnet50)");
  EXPECT_EQ(out.str(), "");
}

TEST_F(PlanCommandsTest, TraceWritesTheTimelineAtomically) {
  const SearchOptions o = Search("efsignsgd", "plan.pb");
  RunOk(o);
  const pb::Plan plan = *ReadPlanFile(o.output);
  std::ostringstream out;
  const std::string trace = dir_.File("trace.json");
  ASSERT_TRUE(RunTrace({.plan = o.output, .output = trace}, out).ok());
  EXPECT_EQ(out.str(), "");
  const auto j = nlohmann::json::parse(*ReadFile(trace));
  int comm = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("cat", "") != "comm") continue;
    // Each collective carries its group's elements and bytes per rank.
    EXPECT_EQ(e["args"]["elements"], plan.groups(comm).numel()) << e;
    EXPECT_EQ(e["args"]["bytes"], plan.groups(comm).payload_bytes()) << e;
    ++comm;
  }
  EXPECT_EQ(comm, plan.groups_size());
  std::ostringstream to_stdout;
  ASSERT_TRUE(RunTrace({.plan = o.output, .output = "-"}, to_stdout).ok());
  EXPECT_EQ(to_stdout.str(), *ReadFile(trace));
  EXPECT_EQ(RunTrace({.plan = dir_.File("nope.pb"), .output = trace}, out).message(),
            dir_.File("nope.pb") + ": no such file");
}

TEST_F(PlanCommandsTest, DiffSaysWhetherPlansDiffer) {
  RunOk(Search("efsignsgd", "a.pb"));
  RunOk(Search("efsignsgd", "a2.pb"));
  RunOk(Search("topk", "b.pb"));
  const std::string a = dir_.File("a.pb"), b = dir_.File("b.pb");
  std::ostringstream same;
  auto d = RunDiff({a, dir_.File("a2.pb"), 0, tools::OutputFormat::kText}, same);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(*d);
  EXPECT_EQ(same.str(), "plans are equivalent\n");

  std::ostringstream text;
  d = RunDiff({a, b, 0, tools::OutputFormat::kText}, text);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(*d);
  EXPECT_TRUE(text.str().starts_with("compressor: efsignsgd -> topk\n")) << text.str();
  EXPECT_NE(text.str().find("\npredicted.iteration_us: "), std::string::npos);

  std::ostringstream json;
  d = RunDiff({a, b, 5, tools::OutputFormat::kJson}, json);
  ASSERT_TRUE(d.ok());
  const auto j = nlohmann::json::parse(json.str());
  EXPECT_EQ(j["different"], true);
  EXPECT_EQ(j["changes"][0], "compressor: efsignsgd -> topk");
  const pb::Plan pa = *ReadPlanFile(a), pb_ = *ReadPlanFile(b);
  EXPECT_DOUBLE_EQ(
      j["time_change_pct"].get<double>(),
      (pb_.predicted().iteration_us() - pa.predicted().iteration_us()) / pa.predicted().iteration_us() * 100);

  std::ostringstream none;
  EXPECT_EQ(RunDiff({a, dir_.File("missing.pb"), 0, tools::OutputFormat::kText}, none).status().message(),
            dir_.File("missing.pb") + ": no such file");
  EXPECT_EQ(RunDiff({a, b, -1, tools::OutputFormat::kText}, none).status().message(),
            "--tolerance: must be a percentage >= 0; got -1");
  EXPECT_EQ(none.str(), "");
}

}  // namespace
}  // namespace cupcake::plan_cli

namespace cupcake::plan_cli {
namespace {

// The zen scheme (docs/MODEL.md) through the commands: the sample profile plus a constant
// 10 us global alltoall curve, topk on ncf over the profile's 64 ranks. With an alltoall that cheap
// zen sends far fewer allgather bytes (an owner's share of the union, a bitmap, instead of all
// 64 ranks' pairs), so the search picks it for some groups; search's summary and show's rows
// name it like any option, and the plan loads (ValidatePlan).
TEST_F(PlanCommandsTest, OptionsSearchCanChooseZenAndShowNamesIt) {
  nlohmann::json profile = nlohmann::json::parse(ReadExample("profiles/v100-8x8-pcie-25g.json"));
  profile["curves"].push_back(
      {{"kind", "comm"}, {"op", "alltoall"}, {"scope", "global"}, {"points", {{8, 10.0}, {1 << 26, 10.0}}}});
  SearchOptions o = Search("topk", "zen.pb", "ncf");
  o.profile = Write("with-alltoall.json", profile.dump());
  o.search.space = planner::SearchSpace::kOptions;
  const std::string out = RunOk(o);
  EXPECT_NE(out.find(" x zen gpu"), std::string::npos) << out;
  auto plan = ReadPlanFile(o.output);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  int zen = 0;
  for (const auto& g : plan->groups()) zen += g.options().scheme() == "zen";
  EXPECT_GT(zen, 0);
  std::ostringstream text;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kText}, text).ok());
  EXPECT_NE(text.str().find(" zen gpu "), std::string::npos) << text.str();
  EXPECT_EQ(text.str().find("zen union"), std::string::npos) << text.str();
  // A measured union share is kept in the plan and shown with the compressor's parameters.
  o.request.zen_union = 0.5;
  RunOk(o);
  auto measured = ReadPlanFile(o.output);
  ASSERT_TRUE(measured.ok()) << measured.status().ToString();
  EXPECT_EQ(measured->compressor().zen_union(), 0.5);
  std::ostringstream shown;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kText}, shown).ok());
  EXPECT_NE(shown.str().find("compressor  topk (ratio 0.01, zen union 0.5)"), std::string::npos) << shown.str();
}

}  // namespace
}  // namespace cupcake::plan_cli

namespace cupcake::plan_cli {
namespace {

// A ladder through the commands: search --ratios writes it and lists the rungs; show lists them
// (text and JSON) or prints one rung as a plan; simulate and trace need --rung; diff compares
// two ladders rung by rung and refuses a ladder against a plan.
TEST_F(PlanCommandsTest, LadderSearchShowSimulateTraceAndDiff) {
  SearchOptions o = Search("topk", "ladder.pb");
  o.ratios = {0.001, 0.1, 0.01};
  const std::string out = RunOk(o);
  auto plans = ReadPlansFile(o.output);
  ASSERT_TRUE(plans.ok()) << plans.status().ToString();
  ASSERT_FALSE(plans->single);
  const pb::Ladder& ladder = plans->ladder;
  ASSERT_EQ(ladder.rungs_size(), 4);
  EXPECT_TRUE(out.starts_with("wrote ladder " + o.output + " (4 rungs, each searched on its own)\n")) << out;
  const double dense = ladder.rungs(0).plan().predicted().iteration_us();
  for (const pb::Rung& r : ladder.rungs()) {
    char speedup[32];
    std::snprintf(speedup, sizeof speedup, "%.2fx", dense / r.plan().predicted().iteration_us());
    const std::string row = " " + r.plan().compressor().name() + " ";
    const std::string cells = Ms(r.plan().predicted().iteration_us()) + "        " + speedup;
    EXPECT_NE(out.find(cells), std::string::npos) << cells << "\n" << out;
  }
  std::ostringstream shown;
  ASSERT_TRUE(RunShow({.plan = o.output}, shown).ok());
  EXPECT_TRUE(shown.str().starts_with("ladder      " + o.output + " (cupcake.ladder.v1): 4 rungs")) << shown.str();
  EXPECT_NE(shown.str().find("\n      1 fp32 "), std::string::npos) << shown.str();
  EXPECT_NE(shown.str().find("\n  0.001 topk "), std::string::npos) << shown.str();

  std::ostringstream json;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kJson}, json).ok());
  const auto j = nlohmann::json::parse(json.str());
  ASSERT_EQ(j["rungs"].size(), 4u);
  EXPECT_EQ(j["rungs"][2]["ratio"], 0.01);
  EXPECT_EQ(j["rungs"][2]["plan"]["compressor"]["ratio"], 0.01);
  EXPECT_EQ(j["rungs"][0]["plan"]["compressor"]["name"], "fp32");

  std::ostringstream one;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kText, .rung = 0.01}, one).ok());
  EXPECT_NE(one.str().find("\ncompressor  topk (ratio 0.01), memory residual"), std::string::npos) << one.str();

  std::ostringstream sink;
  SimulateOptions sim{.plan = o.output, .model = o.model, .profile = profile_};
  EXPECT_EQ(RunSimulate(sim, sink).message(),
            o.output + ": a ladder of 4 plans; expected --rung RATIO, one of 1 (fp32), 0.1, 0.01, 0.001");
  sim.rung = 0.1;
  ASSERT_TRUE(RunSimulate(sim, sink).ok());
  EXPECT_EQ(RunTrace({o.output, dir_.File("t.json"), 0.3}, sink).message(),
            o.output + ": --rung: no rung of ratio 0.3; expected one of 1 (fp32), 0.1, 0.01, 0.001");
  ASSERT_TRUE(RunTrace({o.output, dir_.File("t.json"), 1.0}, sink).ok());

  SearchOptions other = Search("topk", "other.pb");
  other.ratios = {0.1, 0.003};
  RunOk(other);
  std::ostringstream same, diff;
  auto d = RunDiff({o.output, o.output, 0, tools::OutputFormat::kText}, same);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(*d);
  EXPECT_EQ(same.str(), "ladders are equivalent\n");
  d = RunDiff({o.output, other.output, 0, tools::OutputFormat::kText}, diff);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(*d);
  EXPECT_EQ(diff.str(), "rung 0.01: only in A\nrung 0.001: only in A\nrung 0.003: only in B\n");
  RunOk(Search("topk", "plan.pb"));
  EXPECT_EQ(RunDiff({o.output, dir_.File("plan.pb"), 0, tools::OutputFormat::kText}, sink).status().message(),
            o.output + " is a ladder and " + dir_.File("plan.pb") +
                " a single plan; expected two plans or two ladders (show --rung RATIO picks a rung)");
  EXPECT_EQ(ReadPlanFile(o.output).status().code(), StatusCode::kInvalidArgument);
}

// show --profile: the replica schedule (docs/CHECKPOINT.md). The gaps restated from the plan's
// groups; each chunk checked against the definition on the profile's allreduce curve (W = 8 x 8:
// a transfer of x bytes is the allreduce of x W / (2 (W - 1)) bytes): it fits its gap and one
// byte more does not, or it is the whole state.
TEST_F(PlanCommandsTest, ShowPrintsTheReplicaSchedule) {
  const SearchOptions o = Search("topk", "plan.pb");
  RunOk(o);
  const pb::Plan plan = *ReadPlanFile(o.output);
  ShowOptions show{.plan = o.output, .format = tools::OutputFormat::kJson};
  show.profile = profile_;
  std::ostringstream json;
  ASSERT_TRUE(RunShow(show, json).ok());
  const auto j = nlohmann::json::parse(json.str());
  ASSERT_TRUE(j.contains("replica_schedule")) << json.str();
  const auto& s = j["replica_schedule"];
  int64_t elements = 0;
  for (const auto& t : plan.model().model().tensors()) elements += t.numel();
  // topk keeps a residual, no momentum: a float per parameter and the 8-byte iteration counter.
  const int64_t state = 4 * elements + 8;
  EXPECT_EQ(s["state_bytes"], state);
  // Gaps: before the first block, between blocks that do not touch, after the last.
  const double forward = plan.model().model().forward_us();
  std::vector<std::pair<double, double>> want;
  double until = 0;
  for (const pb::Group& g : plan.groups()) {
    if (forward + g.comm_start_us() > until) want.emplace_back(until, forward + g.comm_start_us());
    until = forward + g.comm_end_us();
  }
  if (plan.predicted().iteration_us() > until) want.emplace_back(until, plan.predicted().iteration_us());
  ASSERT_EQ(s["gaps"].size(), want.size());
  const pb::Profile profile = *profile::LoadProfileFile(profile_);
  const pb::Curve* allreduce = nullptr;
  for (const pb::Curve& c : profile.curves())
    if (c.kind() == pb::COMM && c.comm_op() == pb::ALLREDUCE && c.scope() == pb::GLOBAL && !c.busy() &&
        c.dtype() != pb::FLOAT16)
      allreduce = &c;
  ASSERT_NE(allreduce, nullptr);
  const planner::Curve curve(*allreduce);
  const double w = plan.world_size();
  auto transfer_us = [&](double x) { return curve.At(x * w / (2 * (w - 1))); };
  int64_t per_iteration = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("gap " + std::to_string(i));
    const auto& g = s["gaps"][i];
    EXPECT_DOUBLE_EQ(g["start_us"].get<double>(), want[i].first);
    EXPECT_DOUBLE_EQ(g["end_us"].get<double>(), want[i].second);
    const int64_t chunk = g["chunk_bytes"];
    const double idle = want[i].second - want[i].first;
    if (chunk > 0) {
      EXPECT_LE(transfer_us(static_cast<double>(chunk)), idle * (1 + 1e-12));
    }
    if (chunk < state) {
      EXPECT_GT(transfer_us(static_cast<double>(chunk + 1)), idle * (1 - 1e-12));
    }
    per_iteration += chunk;
  }
  EXPECT_EQ(s["bytes_per_iteration"], per_iteration);
  ASSERT_GT(per_iteration, 0);
  EXPECT_EQ(s["iterations"], (state + per_iteration - 1) / per_iteration);
  EXPECT_EQ(s["commit_chunk_bytes"], s["gaps"][0]["chunk_bytes"]);  // the first block starts after 0
  // The text names the profile and the iterations.
  show.format = tools::OutputFormat::kText;
  std::ostringstream text;
  ASSERT_TRUE(RunShow(show, text).ok());
  EXPECT_NE(text.str().find("\nreplica     a replica of "), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("a full replica in " + std::to_string(s["iterations"].get<int64_t>()) + " iterations\n"),
            std::string::npos)
      << text.str();
  // Without --profile: no schedule.
  std::ostringstream plain;
  ASSERT_TRUE(RunShow({.plan = o.output, .format = tools::OutputFormat::kText}, plain).ok());
  EXPECT_EQ(plain.str().find("replica"), std::string::npos);
}

// The replica's default size is the plan's per-rank state (docs/CHECKPOINT.md): dgc keeps error
// feedback and momentum (8 bytes per parameter), fp32 neither (the iteration counter's 8 bytes
// alone); --state-bytes overrides it.
TEST_F(PlanCommandsTest, ShowSizesTheReplicaFromThePerRankState) {
  int64_t elements = 0;
  for (const auto& [compressor, per_parameter] : std::vector<std::pair<std::string, int64_t>>{{"dgc", 8}, {"fp32", 0}}) {
    SCOPED_TRACE(compressor);
    const SearchOptions o = Search(compressor, compressor + ".pb");
    RunOk(o);
    const pb::Plan plan = *ReadPlanFile(o.output);
    elements = 0;
    for (const auto& t : plan.model().model().tensors()) elements += t.numel();
    ShowOptions show{o.output, tools::OutputFormat::kJson};
    show.profile = profile_;
    std::ostringstream json;
    ASSERT_TRUE(RunShow(show, json).ok());
    EXPECT_EQ(nlohmann::json::parse(json.str())["replica_schedule"]["state_bytes"], per_parameter * elements + 8);
    show.state_bytes = 12345;
    std::ostringstream given;
    ASSERT_TRUE(RunShow(show, given).ok());
    EXPECT_EQ(nlohmann::json::parse(given.str())["replica_schedule"]["state_bytes"], 12345);
  }
  EXPECT_GT(elements, 0);
}

TEST_F(PlanCommandsTest, ShowScheduleErrorsNameTheirCause) {
  const SearchOptions o = Search("topk", "plan.pb");
  RunOk(o);
  auto run = [&](std::vector<std::string> args) {
    std::ostringstream out, err;
    const int code = tools::Dispatch(kTool, Commands(), args, out, err);
    return std::pair{code, err.str().substr(0, err.str().find('\n'))};
  };
  using P = std::pair<int, std::string>;
  EXPECT_EQ(
      run({"show", o.output, "--state-bytes", "100"}),
      P(tools::kExitUsage, "cupcake-plan show: --state-bytes: sizes the replica schedule; expected --profile too"));
  EXPECT_EQ(run({"show", o.output, "--profile", profile_, "--state-bytes", "0"}),
            P(tools::kExitUsage, "cupcake-plan show: --state-bytes: out of range; got 0, expected > 0"));
  // A profile without the allreduce curve.
  const pb::Profile profile = *profile::LoadProfileFile(profile_);
  pb::Profile bare = profile;
  bare.clear_curves();
  for (const pb::Curve& c : profile.curves())
    if (CurveKey(c) != "comm allreduce global") *bare.add_curves() = c;
  ASSERT_LT(bare.curves_size(), profile.curves_size());
  const std::string path = Write("bare.json", profile::ProfileToJson(bare));
  ShowOptions show{.plan = o.output, .format = tools::OutputFormat::kText};
  show.profile = path;
  std::ostringstream out;
  const Status s = RunShow(show, out);
  EXPECT_EQ(s.message(), path + ": profile " + profile.cluster().name() +
                             ": curves: no \"comm allreduce global\" curve; expected one to price replica chunks");
}

TEST_F(PlanCommandsTest, LadderFlagsAreUsageErrors) {
  auto run = [&](std::vector<std::string> args) {
    std::ostringstream out, err;
    std::vector<std::string> all = {
        "search", "--model", ExamplePath("models/resnet50.json"), "--profile", profile_, "-o", dir_.File("x.pb")};
    all.insert(all.end(), args.begin(), args.end());
    const int code = tools::Dispatch(kTool, Commands(), all, out, err);
    EXPECT_FALSE(std::filesystem::exists(dir_.File("x.pb")));
    return std::pair{code, err.str().substr(0, err.str().find('\n'))};
  };
  using P = std::pair<int, std::string>;
  EXPECT_EQ(
      run({"--compressor", "efsignsgd", "--ratios", "0.1"}),
      P(tools::kExitUsage,
        "cupcake-plan search: --ratios: efsignsgd keeps no fraction of the elements; expected topk, randk or dgc"));
  EXPECT_EQ(run({"--compressor", "topk", "--ratios", "0.1,x"}),
            P(tools::kExitUsage,
              "cupcake-plan search: --ratios: not a number; got \"x\" in \"0.1,x\", expected "
              "comma-separated ratios such as 0.1,0.01"));
  EXPECT_EQ(run({"--compressor", "topk", "--ratios", "0.1,1"}),
            P(tools::kExitUsage,
              "cupcake-plan search: --ratios: out of range; got 1, expected 0 < ratio < 1 (the "
              "fp32 rung is always added)"));
  EXPECT_EQ(run({"--compressor", "topk", "--ratios", "0.1", "--ratio", "0.2"}),
            P(tools::kExitUsage, "cupcake-plan search: give --ratio (one plan) or --ratios (a ladder), not both"));
  EXPECT_EQ(run({"--compressor", "fp32", "--search-space", "options", "--ranks", "4,x"}),
            P(tools::kExitUsage,
              "cupcake-plan search: --ranks: not a whole number; got \"x\" in \"4,x\", expected comma-separated "
              "PowerSGD ranks such as 4,2,1"));
  EXPECT_EQ(run({"--compressor", "fp32", "--search-space", "options", "--ranks", "4", "--ratios", "0.1"}),
            P(tools::kExitUsage,
              "cupcake-plan search: give --ratios (a ladder of ratios) or --ranks (a ladder of PowerSGD ranks), not "
              "both"));
  EXPECT_EQ(run({"--compressor", "topk", "--search-space", "options", "--ranks", "4"}),
            P(tools::kExitUsage,
              "cupcake-plan search: --ranks: PowerSGD plans are fp32 plans whose groups may run PowerSGD; got "
              "--compressor topk, expected --compressor fp32"));
  EXPECT_EQ(run({"--compressor", "fp32", "--ranks", "4"}),
            P(tools::kExitUsage,
              "cupcake-plan search: --ranks: only --search-space options offers the powersgd schemes; expected "
              "--search-space options"));
}

}  // namespace
}  // namespace cupcake::plan_cli

namespace cupcake::plan_cli {
namespace {

// An options plan that leaves the compressor out of its groups says so where the compressor is
// named, and diff names each added or removed group's option (scheme, device, collective).
TEST_F(PlanCommandsTest, SummaryAndDiffSayWhatEachGroupRuns) {
  SearchOptions o = Search("efsignsgd", "options.pb");
  o.search.space = planner::SearchSpace::kOptions;
  o.search.node_budget = planner::DefaultNodeBudget(planner::SearchSpace::kOptions);
  const std::string out = RunOk(o);
  const pb::Plan plan = *ReadPlanFile(o.output);
  int fp16 = 0;
  for (const pb::Group& g : plan.groups()) fp16 += g.options().scheme() == "flat_fp16" ? 1 : 0;
  ASSERT_GT(fp16, 0) << "the sample profile makes fp16 the better option for some group";
  EXPECT_NE(out.find("\ncompressor  efsignsgd, memory residual, on gpu; chosen: "), std::string::npos) << out;
  EXPECT_NE(out.find(std::to_string(fp16) + " x flat_fp16 gpu"), std::string::npos) << out;

  RunOk(Search("efsignsgd", "fusion.pb"));
  std::ostringstream fusion;
  ASSERT_TRUE(RunShow({.plan = dir_.File("fusion.pb")}, fusion).ok());
  EXPECT_NE(fusion.str().find("\ncompressor  efsignsgd, memory residual, on gpu\n"), std::string::npos)
      << fusion.str();

  std::ostringstream diff;
  ASSERT_TRUE(RunDiff({dir_.File("fusion.pb"), o.output, 0, tools::OutputFormat::kText}, diff).ok());
  const pb::Plan& first = plan;
  const std::string added = "\n+ group [" + first.model().model().tensors(first.groups(0).first_tensor()).name();
  EXPECT_NE(diff.str().find(added), std::string::npos) << diff.str();
  EXPECT_NE(diff.str().find("] (" + first.groups(0).options().scheme() + " "), std::string::npos) << diff.str();
  EXPECT_NE(diff.str().find(" on gpu via "), std::string::npos) << diff.str();
}

}  // namespace
}  // namespace cupcake::plan_cli


#include "cupcake/proto/plan_io.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cupcake/proto/catalogue.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/fingerprint.h"
#include "tiny_plan.h"

namespace cupcake {
namespace {

std::string Message(const pb::Plan& plan) {
  Status s = ValidatePlan(plan, "plan.pb");
  return s.ok() ? "OK" : s.message();
}

class PlanIoTest : public ::testing::Test {
 protected:
  PlanIoTest() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cupcake-plan-io-XXXXXX").string();
    dir_ = ::mkdtemp(tmpl.data());
  }
  ~PlanIoTest() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(PlanIoTest, WriteThenReadGivesTheSamePlan) {
  const pb::Plan plan = TinyPlan();
  ASSERT_EQ(Message(plan), "OK");
  const std::string path = dir_ + "/plan.pb";
  ASSERT_TRUE(WritePlanFile(path, plan).ok());
  auto back = ReadPlanFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(plan, *back));
  EXPECT_EQ(*ReadFile(path), SerializePlan(plan));
  EXPECT_EQ(SerializePlan(*back), SerializePlan(plan));  // deterministic: same plan, same bytes
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1);  // written atomically: no temporary left behind
}

TEST_F(PlanIoTest, RejectsEveryTruncationWithoutCrashing) {
  const std::string bytes = SerializePlan(TinyPlan());
  ASSERT_GT(bytes.size(), 100u);
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto plan = ParsePlan(std::string_view(bytes).substr(0, len), "plan.pb");
    EXPECT_FALSE(plan.ok()) << "a plan truncated to " << len << " of " << bytes.size() << " bytes was accepted";
  }
  EXPECT_TRUE(ParsePlan(bytes, "plan.pb").ok());
}

TEST_F(PlanIoTest, RejectsEmptyCorruptAndMissingFiles) {
  auto empty = ParsePlan("", "plan.pb");
  EXPECT_EQ(empty.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(empty.status().message(), "plan.pb: empty file; expected a cupcake.plan.v1 plan");

  const std::string bytes = SerializePlan(TinyPlan());
  auto cut = ParsePlan(std::string_view(bytes).substr(0, 40), "plan.pb");
  EXPECT_EQ(cut.status().message(),
            "plan.pb: not a valid plan: corrupt or truncated protobuf; got 40 bytes, expected a cupcake.plan.v1 plan");
  auto json = ParsePlan("{\"format\": \"cupcake.plan.v1\"}", "plan.json");
  EXPECT_EQ(json.status().message(),
            "plan.json: not a valid plan: corrupt or truncated protobuf; got 29 bytes, expected a cupcake.plan.v1 "
            "plan (this looks like JSON; plans are read as binary .pb)");
  // Flipped bytes: an error or, where the damage still parses, a plan that passes validation;
  // never a crash.
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string damaged = bytes;
    damaged[i] = static_cast<char>(damaged[i] ^ 0xff);
    auto plan = ParsePlan(damaged, "plan.pb");
    if (plan.ok()) {
      EXPECT_TRUE(ValidatePlan(*plan, "x").ok());
    }
  }
  auto missing = ReadPlanFile(dir_ + "/missing.pb");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), dir_ + "/missing.pb: no such file");
}

TEST_F(PlanIoTest, RejectsWrongOrMissingFormat) {
  pb::Plan plan = TinyPlan();
  plan.set_format("cupcake.plan.v2");
  EXPECT_EQ(Message(plan), "plan.pb: format: unsupported; got \"cupcake.plan.v2\", expected \"cupcake.plan.v1\"");
  plan.clear_format();
  EXPECT_EQ(Message(plan), "plan.pb: format: missing; expected \"cupcake.plan.v1\"");
}

TEST_F(PlanIoTest, RejectsGroupsOutOfRange) {
  pb::Plan plan = TinyPlan();
  plan.mutable_groups(1)->set_last_tensor(912);
  EXPECT_EQ(Message(plan), "plan.pb: groups[1].last_tensor: out of range; got 912, expected < 3 (model tiny)");
  plan = TinyPlan();
  plan.mutable_groups(0)->set_first_tensor(-1);
  EXPECT_EQ(Message(plan), "plan.pb: groups[0].first_tensor: out of range; got -1, expected 0 <= x < 3 (model tiny)");
}

TEST_F(PlanIoTest, RejectsGroupsThatDoNotCoverTheModelContiguously) {
  pb::Plan plan = TinyPlan();
  plan.mutable_groups(1)->set_first_tensor(1);  // overlaps group 0
  plan.mutable_groups(1)->set_numel(1500);
  plan.mutable_groups(1)->set_payload_bytes(8 * 15);  // topk 1% of 1500: 15 (value, index) pairs
  EXPECT_EQ(Message(plan),
            "plan.pb: groups[1].first_tensor: not contiguous; got 1, expected 2 (groups[0].last_tensor + 1)");

  plan = TinyPlan();
  plan.mutable_groups(0)->set_first_tensor(1);
  plan.mutable_groups(0)->set_numel(1000);
  EXPECT_EQ(Message(plan),
            "plan.pb: groups[0].first_tensor: not contiguous; got 1, expected 0 (the first group starts at tensor 0)");

  plan = TinyPlan();
  plan.mutable_groups()->RemoveLast();
  EXPECT_EQ(Message(plan), "plan.pb: groups[0].last_tensor: does not end the model; got 1, expected 2 (model tiny)");

  plan = TinyPlan();
  plan.mutable_groups(1)->set_first_tensor(2);
  plan.mutable_groups(1)->set_last_tensor(1);
  EXPECT_EQ(Message(plan), "plan.pb: groups[1]: first_tensor after last_tensor; got 2 > 1, expected first_tensor <= "
                           "last_tensor");

  plan = TinyPlan();
  plan.clear_groups();
  EXPECT_EQ(Message(plan), "plan.pb: groups: empty; expected groups covering tensors 0..2 (model tiny)");
}

TEST_F(PlanIoTest, RejectsAModelThatDoesNotMatchItsFingerprint) {
  pb::Plan plan = TinyPlan();
  const std::string want = plan.model().fingerprint();
  plan.mutable_model()->mutable_model()->mutable_tensors(2)->set_numel(501);
  const std::string got = ModelFingerprint(plan.model().model());
  EXPECT_EQ(Message(plan), "plan.pb: model.fingerprint: does not match the embedded model; got " + want +
                               ", expected " + got + " (model tiny)\n"
                               "plan.pb: groups[1].numel: does not match its tensors; got 500, expected 501 "
                               "(tensors 2..2)");
}

TEST_F(PlanIoTest, RejectsAPlanWithoutTensorsOrModel) {
  pb::Plan plan = TinyPlan();
  plan.mutable_model()->mutable_model()->clear_tensors();
  plan.mutable_model()->set_fingerprint(ModelFingerprint(plan.model().model()));
  EXPECT_EQ(Message(plan), "plan.pb: model.model.tensors: empty; expected at least one tensor (model tiny)");
  plan.clear_model();
  EXPECT_EQ(Message(plan), "plan.pb: model: missing; expected the model the plan was made for");
}

TEST_F(PlanIoTest, ReportsSeveralProblemsTogether) {
  pb::Plan plan = TinyPlan();
  plan.set_world_size(0);
  plan.mutable_compressor()->set_name("topq");
  plan.mutable_compressor()->set_memory("resid");
  plan.mutable_groups(1)->set_last_tensor(7);
  plan.clear_search();
  EXPECT_EQ(Message(plan),
            "plan.pb: world_size: out of range; got 0, expected 1 <= x <= 1048576\n"
            "plan.pb: compressor.name: unknown compressor 'topq' (did you mean 'topk'?); expected one of fp32, fp16, "
            "topk, randk, dgc, qsgd, signsgd, efsignsgd, signum, terngrad, onebit\n"
            "plan.pb: compressor.memory: unknown memory; got \"resid\", expected one of residual, dgc, none\n"
            "plan.pb: groups[1].last_tensor: out of range; got 7, expected < 3 (model tiny)\n"
            "plan.pb: search: missing; expected the search statistics (a truncated file?)");
}

TEST_F(PlanIoTest, CapsTheProblemsListed) {
  pb::Plan plan = TinyPlan();
  for (int i = 0; i < 30; ++i) plan.mutable_model()->mutable_model()->add_tensors();  // no name, numel, dtype
  plan.mutable_model()->set_fingerprint(ModelFingerprint(plan.model().model()));
  Status s = ValidatePlan(plan, "plan.pb");
  ASSERT_FALSE(s.ok());
  const std::string& m = s.message();
  EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 20);
  EXPECT_TRUE(m.ends_with("\nplan.pb: ... and 71 more problems")) << m;
}

TEST_F(PlanIoTest, JsonKeepsProtoFieldNamesAndDefaults) {
  pb::Plan plan = TinyPlan();
  const std::string json = PlanToJson(plan);
  EXPECT_TRUE(json.starts_with("{\n \"format\": \"cupcake.plan.v1\",\n \"model\": {\n")) << json;
  EXPECT_TRUE(json.ends_with("}\n"));
  EXPECT_NE(json.find("\"first_tensor\": 0,"), std::string::npos) << "defaults are printed";
  EXPECT_NE(json.find("\"profile_fingerprint\": \"0123456789abcdef\""), std::string::npos);
  EXPECT_NE(json.find("\"encode_start_us\": 25,"), std::string::npos);
  EXPECT_NE(json.find("\"pruned\": \"0\""), std::string::npos) << "int64 as strings (proto3 JSON mapping)";
  const std::string text = PlanToTextProto(plan);
  EXPECT_TRUE(text.starts_with("format: \"cupcake.plan.v1\"\nmodel {\n")) << text;
}

// Regression: a loaded plan's times were trusted, so `trace` wrote "ts":nan and `diff` called
// damaged plans equivalent.
TEST_F(PlanIoTest, RejectsBadBackwardTimesAndTimesOutOfOrder) {
  pb::Plan plan = TinyPlan();
  plan.mutable_model()->mutable_model()->mutable_tensors(1)->set_backward_us(-5);
  plan.mutable_model()->mutable_model()->mutable_tensors(2)->set_backward_us(std::nan(""));
  plan.mutable_model()->set_fingerprint(ModelFingerprint(plan.model().model()));
  EXPECT_EQ(Message(plan),
            "plan.pb: model.model.tensors[1].backward_us: not a time; got -5, expected a finite number >= 0 and <= "
            "1e+12 (microseconds)\n"
            "plan.pb: model.model.tensors[2].backward_us: not a time; got nan, expected a finite number >= 0 and <= "
            "1e+12 (microseconds)");

  plan = TinyPlan();  // group 1's collective starts before group 0's ends: the network runs one at a time
  plan.mutable_groups(1)->set_comm_start_us(10);
  EXPECT_EQ(Message(plan), "plan.pb: groups[1].comm_start_us: out of order; got 10, expected >= 26.5 "
                           "(groups[1].encode_end_us)\n"
                           "plan.pb: groups[1].comm_start_us: out of order; got 10, expected >= 20.25 "
                           "(groups[0].comm_end_us)");
  plan = TinyPlan();
  plan.mutable_groups(0)->set_decode_start_us(19);
  EXPECT_EQ(Message(plan), "plan.pb: groups[0].decode_start_us: out of order; got 19, expected >= 20.25 "
                           "(groups[0].comm_end_us)");
  plan = TinyPlan();
  plan.mutable_predicted()->set_iteration_us(60);
  EXPECT_EQ(Message(plan), "plan.pb: predicted.iteration_us: out of order; got 60, expected >= 66 "
                           "(groups[1].decode_end_us)");
}

TEST_F(PlanIoTest, RejectsAPayloadTheCompressorDoesNotMake) {
  pb::Plan plan = TinyPlan();
  plan.mutable_groups(0)->set_payload_bytes(-80);  // wrapped arithmetic
  EXPECT_EQ(Message(plan), "plan.pb: groups[0].payload_bytes: does not match the compressor; got -80, expected 80 "
                           "(topk of 1010 elements)");
  plan = TinyPlan();
  plan.mutable_groups(1)->mutable_options()->set_compress(false);  // an fp32 group sends 4 bytes an element
  EXPECT_EQ(Message(plan), "plan.pb: groups[1].payload_bytes: does not match the compressor; got 40, expected 2000 "
                           "(fp32 of 500 elements)\n"
                           "plan.pb: groups[1].options.collective: does not match the compressor; got allgather, "
                           "expected allreduce (fp32)");
}

// Found by test/fuzz/plan_fuzz.cc: a NaN in a field the loader did not check made the plan
// differ from itself after a round trip (and printed "nan" in show and diff).
TEST_F(PlanIoTest, RejectsNonFiniteSummariesBaselinesAndRatios) {
  pb::Plan plan = TinyPlan();
  plan.mutable_baselines(0)->set_iteration_us(std::nan(""));
  plan.mutable_baselines(0)->set_groups(0);
  plan.mutable_predicted()->set_comm_us(-1);
  EXPECT_EQ(Message(plan), "plan.pb: predicted.comm_us: not a time; got -1, expected a finite number >= 0 and <= "
                           "1e+18 (microseconds)\n"
                           "plan.pb: baselines[0].groups: must be positive; got 0, expected >= 1\n"
                           "plan.pb: baselines[0].iteration_us: not a time; got nan, expected a finite number >= 0 "
                           "and <= 1e+18 (microseconds)");
  plan = TinyPlan();
  plan.mutable_compressor()->set_name("efsignsgd");
  plan.mutable_compressor()->set_ratio(std::nan(""));
  const std::string m = Message(plan);  // then the topk groups' payloads, which efsignsgd does not make
  EXPECT_EQ(m.substr(0, m.find('\n')),
            "plan.pb: compressor.ratio: out of range; got nan, expected in [0, 1] (unused by efsignsgd)");
}

// Found by test/fuzz/plan_fuzz.cc: tensors of numel near 2^63 overflowed the group's sum
// (undefined behaviour) before their own bound was reported.
TEST_F(PlanIoTest, HugeTensorsAreReportedWithoutOverflowingTheGroupSum) {
  pb::Plan plan = TinyPlan();
  plan.mutable_model()->mutable_model()->mutable_tensors(0)->set_numel(int64_t{1} << 62);
  plan.mutable_model()->mutable_model()->mutable_tensors(1)->set_numel(int64_t{1} << 62);
  plan.mutable_model()->set_fingerprint(ModelFingerprint(plan.model().model()));
  const std::string m = Message(plan);
  EXPECT_EQ(m.substr(0, m.find('\n')), "plan.pb: model.model.tensors[0].numel: out of range; got 4611686018427387904, "
                                       "expected 1 <= x <= 1099511627776");
  EXPECT_EQ(m.find("groups[0].numel"), std::string::npos) << m;
}

// Regression: fields were checked by count, not by value, so these loaded (exit 0) and printed
// nonsense in show, trace, simulate and diff: a time of 1e308, a NaN lower bound, extrapolation
// sizes NaN and units "parsecs", a group device 5, an unknown search space, devices_per_node
// and search counters -1, the embedded model's forward time NaN.
TEST_F(PlanIoTest, ChecksEveryFieldByValue) {
  pb::Plan plan = TinyPlan();
  plan.mutable_predicted()->set_iteration_us(1e308);
  plan.mutable_baselines(0)->set_iteration_us(1e300);
  plan.mutable_search()->set_lower_bound_us(std::nan(""));
  plan.mutable_search()->set_nodes(-1);
  plan.mutable_search()->set_search_space("bogus");
  plan.set_devices_per_node(-1);
  plan.mutable_model()->mutable_model()->set_forward_us(std::nan(""));
  pb::Extrapolation* e = plan.add_extrapolations();
  e->set_curve("comm allreduce global");
  e->set_last_size(std::nan(""));
  e->set_max_size(4096);
  e->set_unit("parsecs");
  plan.mutable_groups(1)->mutable_options()->set_device(static_cast<pb::Device>(5));
  EXPECT_EQ(Message(plan),
            "plan.pb: model.model.forward_us: not a time; got nan, expected a finite number >= 0 and <= 1e+12 "
            "(microseconds)\n"
            "plan.pb: groups[1].options.device: unknown device; got 5, expected one of gpu, cpu\n"
            "plan.pb: predicted.iteration_us: not a time; got 1e+308, expected a finite number > 0 and <= 1e+18 "
            "(microseconds)\n"
            "plan.pb: baselines[0].iteration_us: not a time; got 1e+300, expected a finite number >= 0 and <= 1e+18 "
            "(microseconds)\n"
            "plan.pb: devices_per_node: out of range; got -1, expected 0 (fusion plans) or 1 <= x <= world_size 8\n"
            "plan.pb: extrapolations[0].last_size: out of range; got nan, expected a finite size > 0 and <= "
            "1125899906842624\n"
            "plan.pb: extrapolations[0].unit: unknown unit; got \"parsecs\", expected one of bytes, elements, ratio\n"
            "plan.pb: search.nodes: negative; got -1, expected >= 0\n"
            "plan.pb: search.search_space: unknown search space; got \"bogus\", expected \"options\" or none (fusion)\n"
            "plan.pb: search.lower_bound_us: not a time; got nan, expected a finite number >= 0 and <= 1e+18 "
            "(microseconds)");
}

// The steps of an options plan's group must be the scheme's: op, scope and bytes per rank.
TEST_F(PlanIoTest, ChecksEachStepAgainstItsScheme) {
  pb::Plan plan = TinyPlan();
  plan.set_devices_per_node(1);
  plan.mutable_search()->set_search_space("options");
  for (pb::Group& g : *plan.mutable_groups()) {
    g.mutable_options()->set_scheme("flat");
    pb::Step* st = g.add_steps();
    st->set_op(pb::ALLGATHER);
    st->set_scope(pb::GLOBAL);
    st->set_bytes(g.payload_bytes());
    st->set_start_us(g.comm_start_us());
    st->set_end_us(g.comm_end_us());
  }
  ASSERT_EQ(Message(plan), "OK");
  pb::Step* st = plan.mutable_groups(0)->mutable_steps(0);
  st->set_op(static_cast<pb::CommOp>(99));
  st->set_scope(static_cast<pb::Scope>(77));
  st->set_bytes(-1);
  plan.mutable_groups(1)->mutable_steps(0)->set_bytes(int64_t{1} << 62);
  EXPECT_EQ(Message(plan),
            "plan.pb: groups[0].steps[0].op: does not match the scheme; got 99, expected allgather (flat step 0)\n"
            "plan.pb: groups[0].steps[0].scope: does not match the scheme; got 77, expected global (flat step 0)\n"
            "plan.pb: groups[0].steps[0].bytes: does not match the scheme; got -1, expected " +
                std::to_string(plan.groups(0).payload_bytes()) +
                " (flat step 0)\n"
                "plan.pb: groups[1].steps[0].bytes: does not match the scheme; got 4611686018427387904, expected " +
                std::to_string(plan.groups(1).payload_bytes()) + " (flat step 0)");
}

}  // namespace
}  // namespace cupcake

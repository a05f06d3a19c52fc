#include "cupcake/profile/json_io.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <limits>
#include <nlohmann/json.hpp>

#include "cupcake/proto/file_io.h"
#include "cupcake/proto/names.h"

namespace cupcake::profile {
namespace {

using google::protobuf::util::MessageDifferencer;

std::string Example(const std::string& rel) {
  auto text = ReadFile(std::string(CUPCAKE_SOURCE_DIR) + "/examples/" + rel);
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

std::string ModelError(const std::string& json) {
  auto m = ParseModelJson(json, "model.json");
  EXPECT_FALSE(m.ok());
  return m.ok() ? "" : m.status().message();
}

std::string ProfileError(const std::string& json) {
  auto p = ParseProfileJson(json, "profile.json");
  EXPECT_FALSE(p.ok());
  return p.ok() ? "" : p.status().message();
}

// A valid model with one tensor, with `tensor` as its tensor's JSON.
std::string ModelWithTensor(const std::string& tensor) {
  return R"({"format": "cupcake.model.v1", "name": "m", "tensors": [)" + tensor + "]}";
}

std::string ProfileWithCurve(const std::string& curve) {
  return R"({"format": "cupcake.profile.v1", "cluster": {"name": "c", "nodes": 2, "devices_per_node": 4},
             "curves": [)" +
         curve + "]}";
}

TEST(ModelJson, ParsesEveryExampleAndRoundTripsExactly) {
  for (const char* name : {"bert_base", "gpt2", "ncf", "resnet50", "vgg16"}) {
    SCOPED_TRACE(name);
    std::string text = Example(std::string("models/") + name + ".json");
    auto model = ParseModelJson(text, name);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    EXPECT_EQ(model->name(), name);
    EXPECT_TRUE(model->has_source());
    EXPECT_GT(model->tensors_size(), 10);
    std::string out = ModelToJson(*model);
    // Same content as the original file (numbers compared by value)...
    EXPECT_EQ(nlohmann::json::parse(out), nlohmann::json::parse(text));
    // ...and a fixed point of parse + write.
    auto again = ParseModelJson(out, "out.json");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(MessageDifferencer::Equals(*again, *model));
    EXPECT_EQ(ModelToJson(*again), out);
  }
}

TEST(ModelJson, ResNet50HasTheRecordedTensors) {
  auto model = ParseModelJson(Example("models/resnet50.json"), "resnet50.json");
  ASSERT_TRUE(model.ok());
  ASSERT_EQ(model->tensors_size(), 161);
  EXPECT_EQ(model->tensors(0).name(), "fc.bias");
  EXPECT_EQ(model->tensors(0).numel(), 1000);
  EXPECT_EQ(model->tensors(0).dtype(), pb::FLOAT32);
  EXPECT_EQ(model->tensors(1).backward_us(), 72.0);
  EXPECT_FALSE(model->has_forward_us());
}

TEST(ModelJson, WritesKeysInDesignOrderAndPointsInline) {
  pb::Model m;
  m.set_name("tiny");
  m.set_source("hand-made");
  m.set_forward_us(1.5);
  m.set_update_us(0);
  auto* t = m.add_tensors();
  t->set_name("w");
  t->set_numel(3);
  t->set_dtype(pb::FLOAT16);
  t->set_backward_us(0.1);
  EXPECT_EQ(ModelToJson(m), R"({
  "format": "cupcake.model.v1",
  "name": "tiny",
  "source": "hand-made",
  "forward_us": 1.5,
  "update_us": 0.0,
  "tensors": [
    {
      "name": "w",
      "numel": 3,
      "dtype": "float16",
      "backward_us": 0.1
    }
  ]
}
)");
}

// A tensor's density (naturally sparse gradients) is written after backward_us when recorded,
// read back, and checked: in (0, 1].
TEST(ModelJson, DensityRoundTripsAndIsChecked) {
  pb::Model m;
  m.set_name("embed");
  auto* t = m.add_tensors();
  t->set_name("table");
  t->set_numel(1000);
  t->set_dtype(pb::FLOAT32);
  t->set_backward_us(2);
  t->set_density(0.0125);
  const std::string text = ModelToJson(m);
  EXPECT_THAT(text, ::testing::HasSubstr("\"backward_us\": 2.0,\n      \"density\": 0.0125\n"));
  auto back = ParseModelJson(text, "embed.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(MessageDifferencer::Equals(*back, m));
  for (const char* bad : {"0", "1.5", "-0.25"}) {
    std::string edited = text;
    edited.replace(edited.find("0.0125"), 6, bad);
    auto refused = ParseModelJson(edited, "embed.json");
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_THAT(refused.status().message(),
                ::testing::HasSubstr("embed.json: tensors[0].density: out of range; got " + std::string(bad) +
                                     ", expected 0 < density <= 1 (the share of non-zero elements)"));
  }
}

// A tensor's shape is written last when recorded, read back, and checked: integers, each >= 1,
// their product the numel. A model without shapes reads as before.
TEST(ModelJson, ShapeRoundTripsAndIsChecked) {
  pb::Model m;
  m.set_name("conv");
  auto* t = m.add_tensors();
  t->set_name("weight");
  t->set_numel(24);
  t->set_dtype(pb::FLOAT32);
  t->set_backward_us(2);
  for (int64_t d : {4, 3, 2}) t->add_shape(d);
  const std::string text = ModelToJson(m);
  EXPECT_THAT(text, ::testing::HasSubstr("\"backward_us\": 2.0,\n      \"shape\": [4, 3, 2]\n"));
  auto back = ParseModelJson(text, "conv.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(MessageDifferencer::Equals(*back, m));
  const auto error = [&](const std::string& shape) {
    std::string edited = text;
    const size_t at = edited.find("[", edited.find("\"shape\""));
    edited.replace(at, edited.find("]", at) + 1 - at, shape);
    auto refused = ParseModelJson(edited, "conv.json");
    EXPECT_FALSE(refused.ok()) << shape;
    return refused.ok() ? std::string() : refused.status().message();
  };
  EXPECT_THAT(error("[4, 3, 3]"), ::testing::HasSubstr("conv.json: tensors[0].shape: wrong size; got [4, 3, 3] (36 "
                                                     "elements), expected numel 24"));
  EXPECT_THAT(error("[24, 0]"), ::testing::HasSubstr("conv.json: tensors[0].shape: out of range; got dimension 1 = "
                                                   "0, expected >= 1"));
  EXPECT_THAT(error("[24, 1.5]"), ::testing::HasSubstr("conv.json: tensors[0].shape[1]: wrong type; got a number "
                                                     "1.5, expected an integer"));
  EXPECT_THAT(error("\"24\""), ::testing::HasSubstr("conv.json: tensors[0].shape: wrong type; got a string "
                                                  "\"24\", expected an array of integers (the tensor's dimensions)"));
}

TEST(ModelJson, DoublesRoundTripBitForBit) {
  // Extremes within the bounds (limits.h: times <= 1e12 us, 2^40 elements in all).
  const double values[] = {0.1, 1.0 / 3.0, 5e-324, DBL_MIN, 1e12, 123456.78901234567, 2.5e-7, 999999999999.99988};
  pb::Model m;
  m.set_name("numbers");
  int i = 0;
  for (double v : values) {
    auto* t = m.add_tensors();
    t->set_name("t" + std::to_string(i++));
    t->set_numel(int64_t{1} << 37);
    t->set_dtype(pb::FLOAT32);
    t->set_backward_us(v);
  }
  auto back = ParseModelJson(ModelToJson(m), "x");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (int k = 0; k < m.tensors_size(); ++k) {
    EXPECT_EQ(back->tensors(k).backward_us(), m.tensors(k).backward_us());
    EXPECT_EQ(back->tensors(k).numel(), int64_t{1} << 37);
  }
}

TEST(ProfileJson, ExampleRoundTripsWithIdenticalContent) {
  std::string text = Example("profiles/v100-8x8-pcie-25g.json");
  auto profile = ParseProfileJson(text, "v100.json");
  ASSERT_TRUE(profile.ok()) << profile.status().ToString();
  EXPECT_EQ(profile->cluster().name(), "v100-8x8-pcie-25g");
  EXPECT_EQ(profile->cluster().nodes(), 8);
  EXPECT_EQ(profile->curves_size(), 53);
  std::string out = ProfileToJson(*profile);
  EXPECT_EQ(nlohmann::json::parse(out), nlohmann::json::parse(text));
  auto again = ParseProfileJson(out, "out.json");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(MessageDifferencer::Equals(*again, *profile));
  EXPECT_EQ(ProfileToJson(*again), out);
}

TEST(ProfileJson, KeepsEveryOptionalFieldAndEmbeddedModels) {
  const std::string text = R"({
  "format": "cupcake.profile.v1",
  "cluster": {
    "name": "lab",
    "nodes": 2,
    "devices_per_node": 4,
    "device": "H100",
    "interconnect": "NVLink",
    "network": "100G",
    "source": "measured",
    "meta": {
      "date": "2025-01-01",
      "nccl": "2.28.9"
    }
  },
  "curves": [
    {
      "kind": "copy",
      "op": "d2h",
      "device": "gpu",
      "method": "event",
      "warmup": 5,
      "iters": 20,
      "wrong": 0,
      "points": [
        [4, 10.0],
        [1024, 12.25]
      ]
    },
    {
      "kind": "decode",
      "compressor": "qsgd",
      "device": "cpu",
      "points": [
        [1, 3.0]
      ]
    }
  ],
  "models": [
    {
      "format": "cupcake.model.v1",
      "name": "m",
      "forward_us": 10.0,
      "tensors": [
        {
          "name": "a",
          "numel": 1,
          "dtype": "bfloat16",
          "backward_us": 0.0
        }
      ]
    }
  ]
}
)";
  auto p = ParseProfileJson(text, "p.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->cluster().meta().at("nccl"), "2.28.9");
  EXPECT_EQ(p->curves(0).copy_op(), pb::D2H);
  EXPECT_EQ(p->curves(0).iters(), 20);
  EXPECT_TRUE(p->curves(0).has_wrong());
  EXPECT_FALSE(p->curves(1).has_method());
  EXPECT_EQ(p->models(0).tensors(0).dtype(), pb::BFLOAT16);
  // Written back byte for byte: this text is in the writer's own layout.
  EXPECT_EQ(ProfileToJson(*p), text);
}

TEST(ProfileJson, EmbeddedModelMayOmitFormat) {
  auto p = ParseProfileJson(R"({"format": "cupcake.profile.v1",
      "cluster": {"name": "c", "nodes": 1, "devices_per_node": 1}, "curves": [],
      "models": [{"name": "m", "tensors": [{"name": "a", "numel": 1, "dtype": "float32", "backward_us": 0}]}]})",
                            "p.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->models(0).name(), "m");
}

TEST(DetectJsonFormat, TellsModelsFromProfiles) {
  EXPECT_EQ(*DetectJsonFormat(Example("models/ncf.json"), "ncf.json"), JsonFormat::kModel);
  EXPECT_EQ(*DetectJsonFormat(Example("profiles/v100-8x8-pcie-25g.json"), "p.json"), JsonFormat::kProfile);
  EXPECT_EQ(DetectJsonFormat(R"({"name": "x"})", "x.json").status().message(),
            R"(x.json: format: missing; expected "cupcake.model.v1" or "cupcake.profile.v1")");
  EXPECT_EQ(
      DetectJsonFormat(R"({"format": "cupcake.plan.v1"})", "x.json").status().message(),
      R"(x.json: format: unknown format; got "cupcake.plan.v1", expected "cupcake.model.v1" or "cupcake.profile.v1")");
  EXPECT_EQ(DetectJsonFormat("[1]", "x.json").status().message(),
            "x.json: (top level): wrong type; got an array, expected a JSON object");
}

// ---------------------------------------------------------------- bad input: text pinned

TEST(ModelJsonErrors, NotJsonSaysLineAndColumn) {
  EXPECT_EQ(ModelError("{\n  \"format\": \"cupcake.model.v1\",\n  \"name\": nope\n}"),
            "model.json:3:12: not valid JSON: syntax error while parsing value - invalid literal; last read: "
            "'\"name\": no'");
}

TEST(ModelJsonErrors, TruncatedFileIsReportedAsUnexpectedEnd) {
  std::string text = Example("models/vgg16.json");
  std::string cut = text.substr(0, text.size() / 2);
  auto m = ParseModelJson(cut, "vgg16.json");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(m.status().message().starts_with("vgg16.json:")) << m.status().message();
  EXPECT_NE(m.status().message().find(": not valid JSON: syntax error while parsing"), std::string::npos)
      << m.status().message();
  EXPECT_NE(m.status().message().find("unexpected end of input"), std::string::npos) << m.status().message();
}

TEST(ModelJsonErrors, EmptyFile) {
  EXPECT_EQ(ModelError(""),
            "model.json:1:1: not valid JSON: syntax error while parsing value - unexpected end of input; expected "
            "'[', '{', or a literal");
}

TEST(ModelJsonErrors, MissingOrWrongFormat) {
  EXPECT_EQ(ModelError(R"({"name": "m", "tensors": []})"),
            R"(model.json: format: missing; expected "cupcake.model.v1")");
  EXPECT_EQ(
      ModelError(R"({"format": "cupcake.profile.v1", "cluster": {}})"),
      R"(model.json: format: wrong format; got "cupcake.profile.v1" (this is a profile), expected "cupcake.model.v1")");
  EXPECT_EQ(ModelError(R"({"format": "cupcake.model.v2"})"),
            R"(model.json: format: wrong format; got "cupcake.model.v2", expected "cupcake.model.v1")");
  EXPECT_EQ(ModelError(R"({"format": 1})"),
            R"(model.json: format: wrong type; got an integer 1, expected "cupcake.model.v1")");
  EXPECT_EQ(ModelError("[]"),
            "model.json: (top level): wrong type; got an array [], expected a JSON object (a cupcake.model.v1 model)");
}

TEST(ModelJsonErrors, NonPositiveNumel) {
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 0, "dtype": "float32", "backward_us": 0})")),
            "model.json: tensors[0].numel: must be positive; got 0, expected > 0");
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": -5, "dtype": "float32", "backward_us": 0})")),
            "model.json: tensors[0].numel: must be positive; got -5, expected > 0");
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 2.5, "dtype": "float32", "backward_us": 0})")),
            "model.json: tensors[0].numel: wrong type; got a number 2.5, expected an integer");
}

TEST(ModelJsonErrors, MissingAndDuplicateNames) {
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"numel": 1, "dtype": "float32", "backward_us": 0})")),
            "model.json: tensors[0].name: missing; expected a non-empty string");
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "", "numel": 1, "dtype": "float32", "backward_us": 0})")),
            "model.json: tensors[0].name: missing; expected a non-empty string");
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1, "dtype": "float32", "backward_us": 0},
                                          {"name": "b", "numel": 1, "dtype": "float32", "backward_us": 0},
                                          {"name": "a", "numel": 1, "dtype": "float32", "backward_us": 0})")),
            R"(model.json: tensors[2].name: duplicate name; got "a", expected unique names (first at tensors[0]))");
  EXPECT_EQ(
      ModelError(
          R"({"format": "cupcake.model.v1", "tensors": [{"name": "a", "numel": 1, "dtype": "float32", "backward_us": 0}]})"),
      "model.json: name: missing; expected a non-empty string");
}

TEST(ModelJsonErrors, UnknownDtypeSuggestsTheClosest) {
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1, "dtype": "flaot32", "backward_us": 0})")),
            "model.json: tensors[0].dtype: unknown dtype; got \"flaot32\" (did you mean 'float32'?), expected one of "
            "float32, float16, bfloat16");
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1, "dtype": "int8", "backward_us": 0})")),
            "model.json: tensors[0].dtype: unknown dtype; got \"int8\", expected one of float32, float16, bfloat16");
}

TEST(ModelJsonErrors, NegativeOrNonFiniteBackward) {
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1, "dtype": "float32", "backward_us": -0.5})")),
            "model.json: tensors[0].backward_us: must not be negative; got -0.5, expected >= 0");
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1, "dtype": "float32", "backward_us": 1e999})")),
            "model.json: not valid JSON: number overflow parsing '1e999'");
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1, "dtype": "float32", "backward_us": "3"})")),
            "model.json: tensors[0].backward_us: wrong type; got a string \"3\", expected a number");
  EXPECT_EQ(ModelError(R"({"format": "cupcake.model.v1", "name": "m", "forward_us": -1,
                          "tensors": [{"name": "a", "numel": 1, "dtype": "float32", "backward_us": 0}]})"),
            "model.json: forward_us: must not be negative; got -1, expected >= 0");
}

TEST(ModelJsonErrors, EmptyOrMissingTensorList) {
  EXPECT_EQ(ModelError(R"({"format": "cupcake.model.v1", "name": "m", "tensors": []})"),
            "model.json: tensors: empty tensor list; got 0 tensors, expected at least 1");
  EXPECT_EQ(ModelError(R"({"format": "cupcake.model.v1", "name": "m"})"),
            "model.json: tensors: missing; expected an array of tensors");
  EXPECT_EQ(ModelError(R"({"format": "cupcake.model.v1", "name": "m", "tensors": {}})"),
            "model.json: tensors: wrong type; got an object {}, expected an array of tensors");
}

TEST(ModelJsonErrors, UnknownKeysAreNamedWithDidYouMean) {
  EXPECT_EQ(
      ModelError(ModelWithTensor(R"({"name": "a", "nmel": 1, "numel": 1, "dtype": "float32", "backward_us": 0})")),
      "model.json: tensors[0].nmel: unknown key; got \"nmel\" (did you mean 'numel'?), expected one of name, "
      "numel, dtype, backward_us, density, shape");
  EXPECT_EQ(ModelError(R"({"format": "cupcake.model.v1", "name": "m", "froward_us": 3,
                          "tensors": [{"name": "a", "numel": 1, "dtype": "float32", "backward_us": 0}]})"),
            "model.json: froward_us: unknown key; got \"froward_us\" (did you mean 'forward_us'?), expected one of "
            "format, name, source, forward_us, update_us, tensors");
}

TEST(ModelJsonErrors, ReportsSeveralProblemsOnePerLine) {
  EXPECT_EQ(ModelError(R"({"format": "cupcake.model.v1", "name": "m", "tensors": [
      {"name": "a", "numel": 0, "dtype": "float32", "backward_us": 0},
      {"name": "b", "numel": 4, "dtype": "float64", "backward_us": -1},
      7]})"),
            "model.json: tensors[1].dtype: unknown dtype; got \"float64\" (did you mean 'float32'?), expected one of "
            "float32, float16, bfloat16\n"
            "model.json: tensors[2]: wrong type; got an integer 7, expected an object with name, numel, dtype, "
            "backward_us\n"
            "model.json: tensors[0].numel: must be positive; got 0, expected > 0\n"
            "model.json: tensors[1].backward_us: must not be negative; got -1, expected >= 0");
}

// Regression: 100,000 levels of nesting used to overflow the stack.
TEST(ModelJsonErrors, NestingTooDeepIsRefusedWithItsPath) {
  auto zeros = [](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += "[0]";
    return s;
  };
  const std::string problem = ": nested too deep; got more than 64 levels of objects and arrays, expected at most 64";
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(ModelError(deep), "model.json: " + zeros(64) + problem);  // 64 arrays open, the 65th refused
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1, "dtype": "float32", "backward_us": )" +
                                       std::string(70, '[') + std::string(70, ']') + "}")),
            "model.json: tensors[0].backward_us" + zeros(61) + problem);  // 3 + 61 levels open
}

// Regression: JSON's "the last one wins" let a second "numel" replace the first silently.
TEST(ModelJsonErrors, DuplicateKeysAreRefusedWithTheirPath) {
  EXPECT_EQ(
      ModelError(ModelWithTensor(
          R"({"name": "a", "numel": 4, "dtype": "float32", "backward_us": 1}, {"name": "b", "numel": 1, "numel": 2})")),
      "model.json: tensors[1].numel: duplicate key; got \"numel\" twice in one object, expected each key once");
  EXPECT_EQ(ModelError(R"({"format": "cupcake.model.v1", "name": "m", "name": "n", "tensors": []})"),
            "model.json: name: duplicate key; got \"name\" twice in one object, expected each key once");
}

// Regression: the parser took a NUL byte for the end of the input, so whatever followed one was
// ignored (a model with garbage after a NUL loaded).
TEST(ModelJsonErrors, ANulByteIsRefusedWithItsPlace) {
  const std::string model = R"({"format": "cupcake.model.v1", "name": "m", "tensors": []})";
  EXPECT_EQ(ModelError(model + std::string("\0garbage", 8)), "model.json:1:59: not valid JSON: a NUL byte; expected text");
  EXPECT_EQ(ModelError(std::string("{\n  \"format\"\0: 1}", 18)),
            "model.json:2:11: not valid JSON: a NUL byte; expected text");
  const std::string trailing = ModelError(model + " trailing");  // text after the document, as before
  EXPECT_TRUE(trailing.starts_with("model.json:1:") && trailing.ends_with("expected end of input")) << trailing;
}

// Regression: times near 1e308 made the planner's sums infinite (a failed check), and numel
// past 2^40 made byte counts wrap.
TEST(ModelJsonErrors, ValuesBeyondTheBoundsAreRefused) {
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1, "dtype": "float32", "backward_us": 1e308})")),
            "model.json: tensors[0].backward_us: out of range; got 1e+308, expected at most 1e+12 (microseconds)");
  EXPECT_EQ(
      ModelError(ModelWithTensor(R"({"name": "a", "numel": 1099511627777, "dtype": "float32", "backward_us": 1})")),
      "model.json: tensors[0].numel: out of range; got 1099511627777, expected 1 <= x <= 1099511627776");
  EXPECT_EQ(ModelError(ModelWithTensor(R"({"name": "a", "numel": 1099511627776, "dtype": "float32", "backward_us": 1},
                                          {"name": "b", "numel": 1, "dtype": "float32", "backward_us": 1})")),
            "model.json: tensors: too many elements in all; got 1099511627777, expected at most 1099511627776");
  EXPECT_EQ(ProfileError(R"({"format": "cupcake.profile.v1", "cluster": {"name": "c", "nodes": 2147483647,
                              "devices_per_node": 2147483647}, "curves": []})"),
            "profile.json: cluster: world too large; got 2147483647 nodes x 2147483647 devices = 4611686014132420609 "
            "ranks, expected at most 1048576");
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[1125899906842625, 1e13]]})")),
            "profile.json: curves[0].points[0].size: out of range; got 1125899906842625, expected 1 <= x <= "
            "1125899906842624\nprofile.json: curves[0].points[0].us: out of range; got 1e+13, expected at most 1e+12 "
            "(microseconds)");
}

// Comm curves carry the element type their reduction sums; float32 is the default and is
// written by leaving it out, so profiles from before the field read and write back unchanged.
TEST(ProfileJson, CommCurvesCarryTheReductionsElementType) {
  auto p =
      ParseProfileJson(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "dtype": "float16",
                                                  "points": [[4, 1]]},
                                                 {"kind": "comm", "op": "allreduce", "scope": "global", "dtype": "float32",
                                                  "points": [[4, 2]]})"),
                       "profile.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(CurveKey(p->curves(0)), "comm allreduce global float16");
  EXPECT_EQ(CurveKey(p->curves(1)), "comm allreduce global");
  const std::string out = ProfileToJson(*p);
  EXPECT_NE(out.find(R"("dtype": "float16")"), std::string::npos) << out;
  EXPECT_EQ(out.find(R"("dtype": "float32")"), std::string::npos) << out;
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "comm", "op": "allgather", "scope": "global", "dtype": "float16", "points": [[4, 1]]})")),
            "profile.json: curves[0].dtype: not allowed for op allgather; got \"float16\", expected none (it moves "
            "bytes, it sums nothing)");
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "comm", "op": "allreduce", "scope": "global", "dtype": "half", "points": [[4, 1]]})")),
            "profile.json: curves[0].dtype: unknown dtype; got \"half\", expected one of float32, float16, bfloat16");
}

// Kernel curves of ratio compressors may record the ratio they were measured at (older profiles
// do not), Zen's must; it is part of the curve's key, so one profile holds several.
TEST(ProfileJson, KernelCurvesCarryTheirRatio) {
  auto p = ParseProfileJson(ProfileWithCurve(R"({"kind": "decode", "compressor": "topk", "device": "cpu",
                                                  "points": [[4, 1]]},
                                                 {"kind": "decode", "compressor": "topk", "device": "cpu", "ratio": 0.001,
                                                  "points": [[4, 2]]},
                                                 {"kind": "encode", "compressor": "zen", "device": "cpu", "ratio": 0.25,
                                                  "points": [[4, 3]]})"),
                            "profile.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(CurveKey(p->curves(0)), "decode topk cpu");
  EXPECT_EQ(CurveKey(p->curves(1)), "decode topk cpu ratio 0.001");
  EXPECT_EQ(CurveKey(p->curves(2)), "encode zen cpu ratio 0.25");
  const std::string out = ProfileToJson(*p);
  EXPECT_NE(out.find(R"("ratio": 0.001)"), std::string::npos) << out;
  auto again = ParseProfileJson(out, "again.json");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ProfileToJson(*again), out);

  EXPECT_EQ(
      ProfileError(ProfileWithCurve(
          R"({"kind": "decode", "compressor": "efsignsgd", "device": "cpu", "ratio": 0.01, "points": [[4, 1]]})")),
      "profile.json: curves[0].ratio: not allowed for compressor efsignsgd; got 0.01, expected none (it selects "
      "no ratio of the elements)");
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "encode", "compressor": "dgc", "device": "cpu", "ratio": 1.5, "points": [[4, 1]]})")),
            "profile.json: curves[0].ratio: out of range; got 1.5, expected 0 < ratio <= 1");
  EXPECT_EQ(
      ProfileError(ProfileWithCurve(R"({"kind": "decode", "compressor": "zen", "device": "cpu", "points": [[4, 1]]})")),
      "profile.json: curves[0].ratio: missing; expected the ratio Zen's curves were measured at, 0 < ratio <= 1");
  EXPECT_EQ(ProfileError(ProfileWithCurve(R"({"kind": "decode", "compressor": "topk", "device": "cpu", "ratio": 0.01,
                                              "points": [[4, 1]]},
                                             {"kind": "decode", "compressor": "topk", "device": "cpu", "ratio": 0.01,
                                              "points": [[4, 2]]})")),
            "profile.json: curves[1]: duplicate curve; got \"decode topk cpu ratio 0.01\", expected one curve per key "
            "(first at curves[0])");
}

// Comm curves measured beside busy cores (cupcake-profile comm --busy) are their own curves;
// "busy" is a boolean, written only when true, and belongs to comm curves only.
TEST(ProfileJson, BusyCommCurvesAreTheirOwnCurves) {
  auto p =
      ParseProfileJson(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, 1]]},
                                                 {"kind": "comm", "op": "allreduce", "scope": "global", "busy": true,
                                                  "points": [[4, 2]]},
                                                 {"kind": "comm", "op": "allgather", "scope": "global", "busy": false,
                                                  "points": [[4, 3]]})"),
                       "profile.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(CurveKey(p->curves(0)), "comm allreduce global");
  EXPECT_EQ(CurveKey(p->curves(1)), "comm allreduce global busy");
  EXPECT_EQ(CurveKey(p->curves(2)), "comm allgather global");
  const std::string out = ProfileToJson(*p);
  EXPECT_NE(out.find(R"("busy": true)"), std::string::npos) << out;
  EXPECT_EQ(out.find(R"("busy": false)"), std::string::npos) << out;
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "comm", "op": "allreduce", "scope": "global", "busy": 1, "points": [[4, 1]]})")),
            "profile.json: curves[0].busy: wrong type; got an integer 1, expected true or false");
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "copy", "op": "pack", "device": "cpu", "busy": true, "points": [[4, 1]]})")),
            "profile.json: curves[0].busy: unknown key for kind copy; got \"busy\", expected one of kind, op, device, "
            "points, method, warmup, iters, wrong");
}

// Comm curves measured on calls back to back (cupcake-profile comm --chained) are their own
// curves as busy ones are: a boolean, written only when true, on comm curves only.
TEST(ProfileJson, ChainedCommCurvesAreTheirOwnCurves) {
  auto p =
      ParseProfileJson(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, 1]]},
                          {"kind": "comm", "op": "allreduce", "scope": "global", "chained": true, "points": [[4, 2]]},
                          {"kind": "comm", "op": "allreduce", "scope": "global", "dtype": "float16", "chained": true,
                           "points": [[4, 3]]})"),
                       "profile.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(CurveKey(p->curves(1)), "comm allreduce global chained");
  EXPECT_EQ(CurveKey(p->curves(2)), "comm allreduce global float16 chained");
  const std::string out = ProfileToJson(*p);
  EXPECT_NE(out.find(R"("chained": true)"), std::string::npos) << out;
  auto back = ParseProfileJson(out, "profile.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->curves(1).chained());
  EXPECT_FALSE(back->curves(0).chained());
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "comm", "op": "allreduce", "scope": "global", "chained": "yes", "points": [[4, 1]]})")),
            "profile.json: curves[0].chained: wrong type; got a string \"yes\", expected true or false");
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "encode", "compressor": "dgc", "device": "gpu", "chained": true, "points": [[4, 1]]})")),
            "profile.json: curves[0].chained: unknown key for kind encode; got \"chained\", expected one of kind, "
            "compressor, device, ratio, points, method, warmup, iters, wrong");
}

TEST(ProfileJsonErrors, CurveWithNoPoints) {
  EXPECT_EQ(ProfileError(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": []})")),
            "profile.json: curves[0].points: no points; got 0 points, expected at least 1");
}

TEST(ProfileJsonErrors, UnsortedOrDuplicateSizes) {
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, 1], [256, 2], [64, 3]]})")),
            "profile.json: curves[0].points[2].size: sizes not sorted; got 64 after 256, expected increasing sizes");
  EXPECT_EQ(ProfileError(ProfileWithCurve(
                R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, 1], [4, 2]]})")),
            "profile.json: curves[0].points[1].size: duplicate size; got 4 again, expected distinct sizes");
  EXPECT_EQ(
      ProfileError(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[0, 1]]})")),
      "profile.json: curves[0].points[0].size: must be positive; got 0, expected > 0");
  EXPECT_EQ(
      ProfileError(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4.5, 1]]})")),
      "profile.json: curves[0].points[0].size: wrong type; got a number 4.5, expected an integer");
  EXPECT_EQ(ProfileError(
                ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, 1, 2]]})")),
            "profile.json: curves[0].points[0]: wrong type; got an array [4,1,2], expected a [size, us] pair");
}

TEST(ProfileJsonErrors, NegativeOrNonFiniteTime) {
  EXPECT_EQ(ProfileError(
                ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, -2.5]]})")),
            "profile.json: curves[0].points[0].us: must not be negative; got -2.5, expected >= 0");
  EXPECT_EQ(ProfileError(
                ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "points": [[4, -1e999]]})")),
            "profile.json: not valid JSON: number overflow parsing '-1e999'");
}

TEST(ProfileJsonErrors, UnknownKindOpCompressorDevice) {
  EXPECT_EQ(
      ProfileError(ProfileWithCurve(R"({"kind": "comms", "op": "allreduce", "scope": "global", "points": [[4, 1]]})")),
      "profile.json: curves[0].kind: unknown kind; got \"comms\" (did you mean 'comm'?), expected one of comm, "
      "encode, decode, copy");
  EXPECT_EQ(
      ProfileError(ProfileWithCurve(R"({"kind": "comm", "op": "allgahter", "scope": "global", "points": [[4, 1]]})")),
      "profile.json: curves[0].op: unknown op; got \"allgahter\" (did you mean 'allgather'?), expected one of "
      "allreduce, allgather, reduce_scatter, alltoall, broadcast");
  EXPECT_EQ(
      ProfileError(ProfileWithCurve(R"({"kind": "copy", "op": "allreduce", "device": "gpu", "points": [[4, 1]]})")),
      "profile.json: curves[0].op: unknown op; got \"allreduce\", expected one of pack, unpack, d2h, h2d");
  EXPECT_EQ(ProfileError(
                ProfileWithCurve(R"({"kind": "encode", "compressor": "topK", "device": "gpu", "points": [[4, 1]]})")),
            "profile.json: curves[0].compressor: unknown compressor; got \"topK\" (did you mean 'topk'?), expected one "
            "of fp32, fp16, topk, randk, dgc, qsgd, signsgd, efsignsgd, signum, terngrad, onebit, zen, nonzero or powersgd");
  EXPECT_EQ(
      ProfileError(ProfileWithCurve(R"({"kind": "decode", "compressor": "dgc", "device": "tpu", "points": [[4, 1]]})")),
      "profile.json: curves[0].device: unknown device; got \"tpu\" (did you mean 'gpu'?), expected one of gpu, cpu");
  EXPECT_EQ(ProfileError(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "points": [[4, 1]]})")),
            "profile.json: curves[0].scope: missing; expected one of global, intra, inter");
}

TEST(ProfileJsonErrors, UnknownOrMisplacedKeys) {
  EXPECT_EQ(ProfileError(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scop": "global", "scope": "global",
                                              "points": [[4, 1]]})")),
            "profile.json: curves[0].scop: unknown key for kind comm; got \"scop\" (did you mean 'scope'?), expected "
            "one of kind, op, scope, dtype, busy, chained, points, method, warmup, iters, wrong");
  EXPECT_EQ(ProfileError(ProfileWithCurve(R"({"kind": "encode", "compressor": "dgc", "device": "gpu", "scope": "global",
                                              "points": [[4, 1]]})")),
            "profile.json: curves[0].scope: unknown key for kind encode; got \"scope\", expected one of kind, "
            "compressor, device, ratio, points, method, warmup, iters, wrong");
  EXPECT_EQ(ProfileError(R"({"format": "cupcake.profile.v1", "cluster": {"name": "c", "nodes": 2, "devices_per_node": 4,
                                "netwrok": "x"}, "curves": []})"),
            "profile.json: cluster.netwrok: unknown key; got \"netwrok\" (did you mean 'network'?), expected one of "
            "name, nodes, devices_per_node, device, interconnect, network, source, meta");
  EXPECT_EQ(
      ProfileError(R"({"format": "cupcake.profile.v1", "cluster": {"name": "c", "nodes": 2, "devices_per_node": 4},
                             "curve": []})"),
      "profile.json: curve: unknown key; got \"curve\" (did you mean 'curves'?), expected one of format, cluster, "
      "curves, models\n"
      "profile.json: curves: missing; expected an array of curves");
}

TEST(ProfileJsonErrors, ClusterAndDuplicateCurves) {
  EXPECT_EQ(ProfileError(R"({"format": "cupcake.profile.v1", "curves": []})"),
            "profile.json: cluster: missing; expected an object with name, nodes, devices_per_node");
  EXPECT_EQ(
      ProfileError(R"({"format": "cupcake.profile.v1", "cluster": {"name": "c", "nodes": 0, "devices_per_node": 4},
                             "curves": []})"),
      "profile.json: cluster.nodes: must be positive; got 0, expected >= 1");
  EXPECT_EQ(ProfileError(ProfileWithCurve(R"({"kind": "copy", "op": "pack", "device": "gpu", "points": [[4, 1]]},
                                             {"kind": "copy", "op": "pack", "device": "gpu", "points": [[8, 1]]})")),
            "profile.json: curves[1]: duplicate curve; got \"copy pack gpu\", expected one curve per key (first at "
            "curves[0])");
  EXPECT_EQ(ProfileError(ProfileWithCurve(R"({"kind": "comm", "op": "allreduce", "scope": "global", "method": "evnt",
                                              "points": [[4, 1]]})")),
            "profile.json: curves[0].method: unknown method; got \"evnt\" (did you mean 'event'?), expected one of "
            "event, kernel, wall");
}

TEST(ProfileJsonErrors, EmbeddedModelProblemsCarryTheirPath) {
  EXPECT_EQ(
      ProfileError(R"({"format": "cupcake.profile.v1", "cluster": {"name": "c", "nodes": 1, "devices_per_node": 1},
      "curves": [], "models": [{"name": "m", "tensors": [{"name": "a", "numel": 0, "dtype": "float32", "backward_us": 0}]},
                               {"format": "cupcake.model.v1", "name": "m", "tensors": [{"name": "a", "numel": 1, "dtype": "float32", "backward_us": 0}]}]})"),
      "profile.json: models[0].tensors[0].numel: must be positive; got 0, expected > 0\n"
      "profile.json: models[1].name: duplicate model; got \"m\", expected unique names (first at models[0])");
  EXPECT_EQ(
      ProfileError(R"({"format": "cupcake.model.v1", "name": "m", "tensors": []})"),
      R"(profile.json: format: wrong format; got "cupcake.model.v1" (this is a model), expected "cupcake.profile.v1")");
}

TEST(Validate, ChecksProtosMadeInCode) {
  pb::Model m;
  m.set_name("m");
  EXPECT_EQ(ValidateModel(m, "model 'm'").message(),
            "model 'm': tensors: empty tensor list; got 0 tensors, expected at least 1");
  pb::Curve c;
  c.set_kind(pb::ENCODE);
  c.set_compressor("topk");
  EXPECT_EQ(ValidateCurveKey(c, "key").message(), "key: device: missing; expected one of gpu, cpu");
  c.set_device(pb::GPU);
  c.set_scope(pb::GLOBAL);
  c.add_points()->set_size(4);
  EXPECT_EQ(ValidateCurveKey(c, "key").message(),
            "key: scope: not allowed for kind encode; got \"global\", expected no value");
  // JSON cannot carry a non-finite number; a proto made in code can.
  auto* t = m.add_tensors();
  t->set_name("a");
  t->set_numel(1);
  t->set_dtype(pb::FLOAT32);
  t->set_backward_us(std::numeric_limits<double>::infinity());
  EXPECT_EQ(ValidateModel(m, "model 'm'").message(),
            "model 'm': tensors[0].backward_us: must be finite; got inf, expected a finite time >= 0");
  t->set_backward_us(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(ValidateModel(m, "model 'm'").message(),
            "model 'm': tensors[0].backward_us: must be finite; got nan, expected a finite time >= 0");
}

}  // namespace
}  // namespace cupcake::profile

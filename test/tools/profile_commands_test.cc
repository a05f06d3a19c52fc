#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "cupcake/profile/json_io.h"
#include "cupcake/profile/store.h"
#include "test_files.h"

namespace cupcake::profile_cli {
namespace {

using testing::ExamplePath;
using testing::ReadExample;

class ProfileCommandsTest : public ::testing::Test {
 protected:
  Status Import(const std::string& file, bool replace = false) {
    std::ostringstream out;
    return RunImport({db_, file, replace}, out);
  }
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_.File(name);
    std::ofstream(path) << text;
    return path;
  }
  std::string DbBytes() {
    auto b = ReadFile(db_);
    return b.ok() ? *b : "";
  }
  std::string Export(const std::string& model = "") {
    std::ostringstream out;
    Status s = RunExport({db_, model, "-"}, out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out.str();
  }

  testing::TempDir dir_;
  std::string db_ = dir_.File("profile.db");
  std::string profile_ = ExamplePath("profiles/v100-8x8-pcie-25g.json");
};

TEST_F(ProfileCommandsTest, ImportExportRoundTripsTheSampleProfile) {
  std::ostringstream out;
  ASSERT_TRUE(RunImport({db_, profile_, false}, out).ok());
  EXPECT_EQ(out.str(),
            "imported profile 'v100-8x8-pcie-25g' (53 curves, 0 models) from " + profile_ + " into " + db_ + "\n");
  // The export is the writer's canonical form of the very same content.
  auto original = profile::ParseProfileJson(ReadExample("profiles/v100-8x8-pcie-25g.json"), "x");
  ASSERT_TRUE(original.ok());
  EXPECT_EQ(Export(), profile::ProfileToJson(*original));

  // -o FILE writes the same bytes to a file, atomically (no temporary left behind).
  const std::string file = dir_.File("out.json");
  std::ostringstream none;
  ASSERT_TRUE(RunExport({db_, "", file}, none).ok());
  EXPECT_EQ(none.str(), "");
  EXPECT_EQ(*ReadFile(file), Export());
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir_.path())) ++entries;
  EXPECT_EQ(entries, 2) << "profile.db and out.json only (WAL files are removed on close)";
}

TEST_F(ProfileCommandsTest, ImportsModelsAndExportsOne) {
  ASSERT_TRUE(Import(profile_).ok());
  std::ostringstream out;
  ASSERT_TRUE(RunImport({db_, ExamplePath("models/resnet50.json"), false}, out).ok());
  EXPECT_EQ(out.str(), "imported model 'resnet50' (161 tensors) from " + ExamplePath("models/resnet50.json") +
                           " into " + db_ + "\n");
  auto model = profile::ParseModelJson(ReadExample("models/resnet50.json"), "x");
  EXPECT_EQ(Export("resnet50"), profile::ModelToJson(*model));
  std::ostringstream ignored;
  EXPECT_EQ(RunExport({db_, "resnet", "-"}, ignored).message(),
            db_ + ": models: no such model; got \"resnet\" (did you mean 'resnet50'?), expected one of resnet50");
}

TEST_F(ProfileCommandsTest, ConflictsNeedReplaceAndLeaveTheDbUnchanged) {
  ASSERT_TRUE(Import(profile_).ok());
  ASSERT_TRUE(Import(ExamplePath("models/ncf.json")).ok());
  std::string before = Export();
  Status s = Import(ExamplePath("models/ncf.json"));
  EXPECT_EQ(s.message(), db_ +
                             ": models: already present; got \"ncf\", expected a model the DB does not hold (replace "
                             "not requested)\n" +
                             db_ + ": nothing imported; pass --replace to replace what the DB holds");
  std::string other = Write("other.json", R"({"format": "cupcake.profile.v1",
      "cluster": {"name": "other", "nodes": 1, "devices_per_node": 2}, "curves": []})");
  EXPECT_EQ(Import(other).message(),
            db_ +
                ": cluster.name: the DB holds another cluster's profile; got \"other\", expected "
                "\"v100-8x8-pcie-25g\" (one DB holds one profile; replace not requested)\n" +
                db_ + ": nothing imported; pass --replace to replace what the DB holds");
  EXPECT_EQ(Export(), before);
  ASSERT_TRUE(Import(other, true).ok());
  EXPECT_EQ(Export(),
            "{\n  \"format\": \"cupcake.profile.v1\",\n  \"cluster\": {\n    \"name\": \"other\",\n"
            "    \"nodes\": 1,\n    \"devices_per_node\": 2\n  },\n  \"curves\": []\n}\n");
}

TEST_F(ProfileCommandsTest, BadInputNamesFileAndFieldAndLeavesTheDbUnchanged) {
  ASSERT_TRUE(Import(profile_).ok());
  std::string before = DbBytes();
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"{\"format\": \"cupcake.model.v1\",",
       "bad.json:1:31: not valid JSON: syntax error while parsing object key - "
       "unexpected end of input; expected string literal"},
      {R"({"name": "m"})", R"(bad.json: format: missing; expected "cupcake.model.v1" or "cupcake.profile.v1")"},
      {R"({"format": "cupcake.model.v1", "name": "m", "tensors": [{"name": "a", "numel": 0, "dtype": "f32", "backward_us": 0}]})",
       "bad.json: tensors[0].dtype: unknown dtype; got \"f32\", expected one of float32, float16, bfloat16\n"
       "bad.json: tensors[0].numel: must be positive; got 0, expected > 0"},
      {R"({"format": "cupcake.profile.v1", "cluster": {"name": "v100-8x8-pcie-25g", "nodes": 8, "devices_per_node": 8},
          "curves": [{"kind": "encode", "compressor": "signsg", "device": "gpu", "points": [[8, 1], [4, 2]]}]})",
       "bad.json: curves[0].compressor: unknown compressor; got \"signsg\" (did you mean 'signsgd'?), expected one of "
       "fp32, fp16, topk, randk, dgc, qsgd, signsgd, efsignsgd, signum, terngrad, onebit, zen, nonzero or powersgd\n"
       "bad.json: curves[0].points[1].size: sizes not sorted; got 4 after 8, expected increasing sizes"},
  };
  for (const Case& c : cases) {
    std::string file = Write("bad.json", c.text);
    // Messages name the file as given: use a relative path from the temp dir.
    std::filesystem::path cwd = std::filesystem::current_path();
    std::filesystem::current_path(dir_.path());
    std::ostringstream out;
    Status s = RunImport({db_, "bad.json", false}, out);
    std::filesystem::current_path(cwd);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), c.message);
    EXPECT_EQ(out.str(), "");
    EXPECT_EQ(DbBytes(), before);
  }
}

TEST_F(ProfileCommandsTest, FailedImportIntoANewDbLeavesNoFile) {
  Status s = Import(ExamplePath("models/ncf.json"));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(std::filesystem::exists(db_));
}

TEST_F(ProfileCommandsTest, RefusesDbsThatAreNotCupcakeProfiles) {
  std::string json = Write("p.db", "{}");
  std::ostringstream out;
  EXPECT_EQ(RunImport({json, profile_, false}, out).message(),
            json +
                ": not a cupcake profile DB; got a file starting with '{}', expected an SQLite database (a JSON "
                "file? import it with cupcake-profile import)");
  EXPECT_EQ(*ReadFile(json), "{}");
  EXPECT_EQ(RunExport({dir_.File("none.db"), "", "-"}, out).message(), dir_.File("none.db") + ": no such profile DB");
}

TEST_F(ProfileCommandsTest, InspectSummarizesInHumanUnits) {
  std::string small = Write("small.json", R"({"format": "cupcake.profile.v1",
      "cluster": {"name": "lab", "nodes": 2, "devices_per_node": 4, "device": "H100", "meta": {"nccl": "2.28.9"}},
      "curves": [{"kind": "comm", "op": "allgather", "scope": "global", "points": [[4, 10], [1536, 20], [67108864, 900]]},
                 {"kind": "encode", "compressor": "topk", "device": "gpu", "method": "kernel", "points": [[1, 3], [1048576, 50]]},
                 {"kind": "copy", "op": "pack", "device": "gpu", "wrong": 2, "points": [[8, 1]]}]})");
  ASSERT_TRUE(Import(small).ok());
  ASSERT_TRUE(Import(ExamplePath("models/ncf.json")).ok());
  std::ostringstream text;
  ASSERT_TRUE(RunInspect({db_, tools::OutputFormat::kText}, text).ok());
  EXPECT_EQ(text.str(), "profile " + db_ +
                            "\n"
                            "cluster lab: 2 nodes x 4 devices (8 ranks)\n"
                            "  device:    H100\n"
                            "  meta.nccl: 2.28.9\n"
                            "curves: 3\n"
                            "  comm allgather global    3 points  4 B .. 64 MiB\n"
                            "  encode topk gpu          2 points  1 .. 1 Mi elements  (kernel)\n"
                            "  copy pack gpu             1 point  8 B .. 8 B  WRONG RESULTS: 2\n"
                            "models: 1\n"
                            "  ncf  12 tensors, 178064769 parameters (679.3 MiB of gradients)\n");
  std::ostringstream json;
  ASSERT_TRUE(RunInspect({db_, tools::OutputFormat::kJson}, json).ok());
  auto j = nlohmann::json::parse(json.str());
  EXPECT_EQ(j["curves"][0]["key"], "comm allgather global");
  EXPECT_EQ(j["curves"][0]["max_size"], 67108864);
  EXPECT_EQ(j["curves"][1]["unit"], "elements");
  EXPECT_EQ(j["models"][0]["parameters"], 178064769);
  // The same summary from the JSON file itself.
  std::ostringstream from_json;
  ASSERT_TRUE(RunInspect({small, tools::OutputFormat::kText}, from_json).ok());
  EXPECT_NE(from_json.str().find("curves: 3\n"), std::string::npos);
}

}  // namespace
}  // namespace cupcake::profile_cli

// The real binaries: exit codes 0/1/2, results on stdout, diagnostics on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cupcake/proto/file_io.h"
#include "test_files.h"

namespace cupcake {
namespace {

struct Result {
  int code;
  std::string out, err;
};

class BinaryTest : public ::testing::Test {
 protected:
  Result Invoke(const std::string& bin, const std::string& args) {
    std::string cmd = "cd '" + dir_.path() + "' && '" + bin + "' " + args + " >stdout 2>stderr";
    int status = std::system(cmd.c_str());
    Result r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, "", ""};
    r.out = ReadFile(dir_.File("stdout")).value();
    r.err = ReadFile(dir_.File("stderr")).value();
    return r;
  }
  testing::TempDir dir_;
};

TEST_F(BinaryTest, CupcakeProfileEndToEnd) {
  const std::string profile = testing::ExamplePath("profiles/v100-8x8-pcie-25g.json");
  Result r = Invoke(CUPCAKE_PROFILE_BIN, "import --db p.db " + profile);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  r = Invoke(CUPCAKE_PROFILE_BIN, "import --db p.db " + testing::ExamplePath("models/resnet50.json"));
  EXPECT_EQ(r.code, 0) << r.err;
  r = Invoke(CUPCAKE_PROFILE_BIN, "inspect --db p.db");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("cluster v100-8x8-pcie-25g: 8 nodes x 8 devices (64 ranks)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  resnet50  161 tensors, 25557032 parameters (97.5 MiB of gradients)\n"), std::string::npos);
  r = Invoke(CUPCAKE_PROFILE_BIN, "export --db p.db --model resnet50 -o r.json");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  r = Invoke(CUPCAKE_PROFILE_BIN, "export --db p.db");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(r.out.starts_with("{\n  \"format\": \"cupcake.profile.v1\",\n  \"cluster\": {\n")) << r.out;
}

TEST_F(BinaryTest, FailuresExitOneAndUsageErrorsTwo) {
  std::ofstream(dir_.File("model.json")) << R"({"format": "cupcake.model.v1", "name": "m", "tensors": [
    {"name": "a", "numel": 1, "dtype": "float32", "backward_us": 0}, {"name": "b", "numel": 0, "dtype": "float32", "backward_us": 0}]})";
  Result r = Invoke(CUPCAKE_PROFILE_BIN, "import --db p.db model.json");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "model.json: tensors[1].numel: must be positive; got 0, expected > 0\n");
  EXPECT_FALSE(std::filesystem::exists(dir_.File("p.db")));

  r = Invoke(CUPCAKE_PROFILE_BIN, "improt --db p.db model.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "cupcake-profile: unknown command; got 'improt' (did you mean 'import'?), expected one of import, "
                   "export, inspect; run 'cupcake-profile --help' for the commands\n");
  r = Invoke(CUPCAKE_PROFILE_BIN, "inspect --db p.db --format yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "cupcake-profile inspect: --format: unknown format; got \"yaml\", expected one of text, json\n"
                   "run 'cupcake-profile inspect --help' for its options\n");
  r = Invoke(CUPCAKE_PROFILE_BIN, "export");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(r.err.starts_with("cupcake-profile export: the option '--db' is required but missing\n")) << r.err;
  r = Invoke(CUPCAKE_PROFILE_BIN, "--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(r.out.starts_with("cupcake-profile ")) << r.out;
}

TEST_F(BinaryTest, CupcakePlanFrame) {
  Result r = Invoke(CUPCAKE_PLAN_BIN, "--version");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(r.out.starts_with("cupcake-plan ")) << r.out;
  r = Invoke(CUPCAKE_PLAN_BIN, "--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(r.out.starts_with("usage: cupcake-plan <command> [options]\n")) << r.out;
  r = Invoke(CUPCAKE_PLAN_BIN, "no-such-command");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(r.err.starts_with("cupcake-plan: unknown command; got 'no-such-command'")) << r.err;
}

}  // namespace
}  // namespace cupcake

// cupcake-profile compute: a fake training command (a shell script) records a model; the
// command's failures, a missing model and a malformed one give messages pinned here.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "commands.h"
#include "cupcake/profile/store.h"
#include "test_files.h"

namespace cupcake::profile_cli {
namespace {

class ProfileComputeTest : public ::testing::Test {
 protected:
  // Models go into a DB that holds a profile.
  void SetUp() override {
    std::ostringstream out;
    Status s = RunImport({db_, testing::ExamplePath("profiles/v100-8x8-pcie-25g.json"), false}, out);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  // Writes an executable /bin/sh script.
  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = dir_.File(name);
    std::ofstream(path) << "#!/bin/sh\n" << body;
    ::chmod(path.c_str(), 0755);
    return path;
  }
  Status Compute(const std::vector<std::string>& command, std::string* out_text = nullptr) {
    ComputeOptions options;
    options.db = db_;
    options.command = command;
    options.iterations = 7;
    options.model_file = model_;
    std::ostringstream out;
    Status s = RunCompute(options, out);
    if (out_text != nullptr) *out_text = out.str();
    return s;
  }

  testing::TempDir dir_;
  std::string db_ = dir_.File("profile.db");
  std::string model_ = dir_.File("recorded.json");
};

// The fake job writes a model naming the iteration count it was asked for.
constexpr const char* kGoodJob = R"(cat > "$CUPCAKE_RECORD" <<JSON
{"format": "cupcake.model.v1", "name": "fake", "source": "iterations=$CUPCAKE_RECORD_ITERATIONS $1",
 "tensors": [{"name": "b", "numel": 10, "dtype": "float32", "backward_us": 5.5},
             {"name": "w", "numel": 100, "dtype": "float32", "backward_us": 20}]}
JSON
)";

TEST_F(ProfileComputeTest, RunsTheJobAndImportsItsModel) {
  const std::string job = Script("job.sh", kGoodJob);
  std::string out;
  Status s = Compute({job, "arg1"}, &out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out, "imported model 'fake' (2 tensors) from " + model_ + " into " + db_ + "\n");
  auto store = profile::ProfileStore::Open(db_, /*create=*/false);
  ASSERT_TRUE(store.ok());
  auto model = store->LoadModel("fake");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  EXPECT_EQ(model->source(), "iterations=7 arg1");
  ASSERT_EQ(model->tensors_size(), 2);
  EXPECT_EQ(model->tensors(0).backward_us(), 5.5);
  // Recording again needs --replace, as import does.
  EXPECT_EQ(Compute({job}).code(), StatusCode::kAlreadyExists);
}

TEST_F(ProfileComputeTest, ReportsTheExitStatusOfAFailedJob) {
  const std::string job = Script("fail.sh", "echo boom >&2\nexit 3\n");
  EXPECT_EQ(Compute({job, "x"}).message(),
            "compute: the training command failed; got exit status 3, expected 0 (command: " + job + " x)");
  const std::string killed = Script("killed.sh", "kill -9 $$\n");
  EXPECT_EQ(Compute({killed}).message(),
            "compute: the training command failed; got signal 9 (Killed), expected exit status 0 (command: " + killed +
                ")");
  EXPECT_EQ(Compute({dir_.File("missing")}).message(),
            "compute: the training command failed; got exit status 127, expected 0 (command: " + dir_.File("missing") +
                ")");
}

TEST_F(ProfileComputeTest, ReportsAMissingModel) {
  std::ofstream(model_) << "stale";  // from an earlier run: removed before the job starts
  const std::string job = Script("silent.sh", "exit 0\n");
  EXPECT_EQ(Compute({job}).message(),
            "compute: " + model_ +
                ": no model written; expected the training command to write one (CUPCAKE_RECORD names the file; "
                "command: " + job + ")");
}

TEST_F(ProfileComputeTest, ReportsAMalformedModel) {
  const std::string job = Script("bad.sh",
                                 "printf '{\"format\": \"cupcake.model.v1\", \"name\": \"m\", \"tensors\": "
                                 "[{\"name\": \"a\", \"numel\": 1, \"dtype\": \"float32\", \"backward_us\": 1, "
                                 "\"typo\": 0}]}' > \"$CUPCAKE_RECORD\"\n");
  Status s = Compute({job});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("compute: the recorded model: " + model_ + ":", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("typo"), std::string::npos) << s.message();
}

TEST_F(ProfileComputeTest, RefusesADbWithoutAProfileBeforeRunningTheJob) {
  const std::string ran = dir_.File("ran");
  const std::string job = Script("job.sh", "touch " + ran + "\n");
  db_ = dir_.File("empty.db");
  Status s = Compute({job});
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("compute: " + db_, 0), 0u) << s.message();
  EXPECT_NE(s.message().find("\ncompute: nothing run; profile the cluster into the DB first "
                             "(cupcake-profile kernels/comm, or import a profile)"),
            std::string::npos)
      << s.message();
  EXPECT_FALSE(std::filesystem::exists(ran));
  EXPECT_FALSE(std::filesystem::exists(db_));
}

TEST_F(ProfileComputeTest, ADefaultModelFileIsTemporary) {
  const std::string job = Script("job.sh", std::string("echo \"$CUPCAKE_RECORD\" > ") + dir_.File("where") + "\n" +
                                               kGoodJob);
  ComputeOptions options;
  options.db = db_;
  options.command = {job};
  std::ostringstream out;
  ASSERT_TRUE(RunCompute(options, out).ok());
  std::ifstream where(dir_.File("where"));
  std::string path;
  std::getline(where, path);
  EXPECT_FALSE(path.empty());
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace cupcake::profile_cli

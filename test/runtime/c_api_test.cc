// The C API (cupcake.h) on the in-process communicator; under MPI it is run by runtime_mpi_test.
#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/runtime/cupcake.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "c_api_internal.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/ladder_io.h"
#include "cupcake/proto/plan_io.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using comm::BuiltWithMpi;
using comm::BuiltWithNccl;
using comm::InProcessGroup;

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / ("cupcake_c_api_" + std::to_string(::getpid()) + ".pb")).string();
    model_ = testing::SmallModel("tiny", {3, 2});
    ASSERT_TRUE(WritePlanFile(path_, testing::MakePlan(model_, testing::LayerWise(model_), "fp32", 1)).ok());
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_;
  pb::Model model_;
};

// A ladder of two rungs of the test model, fp32 and topk at `ratio` (layer-wise groups), in a
// file beside the fixture's plan.
std::string WriteLadder(const pb::Model& model, const std::string& plan_path, double ratio) {
  pb::Ladder ladder;
  ladder.set_format("cupcake.ladder.v1");
  for (double r : {1.0, ratio}) {
    pb::Rung* rung = ladder.add_rungs();
    rung->set_ratio(r);
    *rung->mutable_plan() = testing::MakePlan(model, testing::LayerWise(model), r == 1 ? "fp32" : "topk", 1, r);
  }
  const std::string path = plan_path + ".ladder";
  EXPECT_TRUE(WriteLadderFile(path, ladder).ok());
  return path;
}

// A ladder file through the C API: one plan per rung, the fp32 rung active first, a switch to
// the other rung between steps, and an index out of range refused naming it.
TEST_F(CApi, SwitchesBetweenTheRungsOfALadder) {
  const std::string path = WriteLadder(model_, path_, 0.25);
  InProcessGroup group(1);
  cupcake_session* s = nullptr;
  ASSERT_EQ(internal::CreateCSession(path.c_str(), group.Rank(0), {}, &s), CUPCAKE_OK) << cupcake_last_error();
  int count = 0, active = -1;
  EXPECT_EQ(cupcake_session_plan_count(s, &count), CUPCAKE_OK);
  EXPECT_EQ(count, 2);
  EXPECT_EQ(cupcake_session_active_plan(s, &active), CUPCAKE_OK);
  EXPECT_EQ(active, 0);
  EXPECT_EQ(cupcake_session_switch_plan(s, 1), CUPCAKE_OK) << cupcake_last_error();
  EXPECT_EQ(cupcake_session_active_plan(s, &active), CUPCAKE_OK);
  EXPECT_EQ(active, 1);
  EXPECT_EQ(cupcake_session_switch_plan(s, 2), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(), "SwitchPlan: plan index out of range; got 2, expected 0 <= index < 2 (plans added)");
  EXPECT_EQ(cupcake_session_plan_count(s, nullptr), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_EQ(cupcake_session_switch_plan(nullptr, 0), CUPCAKE_INVALID_ARGUMENT);
  cupcake_session_destroy(s);
  std::filesystem::remove(path);
}

// GraVAC through C: a window of one step on a ladder of one rank; the first window ran the fp32
// rung, and the decision reads back field by field.
TEST_F(CApi, AdaptsOverALadderWithGravac) {
  const std::string path = WriteLadder(model_, path_, 0.5);
  InProcessGroup group(1);
  cupcake_session* s = nullptr;
  ASSERT_EQ(internal::CreateCSession(path.c_str(), group.Rank(0), {}, &s), CUPCAKE_OK) << cupcake_last_error();
  cupcake_gravac_options bad = {-1, 0, 0, 0, 0};
  EXPECT_EQ(cupcake_session_enable_gravac(s, &bad), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_NE(std::string(cupcake_last_error()).find("GravacOptions.window: out of range; got -1"), std::string::npos)
      << cupcake_last_error();
  cupcake_gravac_options o = {1, 0.5, 0, 0, 0};
  ASSERT_EQ(cupcake_session_enable_gravac(s, &o), CUPCAKE_OK) << cupcake_last_error();
  float a[3] = {3, -4, 0}, b[2] = {1, 0};  // at 0.5 each tensor keeps one element: -4 and 1
  ASSERT_EQ(cupcake_session_register(s, "t0", a, 3), CUPCAKE_OK);
  ASSERT_EQ(cupcake_session_register(s, "t1", b, 2), CUPCAKE_OK);
  ASSERT_EQ(cupcake_session_gradient_ready(s, 0), CUPCAKE_OK);
  ASSERT_EQ(cupcake_session_gradient_ready(s, 1), CUPCAKE_OK);
  ASSERT_EQ(cupcake_session_synchronize(s), CUPCAKE_OK) << cupcake_last_error();
  int count = 0;
  ASSERT_EQ(cupcake_session_decision_count(s, &count), CUPCAKE_OK);
  ASSERT_EQ(count, 1);
  cupcake_gravac_decision d;
  ASSERT_EQ(cupcake_session_decision(s, 0, &d), CUPCAKE_OK);
  EXPECT_EQ(d.step, 0u);
  EXPECT_EQ(d.steps, 1);
  EXPECT_EQ(d.ratio, 1.0);
  EXPECT_EQ(d.ratio_min, 0.5);
  EXPECT_EQ(d.ratio_c, 0.5);
  EXPECT_DOUBLE_EQ(d.gain_min, 17.0 / 26.0);  // (16 + 1) / (9 + 16 + 0 + 1 + 0)
  EXPECT_EQ(d.groups_skipped, 0);
  EXPECT_EQ(d.bytes_sent, 4 * 5);
  EXPECT_EQ(d.next_ratio, 0.5);  // 0.65 >= epsilon 0.5
  int active = -1;
  EXPECT_EQ(cupcake_session_active_plan(s, &active), CUPCAKE_OK);
  EXPECT_EQ(active, 1);
  EXPECT_EQ(cupcake_session_decision(s, 1, &d), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(), "cupcake_session_decision: index out of range; got 1, expected 0 <= index < 1 "
                                     "(decisions so far)");
  EXPECT_EQ(cupcake_session_decision_count(nullptr, &count), CUPCAKE_INVALID_ARGUMENT);
  cupcake_session_destroy(s);
  std::filesystem::remove(path);
}

TEST_F(CApi, RunsAStepAndReportsErrors) {
  InProcessGroup group(1);
  cupcake_session* s = nullptr;
  ASSERT_EQ(internal::CreateCSession(path_.c_str(), group.Rank(0), {}, &s), CUPCAKE_OK) << cupcake_last_error();
  float a[3] = {1, 2, 3}, b[2] = {4, 5};
  EXPECT_EQ(cupcake_session_register(s, "t0", a, 3), CUPCAKE_OK);
  EXPECT_EQ(cupcake_session_register(s, "t1", b, 3), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               (path_ + ": tensor 1: the job's gradient is not the plan's; got 't1' with 3 elements (the job's "
                        "gradient 1), expected 't1' with 2 elements (the plan's model tiny)")
                   .c_str());
  EXPECT_EQ(cupcake_session_register(s, "t1", b, 2), CUPCAKE_OK);
  EXPECT_EQ(cupcake_session_set_accumulating(s, 0), CUPCAKE_OK);
  EXPECT_EQ(cupcake_session_gradient_ready(s, 1), CUPCAKE_OK);
  EXPECT_EQ(cupcake_session_gradient_ready(s, 0), CUPCAKE_OK);
  EXPECT_EQ(cupcake_session_synchronize(s), CUPCAKE_OK);
  EXPECT_EQ(a[2], 3.0f);  // the average over one rank
  EXPECT_EQ(b[0], 4.0f);
  EXPECT_EQ(cupcake_session_gradient_ready(s, 7), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "GradientReady: tensor index out of range; got 7, expected 0 <= i < 2 (model tiny)");
  cupcake_session_destroy(s);
  cupcake_session_destroy(nullptr);
}

TEST_F(CApi, NullSessionIsAnError) {
  EXPECT_EQ(cupcake_session_synchronize(nullptr), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_session_synchronize: session is NULL; expected one from cupcake_session_create_with_options");
  EXPECT_EQ(cupcake_session_register(nullptr, "t0", nullptr, 0), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_session_register: session is NULL; expected one from cupcake_session_create_with_options");
  // This rank's own failure: printed by the rank that got it, whichever that is.
  EXPECT_EQ(cupcake_last_error_reporter(), CUPCAKE_ANY_RANK);
  EXPECT_EQ(cupcake_last_error_printed_by(0), 1);
  EXPECT_EQ(cupcake_last_error_printed_by(1), 1);
}

// An error every rank gets alike (a plan for another world size, found by each rank and agreed
// on) is printed by rank 0 only: each rank's thread holds its own last error, reporter 0.
TEST_F(CApi, AnErrorEveryRankGetsAlikeIsPrintedByOneRank) {
  InProcessGroup group(2);
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  for (int r = 0; r < 2; ++r) comms.push_back(group.Rank(r));
  int code[2] = {}, reporter[2] = {}, printed_by_self[2] = {}, printed_by_other[2] = {};
  std::string message[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      cupcake_session* s = nullptr;
      code[r] = internal::CreateCSession(path_.c_str(), std::move(comms[static_cast<size_t>(r)]), {}, &s);
      message[r] = cupcake_last_error();
      reporter[r] = cupcake_last_error_reporter();
      printed_by_self[r] = cupcake_last_error_printed_by(r);
      printed_by_other[r] = cupcake_last_error_printed_by(1 - r);
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(code[r], CUPCAKE_INVALID_ARGUMENT) << r;
    EXPECT_EQ(message[r], path_ + ": world_size: does not match the job; got 1, expected 2 (ranks in the communicator)")
        << r;
    EXPECT_EQ(reporter[r], 0) << r;
  }
  EXPECT_EQ(printed_by_self[0], 1);
  EXPECT_EQ(printed_by_other[0], 0);  // rank 0's view: rank 1 stays quiet
  EXPECT_EQ(printed_by_self[1], 0);
  EXPECT_EQ(printed_by_other[1], 1);
  // Before any failure on a thread there is nothing to print.
  int fresh = -2;
  std::thread([&] { fresh = cupcake_last_error_printed_by(0); }).join();
  EXPECT_EQ(fresh, 0);
}

// NULL options are the defaults: MPI on MPI_COMM_WORLD, which needs MPI initialized.
TEST_F(CApi, CreateOverMpiNeedsMpiInitialized) {
  cupcake_session* s = reinterpret_cast<cupcake_session*>(this);
  EXPECT_EQ(cupcake_session_create_with_options(path_.c_str(), nullptr, &s), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(s, nullptr);
  if (BuiltWithMpi())
    EXPECT_STREQ(cupcake_last_error(),
                 "MPI communicator: MPI is not initialized; expected MPI_Init_thread (or InitMpi) first");
  else
    EXPECT_NE(std::string(cupcake_last_error()).find("this build has no MPI"), std::string::npos);
}

// Every bad field of the options is reported together, before any communicator is made.
TEST_F(CApi, OptionsAreCheckedTogether) {
  cupcake_session_options o{};
  o.backend = 7;
  o.ready_timeout_us = -1;
  cupcake_session* s = reinterpret_cast<cupcake_session*>(this);
  EXPECT_EQ(cupcake_session_create_with_options(path_.c_str(), &o, &s), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_EQ(s, nullptr);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_session_create_with_options: options.backend: unknown backend; got 7, expected "
               "CUPCAKE_BACKEND_MPI (0), CUPCAKE_BACKEND_NCCL (1) or CUPCAKE_BACKEND_NCCL_COMM (2)\n"
               "cupcake_session_create_with_options: options.ready_timeout_us: out of range; got -1, expected > 0 "
               "microseconds, or 0 for the default (60 s)");
  o = cupcake_session_options{};
  int stream = 0;
  o.job_stream = &stream;
  EXPECT_EQ(cupcake_session_create_with_options(path_.c_str(), &o, &s), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_session_create_with_options: options.job_stream: set for backend MPI; expected NULL (a stream "
               "is for the NCCL backends)");
  EXPECT_EQ(cupcake_session_create_with_options(nullptr, &o, &s), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(), "cupcake_session_create_with_options: plan_path is NULL; expected a path");
}

// The options struct as SessionOptions: the timeout in microseconds as given, 0 the default.
TEST_F(CApi, OptionsBecomeSessionOptionsInTheSameUnits) {
  cupcake_session_options o{};
  auto defaults = internal::ToSessionOptions(o, "call");
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_EQ(defaults->ready_timeout_us, 60e6);
  EXPECT_EQ(defaults->compressor, "");
  EXPECT_EQ(defaults->job_stream, nullptr);
  o.backend = CUPCAKE_BACKEND_NCCL;
  o.ready_timeout_us = 2.5e6;
  o.compressor = "topk";
  o.model_fingerprint = "abc";
  int stream = 0;
  o.job_stream = &stream;
  auto set = internal::ToSessionOptions(o, "call");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->ready_timeout_us, 2.5e6);
  EXPECT_EQ(set->compressor, "topk");
  EXPECT_EQ(set->model_fingerprint, "abc");
  EXPECT_EQ(set->job_stream, &stream);
  o.ready_timeout_us = std::numeric_limits<double>::infinity();
  EXPECT_EQ(internal::ToSessionOptions(o, "call").status().message(),
            "call: options.ready_timeout_us: out of range; got inf, expected > 0 microseconds, or 0 for the default "
            "(60 s)");
}

// Without a GPU (this machine), the GPU backends say so, naming the call; with no MPI
// initialized backend NCCL makes a group of one rank, so the device check is what fails.
TEST_F(CApi, CreateOverNcclWithoutAGpuSaysNoCudaDeviceFound) {
  if (kernels::BackendAvailable(kernels::Backend::kCuda).ok()) GTEST_SKIP() << "a GPU is present";
  cupcake_session* s = reinterpret_cast<cupcake_session*>(this);
  cupcake_session_options o{};
  o.backend = CUPCAKE_BACKEND_NCCL;
  EXPECT_EQ(cupcake_session_create_with_options(path_.c_str(), &o, &s), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(s, nullptr);
  const std::string m = cupcake_last_error();
  EXPECT_EQ(
      m.rfind(BuiltWithNccl() ? "cupcake_session_create_with_options: NCCL communicator: no CUDA device found; got "
                              : "cupcake_session_create_with_options: NCCL communicator: this build has no NCCL",
              0),
      0u)
      << m;
  // On the job's NCCL communicator: a null handle, then (with NCCL) the missing device.
  o.backend = CUPCAKE_BACKEND_NCCL_COMM;
  EXPECT_NE(cupcake_session_create_with_options(path_.c_str(), &o, &s), CUPCAKE_OK);
  EXPECT_STREQ(cupcake_last_error(),
               BuiltWithNccl() ? "cupcake_session_create_with_options: NCCL communicator from the job's: nccl_comm: "
                                 "null; expected a pointer to the job's ncclComm_t"
                               : "cupcake_session_create_with_options: NCCL communicator from the job's: this build "
                                 "has no NCCL; expected a build with the CUDA toolkit and NCCL found "
                                 "(CUPCAKE_WITH_NCCL=ON or AUTO)");
  const void* job_comm = this;  // never read: the device check comes first
  o.nccl_comm = &job_comm;
  EXPECT_NE(cupcake_session_create_with_options(path_.c_str(), &o, &s), CUPCAKE_OK);
  EXPECT_EQ(s, nullptr);
  if (BuiltWithNccl()) {
    EXPECT_EQ(std::string(cupcake_last_error())
                  .rfind("cupcake_session_create_with_options: NCCL communicator from the job's: no CUDA device "
                         "found; got ",
                         0),
              0u)
        << cupcake_last_error();
  }
  EXPECT_EQ(cupcake_session_register_device(nullptr, "t0", nullptr, 0), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_session_register_device: session is NULL; expected one from "
               "cupcake_session_create_with_options");
}

// The names before cupcake_session_*, kept one release as deprecated aliases
// (libruntime/README.md): each still works and its errors still name it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST_F(CApi, DeprecatedAliasesStillWork) {
  InProcessGroup group(1);
  cupcake_session* s = nullptr;
  ASSERT_EQ(internal::CreateCSession(path_.c_str(), group.Rank(0), {}, &s), CUPCAKE_OK) << cupcake_last_error();
  float a[3] = {1, 2, 3}, b[2] = {4, 5};
  EXPECT_EQ(cupcake_register(s, "t0", a, 3), CUPCAKE_OK);
  EXPECT_EQ(cupcake_register(s, "t1", b, 2), CUPCAKE_OK);
  EXPECT_EQ(cupcake_set_accumulating(s, 0), CUPCAKE_OK);
  EXPECT_EQ(cupcake_gradient_ready(s, 0), CUPCAKE_OK);
  EXPECT_EQ(cupcake_gradient_ready(s, 1), CUPCAKE_OK);
  EXPECT_EQ(cupcake_synchronize(s), CUPCAKE_OK);
  EXPECT_EQ(a[1], 2.0f);  // the average over one rank
  EXPECT_EQ(cupcake_gradient_ready(s, 2), CUPCAKE_INVALID_ARGUMENT);
  cupcake_session_destroy(s);

  EXPECT_EQ(cupcake_synchronize(nullptr), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_synchronize: session is NULL; expected one from cupcake_session_create_with_options");
  EXPECT_EQ(cupcake_register(nullptr, "t0", a, 3), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_EQ(cupcake_register_device(nullptr, "t0", nullptr, 0), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_register_device: session is NULL; expected one from cupcake_session_create_with_options");
  EXPECT_EQ(cupcake_set_accumulating(nullptr, 1), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_EQ(cupcake_gradient_ready(nullptr, 0), CUPCAKE_INVALID_ARGUMENT);

  // The old creates: MPI is not initialized in this process, so both MPI ones fail alike.
  s = reinterpret_cast<cupcake_session*>(this);
  EXPECT_EQ(cupcake_session_create(path_.c_str(), nullptr, &s), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(s, nullptr);
  const std::string no_mpi = cupcake_last_error();
  s = reinterpret_cast<cupcake_session*>(this);
  EXPECT_EQ(cupcake_session_create_ex(path_.c_str(), nullptr, "fp32", "", 30, &s), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(s, nullptr);
  EXPECT_EQ(cupcake_last_error(), no_mpi);
  EXPECT_EQ(cupcake_session_create(nullptr, nullptr, &s), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(), "cupcake_session_create: plan_path is NULL; expected a path");
  EXPECT_EQ(cupcake_session_create_ex(path_.c_str(), nullptr, nullptr, nullptr, 0, nullptr), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(), "cupcake_session_create_ex: out is NULL; expected a pointer");
  if (kernels::BackendAvailable(kernels::Backend::kCuda).ok()) return;  // below: what a GPU-less machine says
  EXPECT_EQ(cupcake_session_create_nccl(path_.c_str(), nullptr, nullptr, &s), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(std::string(cupcake_last_error()).rfind("cupcake_session_create_nccl: NCCL communicator: ", 0), 0u)
      << cupcake_last_error();
  EXPECT_NE(cupcake_session_create_nccl_comm(path_.c_str(), nullptr, nullptr, &s), CUPCAKE_OK);
  EXPECT_EQ(std::string(cupcake_last_error())
                .rfind("cupcake_session_create_nccl_comm: NCCL communicator from the job's: ", 0),
            0u)
      << cupcake_last_error();
}
#pragma GCC diagnostic pop

}  // namespace
}  // namespace cupcake::runtime

// The C API (cupcake.h) on the in-process communicator; under MPI it is run by runtime_mpi_test.
#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/runtime/cupcake.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "c_api_internal.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/proto/plan_io.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using comm::InProcessGroup;
using comm::BuiltWithMpi;
using comm::BuiltWithNccl;

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

TEST_F(CApi, RunsAStepAndReportsErrors) {
  InProcessGroup group(1);
  cupcake_session* s = nullptr;
  ASSERT_EQ(internal::CreateCSession(path_.c_str(), group.Rank(0), {}, &s), CUPCAKE_OK) << cupcake_last_error();
  float a[3] = {1, 2, 3}, b[2] = {4, 5};
  EXPECT_EQ(cupcake_register(s, "t0", a, 3), CUPCAKE_OK);
  EXPECT_EQ(cupcake_register(s, "t1", b, 3), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               (path_ + ": model.model.tensors[1]: does not match the job's gradient 1; got 't1' with 2 elements, "
                        "expected 't1' with 3 elements (model tiny)").c_str());
  EXPECT_EQ(cupcake_register(s, "t1", b, 2), CUPCAKE_OK);
  EXPECT_EQ(cupcake_set_accumulating(s, 0), CUPCAKE_OK);
  EXPECT_EQ(cupcake_gradient_ready(s, 1), CUPCAKE_OK);
  EXPECT_EQ(cupcake_gradient_ready(s, 0), CUPCAKE_OK);
  EXPECT_EQ(cupcake_synchronize(s), CUPCAKE_OK);
  EXPECT_EQ(a[2], 3.0f);  // the average over one rank
  EXPECT_EQ(b[0], 4.0f);
  EXPECT_EQ(cupcake_gradient_ready(s, 7), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(), "GradientReady: tensor index out of range; got 7, expected 0 <= i < 2 (model tiny)");
  cupcake_session_destroy(s);
  cupcake_session_destroy(nullptr);
}

TEST_F(CApi, NullSessionIsAnError) {
  EXPECT_EQ(cupcake_synchronize(nullptr), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(), "cupcake_synchronize: session is NULL; expected one from cupcake_session_create");
}

TEST_F(CApi, CreateOverMpiNeedsMpiInitialized) {
  cupcake_session* s = reinterpret_cast<cupcake_session*>(this);
  EXPECT_EQ(cupcake_session_create(path_.c_str(), nullptr, &s), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(s, nullptr);
  if (BuiltWithMpi())
    EXPECT_STREQ(cupcake_last_error(),
                 "MPI communicator: MPI is not initialized; expected MPI_Init_thread (or InitMpi) first");
  else
    EXPECT_NE(std::string(cupcake_last_error()).find("this build has no MPI"), std::string::npos);
}

// Without a GPU (this machine), the GPU entry point says so, naming the call; with no MPI
// initialized it makes a group of one rank, so the device check is what fails.
TEST_F(CApi, CreateOverNcclWithoutAGpuSaysNoCudaDeviceFound) {
  if (kernels::BackendAvailable(kernels::Backend::kCuda).ok()) GTEST_SKIP() << "a GPU is present";
  cupcake_session* s = reinterpret_cast<cupcake_session*>(this);
  EXPECT_EQ(cupcake_session_create_nccl(path_.c_str(), nullptr, nullptr, &s), CUPCAKE_FAILED_PRECONDITION);
  EXPECT_EQ(s, nullptr);
  const std::string m = cupcake_last_error();
  EXPECT_EQ(m.rfind(BuiltWithNccl() ? "cupcake_session_create_nccl: NCCL communicator: no CUDA device found; got "
                                    : "cupcake_session_create_nccl: NCCL communicator: this build has no NCCL",
                    0),
            0u)
      << m;
  // On the job's NCCL communicator: a null handle, then (with NCCL) the missing device.
  EXPECT_NE(cupcake_session_create_nccl_comm(path_.c_str(), nullptr, nullptr, &s), CUPCAKE_OK);
  EXPECT_STREQ(cupcake_last_error(),
               BuiltWithNccl() ? "cupcake_session_create_nccl_comm: NCCL communicator from the job's: nccl_comm: null; "
                                 "expected a pointer to the job's ncclComm_t"
                               : "cupcake_session_create_nccl_comm: NCCL communicator from the job's: this build has no "
                                 "NCCL; expected a build with the CUDA toolkit and NCCL found (CUPCAKE_WITH_NCCL=ON or "
                                 "AUTO)");
  const void* job_comm = this;  // never read: the device check comes first
  EXPECT_NE(cupcake_session_create_nccl_comm(path_.c_str(), &job_comm, nullptr, &s), CUPCAKE_OK);
  EXPECT_EQ(s, nullptr);
  if (BuiltWithNccl()) {
    EXPECT_EQ(std::string(cupcake_last_error())
                  .rfind("cupcake_session_create_nccl_comm: NCCL communicator from the job's: no CUDA device found; got ", 0),
              0u)
        << cupcake_last_error();
  }
  EXPECT_EQ(cupcake_register_device(nullptr, "t0", nullptr, 0), CUPCAKE_INVALID_ARGUMENT);
  EXPECT_STREQ(cupcake_last_error(),
               "cupcake_register_device: session is NULL; expected one from cupcake_session_create");
}

}  // namespace
}  // namespace cupcake::runtime

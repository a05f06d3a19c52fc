// The runtime under a real MPI launcher (mpirun -np 2 and 4, label mpi): every compressor and
// grouping against the reference over several iterations, fp32 exactly the MPI average, the
// C API on a communicator the job owns, a plan for another world size refused. With --die,
// rank 1 dies after setup and the job must end with a non-zero exit instead of hanging.
// Prints `runtime_mpi_test: rank 0: all N checks passed`; every failure line has FAIL.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cupcake/proto/plan_io.h"
#include "cupcake/runtime/cupcake.h"
#include "cupcake/runtime/session.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using testing::FillGradients;

struct Checks {
  int rank = 0;
  int count = 0;
  int failures = 0;
  void operator()(bool ok, const std::string& what) {
    ++count;
    if (ok) return;
    ++failures;
    std::fprintf(stderr, "runtime_mpi_test: rank %d: FAIL %s\n", rank, what.c_str());
  }
};

std::vector<std::vector<float>> Buffers(const pb::Model& m) {
  std::vector<std::vector<float>> grads;
  for (const auto& t : m.tensors()) grads.emplace_back(static_cast<size_t>(t.numel()), 0.0f);
  return grads;
}

void MatchesReference(MpiProcess& mpi, Checks& check, int rank, int world) {
  const pb::Model model = testing::SmallModel();
  for (std::string_view name : CompressorNames()) {
    for (const char* grouping : {"layerwise", "one_group", "planned"}) {
      const std::string what = std::string(name) + "/" + grouping;
      const testing::Grouping g = std::string(grouping) == "layerwise" ? testing::LayerWise(model)
                                  : std::string(grouping) == "one_group" ? testing::OneGroup(model)
                                                                         : testing::Planned();
      const pb::Plan plan = testing::MakePlan(model, g, std::string(name), world);
      auto comm = mpi.World();
      if (!comm.ok()) return check(false, comm.status().ToString());
      auto session = Session::Create(plan, std::move(comm).value());
      if (!session.ok()) return check(false, what + ": " + session.status().ToString());
      auto grads = Buffers(model);
      for (int i = 0; i < model.tensors_size(); ++i)
        check((*session)->Register(model.tensors(i).name(), grads[static_cast<size_t>(i)]).ok(), what + ": register");
      testing::Reference reference(plan, world);
      for (int it = 0; it < 3; ++it) {
        FillGradients(grads, rank, it);
        for (int i = 0; i < model.tensors_size(); ++i) check((*session)->GradientReady(i).ok(), what + ": ready");
        Status s = (*session)->Synchronize();
        check(s.ok(), what + ": synchronize: " + s.ToString());
        const std::string diff = testing::FirstDifference(grads, reference.Step(it));
        check(diff.empty(), what + ": iteration " + std::to_string(it) + ": " + diff);
      }
    }
  }
}

void Fp32IsTheMpiAverage(MpiProcess& mpi, Checks& check, int rank, int world) {
  const pb::Model model = testing::SmallModel();
  auto comm = mpi.World();
  if (!comm.ok()) return check(false, comm.status().ToString());
  auto session = Session::Create(testing::MakePlan(model, testing::Planned(), "fp32", world), std::move(comm).value());
  if (!session.ok()) return check(false, session.status().ToString());
  auto grads = Buffers(model);
  for (int i = 0; i < model.tensors_size(); ++i) check((*session)->Register(model.tensors(i).name(), grads[static_cast<size_t>(i)]).ok(), "register");
  FillGradients(grads, rank, 5);
  auto want = grads;
  for (auto& w : want) {
    MPI_Allreduce(MPI_IN_PLACE, w.data(), static_cast<int>(w.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (float& x : w) x /= static_cast<float>(world);
  }
  for (int i = 0; i < model.tensors_size(); ++i) check((*session)->GradientReady(i).ok(), "fp32: ready");
  check((*session)->Synchronize().ok(), "fp32: synchronize");
  check(grads == want, "fp32: not exactly the MPI average");
}

void CApiOnTheJobsCommunicator(Checks& check, int rank, int world, const std::string& dir) {
  const pb::Model model = testing::SmallModel();
  const pb::Plan plan = testing::MakePlan(model, testing::Planned(), "fp16", world);
  const std::string path = dir + "/plan-rank" + std::to_string(rank) + ".pb";
  check(WritePlanFile(path, plan).ok(), "write plan");
  MPI_Comm job = MPI_COMM_WORLD;
  cupcake_session* s = nullptr;
  if (cupcake_session_create_ex(path.c_str(), &job, "fp16", ModelFingerprint(model).c_str(), 30, &s) != CUPCAKE_OK)
    return check(false, std::string("cupcake_session_create: ") + cupcake_last_error());
  auto grads = Buffers(model);
  for (int i = 0; i < model.tensors_size(); ++i)
    check(cupcake_register(s, model.tensors(i).name().c_str(), grads[static_cast<size_t>(i)].data(),
                           model.tensors(i).numel()) == CUPCAKE_OK, std::string("c register: ") + cupcake_last_error());
  testing::Reference reference(plan, world);
  for (int it = 0; it < 2; ++it) {
    FillGradients(grads, rank, it);
    for (int i = 0; i < model.tensors_size(); ++i) check(cupcake_gradient_ready(s, i) == CUPCAKE_OK, "c ready");
    check(cupcake_synchronize(s) == CUPCAKE_OK, std::string("c synchronize: ") + cupcake_last_error());
    check(testing::FirstDifference(grads, reference.Step(it)).empty(), "c api fp16: differs from the reference");
  }
  cupcake_session_destroy(s);

  // A plan for another world size is refused with its message.
  const std::string other = dir + "/other-rank" + std::to_string(rank) + ".pb";
  check(WritePlanFile(other, testing::MakePlan(model, testing::Planned(), "fp16", world + 1)).ok(), "write plan");
  check(cupcake_session_create(other.c_str(), nullptr, &s) == CUPCAKE_INVALID_ARGUMENT, "other world size accepted");
  const std::string want = other + ": world_size: does not match the job; got " + std::to_string(world + 1) +
                           ", expected " + std::to_string(world) + " (ranks in the communicator)";
  check(cupcake_last_error() == want, std::string("message: ") + cupcake_last_error());
}

// Rank 1 dies after setup; the others must not hang: mpirun ends the job, or the Synchronize
// timeout fires and destroying the session aborts the job. Either way the exit is non-zero.
int DieTest(MpiProcess& mpi, int rank, int world) {
  const pb::Model model = testing::SmallModel();
  auto comm = mpi.World();
  SessionOptions options;
  options.ready_timeout_us = 10e6;
  auto session = Session::Create(testing::MakePlan(model, testing::OneGroup(model), "topk", world),
                                 std::move(comm).value(), options);
  if (!session.ok()) return 2;
  auto grads = Buffers(model);
  for (int i = 0; i < model.tensors_size(); ++i) (void)(*session)->Register(model.tensors(i).name(), grads[static_cast<size_t>(i)]);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) std::_Exit(3);
  for (int i = 0; i < model.tensors_size(); ++i) (void)(*session)->GradientReady(i);
  Status s = (*session)->Synchronize();
  std::fprintf(stderr, "runtime_mpi_test: rank %d: synchronize after a peer died: %s\n", rank, s.ToString().c_str());
  return 0;  // the job's exit must still be non-zero (the dead rank's, or MPI_Abort's)
}

}  // namespace
}  // namespace cupcake::runtime

int main(int argc, char** argv) {
  using namespace cupcake::runtime;
  auto mpi = InitMpi(&argc, &argv);
  if (!mpi.ok()) {
    std::fprintf(stderr, "runtime_mpi_test: FAIL %s\n", mpi.status().ToString().c_str());
    return 1;
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc > 2 && std::string(argv[2]) == "--die") return DieTest(**mpi, rank, world);
  const std::string dir = argc > 1 ? argv[1] : ".";
  std::filesystem::create_directories(dir);
  Checks check;
  check.rank = rank;
  MatchesReference(**mpi, check, rank, world);
  Fp32IsTheMpiAverage(**mpi, check, rank, world);
  CApiOnTheJobsCommunicator(check, rank, world, dir);
  int failures = 0;
  MPI_Allreduce(&check.failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && failures == 0) std::printf("runtime_mpi_test: rank 0: all %d checks passed\n", check.count);
  return failures == 0 ? 0 : 1;
}

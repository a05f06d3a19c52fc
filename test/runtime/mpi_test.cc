// The runtime under a real MPI launcher (mpirun -np 2 and 4, label mpi): every compressor and
// grouping against the reference over several iterations, zen groups equal to the allgather
// scheme, zen_sparse groups the exact mean of sparse gradients, fp32 exactly the MPI average, the C API on a
// communicator the job owns, a plan for another world size refused, checkpoint replicas in the
// idle gaps between a session's collectives. With --die, rank 1 dies after setup and the job
// must end with a non-zero exit instead of hanging. Prints `runtime_mpi_test: rank 0: all N checks passed`; every
// failure line has FAIL.
#include <mpi.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/proto/file_io.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/plan_io.h"
#include "cupcake/runtime/checkpoint.h"
#include "cupcake/runtime/cupcake.h"
#include "cupcake/runtime/recorder.h"
#include "cupcake/runtime/session.h"
#include "runtime_test_util.h"

namespace cupcake::runtime {
namespace {

using comm::InitMpi;
using comm::MpiProcess;

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

// Runs `plan` in a Session over MPI on `model`'s gradients in `layout` for three iterations:
// `fill(grads, it)` before each, `verify(grads, it)` on its averaged gradients after.
template <typename Fill, typename Verify>
void RunSessionSteps(MpiProcess& mpi, Checks& check, const pb::Plan& plan, const pb::Model& model,
                     testing::Layout layout, const std::string& what, Fill fill, Verify verify) {
  auto comm = mpi.World();
  if (!comm.ok()) return check(false, comm.status().ToString());
  auto session = Session::Create(plan, std::move(comm).value());
  if (!session.ok()) return check(false, what + ": " + session.status().ToString());
  testing::Gradients grads(model, layout);
  check(testing::RegisterAll(**session, model, grads).ok(), what + ": register");
  for (int it = 0; it < 3; ++it) {
    fill(grads, it);
    for (int i = 0; i < model.tensors_size(); ++i) check((*session)->GradientReady(i).ok(), what + ": ready");
    Status s = (*session)->Synchronize();
    check(s.ok(), what + ": synchronize: " + s.ToString());
    verify(grads, it);
  }
}

// The same with every rank's gradients FillGradients(rank, it), each step's result bit for bit
// `reference.Step(it)`.
template <typename Reference>
void RunAgainstReference(MpiProcess& mpi, Checks& check, const pb::Plan& plan, const pb::Model& model,
                         testing::Layout layout, const std::string& what, int rank, Reference& reference) {
  RunSessionSteps(
      mpi, check, plan, model, layout, what, [&](testing::Gradients& grads, int it) { FillGradients(grads, rank, it); },
      [&](const testing::Gradients& grads, int it) {
        const std::string diff = testing::FirstDifference(grads, reference.Step(it));
        check(diff.empty(), what + ": iteration " + std::to_string(it) + ": " + diff);
      });
}

void MatchesReference(MpiProcess& mpi, Checks& check, int rank, int world) {
  const pb::Model model = testing::SmallModel();
  for (std::string_view name : CompressorNames()) {
    for (const char* grouping : {"layerwise", "one_group", "planned"}) {
      for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
        const std::string what = std::string(name) + "/" + grouping + "/" + testing::LayoutName(layout);
        const testing::Grouping g = std::string(grouping) == "layerwise"   ? testing::LayerWise(model)
                                    : std::string(grouping) == "one_group" ? testing::OneGroup(model)
                                                                           : testing::Planned();
        const pb::Plan plan = testing::MakePlan(model, g, std::string(name), world);
        testing::Reference reference(plan, world);
        RunAgainstReference(mpi, check, plan, model, layout, what, rank, reference);
      }
    }
  }
}

// Hierarchical schemes (docs/MODEL.md, v2) with the ranks as 2 simulated hosts of world / 2
// ranks each (ranks r on node r / devices_per_node, as mpirun places them by slot): every rank
// ends with HierarchicalReference's result, bit for bit. Needs 2 nodes of >= 2 ranks (np 4).
void HierarchicalMatchesReference(MpiProcess& mpi, Checks& check, int rank, int world) {
  if (world < 4 || world % 2 != 0) return;
  const int devices = world / 2;
  // On real hosts (the testbed), ranks r of one node group r / devices must share a host: the
  // placement the runtime assumes (mpirun's by slot). One host for all is the simulated case.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  std::vector<char> names(static_cast<size_t>(world) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  auto host = [&](int r) { return std::string(names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME); };
  for (int r = 0; r < world; ++r)
    check(host(r) == host(r / devices * devices), "rank " + std::to_string(r) + " on " + host(r) +
                                                      ", its node group's first rank on " +
                                                      host(r / devices * devices) + " (ranks must be placed by slot)");
  if (rank == 0)
    std::fprintf(stderr, "runtime_mpi_test: hierarchical: ranks 0..%d on %s, %s\n", world - 1, host(0).c_str(),
                 host(world - 1).c_str());
  const pb::Model model = testing::SmallModel();
  const std::pair<const char*, const char*> cases[] = {
      {"fp32", "hier_fp32"}, {"efsignsgd", "hier_fp32"}, {"efsignsgd", "hier"}, {"topk", "hier"},
      {"randk", "hier"},     {"fp16", "hier"},           {"topk", "hier_fp16"}, {"onebit", "hier"}};
  for (auto [compressor, scheme] : cases) {
    for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
      const std::string what =
          std::string(compressor) + "/" + scheme + "/" + testing::LayoutName(layout) + " on 2 hosts";
      const pb::Plan plan =
          testing::WithScheme(testing::MakePlan(model, testing::Planned(), compressor, world), scheme, devices);
      testing::HierarchicalReference reference(plan, world, devices);
      RunAgainstReference(mpi, check, plan, model, layout, what, rank, reference);
    }
  }
}

// Zen groups (docs/ZEN.md) over MPI: the allgather scheme's means bit for bit (the reference
// of the same plan without the scheme; see ZenMatchesFlat in session_test.cc for why exactly).
void ZenMatchesFlat(MpiProcess& mpi, Checks& check, int rank, int world) {
  const pb::Model model = testing::SmallModel();
  for (const char* compressor : {"topk", "dgc"}) {
    for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
      const std::string what = std::string(compressor) + "/zen/" + testing::LayoutName(layout);
      const pb::Plan flat = testing::MakePlan(model, testing::Planned(), compressor, world);
      testing::Reference reference(flat, world);
      RunAgainstReference(mpi, check, testing::WithScheme(flat, "zen", 1), model, layout, what, rank, reference);
    }
  }
}

// zen_sparse over MPI: the exact mean of the ranks' naturally sparse gradients (session_test.cc's
// ZenSparseIsExact).
void ZenSparseIsExact(MpiProcess& mpi, Checks& check, int rank, int world) {
  const pb::Model model = testing::SparseModel();
  for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
    const std::string what = std::string("fp32/zen_sparse/") + testing::LayoutName(layout);
    RunSessionSteps(
        mpi, check, testing::WithScheme(testing::MakePlan(model, testing::Planned(), "fp32", world), "zen_sparse", 1),
        model, layout, what, [&](testing::Gradients& grads, int it) { testing::FillSparseGradients(grads, rank, it); },
        [&](const testing::Gradients& grads, int it) {
          const std::string diff = testing::FirstDifference(grads, testing::SparseMean(model, world, it));
          check(diff.empty(), what + ": iteration " + std::to_string(it) + ": " + diff);
        });
  }
}

// PowerSGD over MPI (runner_test.cc's PowerSgdRunner through a Session): within float rounding
// of the restatement over three steps, and bitwise equal on every rank (rank 0's result
// broadcast and compared).
void PowerSgdMatchesTheRestatement(MpiProcess& mpi, Checks& check, int rank, int world) {
  const pb::Model model = testing::ShapedModel();
  for (const char* scheme : {"powersgd", "powersgd_batched"}) {
    for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
      const std::string what = std::string(scheme) + "/" + testing::LayoutName(layout);
      const pb::Plan plan = testing::PowerSgdPlan(model, testing::Planned(), world, scheme);
      testing::PowerSgdReference reference(plan, world);
      RunSessionSteps(
          mpi, check, plan, model, layout, what,
          [&](testing::Gradients& grads, int it) { FillGradients(grads, rank, it); },
          [&](const testing::Gradients& grads, int it) {
            const std::string far = testing::FirstFarFrom(grads, reference.Step(it));
            check(far.empty(), what + ": iteration " + std::to_string(it) + ": " + far);
            std::vector<std::vector<float>> root;
            for (std::span<const float> g : grads) {
              root.emplace_back(g.begin(), g.end());
              MPI_Bcast(root.back().data(), static_cast<int>(g.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
            }
            const std::string diff = testing::FirstDifference(grads, root);
            check(diff.empty(), what + ": iteration " + std::to_string(it) + ": differs from rank 0: " + diff);
          });
    }
  }
}

// fp32 runs its allreduce in place (MPI_IN_PLACE) on the registered memory or a fusion buffer;
// the result is exactly MPI's average, for every grouping and layout.
void Fp32IsTheMpiAverage(MpiProcess& mpi, Checks& check, int rank, int world) {
  const pb::Model model = testing::SmallModel();
  for (const testing::Grouping& grouping : {testing::Planned(), testing::OneGroup(model), testing::LayerWise(model)}) {
    for (testing::Layout layout : {testing::Layout::kSeparate, testing::Layout::kFlat}) {
      const std::string what = "fp32/" + std::to_string(grouping.size()) + " groups/" + testing::LayoutName(layout);
      auto comm = mpi.World();
      if (!comm.ok()) return check(false, comm.status().ToString());
      auto session = Session::Create(testing::MakePlan(model, grouping, "fp32", world), std::move(comm).value());
      if (!session.ok()) return check(false, session.status().ToString());
      testing::Gradients grads(model, layout);
      check(testing::RegisterAll(**session, model, grads).ok(), what + ": register");
      FillGradients(grads, rank, 5);
      std::vector<std::vector<float>> want;
      for (std::span<float> g : grads) {
        want.emplace_back(g.begin(), g.end());
        MPI_Allreduce(MPI_IN_PLACE, want.back().data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        for (float& x : want.back()) x /= static_cast<float>(world);
      }
      for (int i = 0; i < model.tensors_size(); ++i) check((*session)->GradientReady(i).ok(), what + ": ready");
      check((*session)->Synchronize().ok(), what + ": synchronize");
      const std::string diff = testing::FirstDifference(grads, want);
      check(diff.empty(), what + ": not exactly the MPI average: " + diff);
    }
  }
}

void CApiOnTheJobsCommunicator(Checks& check, int rank, int world, const std::string& dir) {
  const pb::Model model = testing::SmallModel();
  const pb::Plan plan = testing::MakePlan(model, testing::Planned(), "fp16", world);
  const std::string path = dir + "/plan-rank" + std::to_string(rank) + ".pb";
  check(WritePlanFile(path, plan).ok(), "write plan");
  MPI_Comm job = MPI_COMM_WORLD;
  cupcake_session* s = nullptr;
  const std::string fingerprint = ModelFingerprint(model);
  cupcake_session_options options{};
  options.mpi_comm = &job;
  options.compressor = "fp16";
  options.model_fingerprint = fingerprint.c_str();
  options.ready_timeout_us = 30e6;
  if (cupcake_session_create_with_options(path.c_str(), &options, &s) != CUPCAKE_OK)
    return check(false, std::string("cupcake_session_create_with_options: ") + cupcake_last_error());
  testing::Gradients grads(model, testing::Layout::kSeparate);
  for (int i = 0; i < model.tensors_size(); ++i)
    check(cupcake_session_register(s, model.tensors(i).name().c_str(), grads[static_cast<size_t>(i)].data(),
                                   model.tensors(i).numel()) == CUPCAKE_OK,
          std::string("c register: ") + cupcake_last_error());
  testing::Reference reference(plan, world);
  for (int it = 0; it < 2; ++it) {
    FillGradients(grads, rank, it);
    for (int i = 0; i < model.tensors_size(); ++i) check(cupcake_session_gradient_ready(s, i) == CUPCAKE_OK, "c ready");
    check(cupcake_session_synchronize(s) == CUPCAKE_OK, std::string("c synchronize: ") + cupcake_last_error());
    check(testing::FirstDifference(grads, reference.Step(it)).empty(), "c api fp16: differs from the reference");
  }
  cupcake_session_destroy(s);

  // A plan for another world size, one file read by every rank, is refused with its message.
  const std::string other = dir + "/other-world-size.pb";
  if (rank == 0)
    check(WritePlanFile(other, testing::MakePlan(model, testing::Planned(), "fp16", world + 1)).ok(), "write plan");
  MPI_Barrier(MPI_COMM_WORLD);
  check(cupcake_session_create_with_options(other.c_str(), nullptr, &s) == CUPCAKE_INVALID_ARGUMENT,
        "other world size accepted");
  const std::string want = other + ": world_size: does not match the job; got " + std::to_string(world + 1) +
                           ", expected " + std::to_string(world) + " (ranks in the communicator)";
  check(cupcake_last_error() == want, std::string("message: ") + cupcake_last_error());
  // Every rank found it alike (the same file, the same message): rank 0 prints it, the others
  // stay quiet.
  check(cupcake_last_error_reporter() == 0,
        "other world size: reporter " + std::to_string(cupcake_last_error_reporter()) + ", expected 0");
  check(cupcake_last_error_printed_by(rank) == (rank == 0 ? 1 : 0),
        "other world size: printed by rank " + std::to_string(rank) + ": " +
            std::to_string(cupcake_last_error_printed_by(rank)) + ", expected " + (rank == 0 ? "1" : "0"));
  // A rank's own failure: every rank that gets it prints it.
  check(cupcake_session_synchronize(nullptr) == CUPCAKE_INVALID_ARGUMENT, "synchronize(NULL) accepted");
  check(cupcake_last_error_reporter() == CUPCAKE_ANY_RANK && cupcake_last_error_printed_by(rank) == 1,
        "synchronize(NULL): expected reporter CUPCAKE_ANY_RANK, printed by rank " + std::to_string(rank));
}

// Ranks given different plans (rank 0 one, the others another) fail at Create, every rank with
// the same message naming both plans' fingerprints and files, before any collective of a step
// could exchange payloads of different shapes. A rank whose own plan is invalid fails with its
// own message, and the others are told which rank stopped.
void DifferentPlansFailEveryRank(MpiProcess& mpi, Checks& check, int rank, int world, const std::string& dir) {
  const pb::Model model = testing::SmallModel();
  const pb::Plan topk = testing::MakePlan(model, testing::Planned(), "topk", world);
  pb::Plan other_seed = testing::MakePlan(model, testing::Planned(), "randk", world);
  other_seed.mutable_compressor()->set_seed(43);
  const struct {
    const char* what;
    pb::Plan a, b;
  } cases[] = {
      {"topk at another ratio", topk, testing::MakePlan(model, testing::Planned(), "topk", world, 0.1)},
      {"topk against layer-wise", topk, testing::MakePlan(model, testing::LayerWise(model), "topk", world)},
      {"topk against one group", topk, testing::MakePlan(model, testing::OneGroup(model), "topk", world)},
      {"topk against fp32", topk, testing::MakePlan(model, testing::Planned(), "fp32", world)},
      {"topk against an options plan", topk, testing::WithScheme(topk, "zen", 1)},
      {"randk with two seeds", testing::MakePlan(model, testing::Planned(), "randk", world), other_seed},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string a = dir + "/mismatch" + std::to_string(n) + "-a.pb";
    const std::string b = dir + "/mismatch" + std::to_string(n++) + "-b-rank" + std::to_string(rank) + ".pb";
    const std::string mine = rank == 0 ? a : b;
    check(WritePlanFile(mine, rank == 0 ? c.a : c.b).ok(), "write plan");
    auto comm = mpi.World();
    if (!comm.ok()) return check(false, comm.status().ToString());
    auto session = Session::Create(mine, std::move(comm).value());
    const std::string m = session.ok() ? "" : session.status().message();
    const std::string others = world == 2 ? "rank 1" : "ranks 1-" + std::to_string(world - 1);
    const std::string want = mine +
                             ": the ranks run different plans; expected one plan on every rank:\n  rank 0: plan " +
                             PlanFingerprint(c.a) + " (" + a + ")\n  " + others + ": plan " + PlanFingerprint(c.b) +
                             " (" + dir + "/mismatch" + std::to_string(n - 1) + "-b-rank1.pb)";
    check(!session.ok() && session.status().code() == StatusCode::kInvalidArgument && m == want,
          std::string(c.what) + ": got '" + m + "', expected '" + want + "'");
  }
  // Rank 1's plan is for another world size: rank 1 says so, every other rank names rank 1.
  const std::string path = dir + "/invalid-rank" + std::to_string(rank) + ".pb";
  check(WritePlanFile(path, testing::MakePlan(model, testing::Planned(), "topk", rank == 1 ? world + 1 : world)).ok(),
        "write plan");
  auto comm = mpi.World();
  if (!comm.ok()) return check(false, comm.status().ToString());
  auto session = Session::Create(path, std::move(comm).value());
  const std::string m = session.ok() ? "" : session.status().message();
  const std::string want = rank == 1 ? path + ": world_size: does not match the job; got " + std::to_string(world + 1) +
                                           ", expected " + std::to_string(world) + " (ranks in the communicator)"
                                     : path + ": other ranks could not use their plan: rank 1 (" + dir +
                                           "/invalid-rank1.pb); every rank stops (each of those ranks reports why)";
  check(m == want, "invalid plan on rank 1: got '" + m + "', expected '" + want + "'");
}

// Record mode across ranks: each rank records its own gaps; after MergeRanks every rank holds the
// slowest rank's ready time per tensor, and the C API's merge writes the same file on every rank.
class ListClock final : public Clock {
 public:
  explicit ListClock(std::vector<double> times) : times_(std::move(times)) {}
  double NowUs() override { return next_ < times_.size() ? times_[next_++] : times_.back(); }

 private:
  std::vector<double> times_;
  size_t next_ = 0;
};

void RecorderMergesRanks(MpiProcess& mpi, Checks& check, int rank, int world, const std::string& dir) {
  // Rank r's gaps: {1 + r, 10 * (world - r), 5}; ready times 1+r, 1+r+10(world-r), +5.
  auto gaps = [&](int r) { return std::vector<double>{1.0 + r, 10.0 * (world - r), 5.0}; };
  std::vector<double> ready(3, 0.0);
  for (int r = 0; r < world; ++r) {
    double t = 0;
    for (size_t i = 0; i < 3; ++i) ready[i] = std::max(ready[i], t += gaps(r)[i]);
  }
  const std::vector<double> want = {ready[0], ready[1] - ready[0], ready[2] - ready[1]};
  std::vector<double> times = {0};
  for (double g : gaps(rank)) times.push_back(times.back() + g);
  ListClock clock(times);
  RecorderOptions options;
  options.clock = &clock;
  auto rec = std::move(Recorder::Create("merged", options)).value();
  for (const char* name : {"c", "b", "a"}) check(rec->Register(name, 8).ok(), "recorder register");
  check(rec->BeginBackward().ok(), "recorder begin");
  for (int i = 0; i < 3; ++i) check(rec->GradientReady(i).ok(), "recorder ready");
  auto comm = mpi.World();
  if (!comm.ok()) return check(false, comm.status().ToString());
  Status s = rec->MergeRanks(**comm);
  check(s.ok(), "MergeRanks: " + s.ToString());
  auto merged = rec->BackwardUs();
  check(merged.ok() && *merged == want, "MergeRanks: not the slowest rank's ready times");

  // The C API on MPI_COMM_WORLD with a steady clock: every rank writes the same model.
  cupcake_recorder* c = nullptr;
  check(cupcake_recorder_create("capi", &c) == CUPCAKE_OK, "c recorder create");
  check(cupcake_recorder_register(c, "w", 4) == CUPCAKE_OK, "c recorder register");
  check(cupcake_recorder_begin_backward(c) == CUPCAKE_OK, "c recorder begin");
  check(cupcake_recorder_gradient_ready(c, 0) == CUPCAKE_OK, "c recorder ready");
  check(cupcake_recorder_merge(c, nullptr) == CUPCAKE_OK, std::string("c recorder merge: ") + cupcake_last_error());
  const std::string path = dir + "/recorded-rank" + std::to_string(rank) + ".json";
  check(cupcake_recorder_write(c, path.c_str()) == CUPCAKE_OK, "c recorder write");
  cupcake_recorder_destroy(c);
  MPI_Barrier(MPI_COMM_WORLD);
  auto mine = ReadFile(path), rank0 = ReadFile(dir + "/recorded-rank0.json");
  check(mine.ok() && rank0.ok() && *mine == *rank0, "c recorder merge: ranks wrote different models");
  check(mine.ok() && mine->find("slowest of " + std::to_string(world) + " ranks") != std::string::npos,
        "c recorder merge: source does not say it was merged");
}

// Rank 1 dies after setup; the others must not hang: mpirun ends the job, or the Synchronize
// timeout fires and destroying the session aborts the job. Either way the exit is non-zero.
// Each step prints a line that test/runtime/expect_rank_dies.sh requires, so a job that fails
// in setup (and so also exits non-zero) does not pass for one that lost a rank.
int DieTest(MpiProcess& mpi, int rank, int world) {
  const pb::Model model = testing::SmallModel();
  auto comm = mpi.World();
  if (!comm.ok()) {
    std::fprintf(stderr, "runtime_mpi_test: FAIL rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 2;
  }
  SessionOptions options;
  options.ready_timeout_us = 10e6;
  auto session = Session::Create(testing::MakePlan(model, testing::OneGroup(model), "topk", world),
                                 std::move(comm).value(), options);
  if (!session.ok()) {
    std::fprintf(stderr, "runtime_mpi_test: FAIL rank %d: %s\n", rank, session.status().ToString().c_str());
    return 2;
  }
  testing::Gradients grads(model, testing::Layout::kSeparate);
  if (Status s = testing::RegisterAll(**session, model, grads); !s.ok()) {
    std::fprintf(stderr, "runtime_mpi_test: FAIL rank %d: %s\n", rank, s.ToString().c_str());
    return 2;
  }
  std::fprintf(stderr, "runtime_mpi_test: rank %d: session set up\n", rank);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 1) {
    std::fprintf(stderr, "runtime_mpi_test: rank 1: exiting with 3\n");
    std::_Exit(3);
  }
  for (int i = 0; i < model.tensors_size(); ++i) (void)(*session)->GradientReady(i);
  Status s = (*session)->Synchronize();
  std::fprintf(stderr, "runtime_mpi_test: rank %d: synchronize after a peer died: %s\n", rank, s.ToString().c_str());
  return 0;  // the job's exit must still be non-zero (the dead rank's, or MPI_Abort's)
}

// Checkpoint replicas in the idle gaps between a gated session's collectives over MPI (the
// session's communication thread and the checkpointer's exchange thread beside the job's): the
// job of runtime_checkpoint_test's ReplicaInTheGapsBetweenCollectivesCompletesInFewerCommits, a
// topk session (SmallModel, Planned(): 3 groups) and 1000 shared floats, 300 bytes in each of
// its 4 gaps, so each rank's replica (1922 bytes) completes every 2 commits. After commits 1..8
// every exchange was requested with no session collective in flight (gap -1 and 3 gaps per step from
// the second: 8 + 7 x 3); a restart whose rank 1 lost its segments restores step 5 (the newest
// step whose replicas are complete) on every rank, rank 1 from its successor's replica and shared
// entries, the weights bitwise.
void ReplicasInTheGapsOverMpi(MpiProcess& mpi, Checks& check, int rank, int world) {
  const pb::Model model = testing::SmallModel();
  const pb::Plan plan = testing::MakePlan(model, testing::Planned(), "topk", world);
  int pid = static_cast<int>(::getpid());
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  const std::string name = "mpi-gaps-" + std::to_string(pid);
  auto gate = std::make_shared<NetworkGate>();
  auto world_comm = mpi.World();
  if (!world_comm.ok()) return check(false, world_comm.status().ToString());
  auto session = Session::Create(plan, GateCommunicator(gate, std::move(world_comm).value()));
  if (!session.ok()) return check(false, "gaps: " + session.status().ToString());
  Session& s = **session;
  testing::Gradients grads(model, testing::Layout::kSeparate);
  check(testing::RegisterAll(s, model, grads).ok(), "gaps: register");
  std::vector<float> weights(1000);
  CheckpointOptions options;
  options.name = name;
  options.replicate = true;
  options.replica_gaps = {{-1, 300}, {0, 300}, {1, 300}, {2, 300}};
  options.gate = gate;
  for (int run = 0; run < 2; ++run) {
    auto comm = mpi.World();
    if (!comm.ok()) return check(false, comm.status().ToString());
    auto made = Checkpointer::Create(options, comm->get());
    if (!made.ok()) return check(false, "gaps: " + made.status().ToString());
    Checkpointer& ckpt = **made;
    check(ckpt.AddFloats("weights", weights, Capture::kInBackground, Scope::kShared).ok(), "gaps: add");
    check(ckpt.AttachSession(&s).ok(), "gaps: attach");
    auto point = ckpt.Restore();
    if (!point.ok()) return check(false, "gaps: restore: " + point.status().ToString());
    if (run == 1) {
      check(point->step == 5, "gaps: restored step " + std::to_string(point->step) + ", expected 5");
      check(weights == std::vector<float>(weights.size(), 5.0f), "gaps: restored weights are not step 5's");
      const int holder = (1 + 1) % world;
      const std::string from = "rank " + std::to_string(holder) + "'s /dev/shm" +
                               Checkpointer::ReplicaOfSegmentName(name, holder, 1) + ", its shared entries from rank " +
                               std::to_string(holder);
      if (rank == 1) check(point->source == from, "gaps: rank 1 restored from " + point->source + ", expected " + from);
      break;
    }
    for (int it = 0; it < 8; ++it) {
      FillGradients(grads, rank, it);
      // The gaps after groups idle from the first Commit on (it > 0): each group waits for them.
      check(testing::ReadyGroupByGroup(s, plan, it > 0 ? &ckpt : nullptr, [](int) { return true; }).ok(),
            "gaps: ready");
      check(s.Synchronize().ok(), "gaps: synchronize");
      check(ckpt.WaitForCopy().ok(), "gaps: wait");
      std::fill(weights.begin(), weights.end(), static_cast<float>(it + 1));
      Status committed = ckpt.Commit(it + 1);
      check(committed.ok(), "gaps: commit: " + committed.ToString());
    }
    check(ckpt.WaitForCopy().ok(), "gaps: wait");
    // One exchange per Commit and per gap while a stream has bytes left: not in iteration 1's three
    // gaps (Commit 1's streams are empty) nor in the last gap of iterations 3, 5 and 7 (the stream
    // ended in the gap before), as in checkpoint_test's ReplicaInTheGapsBetweenCollectives...
    check(gate->transfers() == 8 + 7 * 3 - 6, "gaps: transfers " + std::to_string(gate->transfers()) + ", expected 23");
    check(gate->transfers_during_collectives() == 0,
          "gaps: transfers during collectives: " + std::to_string(gate->transfers_during_collectives()));
    made->reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) check(Checkpointer::RemoveSegment(name, 1).ok(), "gaps: remove rank 1's segments");
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  check(Checkpointer::RemoveSegment(name, rank).ok(), "gaps: remove segments");
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
  HierarchicalMatchesReference(**mpi, check, rank, world);
  ZenMatchesFlat(**mpi, check, rank, world);
  ZenSparseIsExact(**mpi, check, rank, world);
  PowerSgdMatchesTheRestatement(**mpi, check, rank, world);
  Fp32IsTheMpiAverage(**mpi, check, rank, world);
  CApiOnTheJobsCommunicator(check, rank, world, dir);
  DifferentPlansFailEveryRank(**mpi, check, rank, world, dir);
  RecorderMergesRanks(**mpi, check, rank, world, dir);
  ReplicasInTheGapsOverMpi(**mpi, check, rank, world);
  int failures = 0;
  MPI_Allreduce(&check.failures, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0 && failures == 0) std::printf("runtime_mpi_test: rank 0: all %d checks passed\n", check.count);
  return failures == 0 ? 0 : 1;
}

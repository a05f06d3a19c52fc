// runtime_bench: per-iteration time of the runtime (cupcake::runtime::Session over MPI) against
// a plain MPI_Allreduce of the same fp32 gradients, and of compressed plans against the
// planner's prediction (issue 6; results and method in docs/RUNTIME_BENCH.md).
//
// Method (every rank runs the same steps in the same order):
//   1. Untimed: fill the gradients with small integers that depend on rank, iteration and
//      element (sums over ranks and the divide by W = 2 are exact in float32).
//   2. MPI_Barrier, then time one iteration on the steady clock:
//        baseline: MPI_Allreduce(MPI_IN_PLACE, SUM) over one contiguous buffer holding every
//                  gradient, then the divide by W (the work the runtime does for fp32); also
//                  the same out of place, for reference;
//        runtime:  [backward gap of tensor i] GradientReady(i) for every tensor in plan order,
//                  then Synchronize(). The gradients are registered as slices of one flat
//                  buffer (as frameworks keep them); the fp32 one-group plan also runs on
//                  separate buffers, one per tensor.
//   3. The iteration's time is the slowest rank's (MPI_Allreduce MAX, after the timed part).
//   `warmup` untimed iterations, then `iters` timed ones; median, mean and min over them. Rows
//   compared with each other run interleaved, one iteration of each in turn, so that they see
//   the same load on a shared machine.
// Backward gaps (--backward): none (only the synchronization is timed), busy (spin backward_us
// of the model on the calling thread: backward on this CPU), sleep (sleep through it, spinning
// only the last 200 us: backward on a device while the host thread waits).
// Check column: "exact" when every timed iteration's result equals the in-place baseline's
// bitwise (fp32); for compressed plans "ranks agree" when every rank holds bitwise the same
// gradients after the last iteration (the averaged result must be the same everywhere).
// Predicted column (with --profile): the planner's model (docs/MODEL.md) evaluated for the
// row's groups on that profile, minus forward_us and update_us (the runtime times only
// backward + synchronization), with the backward gaps the row ran with (0 or the model's).
//
// Usage: mpirun -np 2 runtime_bench [--model M.json] [--profile DB] [--plan P.pb]...
//                                   [--warmup W] [--iters I] [--backward none|busy|sleep|all]
// Each --plan adds two rows per backward mode: its layer-wise variant (one group per tensor,
// same compressor and options, built here) and the plan as given.
#include <mpi.h>

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_plans.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/cupcake.pb.h"
#include "cupcake/planner/cost_model.h"
#include "cupcake/planner/planner.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/fingerprint.h"
#include "cupcake/proto/plan_io.h"
#include "cupcake/runtime/session.h"

#ifndef CUPCAKE_SOURCE_DIR
#define CUPCAKE_SOURCE_DIR "."
#endif

namespace {

using cupcake::pb::Model;
using cupcake::pb::Plan;
namespace rt = cupcake::runtime;
using cupcake::bench::NowUs;
using cupcake::bench::Stats;
using cupcake::bench::Summarize;
namespace planner = cupcake::planner;

// Spins until `us` microseconds have passed on the steady clock (a backward gap that keeps the
// core busy, as backward kernels would on a CPU-only job).
void BusyWaitUs(double us) {
  if (us <= 0) return;
  const double end = NowUs() + us;
  while (NowUs() < end) {
  }
}

// Sleeps through a backward gap (as a GPU job's host thread waits on the device, leaving the
// core to the communication thread), spinning only the last 200 us for precision.
void SleepThenSpinUs(double us) {
  if (us <= 0) return;
  const double end = NowUs() + us;
  if (us > 200) std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(us - 200)));
  while (NowUs() < end) {
  }
}

struct Options {
  std::string model = std::string(CUPCAKE_SOURCE_DIR) + "/examples/models/resnet50.json";
  std::string profile;
  std::vector<std::string> plans;
  int warmup = 3;
  int iters = 20;
  std::string backward = "all";
};

[[noreturn]] void Die(int rank, const std::string& message, int code = 1) {
  if (rank == 0) std::fprintf(stderr, "runtime_bench: %s\n", message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

// Gradient values: small integers in [-8, 8], a pattern per rank shifted by the iteration.
class Filler {
 public:
  Filler(int rank, int64_t n) : base_(static_cast<size_t>(n)) {
    for (int64_t j = 0; j < n; ++j)
      base_[static_cast<size_t>(j)] = static_cast<uint8_t>((rank * 7 + j * 3 + (j * j) % 11) % 17);
  }
  void Fill(std::vector<float>& out, int iteration) const {
    const int shift = (iteration * 13) % 17;
    for (size_t j = 0; j < base_.size(); ++j) out[j] = static_cast<float>((base_[j] + shift) % 17 - 8);
  }

 private:
  std::vector<uint8_t> base_;
};

uint64_t Hash(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

bool RanksAgree(uint64_t hash) {
  unsigned long long lo = hash, hi = hash;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

double SlowestRank(double us) {
  MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return us;
}

// The model's prediction of backward + synchronization for `plan`'s groups on `profile`,
// with the model's backward gaps or with none. Negative when it cannot be priced.
double PredictSyncUs(const Plan& plan, const cupcake::pb::Profile& profile, bool with_backward, std::string* why) {
  Model model = plan.model().model();
  if (!with_backward)
    for (auto& t : *model.mutable_tensors()) t.set_backward_us(0);
  // Simulate: the plan's groups with each group's option (docs/MODEL.md, v2; v1 plans as before).
  auto t = planner::Simulate(plan, model, profile);
  if (!t.ok()) {
    *why = t.status().message();
    return -1;
  }
  return t->iteration_us - model.forward_us() - model.update_us();
}

struct Row {
  std::string name;
  int groups = 0;
  std::string backward;
  Stats stats;
  double predicted_us = -1;
  std::string check;
};

}  // namespace

int main(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  auto mpi_or = cupcake::comm::InitMpi(&argc, &argv);
  if (!mpi_or.ok()) {
    std::fprintf(stderr, "runtime_bench: %s\n", mpi_or.status().message().c_str());
    return 1;
  }
  std::unique_ptr<cupcake::comm::MpiProcess> mpi = std::move(mpi_or).value();
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die(rank, flag + ": missing value", 2);
    const std::string value = argv[++i];
    if (flag == "--model")
      o.model = value;
    else if (flag == "--profile")
      o.profile = value;
    else if (flag == "--plan")
      o.plans.push_back(value);
    else if (flag == "--warmup")
      o.warmup = std::atoi(value.c_str());
    else if (flag == "--iters")
      o.iters = std::atoi(value.c_str());
    else if (flag == "--backward")
      o.backward = value;
    else
      Die(rank, "unknown flag " + flag + "; expected --model, --profile, --plan, --warmup, --iters, --backward", 2);
  }
  if (o.warmup < 0 || o.iters < 1)
    Die(rank,
        "--warmup/--iters: got " + std::to_string(o.warmup) + "/" + std::to_string(o.iters) + ", expected >= 0 / >= 1",
        2);
  if (o.backward != "none" && o.backward != "busy" && o.backward != "sleep" && o.backward != "all")
    Die(rank, "--backward: got '" + o.backward + "', expected none, busy, sleep or all", 2);

  auto model_or = cupcake::profile::LoadModelFile(o.model);
  if (!model_or.ok()) Die(rank, model_or.status().message());
  const Model model = *model_or;
  std::vector<Plan> plans;
  for (const std::string& p : o.plans) {
    auto plan = cupcake::ReadPlanFile(p);
    if (!plan.ok()) Die(rank, plan.status().message());
    if (plan->model().fingerprint() != cupcake::ModelFingerprint(model))
      Die(rank, p + ": model: not the benchmarked model; got '" + plan->model().model().name() + "', expected '" +
                    model.name() + "' (" + o.model + ")");
    plans.push_back(*plan);
  }
  cupcake::pb::Profile profile;
  if (!o.profile.empty()) {
    auto p = cupcake::profile::LoadProfileFile(o.profile);
    if (!p.ok()) Die(rank, p.status().message());
    profile = *p;
  }

  // Gradient layout: tensor i at offsets[i] of one contiguous buffer (the same layout for the
  // baseline and the runtime, so results compare with one memcmp).
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& t : model.tensors()) {
    offsets.push_back(total);
    total += t.numel();
  }
  const Filler filler(rank, total);
  std::vector<float> base(static_cast<size_t>(total)), grads(static_cast<size_t>(total));
  const float fworld = static_cast<float>(world);

  if (rank == 0) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    std::string l(lib, static_cast<size_t>(len));
    l = l.substr(0, l.find_first_of(",\n"));
    std::printf("# runtime_bench: %s\n", command.c_str());
    std::printf("# %d ranks, %s; model %s: %d tensors, %" PRId64 " float32 elements (%.1f MiB)\n", world, l.c_str(),
                model.name().c_str(), model.tensors_size(), total, 4.0 * static_cast<double>(total) / (1 << 20));
    std::printf(
        "# warmup %d, iters %d; time per iteration = slowest rank's, from the barrier's exit to the end of "
        "the step\n",
        o.warmup, o.iters);
    if (!o.profile.empty())
      std::printf("# predicted: docs/MODEL.md on %s, minus forward_us and update_us\n", o.profile.c_str());
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  std::string paired;

  // Makes a session for `plan` over a fresh duplicate of MPI_COMM_WORLD, `grads` registered.
  auto make_session = [&](const std::string& name, const Plan& plan) {
    auto comm = mpi->World();
    if (!comm.ok()) Die(rank, comm.status().message());
    auto session_or = rt::Session::Create(plan, std::move(comm).value());
    if (!session_or.ok()) Die(rank, name + ": " + session_or.status().message());
    std::unique_ptr<rt::Session> session = std::move(session_or).value();
    for (int i = 0; i < model.tensors_size(); ++i) {
      cupcake::Status s =
          session->Register(model.tensors(i).name(), std::span<float>(grads.data() + offsets[static_cast<size_t>(i)],
                                                                      static_cast<size_t>(model.tensors(i).numel())));
      if (!s.ok()) Die(rank, name + ": " + s.message());
    }
    return session;
  };
  // One timed step of `session` (fill untimed), backward gaps per `mode`; the slowest rank's us.
  auto step = [&](const std::string& name, rt::Session& session, const std::string& mode, int it) {
    filler.Fill(grads, it);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = NowUs();
    for (int i = 0; i < model.tensors_size(); ++i) {
      const double b = mode == "none" ? 0.0 : model.tensors(i).backward_us();
      if (mode == "busy") BusyWaitUs(b);
      if (mode == "sleep") SleepThenSpinUs(b);
      cupcake::Status s = session.GradientReady(i);
      if (!s.ok()) Die(rank, name + ": " + s.message());
    }
    cupcake::Status s = session.Synchronize();
    if (!s.ok()) Die(rank, name + ": " + s.message());
    return SlowestRank(NowUs() - t0);
  };
  auto predict = [&](Row& r, const Plan& plan) {
    if (o.profile.empty()) return;
    std::string why;
    r.predicted_us = PredictSyncUs(plan, profile, r.backward != "none", &why);
    if (r.predicted_us < 0 && rank == 0)
      std::fprintf(stderr, "runtime_bench: %s: no prediction: %s\n", r.name.c_str(), why.c_str());
  };

  // (a) + (b), interleaved per iteration so that all of them see the same load on a shared
  // machine: the baseline (one in-place MPI_Allreduce over all gradients, then the divide by W),
  // the same out of place (send buffer -> receive buffer, divided back into the gradients), and
  // the runtime with an fp32 one-group plan, no backward gaps, twice: the gradients registered
  // as slices of one flat buffer (as LibTorch and other frameworks keep them: the session works
  // on them in place) and as separate buffers (the session packs them into a fusion buffer and
  // unpacks). Every timed iteration's runtime result is compared with the baseline's.
  {
    const Plan fp32 = cupcake::bench::PlanFor(model, world, cupcake::pb::CPU, "fp32", cupcake::bench::OneGroup(model));
    std::unique_ptr<rt::Session> session = make_session("runtime fp32 one_group, flat", fp32);
    std::vector<std::vector<float>> separate;
    for (const auto& t : model.tensors()) separate.emplace_back(static_cast<size_t>(t.numel()));
    std::unique_ptr<rt::Session> session_separate;
    {
      auto comm = mpi->World();
      if (!comm.ok()) Die(rank, comm.status().message());
      auto s = rt::Session::Create(fp32, std::move(comm).value());
      if (!s.ok()) Die(rank, "runtime fp32 one_group, separate: " + s.status().message());
      session_separate = std::move(s).value();
      for (int i = 0; i < model.tensors_size(); ++i) {
        cupcake::Status st = session_separate->Register(model.tensors(i).name(), separate[static_cast<size_t>(i)]);
        if (!st.ok()) Die(rank, "runtime fp32 one_group, separate: " + st.message());
      }
    }
    std::vector<float> recv(static_cast<size_t>(total));
    std::vector<double> t_in, t_out, t_rt, t_sep;
    bool exact = true;
    auto same_as_base = [&] { return std::memcmp(base.data(), grads.data(), base.size() * sizeof(float)) == 0; };
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      filler.Fill(base, it);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = NowUs();
      MPI_Allreduce(MPI_IN_PLACE, base.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      for (float& f : base) f /= fworld;
      const double in_place = SlowestRank(NowUs() - t0);

      filler.Fill(grads, it);
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = NowUs();
      MPI_Allreduce(grads.data(), recv.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      for (size_t j = 0; j < recv.size(); ++j) grads[j] = recv[j] / fworld;
      const double out_of_place = SlowestRank(NowUs() - t0);
      exact = exact && same_as_base();

      const double runtime = step("runtime fp32 one_group, flat", *session, "none", it);
      exact = exact && same_as_base();

      // Separate buffers: filled from the flat pattern and gathered back for the check, untimed.
      filler.Fill(grads, it);
      for (size_t i = 0; i < separate.size(); ++i)
        std::memcpy(separate[i].data(), grads.data() + offsets[i], separate[i].size() * sizeof(float));
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = NowUs();
      for (int i = 0; i < model.tensors_size(); ++i)
        if (cupcake::Status s = session_separate->GradientReady(i); !s.ok()) Die(rank, s.message());
      if (cupcake::Status s = session_separate->Synchronize(); !s.ok()) Die(rank, s.message());
      const double runtime_separate = SlowestRank(NowUs() - t0);
      for (size_t i = 0; i < separate.size(); ++i)
        std::memcpy(grads.data() + offsets[i], separate[i].data(), separate[i].size() * sizeof(float));
      exact = exact && same_as_base();
      if (it >= o.warmup) {
        t_in.push_back(in_place);
        t_out.push_back(out_of_place);
        t_rt.push_back(runtime);
        t_sep.push_back(runtime_separate);
      }
    }
    int ok = exact ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    const std::string check = ok ? "exact" : "WRONG";
    rows.push_back(Row{"mpi_allreduce in place (baseline)", 1, "none", Summarize(t_in), -1, "reference"});
    rows.push_back(Row{"mpi_allreduce out of place", 1, "none", Summarize(t_out), -1, check});
    rows.push_back(Row{"runtime fp32 one_group, flat buffer", 1, "none", Summarize(t_rt), -1, check});
    rows.push_back(Row{"runtime fp32 one_group, separate buffers", 1, "none", Summarize(t_sep), -1, check});
    for (Row& r : rows) predict(r, fp32);
    // Paired: the rows ran interleaved, so the per-iteration ratio cancels slow load drift.
    auto paired_ratio = [&](const std::vector<double>& t) {
      std::vector<double> ratio;
      for (size_t i = 0; i < t_in.size(); ++i) ratio.push_back(t[i] / t_in[i]);
      return std::to_string(Summarize(ratio).median_us).substr(0, 5);
    };
    auto min_ratio = [&](const std::vector<double>& t) {
      return std::to_string(Summarize(t).min_us / Summarize(t_in).min_us).substr(0, 5);
    };
    paired = "# paired (median over iterations of row / baseline): runtime fp32 one_group flat " + paired_ratio(t_rt) +
             ", separate " + paired_ratio(t_sep) + ", out of place " + paired_ratio(t_out) +
             "; min / baseline's min: flat " + min_ratio(t_rt) + ", separate " + min_ratio(t_sep);
  }

  // (c) Per plan and backward mode: its layer-wise variant and the plan, interleaved per
  // iteration. Check: every rank holds bitwise the same result after the last iteration.
  for (size_t p = 0; p < plans.size(); ++p) {
    const Plan& plan = plans[p];
    const std::string c = plan.compressor().name();
    const Plan layerwise = cupcake::bench::Regroup(plan, cupcake::bench::LayerWise(model));
    for (const std::string mode : {"none", "busy", "sleep"}) {
      if (o.backward != "all" && o.backward != mode) continue;
      Row rl{"runtime " + c + " layerwise", 0, mode, {}, -1, ""};
      Row rp{"runtime " + c + " planned (" + o.plans[p] + ")", 0, mode, {}, -1, ""};
      std::unique_ptr<rt::Session> sl = make_session(rl.name, layerwise);
      std::unique_ptr<rt::Session> sp = make_session(rp.name, plan);
      std::vector<double> tl, tp;
      bool agree_l = true, agree_p = true;
      for (int it = 0; it < o.warmup + o.iters; ++it) {
        const double a = step(rl.name, *sl, mode, it);
        if (it == o.warmup + o.iters - 1) agree_l = RanksAgree(Hash(grads));
        const double b = step(rp.name, *sp, mode, it);
        if (it == o.warmup + o.iters - 1) agree_p = RanksAgree(Hash(grads));
        if (it >= o.warmup) {
          tl.push_back(a);
          tp.push_back(b);
        }
      }
      rl.groups = sl->group_count();
      rp.groups = sp->group_count();
      rl.stats = Summarize(tl);
      rp.stats = Summarize(tp);
      rl.check = agree_l ? "ranks agree" : "RANKS DIFFER";
      rp.check = agree_p ? "ranks agree" : "RANKS DIFFER";
      predict(rl, layerwise);
      predict(rp, plan);
      rows.push_back(rl);
      rows.push_back(rp);
    }
  }

  if (rank == 0) {
    const double baseline = rows[0].stats.median_us;
    std::printf("%-44s %6s %9s %12s %12s %12s %13s %10s %14s %s\n", "# row", "groups", "backward", "median_us",
                "mean_us", "min_us", "predicted_us", "meas/pred", "vs_baseline", "check");
    for (const Row& r : rows) {
      char pred[32] = "-", ratio[32] = "-";
      if (r.predicted_us >= 0) {
        std::snprintf(pred, sizeof pred, "%.0f", r.predicted_us);
        std::snprintf(ratio, sizeof ratio, "%.2f", r.stats.median_us / r.predicted_us);
      }
      std::printf("%-44s %6d %9s %12.0f %12.0f %12.0f %13s %10s %14.3f %s\n", r.name.c_str(), r.groups,
                  r.backward.c_str(), r.stats.median_us, r.stats.mean_us, r.stats.min_us, pred, ratio,
                  r.stats.median_us / baseline, r.check.c_str());
    }
    std::printf("# vs_baseline = median / baseline's median; target for 'runtime fp32 one_group': <= 1.1\n");
    std::printf("%s\n", paired.c_str());
  }
  return 0;
}

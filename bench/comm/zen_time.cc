// zen_time: ZenAllreduce against the allgather scheme for top-k payloads, timed over MPI (run
// under mpirun, or scripts/testbed.sh run for a shaped network; docs/ZEN.md). Both schemes
// start from the same top-k payload per rank (k values, then k ascending indices: the topk
// compressor's layout) and end with the dense mean over the ranks in a float buffer of n, as
// the runtime's decode leaves it:
//   allgather: the communicator's Allgather of the payloads, then the topk compressor's Decode
//   zen:       ZenAllreduce on the payload's view, then the union scattered divided by P
// The two results must be bitwise equal (integer values, sums in rank order); a mismatch ends
// the run with exit 1. A call's time is the slowest rank's (each call after a barrier); the
// table gives the median and the p10-p90 over the calls, the two schemes alternating.
// With --profile=DB (a profile of the same cluster: comm allgather and alltoall, topk's kernels
// on the CPU), rank 0 also prints the planner's prediction for each scheme, what the options
// search prices for one group of n elements from the payload to the dense mean: the scheme's
// network block and its decode (docs/MODEL.md, "The zen scheme"), and which scheme each picks:
// once assuming independent selections (the planner's default, exact for the uniform rows, the
// same price for the overlapping rows), and once with the row's union given as a measured share
// (cupcake-plan search --zen-union: the union's size over the P k pairs), as a job would pass it
// after recording its union (the runtime's timeline) once.
// A second table splits zen's time into its phases (ZenStats::us, the scatter added to the
// decode), each the slowest rank's per call, beside the planner's price of each where a profile
// is given: which term of the model a miss comes from.
//
//   mpirun -np P zen_time [--n=4194304] [--iters=20] [--warmup=3] [--overlap=0.9] [--pool=1.1]
//                         [--seed=1] [--profile=DB]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cupcake/comm/mpi.h"
#include "cupcake/comm/zen.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/planner/options.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/catalogue.h"
#include "zen_indices.h"

namespace cupcake::comm {
namespace {

namespace zen = kernels::zen;

struct Options : bench::IndexSet {
  int iters = 20;
  int warmup = 3;
  std::string profile;  // --profile: print the planner's predictions
};

// The planner's price, in ms, of one group of n elements at `density` from the payload to the
// dense mean (network block + decode) under the topk compressor's `scheme` on the CPU;
// `zen_union` as PlanRequest's (0: independent selections). `phases` (zen only) receives the
// price of each of kPhases' columns.
constexpr int kPhases = 6;
constexpr const char* kPhaseNames[kPhases] = {"counts", "pairs", "work", "sizes", "partitions", "decode"};
using Phases = std::array<double, kPhases>;

StatusOr<double> Predicted(const pb::Profile& profile, int64_t n, double density, const char* scheme,
                           double zen_union, Phases* phases = nullptr) {
  pb::Model model;
  model.set_name("zen_time");
  pb::Tensor* t = model.add_tensors();
  t->set_name("g");
  t->set_numel(n);
  t->set_dtype(pb::FLOAT32);
  planner::PlanRequest request;
  request.compressor = "topk";
  request.ratio = density;
  request.device = pb::CPU;
  request.zen_union = zen_union;
  CUPCAKE_ASSIGN_OR_RETURN(const planner::OptionProblem p, planner::MakeOptionProblem(model, profile, request));
  const int option = planner::FindOption(p, scheme, pb::CPU);
  if (option < 0) {
    std::string why;
    for (const std::string& d : p.dropped) why += (why.empty() ? "" : "; ") + d;
    return NotFoundError(std::string("--profile: the planner offers no '") + scheme + " cpu' option here (" + why +
                         ")");
  }
  const std::vector<int> ends = {0}, options = {option};
  const planner::OptionGroupTimes g = std::move(planner::EvaluateOptions(p, ends, options).groups[0]);
  if (phases != nullptr) {
    // Zen's four steps with the owners' work between the pairs and the sizes (docs/MODEL.md).
    if (g.steps.size() != 4) return InternalError("zen_time: the zen option has " + std::to_string(g.steps.size()) +
                                                  " steps; expected 4");
    auto ms = [](double us) { return us / 1000.0; };
    *phases = {ms(g.steps[0].end_us - g.steps[0].start_us), ms(g.steps[1].end_us - g.steps[1].start_us),
               ms(g.steps[2].start_us - g.steps[1].end_us), ms(g.steps[2].end_us - g.steps[2].start_us),
               ms(g.steps[3].end_us - g.steps[3].start_us), ms(g.cost.post())};
  }
  return (g.cost.net + g.cost.post()) / 1000.0;
}

[[noreturn]] void Die(int rank, const std::string& what) {
  std::fprintf(stderr, "zen_time: rank %d: %s\n", rank, what.c_str());
  std::exit(1);
}

struct Times {
  std::vector<double> zen_ms, allgather_ms;
  std::vector<Phases> zen_phases;  // per call, each phase's slowest rank
};

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// Runs and prints one row; returns its line of the phase table (rank 0; "" elsewhere).
std::string RunRow(Communicator& comm, const Options& o, const pb::Profile* profile, double density,
                   bool overlapping) {
  const int rank = comm.rank(), p = comm.size();
  const int64_t k = SelectedCount(o.n, density);
  const std::vector<uint32_t> indices = bench::RankIndices(o, overlapping, rank, k);
  // The payload: k values (integers, so every sum is exact), then the k indices.
  std::vector<std::byte> payload(static_cast<size_t>(8 * k));
  for (int64_t j = 0; j < k; ++j) {
    const float v = static_cast<float>((indices[static_cast<size_t>(j)] + 3 * rank) % 64) - 32;
    std::memcpy(payload.data() + 4 * j, &v, 4);
  }
  std::memcpy(payload.data() + 4 * k, indices.data(), static_cast<size_t>(4 * k));

  kernels::CompressorConfig config{.name = "topk", .memory = "none", .n = o.n, .world_size = p, .ratio = density};
  auto topk = kernels::MakeCompressor(config, kernels::Backend::kCpu);
  if (!topk.ok()) Die(rank, topk.status().ToString());
  if ((*topk)->payload_bytes() != static_cast<int64_t>(payload.size()))
    Die(rank, "topk payload: size: mismatch; got " + std::to_string(payload.size()) + ", the compressor expects " +
                  std::to_string((*topk)->payload_bytes()));
  std::vector<std::byte> received(static_cast<size_t>((*topk)->decode_input_bytes()));
  std::vector<float> by_allgather(static_cast<size_t>(o.n)), by_zen(static_cast<size_t>(o.n));
  auto view = zen::TopkPayloadView(payload, k);
  if (!view.ok()) Die(rank, view.status().ToString());

  ZenStats stats;
  int64_t union_size = 0;
  auto run_allgather = [&] {
    Status s = comm.Allgather(payload.data(), received.data(), static_cast<int64_t>(payload.size()));
    if (s.ok()) s = (*topk)->Decode(received, by_allgather, 0);
    if (!s.ok()) Die(rank, "allgather scheme: " + s.ToString());
  };
  Phases phases{};  // this rank's, of the last zen call, ms
  auto run_zen = [&] {
    auto sum = ZenAllreduce(comm, *view, {.n = o.n, .seed = static_cast<uint32_t>(o.seed)}, &stats);
    if (!sum.ok()) Die(rank, "zen: " + sum.status().ToString());
    const auto scatter_start = std::chrono::steady_clock::now();
    std::fill(by_zen.begin(), by_zen.end(), 0.0f);
    for (size_t j = 0; j < sum->indices.size(); ++j)
      by_zen[sum->indices[j]] = sum->values[j] / static_cast<float>(p);
    const double scatter_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - scatter_start).count();
    union_size = static_cast<int64_t>(sum->indices.size());
    const ZenPhaseTimes& us = stats.us;
    phases = {us.counts, us.pairs, us.partition + us.merge + us.encode, us.sizes, us.partitions,
              us.decode + scatter_us};
    for (double& v : phases) v /= 1000.0;
  };
  // One call's time: the slowest rank's, each call after a barrier.
  auto timed = [&](auto&& call) {
    if (Status s = comm.Barrier(); !s.ok()) Die(rank, s.ToString());
    const auto start = std::chrono::steady_clock::now();
    call();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (Status s = comm.Allreduce(&ms, &ms, 1, DataType::kFloat64, ReduceOp::kMax); !s.ok()) Die(rank, s.ToString());
    return ms;
  };
  Times t;
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    const double a = timed(run_allgather), z = timed(run_zen);
    if (Status s = comm.Allreduce(phases.data(), phases.data(), kPhases, DataType::kFloat64, ReduceOp::kMax); !s.ok())
      Die(rank, s.ToString());
    if (it < o.warmup) continue;
    t.allgather_ms.push_back(a);
    t.zen_ms.push_back(z);
    t.zen_phases.push_back(phases);
  }
  if (std::memcmp(by_allgather.data(), by_zen.data(), 4 * by_allgather.size()) != 0)
    Die(rank, "zen and the allgather scheme disagree (expected bitwise equal means)");

  // Bytes this rank sent to others: the largest over ranks.
  int64_t sent[2] = {stats.Total().sent, AllgatherSchemeBytes(k, p).sent};
  if (Status s = comm.Allreduce(sent, sent, 2, DataType::kInt64, ReduceOp::kMax); !s.ok()) Die(rank, s.ToString());
  if (rank != 0) return "";
  auto range = [](const std::vector<double>& v) {
    char out[48];
    std::snprintf(out, sizeof(out), "%.3f-%.3f", Quantile(v, 0.1), Quantile(v, 0.9));
    return std::string(out);
  };
  const double zen_med = Quantile(t.zen_ms, 0.5), ag_med = Quantile(t.allgather_ms, 0.5);
  std::printf("%3d %8.3f %12s %9lld %10lld %12lld %12lld %9.3f %17s %9.3f %17s %7.2f", p, 100 * density,
              overlapping ? "overlapping" : "uniform", static_cast<long long>(k), static_cast<long long>(union_size),
              static_cast<long long>(sent[0]), static_cast<long long>(sent[1]), zen_med, range(t.zen_ms).c_str(),
              ag_med, range(t.allgather_ms).c_str(), ag_med / zen_med);
  Phases predicted{};  // zen's, with the row's share
  if (profile != nullptr) {
    const double share = static_cast<double>(union_size) / (static_cast<double>(p) * static_cast<double>(k));
    auto zen_pred = Predicted(*profile, o.n, density, "zen", 0);
    auto zen_pred_union = Predicted(*profile, o.n, density, "zen", share, &predicted);
    auto ag_pred = Predicted(*profile, o.n, density, "flat", 0);
    for (const auto* pred : {&zen_pred, &zen_pred_union, &ag_pred})
      if (!pred->ok()) Die(rank, pred->status().message());
    const bool measured_zen = zen_med < ag_med;
    auto pick = [&](double zen_ms) {
      const bool planner_zen = zen_ms < *ag_pred;
      return std::string(planner_zen ? "   zen" : "    ag") + (planner_zen == measured_zen ? "  right" : "  wrong");
    };
    std::printf(" %9.3f %9.3f %s %6.3f %9.3f %s", *zen_pred, *ag_pred, pick(*zen_pred).c_str(), share,
                *zen_pred_union, pick(*zen_pred_union).c_str());
  }
  std::printf("\n");
  std::fflush(stdout);

  char line[64];
  std::snprintf(line, sizeof(line), "%3d %8.3f %12s", p, 100 * density, overlapping ? "overlapping" : "uniform");
  std::string out = line;
  for (int i = 0; i < kPhases; ++i) {
    std::vector<double> v;
    for (const Phases& call : t.zen_phases) v.push_back(call[static_cast<size_t>(i)]);
    std::snprintf(line, sizeof(line), " %9.3f", Quantile(v, 0.5));
    out += line;
    if (profile != nullptr) {
      std::snprintf(line, sizeof(line), " %9.3f", predicted[static_cast<size_t>(i)]);
      out += line;
    }
  }
  return out + "\n";
}

}  // namespace
}  // namespace cupcake::comm

int main(int argc, char** argv) {
  using namespace cupcake::comm;
  auto process = InitMpi(&argc, &argv);
  if (!process.ok()) {
    std::fprintf(stderr, "zen_time: %s\n", process.status().ToString().c_str());
    return 1;
  }
  auto world = (*process)->World();
  if (!world.ok()) {
    std::fprintf(stderr, "zen_time: %s\n", world.status().ToString().c_str());
    return 1;
  }
  Communicator& comm = **world;
  Options o;
  for (int a = 1; a < argc; ++a) {
    std::string v;
    if (cupcake::bench::ParseFlag(argv[a], "--warmup", v))
      o.warmup = std::atoi(v.c_str());
    else if (cupcake::bench::ParseFlag(argv[a], "--profile", v))
      o.profile = v;
    else if (!cupcake::bench::ParseCommonFlag(argv[a], o, o.iters))
      Die(comm.rank(), std::string(argv[a]) +
                           ": unknown flag; expected --n, --iters, --warmup, --overlap, --pool, --seed or --profile");
  }
  if (!cupcake::bench::CommonFlagsInRange(o, o.iters, cupcake::kernels::zen::kMaxElements) || o.warmup < 0)
    Die(comm.rank(),
        "flags: out of range; expected 1 <= n <= 2^31-1, iters >= 1, warmup >= 0, 0 <= overlap <= 1, pool >= overlap");
  // Rank 0 prices the rows when asked (it alone prints); a profile it cannot read ends the run.
  std::optional<cupcake::pb::Profile> profile;
  if (!o.profile.empty() && comm.rank() == 0) {
    auto loaded = cupcake::profile::LoadProfileFile(o.profile);
    if (!loaded.ok()) Die(0, loaded.status().message());
    profile = std::move(loaded).value();
  }
  if (comm.rank() == 0) {
    std::printf("# zen_time --n=%lld --iters=%d --warmup=%d --overlap=%g --pool=%g --seed=%llu, %d ranks\n",
                static_cast<long long>(o.n), o.iters, o.warmup, o.overlap, o.pool,
                static_cast<unsigned long long>(o.seed), comm.size());
    std::printf(
        "# both schemes from the same top-k payload to the dense mean (checked bitwise equal); time: the slowest\n"
        "# rank's, median and p10-p90 over the calls; sent: the largest bytes one rank sent to the others.\n");
    if (profile)
      std::printf(
          "# pred: the planner's net + decode for the scheme from %s, zen's with independent selections; pick:\n"
          "# its choice, right or wrong against the medians; share: the measured union over P k; zen_pred_u and\n"
          "# its pick: zen priced with that share (--zen-union)\n",
          o.profile.c_str());
    std::printf("%3s %8s %12s %9s %10s %12s %12s %9s %17s %9s %17s %7s%s\n", "P", "dens(%)", "indices", "k", "union",
                "zen_sent(B)", "ag_sent(B)", "zen(ms)", "zen p10-p90", "ag(ms)", "ag p10-p90", "ag/zen",
                profile ? "  zen_pred   ag_pred   pick  check  share zen_pred_u pick_u check_u" : "");
  }
  std::string phase_rows;
  for (bool overlapping : {false, true})
    for (double density : {0.01, 0.001})
      phase_rows += RunRow(comm, o, profile ? &*profile : nullptr, density, overlapping);
  if (comm.rank() == 0) {
    std::printf(
        "# zen's phases, ms: each the median over the calls of its slowest rank (a collective's includes its wait);\n"
        "# work: the pairs split by owner, the owner's merge-sum and its partition encoded; decode: the partitions\n"
        "# decoded and merged, the group zeroed and the mean scattered%s\n",
        profile ? "; pred: the planner's price of each (with the row's share)" : "");
    std::printf("%3s %8s %12s", "P", "dens(%)", "indices");
    for (const char* name : kPhaseNames) std::printf(" %9s%s", name, profile ? "      pred" : "");
    std::printf("\n%s", phase_rows.c_str());
  }
  return 0;
}

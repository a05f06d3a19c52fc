// runtime_gpu_bench: the runtime on GPU memory (Session over NCCL, one rank on one GPU) on
// ResNet-50's gradients, against a plain ncclAllReduce, and a compressor's groupings (issue 6;
// results and method in docs/RUNTIME_BENCH.md).
//
// Method: one process, one GPU, NCCL communicators of one rank (NCCL refuses two ranks on one
// GPU, and the bench machine has one), so the collectives are NCCL's one-rank paths and what is
// measured is the runtime's own cost on the device: packs, encode/decode kernels, events and the
// host's waits. Per iteration:
//   1. Untimed: copy the gradients' values (small integers that depend on the iteration) from
//      the host into the device buffers; cudaDeviceSynchronize.
//   2. Timed on the host's steady clock, until the result is on the device:
//        baseline: ncclAllReduce in place over one flat buffer of all gradients, then the divide
//                  by W (the kernels' fp32 decode, in place), cudaStreamSynchronize;
//        runtime:  GradientReady(i) for every tensor, then Synchronize() (which returns when
//                  the decodes are done).
//   `warmup` untimed iterations, then `iters` timed ones, rows interleaved one iteration each;
//   median, mean and min in us. Check: fp32 rows "exact" when every timed iteration's result
//   equals the baseline's bitwise; compressed rows "-" (runtime_gpu_test checks them against the
//   CUDA kernels bitwise).
// Rows: the fp32 one-group plan on slices of one flat device buffer and on one cudaMalloc per
// tensor; the compressor (--compressor, default efsignsgd) layer-wise (also with
// SessionOptions::device_graphs off: every launch queued each step), in 25 MiB buckets, as one
// group, the last two offloaded to the CPU (pinned copies, the CPU kernels on this host), and as
// --plan's groups when given (a plan for this model; its compressor must match).
//
// Usage: runtime_gpu_bench [--model M.json] [--compressor C] [--plan P.pb] [--warmup W] [--iters I]
#include <cuda_runtime.h>
#include <nccl.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench_plans.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/profile/load.h"
#include "cupcake/proto/catalogue.h"
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
namespace bench = cupcake::bench;

[[noreturn]] void Die(const std::string& message, int code = 1) {
  std::fprintf(stderr, "runtime_gpu_bench: %s\n", message.c_str());
  std::exit(code);
}

void Check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) Die(std::string(call) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}
#define CUDA(call) Check((call), #call)

void CheckNccl(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) Die(std::string(call) + ": " + ncclGetErrorString(r));
}

template <typename T>
T Value(cupcake::StatusOr<T> s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.status().message());
  return std::move(s).value();
}
void Ok(const cupcake::Status& s, const std::string& what) {
  if (!s.ok()) Die(what + ": " + s.message());
}

struct Row {
  std::string name;
  int groups = 0;
  std::vector<double> times;
  std::string check;
};

// A session's gradients: slices of one flat device buffer, or one cudaMalloc per tensor.
struct Registered {
  std::unique_ptr<rt::Session> session;
  std::vector<float*> owned;  // separate buffers, freed at the end
  std::vector<float*> ptrs;
};

}  // namespace

int main(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  std::string model_path = std::string(CUPCAKE_SOURCE_DIR) + "/examples/models/resnet50.json";
  std::string compressor = "efsignsgd", plan_path;
  int warmup = 3, iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Die(flag + ": missing value", 2);
    const std::string value = argv[++i];
    if (flag == "--model")
      model_path = value;
    else if (flag == "--compressor")
      compressor = value;
    else if (flag == "--plan")
      plan_path = value;
    else if (flag == "--warmup")
      warmup = std::atoi(value.c_str());
    else if (flag == "--iters")
      iters = std::atoi(value.c_str());
    else
      Die("unknown flag " + flag + "; expected --model, --compressor, --plan, --warmup, --iters", 2);
  }
  if (warmup < 0 || iters < 1) Die("--warmup/--iters: expected >= 0 / >= 1", 2);
  if (cupcake::FindCompressor(compressor) == nullptr) Die("--compressor: unknown '" + compressor + "'", 2);
  if (cupcake::Status s = cupcake::kernels::BackendAvailable(cupcake::kernels::Backend::kCuda); !s.ok())
    Die(s.message());
  const Model model = Value(cupcake::profile::LoadModelFile(model_path), model_path);

  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& t : model.tensors()) {
    offsets.push_back(total);
    total += t.numel();
  }
  const size_t bytes = 4 * static_cast<size_t>(total);

  int device = 0, driver = 0, nccl_version = 0;
  cudaDeviceProp prop{};
  CUDA(cudaGetDevice(&device));
  CUDA(cudaGetDeviceProperties(&prop, device));
  CUDA(cudaDriverGetVersion(&driver));
  CheckNccl(ncclGetVersion(&nccl_version), "ncclGetVersion");
  std::printf("# runtime_gpu_bench: %s\n", command.c_str());
  std::printf("# %s (sm_%d%d), CUDA driver %d, NCCL %d; 1 rank; model %s: %d tensors, %" PRId64
              " float32 elements (%.1f MiB)\n",
              prop.name, prop.major, prop.minor, driver, nccl_version, model.name().c_str(), model.tensors_size(),
              total, static_cast<double>(bytes) / (1 << 20));
  std::printf(
      "# warmup %d, iters %d; time per iteration on the host's steady clock, until the result is on the device\n",
      warmup, iters);

  // Host pattern per iteration, and the baseline's buffers: its own NCCL communicator of one
  // rank and stream; the divide is the kernels' fp32 decode, in place.
  std::vector<float> host(static_cast<size_t>(total));
  auto fill_host = [&](int it) {
    for (int64_t j = 0; j < total; ++j) host[static_cast<size_t>(j)] = static_cast<float>((j * 3 + it * 13) % 17 - 8);
  };
  float* flat = nullptr;
  float* base = nullptr;
  CUDA(cudaMalloc(&flat, bytes));
  CUDA(cudaMalloc(&base, bytes));
  cudaStream_t stream = nullptr;
  CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclUniqueId id;
  CheckNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t nccl = nullptr;
  CheckNccl(ncclCommInitRank(&nccl, 1, id, 0), "ncclCommInitRank");
  cupcake::kernels::CompressorConfig fp32_config;
  fp32_config.name = "fp32";
  fp32_config.n = total;
  auto divide = Value(cupcake::kernels::MakeCompressor(fp32_config, cupcake::kernels::Backend::kCuda), "fp32 decode");

  // The sessions: fp32 one group (flat and separate), the compressor's groupings.
  auto make = [&](const std::string& name, const Plan& plan, bool separate, bool graphs) {
    Registered r;
    rt::SessionOptions options;
    options.device_graphs = graphs;
    r.session =
        Value(rt::Session::Create(plan, Value(cupcake::comm::MakeNcclCommunicator(nullptr), name), options), name);
    for (int i = 0; i < model.tensors_size(); ++i) {
      float* p = flat + offsets[static_cast<size_t>(i)];
      if (separate) {
        CUDA(cudaMalloc(&p, 4 * static_cast<size_t>(model.tensors(i).numel())));
        r.owned.push_back(p);
      }
      r.ptrs.push_back(p);
      Ok(r.session->RegisterDevice(model.tensors(i).name(), p, model.tensors(i).numel()), name);
    }
    return r;
  };
  std::vector<Row> rows;
  std::vector<Registered> sessions;
  rows.push_back({"ncclAllReduce in place + divide (baseline)", 1, {}, "reference"});
  sessions.emplace_back();  // the baseline has no session
  auto add = [&](const std::string& name, const Plan& plan, bool separate, bool graphs = true) {
    sessions.push_back(make(name, plan, separate, graphs));
    rows.push_back(
        {name, sessions.back().session->group_count(), {}, plan.compressor().name() == "fp32" ? "exact" : "-"});
  };
  const Plan fp32 = bench::PlanFor(model, 1, cupcake::pb::GPU, "fp32", bench::OneGroup(model));
  add("runtime fp32 one_group, flat buffer", fp32, false);
  add("runtime fp32 one_group, separate buffers", fp32, true);
  const Plan layerwise = bench::PlanFor(model, 1, cupcake::pb::GPU, compressor, bench::LayerWise(model));
  add("runtime " + compressor + " layerwise", layerwise, false);
  add("runtime " + compressor + " layerwise, no graphs", layerwise, false, /*graphs=*/false);
  add("runtime " + compressor + " buckets 25MiB",
      bench::PlanFor(model, 1, cupcake::pb::GPU, compressor, bench::Buckets(model, int64_t{25} << 20)), false);
  add("runtime " + compressor + " one_group",
      bench::PlanFor(model, 1, cupcake::pb::GPU, compressor, bench::OneGroup(model)), false);
  // Offloaded to the CPU (the flat scheme, each group on the cpu): the tensors copied to pinned
  // host memory, encoded and decoded by the CPU kernels on this machine's host.
  auto offloaded = [&](Plan plan) {
    for (auto& g : *plan.mutable_groups()) {
      cupcake::ApplyScheme(*cupcake::FindScheme("flat"), *cupcake::FindCompressor(compressor), cupcake::pb::CPU,
                           plan.compressor().ratio(), 0, {1, 1}, g);
    }
    return plan;
  };
  add("runtime " + compressor + " buckets 25MiB, offloaded",
      offloaded(bench::PlanFor(model, 1, cupcake::pb::GPU, compressor, bench::Buckets(model, int64_t{25} << 20))),
      false);
  add("runtime " + compressor + " one_group, offloaded",
      offloaded(bench::PlanFor(model, 1, cupcake::pb::GPU, compressor, bench::OneGroup(model))), false);
  if (!plan_path.empty()) {
    Plan plan = Value(cupcake::ReadPlanFile(plan_path), plan_path);
    if (plan.model().fingerprint() != cupcake::ModelFingerprint(model)) Die(plan_path + ": a plan for another model");
    if (plan.compressor().name() != compressor)
      Die(plan_path + ": compressor '" + plan.compressor().name() + "', expected '" + compressor + "' (--compressor)");
    plan.set_world_size(1);
    plan.set_device(cupcake::pb::GPU);
    std::vector<std::pair<int, int>> groups;
    for (const auto& g : plan.groups()) groups.emplace_back(g.first_tensor(), g.last_tensor());
    add("runtime " + compressor + " planned", bench::PlanFor(model, 1, cupcake::pb::GPU, compressor, groups), false);
  }

  std::vector<float> got(static_cast<size_t>(total)), want(static_cast<size_t>(total));
  for (int it = 0; it < warmup + iters; ++it) {
    fill_host(it);
    for (size_t r = 0; r < rows.size(); ++r) {
      Registered& s = sessions[r];
      // Untimed: the values into the row's buffers.
      if (r == 0) {
        CUDA(cudaMemcpy(base, host.data(), bytes, cudaMemcpyHostToDevice));
      } else {
        for (int i = 0; i < model.tensors_size(); ++i)
          CUDA(cudaMemcpy(s.ptrs[static_cast<size_t>(i)], host.data() + offsets[static_cast<size_t>(i)],
                          4 * static_cast<size_t>(model.tensors(i).numel()), cudaMemcpyHostToDevice));
      }
      CUDA(cudaDeviceSynchronize());
      const double t0 = NowUs();
      if (r == 0) {
        CheckNccl(ncclAllReduce(base, base, static_cast<size_t>(total), ncclFloat32, ncclSum, nccl, stream),
                  "ncclAllReduce");
        Ok(divide->Decode({reinterpret_cast<const std::byte*>(base), bytes}, {base, static_cast<size_t>(total)}, 0,
                          stream),
           "divide");
        CUDA(cudaStreamSynchronize(stream));
      } else {
        for (int i = 0; i < model.tensors_size(); ++i) Ok(s.session->GradientReady(i), rows[r].name);
        Ok(s.session->Synchronize(), rows[r].name);
      }
      const double us = NowUs() - t0;
      if (it >= warmup) rows[r].times.push_back(us);
      if (rows[r].check == "exact" || r == 0) {  // bitwise against the baseline
        std::vector<float>& dst = r == 0 ? want : got;
        if (r == 0) {
          CUDA(cudaMemcpy(dst.data(), base, bytes, cudaMemcpyDeviceToHost));
        } else {
          for (int i = 0; i < model.tensors_size(); ++i)
            CUDA(cudaMemcpy(dst.data() + offsets[static_cast<size_t>(i)], s.ptrs[static_cast<size_t>(i)],
                            4 * static_cast<size_t>(model.tensors(i).numel()), cudaMemcpyDeviceToHost));
          if (std::memcmp(got.data(), want.data(), bytes) != 0) rows[r].check = "WRONG";
        }
      }
    }
  }

  const double baseline = bench::Summarize(rows[0].times).median_us;
  std::printf("%-44s %6s %12s %12s %12s %14s %s\n", "# row", "groups", "median_us", "mean_us", "min_us", "vs_baseline",
              "check");
  for (const Row& r : rows) {
    const bench::Stats st = bench::Summarize(r.times);
    std::printf("%-44s %6d %12.0f %12.0f %12.0f %14.3f %s\n", r.name.c_str(), r.groups, st.median_us, st.mean_us,
                st.min_us, st.median_us / baseline, r.check.c_str());
  }
  std::printf("# vs_baseline = median / baseline's median\n");

  for (Registered& s : sessions) {
    s.session.reset();
    for (float* p : s.owned) CUDA(cudaFree(p));
  }
  ncclCommDestroy(nccl);
  CUDA(cudaStreamDestroy(stream));
  CUDA(cudaFree(flat));
  CUDA(cudaFree(base));
  return 0;
}

// train_mlp: a data-parallel training job on the Cupcake runtime (libruntime/README.md).
//
// Every rank trains the same MLP (same initial weights) on its own batches of generated data:
// inputs drawn from N(0, 1), targets from a fixed random "teacher" network, so the loss can fall
// towards 0. Each parameter's gradient hook copies the gradient into a buffer the runtime owns a
// view of and calls GradientReady; Synchronize runs before the optimizer step, so every rank
// steps with the average gradient (within the plan's compressor).
//
//   record:  CUPCAKE_RECORD=model.json [CUPCAKE_RECORD_ITERATIONS=20] mpirun -np 4 train_mlp
//            (what `cupcake-profile compute --db DB -- mpirun -np 4 train_mlp` sets up)
//   train:   mpirun -np 4 train_mlp --plan plan.pb [--epochs 5] [--steps 10]
// Rank 0 prints the loss on a fixed evaluation set after every epoch, and writes the model.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cupcake/comm/mpi.h"
#include "cupcake/runtime/recorder.h"
#include "cupcake/runtime/session.h"

namespace {

constexpr int64_t kIn = 32, kHidden = 128, kOut = 8, kBatch = 64;

struct Options {
  std::string plan;
  int epochs = 5;
  int steps = 10;  // per epoch
  double lr = 0.05;
  std::string record_path;  // from CUPCAKE_RECORD
  int record_iterations = 20;
};

int Usage(const std::string& problem) {
  std::fprintf(stderr,
               "train_mlp: %s\nusage: train_mlp --plan PLAN.pb [--epochs N] [--steps N] [--lr X]\n"
               "       CUPCAKE_RECORD=MODEL.json [CUPCAKE_RECORD_ITERATIONS=N] train_mlp   (record mode)\n",
               problem.c_str());
  return 2;
}

torch::nn::Sequential MakeMlp(int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(kIn, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, kOut));
}

// A batch of rank `rank`'s data for step `step`: x ~ N(0, 1), y = teacher(x).
std::pair<torch::Tensor, torch::Tensor> Batch(torch::nn::Sequential& teacher, int rank, int64_t step) {
  torch::manual_seed(1000003 * (rank + 1) + step);
  torch::Tensor x = torch::randn({kBatch, kIn});
  torch::NoGradGuard no_grad;
  return {x, teacher->forward(x)};
}

// The parameters in gradient-ready order, found from the hooks of one backward pass (the same
// graph on every rank, so the same order).
std::vector<std::pair<std::string, torch::Tensor>> GradientReadyOrder(torch::nn::Sequential& model,
                                                                      torch::nn::Sequential& teacher) {
  std::vector<std::string> order;
  std::vector<torch::Tensor> params;
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
  std::vector<size_t> handles;
  for (size_t i = 0; i < named.size(); ++i) {
    auto name = named[i].first;
    handles.push_back(named[i].second.register_hook([&order, name](torch::Tensor g) {
      order.push_back(name);
      return g;
    }));
  }
  auto [x, y] = Batch(teacher, 0, -1);
  torch::mse_loss(model->forward(x), y).backward();
  for (size_t i = 0; i < named.size(); ++i) named[i].second.remove_hook(handles[i]);
  model->zero_grad();
  std::map<std::string, torch::Tensor> by_name(named.begin(), named.end());
  std::vector<std::pair<std::string, torch::Tensor>> result;
  for (const auto& name : order) result.emplace_back(name, by_name.at(name));
  return result;
}

double EvalLoss(torch::nn::Sequential& model, torch::nn::Sequential& teacher) {
  auto [x, y] = Batch(teacher, 1 << 20, 0);  // a fixed set, the same on every rank
  torch::NoGradGuard no_grad;
  return torch::mse_loss(model->forward(x), y).item<double>();
}

int Fail(const std::string& what, const cupcake::Status& s) {
  std::fprintf(stderr, "train_mlp: %s: %s\n", what.c_str(), s.message().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // MPI's process state is made here and passed down; sessions are destroyed before it.
  auto mpi = cupcake::comm::InitMpi(&argc, &argv);
  if (!mpi.ok()) return Fail("MPI", mpi.status());
  auto world = (*mpi)->World();
  if (!world.ok()) return Fail("MPI", world.status());
  const int rank = (*world)->rank();

  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) return Usage(arg + ": missing value");
    const char* value = argv[++i];
    if (arg == "--plan")
      options.plan = value;
    else if (arg == "--epochs")
      options.epochs = std::atoi(value);
    else if (arg == "--steps")
      options.steps = std::atoi(value);
    else if (arg == "--lr")
      options.lr = std::atof(value);
    else
      return Usage("unknown flag " + arg);
  }
  // The job's main reads the environment; the runtime never does.
  if (const char* path = std::getenv("CUPCAKE_RECORD"); path != nullptr && *path != '\0') options.record_path = path;
  if (const char* n = std::getenv("CUPCAKE_RECORD_ITERATIONS"); n != nullptr && *n != '\0') {
    options.record_iterations = std::atoi(n);
  }
  if (options.record_path.empty() == options.plan.empty())
    return Usage("expected either --plan PLAN.pb or CUPCAKE_RECORD in the environment");
  if (options.epochs < 1 || options.steps < 1 || options.record_iterations < 1)
    return Usage("--epochs, --steps and CUPCAKE_RECORD_ITERATIONS must be >= 1");

  torch::set_num_threads(1);  // several ranks share the cores
  torch::manual_seed(7);
  auto teacher = MakeMlp(64);
  torch::manual_seed(42);  // the same initial weights on every rank
  auto model = MakeMlp(kHidden);
  auto params = GradientReadyOrder(model, teacher);

  if (!options.record_path.empty()) {
    // Record mode: time the gaps between gradients over N local steps (no synchronization).
    auto recorder = cupcake::runtime::Recorder::Create("mlp");
    if (!recorder.ok()) return Fail("record", recorder.status());
    auto& r = **recorder;
    for (size_t i = 0; i < params.size(); ++i) {
      if (auto s = r.Register(params[i].first, params[i].second.numel()); !s.ok()) return Fail("record", s);
      params[i].second.register_hook([&r, i](torch::Tensor g) {
        if (auto s = r.GradientReady(static_cast<int>(i)); !s.ok()) std::fprintf(stderr, "%s\n", s.message().c_str());
        return g;
      });
    }
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(options.lr).momentum(0.9));
    for (int step = 0; step < options.record_iterations; ++step) {
      auto [x, y] = Batch(teacher, rank, step);
      sgd.zero_grad();
      auto loss = torch::mse_loss(model->forward(x), y);
      if (auto s = r.BeginBackward(); !s.ok()) return Fail("record", s);
      loss.backward();
      sgd.step();
    }
    // Every rank recorded; merged, every rank holds the slowest rank's ready times, and rank 0
    // writes them.
    if (auto s = r.MergeRanks(**world); !s.ok()) return Fail("record", s);
    if (rank == 0) {
      if (auto s = r.Write(options.record_path); !s.ok()) return Fail("record", s);
      std::printf("train_mlp: recorded %d tensors over %d iterations into %s\n", r.registered(),
                  r.completed_iterations(), options.record_path.c_str());
    }
    return 0;
  }

  auto session = cupcake::runtime::Session::Create(options.plan, std::move(world).value());
  if (!session.ok()) return Fail("plan", session.status());
  auto& s = **session;
  // The runtime syncs these buffers: slices of one flat buffer in plan order (as frameworks keep
  // gradients), so the session's groups work on them in place with no fusion buffers. Each hook
  // copies its gradient in, then marks it ready.
  int64_t total = 0;
  for (const auto& p : params) total += p.second.numel();
  torch::Tensor flat = torch::zeros({total});
  std::vector<torch::Tensor> buffers;
  for (size_t i = 0, at = 0; i < params.size(); at += static_cast<size_t>(params[i].second.numel()), ++i) {
    buffers.push_back(flat.narrow(0, static_cast<int64_t>(at), params[i].second.numel()));
    auto status = s.Register(params[i].first, std::span<float>(buffers[i].data_ptr<float>(), buffers[i].numel()));
    if (!status.ok()) return Fail("plan", status);
  }
  bool failed = false;
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].second.register_hook([&s, &buffers, &failed, i](torch::Tensor g) {
      buffers[i].copy_(g.reshape({-1}));
      if (auto status = s.GradientReady(static_cast<int>(i)); !status.ok()) {
        std::fprintf(stderr, "train_mlp: %s\n", status.message().c_str());
        failed = true;
      }
      return g;
    });
  }
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(options.lr).momentum(0.9));
  if (rank == 0) std::printf("epoch 0 loss %.6f\n", EvalLoss(model, teacher));
  for (int epoch = 1; epoch <= options.epochs; ++epoch) {
    for (int step = 0; step < options.steps; ++step) {
      auto [x, y] = Batch(teacher, rank, int64_t{epoch} * options.steps + step);
      sgd.zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      if (failed) return 1;
      if (auto status = s.Synchronize(); !status.ok()) return Fail("synchronize", status);
      // Every rank now steps with the averaged gradient.
      for (size_t i = 0; i < params.size(); ++i)
        params[i].second.mutable_grad().copy_(buffers[i].view_as(params[i].second));
      sgd.step();
    }
    if (rank == 0) {
      std::printf("epoch %d loss %.6f\n", epoch, EvalLoss(model, teacher));
      std::fflush(stdout);
    }
  }
  return 0;
}

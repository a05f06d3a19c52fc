// Getting started, C++ (docs/GETTING_STARTED.md): run a plan over MPI. Each rank registers its
// gradient buffers in plan order, marks each ready as backward would produce it, and
// synchronizes; the buffers then hold the average over ranks (exactly, with an fp32 plan).
// Usage: mpirun -np 2 quickstart_cpp PLAN.pb
#include <cstdio>
#include <string>
#include <vector>

#include "cupcake/comm/mpi.h"
#include "cupcake/runtime/session.h"

int main(int argc, char** argv) {
  using namespace cupcake;
  if (argc != 2) {
    std::fprintf(stderr, "usage: mpirun -np N %s PLAN.pb\n", argv[0]);
    return 2;
  }
  auto mpi = comm::InitMpi(&argc, &argv);  // MPI lives as long as this object
  if (!mpi.ok()) return std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str()), 1;
  auto world = (*mpi)->World();
  if (!world.ok()) return std::fprintf(stderr, "%s\n", world.status().ToString().c_str()), 1;
  const int rank = (*world)->rank(), size = (*world)->size();

  // Collective: every rank loads the plan and the ranks check they run the same one. A failure
  // every rank finds alike (a plan for another world size) is printed by one rank (PrintedBy).
  auto session = runtime::Session::Create(argv[1], std::move(world).value());
  if (!session.ok()) {
    if (session.status().PrintedBy(rank)) std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 1;
  }
  runtime::Session& s = **session;

  // The model's gradients in gradient-ready order (the plan's model: examples/quickstart/model.json).
  const std::vector<std::pair<std::string, size_t>> tensors = {
      {"fc2.bias", 10}, {"fc2.weight", 640}, {"fc1.bias", 64}, {"fc1.weight", 50176}};
  std::vector<std::vector<float>> grads;
  for (const auto& [name, numel] : tensors) {
    grads.emplace_back(numel);
    if (Status r = s.Register(name, grads.back()); !r.ok()) return std::fprintf(stderr, "%s\n", r.ToString().c_str()), 1;
  }

  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < grads.size(); ++i) {
      std::fill(grads[i].begin(), grads[i].end(), static_cast<float>(rank + 1 + step));  // "backward"
      if (Status r = s.GradientReady(static_cast<int>(i)); !r.ok())
        return std::fprintf(stderr, "%s\n", r.ToString().c_str()), 1;
    }
    if (Status r = s.Synchronize(); !r.ok()) return std::fprintf(stderr, "%s\n", r.ToString().c_str()), 1;
    // Every rank now holds the mean: (1 + ... + size) / size + step.
    std::printf("rank %d step %d: fc1.weight[0] = %g (expected %g)\n", rank, step, grads[3][0],
                (size + 1) / 2.0 + step);
  }
  return 0;
}

// Uses the installed libraries: parse a model (profile), name the search (planner), ask the
// runtime's C API for its last error (none yet), and call what the installed communication and
// profiler headers declare (an in-process allreduce, the MPI and NCCL factories, the CUDA
// kernel device), so a declaration whose definition is not installed fails to link here.
#include <iostream>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"
#include "cupcake/planner/search.h"
#include "cupcake/profile/json_io.h"
#include "cupcake/profile/kernel_sweep.h"
#include "cupcake/runtime/cupcake.h"

int main() {
  auto m = cupcake::profile::ParseModelJson(
      R"({"format": "cupcake.model.v1", "name": "m", "tensors": [{"name": "a", "numel": 3, "dtype": "float32", "backward_us": 1}]})",
      "inline");
  if (!m.ok()) {
    std::cerr << m.status().message() << "\n";
    return 1;
  }
  cupcake::comm::InProcessGroup group(1);
  auto comm = group.Rank(0);
  float x = 2;
  if (!comm->Allreduce(&x, &x, 1, cupcake::comm::DataType::kFloat32, cupcake::comm::ReduceOp::kSum).ok()) return 1;
  const bool nccl = cupcake::comm::MakeNcclCommunicator(nullptr).ok();
  const bool device = cupcake::profile::OpenCudaKernelDevice(0).ok();
  std::cout << m->name() << " " << m->tensors_size() << " "
            << cupcake::planner::AlgorithmName(cupcake::planner::Algorithm::kBranchAndBound) << " ["
            << cupcake_last_error() << "] " << x << " mpi " << cupcake::comm::BuiltWithMpi() << " initialized "
            << cupcake::comm::MpiInitialized() << " nccl " << nccl << " device " << device << "\n";
  return 0;
}

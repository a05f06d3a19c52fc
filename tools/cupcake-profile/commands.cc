#include "commands.h"

#include "profiling.h"

namespace cupcake::profile_cli {

std::vector<tools::Command> Commands(comm::Communicator* world, std::string mpi_problem) {
  return {
      {"import", "import a JSON profile or model into a profile DB", ImportMain},
      {"export", "write a profile DB, or one of its models, as JSON", ExportMain},
      {"inspect", "summarize a profile: cluster, curves, models", InspectMain},
      {"kernels",
       "measure compressor encode/decode and copy costs on this machine (under mpirun or torchrun: ranks in step)",
       [world, mpi_problem](tools::Invocation& inv) {
         inv.rank = LaunchRank(world);
         return KernelsMain(inv, world, mpi_problem);
       }},
      {"comm", "measure the collectives under mpirun or torchrun (allreduce, allgather, ...)",
       [world, mpi_problem](tools::Invocation& inv) {
         inv.rank = LaunchRank(world);
         return CommMain(inv, world, mpi_problem);
       }},
      {"compute", "run a training job in record mode and import the model it writes", ComputeMain},
  };
}

}  // namespace cupcake::profile_cli

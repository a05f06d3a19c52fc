#include <memory>
#include <string>

#include "commands.h"
#include "cupcake/profile/mpi.h"

int main(int argc, char** argv) {
  // MPI's process state is made here and passed down (STYLE.md), only for `comm` under a
  // launcher; it must outlive the world communicator, declared after it.
  std::unique_ptr<cupcake::profile::MpiProcess> mpi;
  std::unique_ptr<cupcake::profile::Communicator> world;
  std::string mpi_problem;
  if (argc > 1 && std::string(argv[1]) == "comm" && cupcake::profile_cli::UnderMpiLauncher()) {
    auto process = cupcake::profile::InitMpi(&argc, &argv);
    if (process.ok()) {
      mpi = std::move(process).value();
      world = mpi->World();
    } else {
      mpi_problem = process.status().message();
    }
  }
  const int code = cupcake::tools::RunMain(cupcake::profile_cli::kTool,
                                           cupcake::profile_cli::Commands(world.get(), mpi_problem), argc, argv);
  world.reset();
  mpi.reset();
  return code;
}

#include <memory>
#include <string>

#include "commands.h"
#include "cupcake/comm/mpi.h"

int main(int argc, char** argv) {
  // MPI's process state is made here and passed down, only for `comm` and `kernels` under a
  // launcher; it must outlive the world communicator, declared after it.
  std::unique_ptr<cupcake::comm::MpiProcess> mpi;
  std::unique_ptr<cupcake::comm::Communicator> world;
  std::string mpi_problem;
  const std::string command = argc > 1 ? argv[1] : "";
  if ((command == "comm" || command == "kernels") && cupcake::profile_cli::UnderMpiLauncher()) {
    auto process = cupcake::comm::InitMpi(&argc, &argv);
    auto made = process.ok() ? (*process)->World()
                             : cupcake::StatusOr<std::unique_ptr<cupcake::comm::Communicator>>(process.status());
    if (made.ok()) {
      mpi = std::move(process).value();
      world = std::move(made).value();
    } else {
      mpi_problem = made.status().message();
    }
  }
  const int code = cupcake::tools::RunMain(cupcake::profile_cli::kTool,
                                           cupcake::profile_cli::Commands(world.get(), mpi_problem), argc, argv);
  world.reset();
  mpi.reset();
  return code;
}

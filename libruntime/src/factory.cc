// The one file that picks communicator implementations by what the build has (STYLE.md: `#if
// CUPCAKE_HAVE_*` lives only here).
#include "cupcake/runtime/communicator.h"

#if CUPCAKE_HAVE_MPI
#include "mpi/mpi_communicator.h"
#endif

namespace cupcake::runtime {
namespace {
#if !CUPCAKE_HAVE_MPI
Status NoMpi() {
  return FailedPreconditionError(
      "this build has no MPI; install libopenmpi-dev and openmpi-bin (scripts/install-deps.sh) and rebuild with "
      "-DCUPCAKE_WITH_MPI=ON");
}
#endif
}  // namespace

bool BuiltWithMpi() { return CUPCAKE_HAVE_MPI != 0; }

StatusOr<std::unique_ptr<MpiProcess>> InitMpi(int* argc, char*** argv) {
#if CUPCAKE_HAVE_MPI
  return internal::MakeMpiProcess(argc, argv);
#else
  (void)argc;
  (void)argv;
  return NoMpi();
#endif
}

StatusOr<std::unique_ptr<Communicator>> MpiCommunicatorFromHandle(const void* mpi_comm) {
#if CUPCAKE_HAVE_MPI
  return internal::MakeMpiCommunicator(mpi_comm);
#else
  (void)mpi_comm;
  return NoMpi();
#endif
}

}  // namespace cupcake::runtime

// The one file that picks measurement backends by what the build has (STYLE.md: `#if
// CUPCAKE_HAVE_*` lives only here).
#include "cupcake/profile/mpi.h"

#if CUPCAKE_HAVE_MPI
#include "mpi/mpi_communicator.h"
#endif

namespace cupcake::profile {

bool BuiltWithMpi() { return CUPCAKE_HAVE_MPI != 0; }

StatusOr<std::unique_ptr<MpiProcess>> InitMpi(int* argc, char*** argv) {
#if CUPCAKE_HAVE_MPI
  return internal::MakeMpiProcess(argc, argv);
#else
  (void)argc;
  (void)argv;
  return FailedPreconditionError(
      "this build has no MPI; install libopenmpi-dev and openmpi-bin (scripts/install-deps.sh) and rebuild with "
      "-DCUPCAKE_WITH_MPI=ON");
#endif
}

}  // namespace cupcake::profile

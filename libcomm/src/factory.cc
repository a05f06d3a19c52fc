// The one file that picks backends by what the build has (`#if CUPCAKE_HAVE_*` lives only
// here): MPI and NCCL.
#include "cupcake/comm/mpi.h"
#include "cupcake/comm/nccl.h"

#if CUPCAKE_HAVE_MPI
#include "mpi/mpi_communicator.h"
#endif
#if CUPCAKE_HAVE_NCCL
#include "nccl/nccl_communicator.h"
#endif

namespace cupcake::comm {
namespace {
[[maybe_unused]] Status NoMpi() {
  return FailedPreconditionError(
      "this build has no MPI; install libopenmpi-dev and openmpi-bin (scripts/install-deps.sh) and rebuild with "
      "-DCUPCAKE_WITH_MPI=ON");
}
[[maybe_unused]] Status NoNccl(const std::string& call) {
  return FailedPreconditionError(call +
                                 ": this build has no NCCL; expected a build with the CUDA toolkit and NCCL found "
                                 "(CUPCAKE_WITH_NCCL=ON or AUTO)");
}
}  // namespace

bool BuiltWithMpi() { return CUPCAKE_HAVE_MPI != 0; }
bool BuiltWithNccl() { return CUPCAKE_HAVE_NCCL != 0; }

bool MpiInitialized() {
#if CUPCAKE_HAVE_MPI
  return internal::MpiInitialized();
#else
  return false;
#endif
}

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

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap, int device) {
#if CUPCAKE_HAVE_NCCL
  return internal::MakeNcclCommunicator(bootstrap, device);
#else
  (void)bootstrap;
  (void)device;
  return NoNccl("NCCL communicator");
#endif
}

StatusOr<std::unique_ptr<Communicator>> NcclCommunicatorFromHandle(const void* nccl_comm) {
#if CUPCAKE_HAVE_NCCL
  return internal::MakeNcclCommunicatorFromHandle(nccl_comm);
#else
  (void)nccl_comm;
  return NoNccl("NCCL communicator from the job's");
#endif
}

}  // namespace cupcake::comm

// The one file that picks implementations by what the build has (STYLE.md: `#if
// CUPCAKE_HAVE_*` lives only here): the MPI and NCCL communicators, and the CUDA streams of a
// session on GPU memory.
#include "cupcake/kernels/cupti.h"
#include "cupcake/runtime/communicator.h"
#include "cupcake/runtime/recorder.h"
#include "device_streams.h"

#if CUPCAKE_HAVE_MPI
#include "mpi/mpi_communicator.h"
#endif
#if CUPCAKE_HAVE_NCCL
#include "nccl/nccl_communicator.h"
#endif
#if CUPCAKE_HAVE_CUDA
#include "cuda/cuda_device_streams.h"
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
#if !CUPCAKE_HAVE_NCCL
Status NoNccl(const std::string& call) {
  return FailedPreconditionError(call +
                                 ": this build has no NCCL; expected a build with the CUDA toolkit and NCCL found "
                                 "(CUPCAKE_WITH_NCCL=ON or AUTO)");
}
#endif
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

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap) {
#if CUPCAKE_HAVE_NCCL
  return internal::MakeNcclCommunicator(bootstrap);
#else
  (void)bootstrap;
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

StatusOr<std::unique_ptr<ActivitySource>> OpenKernelTimeSource() {
  return kernels::OpenCuptiActivitySource(kernels::CuptiMarks::kOn);
}

namespace internal {

StatusOr<std::unique_ptr<DeviceStreams>> MakeDeviceStreams(int events, int rank, const std::string& host,
                                                           const std::string& call) {
#if CUPCAKE_HAVE_CUDA
  return MakeCudaDeviceStreams(events, rank, host, call);
#else
  (void)events;
  return FailedPreconditionError(call + ": this build has no CUDA; expected a build with the CUDA toolkit found "
                                        "(CUPCAKE_WITH_CUDA=ON or AUTO) (rank " + std::to_string(rank) + " on " + host + ")");
#endif
}

}  // namespace internal
}  // namespace cupcake::runtime

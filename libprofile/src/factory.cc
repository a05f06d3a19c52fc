// The one file that picks measurement backends by what the build has (STYLE.md: `#if
// CUPCAKE_HAVE_*` lives only here).
#include "cupcake/kernels/cupti.h"
#include "cupcake/profile/activity.h"
#include "cupcake/profile/kernel_sweep.h"
#include "cupcake/profile/mpi.h"
#include "cupcake/profile/nccl.h"

#if CUPCAKE_HAVE_MPI
#include "mpi/mpi_communicator.h"
#endif
#if CUPCAKE_HAVE_NCCL
#include "nccl/nccl_communicator.h"
#endif
#if CUPCAKE_HAVE_CUDA
#include "cuda/cuda_kernel_device.h"
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

bool BuiltWithNccl() { return CUPCAKE_HAVE_NCCL != 0; }

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap, int device) {
#if CUPCAKE_HAVE_NCCL
  return internal::MakeNcclCommunicator(bootstrap, device);
#else
  (void)bootstrap;
  (void)device;
  return FailedPreconditionError(
      "this build has no NCCL; build on a machine with the CUDA toolkit and NCCL (nccl.h, libnccl) with "
      "-DCUPCAKE_WITH_NCCL=ON");
#endif
}

bool BuiltWithCuda() { return CUPCAKE_HAVE_CUDA != 0; }
bool BuiltWithCupti() { return kernels::BuiltWithCupti(); }

StatusOr<std::unique_ptr<KernelDevice>> OpenCudaKernelDevice(int ordinal) {
#if CUPCAKE_HAVE_CUDA
  return internal::MakeCudaKernelDevice(ordinal);
#else
  (void)ordinal;
  return FailedPreconditionError(
      "this build has no CUDA; build on a machine with the CUDA toolkit with -DCUPCAKE_WITH_CUDA=ON");
#endif
}

StatusOr<std::unique_ptr<ActivitySource>> OpenCuptiActivitySource() {
  return kernels::OpenCuptiActivitySource(kernels::CuptiMarks::kOff);
}

}  // namespace cupcake::profile

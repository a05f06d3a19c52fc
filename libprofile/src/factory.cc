// The one file of libprofile that picks implementations by what the build has (`#if
// CUPCAKE_HAVE_*` lives only here): the CUDA kernel device. Communicators are libcomm's.
#include "cupcake/kernels/cupti.h"
#include "cupcake/profile/activity.h"
#include "cupcake/profile/kernel_sweep.h"

#if CUPCAKE_HAVE_CUDA
#include "cuda/cuda_kernel_device.h"
#endif

namespace cupcake::profile {

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

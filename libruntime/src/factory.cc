// The one file of libruntime that picks implementations by what the build has (`#if
// CUPCAKE_HAVE_*` lives only here): the CUDA streams of a session on GPU memory, and CUPTI
// kernel time for record mode. Communicators are libcomm's.
#include "cupcake/kernels/cupti.h"
#include "cupcake/runtime/recorder.h"
#include "device_streams.h"

#if CUPCAKE_HAVE_CUDA
#include "cuda/cuda_device_streams.h"
#endif

namespace cupcake::runtime {

StatusOr<std::unique_ptr<ActivitySource>> OpenKernelTimeSource() {
  return kernels::OpenCuptiActivitySource(kernels::CuptiMarks::kOn);
}

namespace internal {

StatusOr<std::unique_ptr<DeviceStreams>> MakeDeviceStreams(int events, int graphs, int rank,
                                                           const std::string& host, const std::string& call) {
#if CUPCAKE_HAVE_CUDA
  return MakeCudaDeviceStreams(events, graphs, rank, host, call);
#else
  (void)events;
  (void)graphs;
  return FailedPreconditionError(call +
                                 ": this build has no CUDA; expected a build with the CUDA toolkit found "
                                 "(CUPCAKE_WITH_CUDA=ON or AUTO) (rank " +
                                 std::to_string(rank) + " on " + host + ")");
#endif
}

}  // namespace internal
}  // namespace cupcake::runtime

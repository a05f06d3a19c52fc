// The CUDA KernelDevice (kernel_sweep.h): a (blocking) stream on one device, a start and a
// stop event for timing, pinned host memory and cudaMemcpyAsync copies.
#pragma once

#include <memory>

#include "cupcake/profile/kernel_sweep.h"

namespace cupcake::profile::internal {

// Selects device `ordinal` for this thread and makes its stream and events. FailedPrecondition
// "no CUDA device found; got ..." when the machine has none.
StatusOr<std::unique_ptr<KernelDevice>> MakeCudaKernelDevice(int ordinal);

}  // namespace cupcake::profile::internal

// Kernel activity records for kernel-only GPU timings (proto/activity.h: the seam, the fake
// that replays records, kernel-only time), and the profiler's way to open the CUPTI source.
#pragma once

#include <memory>

#include "cupcake/proto/activity.h"

namespace cupcake::profile {

using ::cupcake::ActivitySource;
using ::cupcake::FakeActivitySource;
using ::cupcake::KernelActivity;
using ::cupcake::KernelBusyUs;

// The CUPTI activity source without marks (kernels::OpenCuptiActivitySource, cupti.h there):
// kernel, memcpy and memset records. At most one exists per process (FailedPrecondition for a
// second); make it where the sweep is wired (the command) and pass it down. FailedPrecondition
// when this build has no CUPTI.
StatusOr<std::unique_ptr<ActivitySource>> OpenCuptiActivitySource();
// Whether this build has CUPTI.
bool BuiltWithCupti();

}  // namespace cupcake::profile

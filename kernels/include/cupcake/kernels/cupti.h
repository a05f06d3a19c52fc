// The CUPTI activity source (proto/activity.h's ActivitySource), for kernel-only GPU time: the
// profiler's GPU kernel sweep (no marks) and the runtime's record mode (marks: the kernels
// launched between two gradient-ready marks).
#pragma once

#include <memory>

#include "cupcake/proto/activity.h"

namespace cupcake::kernels {

enum class CuptiMarks {
  kOff,  // kernel, memcpy and memset records; SetMark fails
  kOn,  // also the runtime and driver API and external correlation records, so each record
        // carries the mark current on its launching thread (cuptiActivityPushExternalCorrelationId)
};

// Start() enables CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, MEMCPY and MEMSET (with marks also
// RUNTIME, DRIVER and EXTERNAL_CORRELATION); Flush() synchronizes the device, flushes CUPTI's buffers
// (cuptiActivityFlushAll), disables the kinds and returns the records, failing when CUPTI
// dropped any or delivered one incomplete. CUPTI's buffer callbacks are process-wide, so at
// most one source exists at a time (a second is FailedPrecondition); make it in `main` and pass
// it down. Errors name the CUPTI call and carry cuptiGetResultString. FailedPrecondition when
// this build has no CUPTI.
StatusOr<std::unique_ptr<ActivitySource>> OpenCuptiActivitySource(CuptiMarks marks);
// Whether this build has CUPTI.
bool BuiltWithCupti();

}  // namespace cupcake::kernels

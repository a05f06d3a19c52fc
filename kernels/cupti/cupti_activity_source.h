// The CUPTI ActivitySource (cupcake/kernels/cupti.h): activity records through CUPTI's
// asynchronous buffer API.
#pragma once

#include <memory>

#include "cupcake/kernels/cupti.h"

namespace cupcake::kernels::cupti {

// Registers CUPTI's buffer callbacks; FailedPrecondition when another source is alive.
StatusOr<std::unique_ptr<ActivitySource>> MakeCuptiActivitySource(CuptiMarks marks);

}  // namespace cupcake::kernels::cupti

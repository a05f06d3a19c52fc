// The CUPTI ActivitySource (activity.h): kernel, memcpy and memset activity records through
// CUPTI's asynchronous buffer API.
#pragma once

#include <memory>

#include "cupcake/profile/activity.h"

namespace cupcake::profile::internal {

// Registers CUPTI's buffer callbacks; FailedPrecondition when another source is alive.
StatusOr<std::unique_ptr<ActivitySource>> MakeCuptiActivitySource();

}  // namespace cupcake::profile::internal

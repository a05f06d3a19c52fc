// The CUDA DeviceStreams; built only with CUPCAKE_HAVE_CUDA, reached through src/factory.cc.
#pragma once

#include "device_streams.h"

namespace cupcake::runtime::internal {

StatusOr<std::unique_ptr<DeviceStreams>> MakeCudaDeviceStreams(int events, int graphs, int rank,
                                                               const std::string& host, const std::string& call);

}  // namespace cupcake::runtime::internal

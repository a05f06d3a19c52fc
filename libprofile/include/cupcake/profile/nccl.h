// NCCL on GPU memory: the comm sweep's data communicator (CommSweepOptions::data) when the
// cluster's collectives run between GPUs, as a training job's do.
#pragma once

#include <memory>

#include "cupcake/profile/communicator.h"
#include "cupcake/proto/status.h"

namespace cupcake::profile {

// A NCCL communicator over the ranks of `bootstrap`, in its rank order, on CUDA device `device`
// of this host. Rank 0 makes the ncclUniqueId and broadcasts it through `bootstrap` (MPI, or any
// communicator). Its memory is the device's (Allocate: cudaMalloc); each collective runs on a
// stream of its own and returns once the stream has finished it. Split uses ncclCommSplit.
// Collective over `bootstrap`: every rank learns when any rank cannot take part.
// Errors: FailedPrecondition when the build has no NCCL, or a rank's host has no CUDA device
// `device` (naming the rank, its host and how many devices it has); Internal for a CUDA or NCCL
// failure, naming the call and the library's message (NCCL refuses two ranks on one GPU).
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap, int device);

// Whether this build has NCCL (CUPCAKE_WITH_NCCL).
bool BuiltWithNccl();

}  // namespace cupcake::profile

// NCCL: communicators on GPU memory, one GPU per rank.
#pragma once

#include <memory>

#include "cupcake/comm/communicator.h"
#include "cupcake/proto/status.h"

namespace cupcake::comm {

// A NCCL communicator over the ranks of `bootstrap` (a host communicator: MPI in a job,
// in-process in tests; not kept), in its rank order, on CUDA device `device` of this host (-1:
// the current device). Every rank checks its device and all learn of the first that cannot
// take part; rank 0's ncclUniqueId is broadcast through `bootstrap`. nullptr: a group of one
// rank, no launcher needed. Collectives run on a stream of the communicator's own (stream());
// Synchronize() waits and reports NCCL's asynchronous errors. Split uses ncclCommSplit.
// Collective over `bootstrap`. Errors: FailedPrecondition "NCCL communicator: ..." when the
// build has no NCCL or a rank has no such CUDA device (naming the rank and its host).
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator* bootstrap, int device = -1);

// A NCCL communicator on one the job already owns (a framework's process group): `nccl_comm`
// points to the job's ncclComm_t. We make our own over the same ranks and devices
// (ncclCommSplit with one color, NCCL's MPI_Comm_dup), so our collectives never mix with the
// job's, and destroy it on destruction. A collective over the job's communicator, with none of
// the job's collectives pending on it; the current CUDA device must be the job's
// communicator's. Errors as MakeNcclCommunicator's, and InvalidArgument for a null pointer.
StatusOr<std::unique_ptr<Communicator>> NcclCommunicatorFromHandle(const void* nccl_comm);

bool BuiltWithNccl();

}  // namespace cupcake::comm

// gloo: communicators on host memory over gloo's TCP transport (PyTorch's CPU engine), with
// no launcher: the ranks meet through a KeyValueStore (store.h), e.g. torch.distributed's
// store under torchrun.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "cupcake/comm/communicator.h"
#include "cupcake/comm/store.h"
#include "cupcake/proto/status.h"

namespace cupcake::comm {

struct GlooOptions {
  // Where this rank listens and is reached: a network interface (e.g. "eth0") when set, else
  // `hostname` (an address or a name; empty: this host's name, gethostname).
  std::string iface;
  std::string hostname;
  // The longest any set-up wait (a peer's key in the store) or collective may take.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Rank `rank` of `size` ranks that meet through `store` (kept: Split meets through it again,
// under a prefix of its own). Collective over the ranks: each sets its address and connects to
// every other (a full mesh, gloo::rendezvous::Context). Collectives: Allreduce and
// ReduceScatter reduce each element on one rank in rank order (an alltoall, then an
// allgather; the MPI backend's chunked allreduce), so every rank ends with the same bits and
// those of the MPI backend's chunked path; the others are gloo's algorithms. Abort fails the
// collectives to come with the reason and closes the connections, so peers fail at once and a
// collective in progress here at the latest at its timeout.
// Errors: InvalidArgument naming the field for a bad rank, size, timeout or null store;
// FailedPrecondition when the build has no gloo; DeadlineExceeded naming the key and the world
// when a peer does not arrive in time.
StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(std::shared_ptr<KeyValueStore> store, int rank, int size,
                                                             const GlooOptions& options = {});

bool BuiltWithGloo();

}  // namespace cupcake::comm

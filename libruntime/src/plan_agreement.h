// Every rank of a session proves that it runs the same plan as the others before the first
// collective: ranks that executed different plans would exchange payloads of different sizes,
// layouts or collectives, which corrupts memory or fails deep inside the MPI library.
#pragma once

#include <string>

#include "cupcake/comm/communicator.h"
#include "cupcake/proto/status.h"

namespace cupcake::runtime::internal {

// What one rank brings to the agreement. `fingerprint` is PlanFingerprint of the plan it
// loaded and checked; empty when `local` failed (its plan could not be read or used).
struct PlanVote {
  std::string origin;  // the plan's file (or SessionOptions::origin)
  std::string fingerprint;  // empty when `local` failed, or when there is no plan to vote for
  Status local;
};

// Collective over `comm` (host or device memory): every rank calls it once per session, also
// when its own checks failed, so that no rank is left waiting in a later collective. Returns:
//   - `vote.local` when this rank's own checks failed (its own message is the most precise),
//     reported (Status::reporter) by the lowest rank that failed with the same code and message,
//     so a failure every rank finds alike (a plan for another model) is printed once per job;
//   - FailedPrecondition naming the ranks whose checks failed and their plans, when others did,
//     reported by the lowest rank whose checks passed;
//   - InvalidArgument naming every distinct plan (fingerprint, a file it was read from, its
//     ranks) when the ranks' fingerprints differ, reported by rank 0;
//   - Ok when every rank runs the plan with one fingerprint.
// Every rank but those whose own checks failed returns the same message (after its own file).
// A rank with no plan to vote for (a step all ranks take alike, e.g. registering gradients)
// votes with an empty fingerprint.
Status AgreeOnPlan(comm::Communicator& comm, const PlanVote& vote);

}  // namespace cupcake::runtime::internal

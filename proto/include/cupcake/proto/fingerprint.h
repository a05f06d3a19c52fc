// Fingerprints that tie a plan to the model and the profile it was made from.
// 64-bit FNV-1a over a canonical encoding, printed as 16 hex digits.
#pragma once

#include <string>

#include "cupcake/cupcake.pb.h"

namespace cupcake {

// Of the tensors' names, numel, dtypes and order. Not of backward_us or the model's name:
// re-measured timings of the same model keep its fingerprint.
std::string ModelFingerprint(const pb::Model& model);

// Of the cluster facts (name, nodes, devices_per_node, device, interconnect, network) and the
// curves (key and points, in key order, so curve order does not matter). Not of meta, source,
// measurement method or measured models: a DB and its JSON export agree.
std::string ProfileFingerprint(const pb::Profile& profile);

// Of a whole plan, every field (its deterministic serialization): the ranks of a job run one
// plan exactly when their plans' fingerprints agree. Not of the file it was read from.
std::string PlanFingerprint(const pb::Plan& plan);

}  // namespace cupcake

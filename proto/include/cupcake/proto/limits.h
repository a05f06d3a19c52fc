// The bounds every input is held to, in one place. They are far above any real model, cluster
// or profile, and low enough that no sum or product the tools compute from valid inputs can
// overflow an int64 or leave the finite doubles: N tensors x kMaxNumel elements x 8 bytes
// stays below 2^63, and a timeline adds at most a few x (kMaxTensors + curve points) times
// of at most kMaxTimeUs each.
#pragma once

#include <cstdint>

namespace cupcake {

// Bytes read from one input file (model, profile JSON, plan); /dev/zero stops here.
inline constexpr int64_t kMaxInputBytes = int64_t{256} << 20;
// Seconds a read waits for data from a FIFO, pipe or device before giving up.
inline constexpr double kInputWaitS = 30;
// Nesting depth of a JSON input; the formats need 5.
inline constexpr int kMaxJsonDepth = 64;
// Tensors in one model.
inline constexpr int64_t kMaxTensors = int64_t{1} << 20;
// Elements of one tensor, and of a whole model (2^40 float32 are 4 TiB).
inline constexpr int64_t kMaxNumel = int64_t{1} << 40;
// Any time in microseconds (about 11.6 days).
inline constexpr double kMaxTimeUs = 1e12;
// A plan's times (its groups' phases, the predicted iteration, the baselines) are sums of
// bounded inputs: at most kMaxTensors backward times of kMaxTimeUs and as many phases each.
inline constexpr double kMaxPlanTimeUs = 1e18;
// Size of a curve point (bytes or elements): 1 PiB.
inline constexpr int64_t kMaxCurveSize = int64_t{1} << 50;
// Nodes, devices per node, and their product (the world size, an int everywhere).
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

}  // namespace cupcake

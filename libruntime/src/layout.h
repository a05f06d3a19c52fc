// SessionLayout: what a plan means for one rank of one job, computed before anything is
// allocated or exchanged: each group's scheme, where its encode and decode run, its codec's
// sizes, and (once the gradients are registered) whether it works in place on the registered
// memory or needs a fusion buffer. Pure values: no communicator, no device, so it is tested on
// its own (test/runtime/layout_test.cc).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/cupcake.pb.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/powersgd.h"
#include "cupcake/proto/status.h"

namespace cupcake::runtime::internal {

// How a group's floats cross the ranks (docs/MODEL.md, docs/ZEN.md).
enum class SchemeKind {
  kFlat,  // one allreduce or allgather of the codec's payload over every rank
  kHierarchical,  // reduce-scatter in the node, the codec across nodes on the shard, allgather
  kZen,  // the compressor's sparse pairs summed by ZenAllreduce
  kZenSparse,  // the group's non-zero entries summed by ZenAllreduce (exact)
  kPowerSgd,  // PowerSGD: P (with the uncompressed tensors) allreduced, then Q (powersgd_runner.cc)
};
// "flat", "hierarchical", "zen", "zen_sparse", "powersgd"
const char* SchemeKindName(SchemeKind kind);

// Where a group's encode and decode run.
enum class CodecPlace {
  kHost,  // host session: the caller's thread
  kDevice,  // session on GPU memory: the compute stream
  kOffloaded,  // session on GPU memory, group planned on the cpu: the CPU worker encodes, the
               // caller's thread decodes, on pinned host copies of the group
};

struct TensorLayout {
  std::string name;
  int64_t numel = 0;
  int64_t offset = 0;  // of its first element in model element order
  int group = 0;
  std::vector<int64_t> shape;  // as recorded; empty: not recorded (PowerSGD: a vector)
};

struct GroupLayout {
  int index = 0;
  int first = 0, last = 0;  // tensors, inclusive
  int64_t numel = 0;
  int64_t offset = 0;  // of its first element in model element order
  SchemeKind scheme = SchemeKind::kFlat;
  CodecPlace place = CodecPlace::kHost;
  // Lossless and memoryless flat groups (fp32 or left uncompressed, no error-feedback memory):
  // no encode, no payload; the allreduce sums the group's floats in place and the decode is the
  // divide by W. Never for offloaded, hierarchical or zen groups.
  bool in_place = false;
  // The compressor of the group (flat), of its shard (hierarchical), or fp32 for lossless and
  // zen_sparse groups; `codec` its sizes.
  kernels::CompressorConfig config;
  kernels::CompressorLayout codec;
  comm::DataType reduce_type = comm::DataType::kFloat32;
  int64_t reduce_count = 0;  // allreduce payloads: elements of reduce_type
  // Hierarchical: ranks per node, the shard (elements per rank), the final divisor (W for fp32
  // across nodes, else devices_per_node); whether a codec crosses the nodes.
  int devices_per_node = 1;
  int64_t shard = 0;
  float divisor = 1;
  bool shard_codec = false;
  uint32_t zen_seed = 0;  // zen: the owner hash's seed (GroupSeed's shared form)
  int64_t nonzero_capacity = 0;  // zen_sparse: pairs reserved (twice the plan's expected count)
  // powersgd: the codec's config (the group's tensor shapes, a tensor without a recorded shape
  // as the vector {numel}; the plan's rank; batched; the seed shared by the ranks). Its state
  // (error feedback, Q) lives in the runner; the error feedback over the group's elements is the
  // error-feedback plane (PlaneOffset 0), Q is not per element.
  kernels::powersgd::Config powersgd;
  int64_t powersgd_floats = 0;  // powersgd: the floats its two allreduces carry (first + second)
  // Set by PlaceBuffers: the registered buffers are not one span, so a fusion buffer is packed.
  bool fused = false;

  // A compressor object runs (host: not for lossless groups; device: also the fp32 divide).
  bool has_compressor() const;
  // Floats of error-feedback state per group element (residual 1, dgc 2, signum +1) and the
  // elements they cover: the group (flat, zen) or this rank's shard (hierarchical).
  int64_t state_floats() const { return has_compressor() && !in_place ? codec.state_floats : 0; }
  int64_t state_elements() const { return scheme == SchemeKind::kHierarchical ? shard : numel; }
};

struct SessionLayout {
  std::string model_name;
  std::string model_fingerprint;  // the plan's
  std::string plan_fingerprint;  // PlanFingerprint: what the ranks agree on
  std::string compressor;  // the plan's compressor name
  // The compressor's ratio (1: fp32); a PowerSGD rung's (an fp32 plan with a rank), the share of
  // the dense bytes it sends (PowerSgdRungRatio, as its ladder rung's ratio).
  double ratio = 1;
  int powersgd_rank = 0;  // the plan's compressor.rank
  uint64_t seed = 0;  // the compressor's seed
  double predicted_iteration_us = 0;
  // From tensor 0's gradient ready (the step's first GradientReady) to the last decode's end.
  double predicted_span_us = 0;
  bool device_memory = false;
  int hierarchical_devices = 0;  // devices_per_node when some group is hierarchical, else 0
  int64_t total_elements = 0;
  std::vector<TensorLayout> tensors;
  std::vector<GroupLayout> groups;

  bool has_zen_on_device() const;
  bool has_offloaded() const;
  int64_t fusion_bytes() const;  // after PlaceBuffers
  // Bytes this rank's collectives send per step (payloads; lossless groups' floats; PowerSGD's
  // two allreduces).
  int64_t payload_bytes() const;
};

// What the plan is checked against.
struct LayoutContext {
  std::string origin;  // prefixes every message
  int world_size = 1;
  int rank = 0;
  bool device_memory = false;  // the communicator's memory() is kDevice
  std::string compressor;  // SessionOptions::compressor; empty: not checked
  std::string model_fingerprint;  // SessionOptions::model_fingerprint; empty: not checked
};

// The layout of a valid plan (ValidatePlan passed) for `context`, or InvalidArgument naming
// every problem, one per line: `<origin>: <field>: <problem>; got ..., expected ...`.
StatusOr<SessionLayout> PlanLayout(const pb::Plan& plan, const LayoutContext& context);

// Marks the groups whose registered buffers (one per tensor, in plan order) are not adjacent
// in plan order: they need a fusion buffer.
void PlaceBuffers(SessionLayout& layout, std::span<const float* const> buffers);

// Refuses `other` as another plan for the session of `first` (AddPlan): another model (by
// fingerprint, name or tensors) or memory kind; `<origin>: model.fingerprint: ...`.
Status CheckSameModel(const SessionLayout& first, const SessionLayout& other, const std::string& origin);

}  // namespace cupcake::runtime::internal

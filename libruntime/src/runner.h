// SchemeRunner: one group's scheme (flat, hierarchical, zen, zen_sparse) as three steps that an
// engine schedules: Encode (pack and encode, on the compute side), Exchange (the collectives),
// Decode (decode and unpack). A runner owns the group's compressor, error-feedback state and
// payload buffers, allocated once at creation; its steps allocate nothing (but ZenAllreduce on
// host memory, and a zen_sparse step with more non-zeros than any before).
// Thread-safety: Encode/Decode and Exchange of one group never overlap (the engine orders them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cupcake/comm/communicator.h"
#include "cupcake/kernels/compressor.h"
#include "cupcake/kernels/fusion.h"
#include "cupcake/kernels/powersgd.h"
#include "cupcake/kernels/zen.h"
#include "cupcake/proto/status.h"
#include "device_streams.h"
#include "layout.h"

namespace cupcake::runtime::internal {

class GainProbe;

// The group's floats in plan order: the registered buffer itself, or a fusion buffer that
// `table` packs from and unpacks into the registered buffers (nullptr: not packed).
struct Work {
  float* data = nullptr;
  int64_t numel = 0;
  kernels::FusionTable* table = nullptr;
  std::span<float> span() const { return {data, static_cast<size_t>(numel)}; }
  bool packed() const { return table != nullptr; }
};

// What a step reads besides the group: the communicators, the device (nullptr on host memory)
// and the iteration that keys the compressors.
struct StepContext {
  comm::Communicator* comm = nullptr;
  comm::Communicator* intra = nullptr;  // hierarchical: this rank's node
  comm::Communicator* inter = nullptr;  // hierarchical: this local rank across the nodes
  DeviceStreams* device = nullptr;
  kernels::zen::DeviceSteps* zen_steps = nullptr;
  int hop_event = -1;  // device: the event Hop records between streams
  uint64_t iteration = 0;
  // GraVAC (flat and powersgd groups): fed each group's packed gradient and error-feedback
  // memory before its encode; nullptr when the session does not adapt.
  GainProbe* gain = nullptr;
};

// An offloaded group's pinned host copies (CodecPlace::kOffloaded): `floats` (the group),
// `payload` (what the CPU encode writes) and `received` (what the CPU decode reads), and the
// device buffers the collective moves them through.
struct OffloadBuffers {
  float* floats = nullptr;
  std::byte* payload = nullptr;
  std::byte* received = nullptr;
  void* device_payload = nullptr;
  void* device_received = nullptr;
  int64_t payload_bytes = 0;
  int64_t received_bytes = 0;
};

class SchemeRunner {
 public:
  virtual ~SchemeRunner() = default;
  // Pack (when packed) and encode on `stream` (nullptr: host memory, or an offloaded group's
  // pinned floats on the CPU worker).
  virtual Status Encode(const Work& work, const StepContext& step, void* stream) = 0;
  // The group's collectives; host communicators finish them, device ones enqueue them.
  virtual Status Exchange(const Work& work, const StepContext& step) = 0;
  // Decode into the group's floats (the mean over ranks), then unpack when packed.
  virtual Status Decode(const Work& work, const StepContext& step, void* stream) = 0;
  // Device: whether the encode (decode) queues the same kernels with the same arguments every
  // step, so it can be captured into a CUDA graph once.
  virtual bool Graphable(bool decode) const = 0;
  // "allreduce", "allgather" or "zen": names the collective in messages.
  virtual const char* CollectiveName() const = 0;
  // The union's size of the last zen exchange; 0 for other schemes.
  virtual int64_t zen_union() const { return 0; }
  // The state kept across steps, host or device memory as the compressor's; nullptr when none:
  // the per-element planes, state_floats() floats (layout.state_floats()), or PowerSGD's codec
  // state (e, then Q; its sizes in powersgd()).
  virtual kernels::Buffer* state() { return nullptr; }
  // PowerSGD: its codec's layout; nullptr for the other schemes.
  virtual const kernels::powersgd::Layout* powersgd() const { return nullptr; }
  // A plan becoming active (Session's switch): state that is not per element and so not carried
  // over from the plan before starts anew, the same on every rank. PowerSGD: Q back to its seeded
  // first draw, the memory beyond the group's elements (batched padding) to 0; the others: none.
  // Between steps.
  virtual Status RestartWarmStart() { return Status::Ok(); }
  virtual OffloadBuffers* offload() { return nullptr; }
};

// The runner of `layout` on `backend` (offloaded groups: CPU kernels and pinned staging from
// `device`). Allocates everything the steps use, zeroed.
StatusOr<std::unique_ptr<SchemeRunner>> MakeRunner(const GroupLayout& layout, kernels::Backend backend,
                                                   DeviceStreams* device);

// One runner per scheme (flat_runner.cc, hierarchical_runner.cc, zen_runner.cc,
// powersgd_runner.cc).
StatusOr<std::unique_ptr<SchemeRunner>> MakeFlatRunner(const GroupLayout& layout, kernels::Backend backend,
                                                       DeviceStreams* device);
StatusOr<std::unique_ptr<SchemeRunner>> MakeHierarchicalRunner(const GroupLayout& layout, kernels::Backend backend);
StatusOr<std::unique_ptr<SchemeRunner>> MakeZenRunner(const GroupLayout& layout, kernels::Backend backend);
StatusOr<std::unique_ptr<SchemeRunner>> MakeZenSparseRunner(const GroupLayout& layout);
StatusOr<std::unique_ptr<SchemeRunner>> MakePowerSgdRunner(const GroupLayout& layout, kernels::Backend backend);

// Helpers the runners share.
StatusOr<kernels::Buffer> AllocateZeroed(kernels::Backend backend, int64_t bytes);
// out[i] = in[i] / w: the fp32 decode's arithmetic (bitwise the kernels'); `in` may be `out`.
void DivideInto(const float* in, float* out, int64_t n, float w);
// Unpack when packed, naming group k on failure.
Status UnpackIfPacked(const Work& work, int k, void* stream);
Status PackIfPacked(const Work& work, int k, void* stream);
std::string StepWhere(const char* call, int k, const char* stage);  // "<call>: groups[k] <stage>"

}  // namespace cupcake::runtime::internal

// The flat scheme: one allreduce or allgather of the codec's payload over every rank, or, for
// lossless groups, an allreduce in place on the group's floats and the divide by W. An
// offloaded group runs the same steps with CPU kernels on pinned host copies; the device engine
// moves the payloads between those and the device buffers the collective uses.
#include "gravac.h"
#include "plan_slot.h"
#include "runner.h"

namespace cupcake::runtime::internal {

StatusOr<kernels::Buffer> AllocateZeroed(kernels::Backend backend, int64_t bytes) {
  CUPCAKE_ASSIGN_OR_RETURN(kernels::Buffer b, kernels::Buffer::Allocate(backend, bytes));
  CUPCAKE_RETURN_IF_ERROR(b.Zero());
  return b;
}

void DivideInto(const float* in, float* out, int64_t n, float w) {
  for (int64_t i = 0; i < n; ++i) out[i] = in[i] / w;
}

std::string StepWhere(const char* call, int k, const char* stage) {
  return std::string(call) + ": groups[" + std::to_string(k) + "] " + stage;
}

Status PackIfPacked(const Work& work, int k, void* stream) {
  if (!work.packed()) return Status::Ok();
  if (Status s = work.table->Pack(stream); !s.ok()) return s.WithPrefix(StepWhere("GradientReady", k, "pack"));
  return Status::Ok();
}

Status UnpackIfPacked(const Work& work, int k, void* stream) {
  if (!work.packed()) return Status::Ok();
  if (Status s = work.table->Unpack(stream); !s.ok()) return s.WithPrefix(StepWhere("Synchronize", k, "unpack"));
  return Status::Ok();
}

StatusOr<std::unique_ptr<SchemeRunner>> MakeRunner(const GroupLayout& layout, kernels::Backend backend,
                                                   DeviceStreams* device) {
  switch (layout.scheme) {
    case SchemeKind::kFlat: return MakeFlatRunner(layout, backend, device);
    case SchemeKind::kHierarchical: return MakeHierarchicalRunner(layout, backend);
    case SchemeKind::kZen: return MakeZenRunner(layout, backend);
    case SchemeKind::kZenSparse: return MakeZenSparseRunner(layout);
    case SchemeKind::kPowerSgd: return MakePowerSgdRunner(layout, backend);
  }
  return InternalError("MakeRunner: unknown scheme");
}

namespace {

class FlatRunner final : public SchemeRunner {
 public:
  explicit FlatRunner(const GroupLayout& layout) : layout_(layout) {}

  Status Allocate(kernels::Backend backend, DeviceStreams* device) {
    const kernels::CompressorLayout& c = layout_.codec;
    where_ = offloaded() ? kernels::Backend::kCpu : backend;
    if (offloaded()) {  // CPU kernels and state; the payload and what is received on both sides
      CUPCAKE_ASSIGN_OR_RETURN(compressor_, kernels::MakeCompressor(layout_.config, kernels::Backend::kCpu));
      CUPCAKE_ASSIGN_OR_RETURN(state_, AllocateZeroed(kernels::Backend::kCpu, 4 * c.state_floats));
      CUPCAKE_ASSIGN_OR_RETURN(void* floats, device->PinnedHost(4 * layout_.numel));
      CUPCAKE_ASSIGN_OR_RETURN(void* payload, device->PinnedHost(c.payload_bytes));
      CUPCAKE_ASSIGN_OR_RETURN(void* received, device->PinnedHost(c.decode_input_bytes));
      CUPCAKE_ASSIGN_OR_RETURN(payload_, AllocateZeroed(backend, c.payload_bytes));
      CUPCAKE_ASSIGN_OR_RETURN(received_, AllocateZeroed(backend, c.decode_input_bytes));
      offload_ = {static_cast<float*>(floats),
                  static_cast<std::byte*>(payload),
                  static_cast<std::byte*>(received),
                  payload_.data(),
                  received_.data(),
                  c.payload_bytes,
                  c.decode_input_bytes};
      return Status::Ok();
    }
    if (layout_.has_compressor()) {
      CUPCAKE_ASSIGN_OR_RETURN(compressor_, kernels::MakeCompressor(layout_.config, backend));
    }
    if (layout_.in_place) return Status::Ok();
    CUPCAKE_ASSIGN_OR_RETURN(state_, AllocateZeroed(backend, 4 * c.state_floats));
    CUPCAKE_ASSIGN_OR_RETURN(payload_, AllocateZeroed(backend, c.payload_bytes));
    CUPCAKE_ASSIGN_OR_RETURN(received_, AllocateZeroed(backend, c.decode_input_bytes));
    return Status::Ok();
  }

  Status Encode(const Work& work, const StepContext& step, void* stream) override {
    CUPCAKE_RETURN_IF_ERROR(PackIfPacked(work, layout_.index, stream));
    if (step.gain != nullptr) {
      const int64_t memory = PlaneOffset(layout_, StatePlane::kErrorFeedback);
      Status s = step.gain->Observe(work.span(), memory < 0 ? nullptr : state_.as<float>() + memory, layout_.index,
                                    step.iteration, where_, stream);
      if (!s.ok()) return s.WithPrefix(StepWhere("GradientReady", layout_.index, "gain probe"));
    }
    if (layout_.in_place) return Status::Ok();
    std::byte* payload = offloaded() ? offload_.payload : payload_.as<std::byte>();
    Status s = compressor_->Encode(work.span(), {state_.as<float>(), static_cast<size_t>(state_.size_bytes() / 4)},
                                   step.iteration, {payload, static_cast<size_t>(payload_.size_bytes())}, stream);
    if (!s.ok())
      return s.WithPrefix(StepWhere("GradientReady", layout_.index, offloaded() ? "encode (offloaded)" : "encode"));
    return Status::Ok();
  }

  Status Exchange(const Work& work, const StepContext& step) override {
    comm::Communicator& comm = *step.comm;
    if (layout_.in_place)
      return comm.Allreduce(work.data, work.data, work.numel, comm::DataType::kFloat32, comm::ReduceOp::kSum);
    if (layout_.codec.allreduce)
      return comm.Allreduce(payload_.data(), received_.data(), layout_.reduce_count, layout_.reduce_type,
                            comm::ReduceOp::kSum);
    return comm.Allgather(payload_.data(), received_.data(), payload_.size_bytes());
  }

  // Lossless groups: the divide by W, fused with the unpack when packed (one kernel on the
  // device), else in place (host: a loop; device: fp32's Decode, the same divide as a kernel).
  Status Decode(const Work& work, const StepContext& step, void* stream) override {
    const int k = layout_.index;
    const int world = step.comm->size();
    if (layout_.in_place && work.packed()) {
      if (Status s = work.table->UnpackDivided(world, stream); !s.ok())
        return s.WithPrefix(StepWhere("Synchronize", k, "unpack"));
      return Status::Ok();
    }
    if (layout_.in_place && layout_.place == CodecPlace::kHost) {
      DivideInto(work.data, work.data, work.numel, static_cast<float>(world));
      return Status::Ok();
    }
    const std::byte* received = offloaded() ? offload_.received : received_.as<std::byte>();
    const std::span<const std::byte> input =
        layout_.in_place ? std::span<const std::byte>(reinterpret_cast<const std::byte*>(work.data),
                                                      static_cast<size_t>(4 * work.numel))
                         : std::span<const std::byte>(received, static_cast<size_t>(received_.size_bytes()));
    Status s = compressor_->Decode(input, work.span(), step.iteration, stream);
    if (!s.ok()) return s.WithPrefix(StepWhere("Synchronize", k, "decode"));
    return UnpackIfPacked(work, k, stream);
  }

  // Kernels that take the iteration (randk; qsgd and terngrad encode) change arguments every step.
  bool Graphable(bool decode) const override {
    if (offloaded()) return false;
    const kernels::CompressorKind kind = compressor_->layout().kind;
    return !(kind == kernels::CompressorKind::kRandk ||
             (!decode && (kind == kernels::CompressorKind::kQsgd || kind == kernels::CompressorKind::kTerngrad)));
  }
  const char* CollectiveName() const override { return layout_.codec.allreduce ? "allreduce" : "allgather"; }
  kernels::Buffer* state() override { return &state_; }
  OffloadBuffers* offload() override { return offloaded() ? &offload_ : nullptr; }

 private:
  bool offloaded() const { return layout_.place == CodecPlace::kOffloaded; }

  GroupLayout layout_;
  kernels::Backend where_ = kernels::Backend::kCpu;  // the memory Encode is given (offloaded: host)
  std::unique_ptr<kernels::Compressor> compressor_;  // null for lossless groups on host memory
  kernels::Buffer state_;  // error-feedback memory, momentum; kept across iterations
  kernels::Buffer payload_, received_;  // what the collective sends and receives
  OffloadBuffers offload_;
};

}  // namespace

StatusOr<std::unique_ptr<SchemeRunner>> MakeFlatRunner(const GroupLayout& layout, kernels::Backend backend,
                                                       DeviceStreams* device) {
  auto runner = std::make_unique<FlatRunner>(layout);
  CUPCAKE_RETURN_IF_ERROR(runner->Allocate(backend, device));
  return std::unique_ptr<SchemeRunner>(std::move(runner));
}

}  // namespace cupcake::runtime::internal

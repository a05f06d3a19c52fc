// Hierarchical schemes (docs/MODEL.md, v2): 1. the group, zero-padded, is reduce-scattered in
// the node (each rank gets the node's sum of its shard); 2. the shard crosses the nodes: summed
// as fp32, or encoded, exchanged with the codec's collective and decoded (the mean over the
// nodes); 3. the shards are allgathered in the node into `padded`; the decode divides by the
// divisor into the group. On GPU memory each step is queued on its communicator's stream (the
// intra and inter communicators have their own) after the previous step's (Hop), the codec on
// the inter one's; it starts after the encode event on the session communicator's stream and
// ends there.
#include <algorithm>

#include "runner.h"

namespace cupcake::runtime::internal {
namespace {

// Work queued later on stream `to` waits for the work queued so far on `from` (GPU memory;
// nothing when they are one stream, as on host memory). One event serves every hop: a wait
// holds the record it was queued after, so the event can be recorded again at once.
Status Hop(const StepContext& step, void* from, void* to) {
  if (from == to) return Status::Ok();
  CUPCAKE_RETURN_IF_ERROR(step.device->Record(step.hop_event, from));
  return step.device->StreamWait(to, step.hop_event);
}

class HierarchicalRunner final : public SchemeRunner {
 public:
  explicit HierarchicalRunner(const GroupLayout& layout) : layout_(layout) {}

  Status Allocate(kernels::Backend backend) {
    const kernels::CompressorLayout& c = layout_.codec;
    const int64_t shard = layout_.shard;
    if (layout_.shard_codec) {
      CUPCAKE_ASSIGN_OR_RETURN(compressor_, kernels::MakeCompressor(layout_.config, backend));
      CUPCAKE_ASSIGN_OR_RETURN(state_, AllocateZeroed(backend, 4 * c.state_floats));
      CUPCAKE_ASSIGN_OR_RETURN(payload_, AllocateZeroed(backend, c.payload_bytes));
      CUPCAKE_ASSIGN_OR_RETURN(received_, AllocateZeroed(backend, c.decode_input_bytes));
    }
    CUPCAKE_ASSIGN_OR_RETURN(padded_, AllocateZeroed(backend, 4 * shard * layout_.devices_per_node));
    CUPCAKE_ASSIGN_OR_RETURN(shard_floats_, AllocateZeroed(backend, 4 * shard));
    if (layout_.place == CodecPlace::kDevice) {  // the final divide: fp32's decode with W = divisor
      kernels::CompressorConfig divide;
      divide.name = "fp32";
      divide.n = layout_.numel;
      divide.world_size = static_cast<int>(layout_.divisor);
      CUPCAKE_ASSIGN_OR_RETURN(divide_, kernels::MakeCompressor(divide, backend));
    }
    return Status::Ok();
  }

  // The encode runs on the shard, inside Exchange: here only the pack.
  Status Encode(const Work& work, const StepContext&, void* stream) override {
    return PackIfPacked(work, layout_.index, stream);
  }

  Status Exchange(const Work& work, const StepContext& step) override {
    const int devices = step.intra->size();
    float* padded = padded_.as<float>();
    float* shard = shard_floats_.as<float>();
    void* main = step.comm->stream();  // nullptr on host memory, as the others
    void* in_node = step.intra->stream();
    void* across = step.inter->stream();
    if (step.device != nullptr) {
      CUPCAKE_RETURN_IF_ERROR(step.device->Copy(padded, work.data, 4 * work.numel, main));
      CUPCAKE_RETURN_IF_ERROR(step.device->Zero(padded + work.numel, 4 * (layout_.shard * devices - work.numel), main));
    } else {
      std::copy(work.data, work.data + work.numel, padded);
      std::fill(padded + work.numel, padded + layout_.shard * devices, 0.0f);
    }
    CUPCAKE_RETURN_IF_ERROR(Hop(step, main, in_node));
    CUPCAKE_RETURN_IF_ERROR(
        step.intra->ReduceScatter(padded, shard, layout_.shard, comm::DataType::kFloat32, comm::ReduceOp::kSum));
    CUPCAKE_RETURN_IF_ERROR(Hop(step, in_node, across));
    CUPCAKE_RETURN_IF_ERROR(AcrossNodes(step, across));
    CUPCAKE_RETURN_IF_ERROR(Hop(step, across, in_node));
    CUPCAKE_RETURN_IF_ERROR(step.intra->Allgather(shard, padded, 4 * layout_.shard));
    return Hop(step, in_node, main);
  }

  // The sums (fp32) or the means over the nodes, to the mean over all ranks.
  Status Decode(const Work& work, const StepContext& step, void* stream) override {
    if (divide_ == nullptr) {
      DivideInto(padded_.as<float>(), work.data, work.numel, layout_.divisor);
    } else if (Status d = divide_->Decode({padded_.as<std::byte>(), static_cast<size_t>(4 * work.numel)}, work.span(),
                                          step.iteration, stream);
               !d.ok()) {
      return d.WithPrefix(StepWhere("Synchronize", layout_.index, "decode"));
    }
    return UnpackIfPacked(work, layout_.index, stream);
  }

  bool Graphable(bool) const override { return false; }
  const char* CollectiveName() const override { return layout_.codec.allreduce ? "allreduce" : "allgather"; }
  kernels::Buffer* state() override { return &state_; }

 private:
  // Step 2: the shard across the nodes, on `across`.
  Status AcrossNodes(const StepContext& step, void* across) {
    float* shard = shard_floats_.as<float>();
    if (compressor_ == nullptr)
      return step.inter->Allreduce(shard, shard, layout_.shard, comm::DataType::kFloat32, comm::ReduceOp::kSum);
    const std::span<float> shard_span(shard, static_cast<size_t>(layout_.shard));
    CUPCAKE_RETURN_IF_ERROR(compressor_->Encode(
        shard_span, {state_.as<float>(), static_cast<size_t>(state_.size_bytes() / 4)}, step.iteration,
        {payload_.as<std::byte>(), static_cast<size_t>(payload_.size_bytes())}, across));
    if (layout_.codec.allreduce)
      CUPCAKE_RETURN_IF_ERROR(step.inter->Allreduce(payload_.data(), received_.data(), layout_.reduce_count,
                                                    layout_.reduce_type, comm::ReduceOp::kSum));
    else
      CUPCAKE_RETURN_IF_ERROR(step.inter->Allgather(payload_.data(), received_.data(), payload_.size_bytes()));
    return compressor_->Decode(
        std::span<const std::byte>(received_.as<std::byte>(), static_cast<size_t>(received_.size_bytes())), shard_span,
        step.iteration, across);
  }

  GroupLayout layout_;
  std::unique_ptr<kernels::Compressor> compressor_;  // the shard's codec; null for fp32
  kernels::Buffer state_, payload_, received_;
  kernels::Buffer padded_;  // the group zero-padded to devices x shard floats; then the sums
  kernels::Buffer shard_floats_;
  std::unique_ptr<kernels::Compressor> divide_;  // GPU memory: the final divide
};

}  // namespace

StatusOr<std::unique_ptr<SchemeRunner>> MakeHierarchicalRunner(const GroupLayout& layout, kernels::Backend backend) {
  auto runner = std::make_unique<HierarchicalRunner>(layout);
  CUPCAKE_RETURN_IF_ERROR(runner->Allocate(backend));
  return std::unique_ptr<SchemeRunner>(std::move(runner));
}

}  // namespace cupcake::runtime::internal

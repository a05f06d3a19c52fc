// Zen schemes (docs/ZEN.md): sparse pairs summed by ZenAllreduce, each index by its owner rank.
// zen: the compressor's payload (topk's and dgc's layout: k values, then k indices) viewed as
// pairs; zen_sparse: the group's non-zero entries (exact, no error feedback; host memory only).
// The decode writes the mean at the union's indices and zeros elsewhere.
#include <algorithm>

#include "cupcake/comm/zen.h"
#include "runner.h"

namespace cupcake::runtime::internal {
namespace {

// out = 0 except out[i] = sum / w at the union's indices (strictly increasing, < out.size(), as
// ZenAllreduce returns them): the division the sparse compressors' decode makes, so a zen
// group's means equal the allgather scheme's bitwise whenever the sums do.
void ScatterMean(const kernels::zen::Sparse& sum, float w, std::span<float> out) {
  std::fill(out.begin(), out.end(), 0.0f);
  for (size_t j = 0; j < sum.indices.size(); ++j) out[sum.indices[j]] = sum.values[j] / w;
}

class ZenRunner final : public SchemeRunner {
 public:
  explicit ZenRunner(const GroupLayout& layout) : layout_(layout) {}

  Status Allocate(kernels::Backend backend) {
    CUPCAKE_ASSIGN_OR_RETURN(compressor_, kernels::MakeCompressor(layout_.config, backend));
    CUPCAKE_ASSIGN_OR_RETURN(state_, AllocateZeroed(backend, 4 * layout_.codec.state_floats));
    CUPCAKE_ASSIGN_OR_RETURN(payload_, AllocateZeroed(backend, layout_.codec.payload_bytes));
    return Status::Ok();
  }

  Status Encode(const Work& work, const StepContext& step, void* stream) override {
    CUPCAKE_RETURN_IF_ERROR(PackIfPacked(work, layout_.index, stream));
    Status s = compressor_->Encode(work.span(), {state_.as<float>(), static_cast<size_t>(state_.size_bytes() / 4)},
                                   step.iteration,
                                   {payload_.as<std::byte>(), static_cast<size_t>(payload_.size_bytes())}, stream);
    if (!s.ok()) return s.WithPrefix(StepWhere("GradientReady", layout_.index, "encode"));
    return Status::Ok();
  }

  // Host memory: the payload viewed as pairs (no copy), summed into `sum_` (ZenAllreduce
  // allocates its buffers on every call). GPU memory: ZenAllreduceDevice writes the mean
  // straight into the group's floats on the communicator's stream and returns when it is there
  // (the sizes of its exchanges reach the host), so this waits for the encode and the exchange.
  Status Exchange(const Work& work, const StepContext& step) override {
    const int64_t k = payload_.size_bytes() / static_cast<int64_t>(sizeof(kernels::zen::Pair));
    if (step.device != nullptr) {
      const std::byte* payload = payload_.as<std::byte>();
      CUPCAKE_ASSIGN_OR_RETURN(
          union_, comm::ZenAllreduceDevice(*step.comm, reinterpret_cast<const uint32_t*>(payload + 4 * k),
                                           reinterpret_cast<const float*>(payload), k, {work.numel, layout_.zen_seed},
                                           static_cast<float>(step.comm->size()), work.data, *step.zen_steps));
      return Status::Ok();
    }
    CUPCAKE_ASSIGN_OR_RETURN(
        kernels::zen::SparseView view,
        kernels::zen::TopkPayloadView({payload_.as<std::byte>(), static_cast<size_t>(payload_.size_bytes())}, k));
    CUPCAKE_ASSIGN_OR_RETURN(sum_, comm::ZenAllreduce(*step.comm, view, {work.numel, layout_.zen_seed}));
    union_ = static_cast<int64_t>(sum_.indices.size());
    return Status::Ok();
  }

  // On GPU memory the mean is already in the group's floats.
  Status Decode(const Work& work, const StepContext& step, void* stream) override {
    if (step.device == nullptr) ScatterMean(sum_, static_cast<float>(step.comm->size()), work.span());
    return UnpackIfPacked(work, layout_.index, stream);
  }

  // The decode is at most an unpack; the encode is topk's or dgc's (no iteration).
  bool Graphable(bool decode) const override { return !decode; }
  const char* CollectiveName() const override { return "zen"; }
  int64_t zen_union() const override { return union_; }
  kernels::Buffer* state() override { return &state_; }

 private:
  GroupLayout layout_;
  std::unique_ptr<kernels::Compressor> compressor_;
  kernels::Buffer state_, payload_;
  kernels::zen::Sparse sum_;
  int64_t union_ = 0;
};

class ZenSparseRunner final : public SchemeRunner {
 public:
  explicit ZenSparseRunner(const GroupLayout& layout) : layout_(layout) {
    // Reserved for twice the plan's expected count, so a step allocates only when it has more
    // non-zeros than any before.
    nonzeros_.indices.reserve(static_cast<size_t>(layout.nonzero_capacity));
    nonzeros_.values.reserve(static_cast<size_t>(layout.nonzero_capacity));
  }

  Status Encode(const Work& work, const StepContext&, void* stream) override {
    CUPCAKE_RETURN_IF_ERROR(PackIfPacked(work, layout_.index, stream));
    kernels::zen::CollectNonzeros(work.span(), nonzeros_);
    return Status::Ok();
  }
  Status Exchange(const Work& work, const StepContext& step) override {
    CUPCAKE_ASSIGN_OR_RETURN(sum_, comm::ZenAllreduce(*step.comm, nonzeros_.view(), {work.numel, layout_.zen_seed}));
    return Status::Ok();
  }
  Status Decode(const Work& work, const StepContext& step, void* stream) override {
    ScatterMean(sum_, static_cast<float>(step.comm->size()), work.span());
    return UnpackIfPacked(work, layout_.index, stream);
  }
  bool Graphable(bool) const override { return false; }
  const char* CollectiveName() const override { return "zen"; }
  int64_t zen_union() const override { return static_cast<int64_t>(sum_.indices.size()); }

 private:
  GroupLayout layout_;
  kernels::zen::Sparse nonzeros_;
  kernels::zen::Sparse sum_;
};

}  // namespace

StatusOr<std::unique_ptr<SchemeRunner>> MakeZenRunner(const GroupLayout& layout, kernels::Backend backend) {
  auto runner = std::make_unique<ZenRunner>(layout);
  CUPCAKE_RETURN_IF_ERROR(runner->Allocate(backend));
  return std::unique_ptr<SchemeRunner>(std::move(runner));
}

StatusOr<std::unique_ptr<SchemeRunner>> MakeZenSparseRunner(const GroupLayout& layout) {
  return std::unique_ptr<SchemeRunner>(std::make_unique<ZenSparseRunner>(layout));
}

}  // namespace cupcake::runtime::internal

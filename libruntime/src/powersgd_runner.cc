// The powersgd schemes (docs/MODEL.md, "PowerSGD"; cupcake/kernels/powersgd.h): Encode computes
// P = M Q per matrix (x = the gradient plus the error-feedback memory) into `first`, with the
// uncompressed tensors behind it; Exchange allreduces `first`, orthogonalizes the summed P and
// computes Q = M^T P into `second`, and allreduces `second`; Decode keeps Q / W for the next
// step (warm start), writes P Q^T and the uncompressed means into the group and updates the
// memory. Every rank decodes the same summed buffers, so the group is bitwise equal across
// ranks. On GPU memory the codec's work between the allreduces runs on the communicator's
// stream, after the first allreduce and before the second. The state's first n floats are the
// group's error feedback in element order (the session's StatePlane::kErrorFeedback, carried
// across plan switches and in snapshots); Q is not per element and restarts from its seeded draw
// when the plan becomes active (RestartWarmStart).
#include <algorithm>
#include <vector>

#include "gravac.h"
#include "runner.h"

namespace cupcake::runtime::internal {
namespace {

std::span<float> Floats(const kernels::Buffer& b) { return {b.as<float>(), static_cast<size_t>(b.size_bytes() / 4)}; }

class PowerSgdRunner final : public SchemeRunner {
 public:
  explicit PowerSgdRunner(const GroupLayout& layout) : layout_(layout) {}

  Status Allocate(kernels::Backend backend) {
    CUPCAKE_ASSIGN_OR_RETURN(codec_, kernels::powersgd::MakeCodec(layout_.powersgd, backend));
    const kernels::powersgd::Layout& l = codec_->layout();
    CUPCAKE_ASSIGN_OR_RETURN(state_, AllocateZeroed(backend, 4 * l.state_floats()));
    CUPCAKE_ASSIGN_OR_RETURN(first_, AllocateZeroed(backend, 4 * l.first_floats()));
    CUPCAKE_ASSIGN_OR_RETURN(second_, AllocateZeroed(backend, 4 * l.second_floats()));
    CUPCAKE_RETURN_IF_ERROR(codec_->InitState(Floats(state_)));
    return kernels::Synchronize(backend);
  }

  Status Encode(const Work& work, const StepContext& step, void* stream) override {
    CUPCAKE_RETURN_IF_ERROR(PackIfPacked(work, layout_.index, stream));
    // GraVAC: the gradient with this group's error feedback, e = the state's first n.
    if (step.gain != nullptr) {
      Status s = step.gain->Observe(work.span(), state_.as<float>(), layout_.index, step.iteration,
                                    state_.backend(), stream);
      if (!s.ok()) return s.WithPrefix(StepWhere("GradientReady", layout_.index, "gain probe"));
    }
    if (Status s = codec_->EncodeP(work.span(), Floats(state_), Floats(first_), stream); !s.ok())
      return s.WithPrefix(StepWhere("GradientReady", layout_.index, "encode"));
    return Status::Ok();
  }

  Status Exchange(const Work&, const StepContext& step) override {
    comm::Communicator& comm = *step.comm;
    const kernels::powersgd::Layout& l = codec_->layout();
    CUPCAKE_RETURN_IF_ERROR(comm.Allreduce(first_.data(), first_.data(), l.first_floats(), comm::DataType::kFloat32,
                                           comm::ReduceOp::kSum));
    if (Status s = codec_->ComputeQ(Floats(first_), Floats(state_), Floats(second_), comm.stream()); !s.ok())
      return s.WithPrefix(StepWhere("Synchronize", layout_.index, "powersgd q"));
    if (l.second_floats() == 0) return Status::Ok();  // no matrix compressed: P held the group
    return comm.Allreduce(second_.data(), second_.data(), l.second_floats(), comm::DataType::kFloat32,
                          comm::ReduceOp::kSum);
  }

  Status Decode(const Work& work, const StepContext&, void* stream) override {
    if (Status s = codec_->Decode(Floats(first_), Floats(second_), Floats(state_), work.span(), stream); !s.ok())
      return s.WithPrefix(StepWhere("Synchronize", layout_.index, "decode"));
    return UnpackIfPacked(work, layout_.index, stream);
  }

  kernels::Buffer* state() override { return &state_; }

  Status RestartWarmStart() override {
    const kernels::powersgd::Layout& l = codec_->layout();
    std::vector<float> host(static_cast<size_t>(l.state_floats()));
    CUPCAKE_RETURN_IF_ERROR(state_.CopyToHost(host.data(), state_.size_bytes()));
    std::fill(host.begin() + l.n, host.begin() + l.matrix_floats, 0.0f);
    const std::vector<float> q = kernels::powersgd::InitialQ(l);
    std::copy(q.begin(), q.end(), host.begin() + l.matrix_floats);
    return state_.CopyFromHost(host.data(), state_.size_bytes());
  }

  bool Graphable(bool) const override { return false; }
  const char* CollectiveName() const override { return "allreduce"; }
  const kernels::powersgd::Layout* powersgd() const override { return &codec_->layout(); }

 private:
  GroupLayout layout_;
  std::unique_ptr<kernels::powersgd::Codec> codec_;
  kernels::Buffer state_;  // error feedback, then Q; kept across iterations
  kernels::Buffer first_, second_;  // the two allreduces' buffers, summed in place
};

}  // namespace

StatusOr<std::unique_ptr<SchemeRunner>> MakePowerSgdRunner(const GroupLayout& layout, kernels::Backend backend) {
  auto runner = std::make_unique<PowerSgdRunner>(layout);
  CUPCAKE_RETURN_IF_ERROR(runner->Allocate(backend));
  return std::unique_ptr<SchemeRunner>(std::move(runner));
}

}  // namespace cupcake::runtime::internal

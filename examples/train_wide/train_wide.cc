// train_wide: a model dominated by a few large tensors, trained data-parallel on the Cupcake
// runtime (the loop, flags and record mode: examples/common/training_job.h).
//
// An MLP 1024 -> 2048 -> 2048 -> 16 (6 tensors, 6.3 M parameters, 25 MiB of float32
// gradients, 99.7% of them in the two large weight matrices), the shape of the fully connected
// heads of VGG or of recommendation towers: little compute per byte of gradient, so
// synchronization dominates at a modest network rate. Targets come from a fixed random teacher.
#include <torch/torch.h>

#include "../common/training_job.h"

namespace {

constexpr int64_t kIn = 1024, kHidden = 2048, kOut = 16, kBatch = 32;

class Wide final : public cupcake::examples::TrainingJob {
 public:
  Wide() {
    torch::manual_seed(7);
    teacher_ = torch::nn::Linear(kIn, kOut);
    torch::manual_seed(42);  // the same initial weights on every rank
    model_ =
        torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::ReLU(), torch::nn::Linear(kHidden, kHidden),
                              torch::nn::ReLU(), torch::nn::Linear(kHidden, kOut));
  }
  std::string name() const override { return "wide"; }
  torch::nn::Module& module() override { return *model_; }
  cupcake::examples::Batch MakeBatch(int rank, int64_t index) override {
    torch::manual_seed(1000003 * (rank + 1) + index);
    torch::Tensor x = torch::randn({kBatch, kIn});
    torch::NoGradGuard no_grad;
    return {x, torch::tanh(teacher_->forward(x))};
  }
  torch::Tensor Loss(const cupcake::examples::Batch& b) override {
    return torch::mse_loss(model_->forward(b.first), b.second);
  }

 private:
  torch::nn::Linear teacher_{nullptr};
  torch::nn::Sequential model_{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  Wide job;
  return cupcake::examples::RunTrainingJob(argc, argv, job);
}

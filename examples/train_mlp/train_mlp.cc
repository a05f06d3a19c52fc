// train_mlp: a small MLP trained data-parallel on the Cupcake runtime (the loop, flags and
// record mode: examples/common/training_job.h).
//
// Inputs drawn from N(0, 1), targets from a fixed random "teacher" network, so the loss can fall
// towards 0. 5 tensors, 21 k parameters: the demo's and the tests' model.
#include <torch/torch.h>

#include "../common/training_job.h"

namespace {

constexpr int64_t kIn = 32, kHidden = 128, kOut = 8, kBatch = 64;

torch::nn::Sequential MakeMlp(int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(kIn, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, kOut));
}

class Mlp final : public cupcake::examples::TrainingJob {
 public:
  Mlp() {
    torch::manual_seed(7);
    teacher_ = MakeMlp(64);
    torch::manual_seed(42);  // the same initial weights on every rank
    model_ = MakeMlp(kHidden);
  }
  std::string name() const override { return "mlp"; }
  torch::nn::Module& module() override { return *model_; }
  cupcake::examples::Batch MakeBatch(int rank, int64_t index) override {
    torch::manual_seed(1000003 * (rank + 1) + index);
    torch::Tensor x = torch::randn({kBatch, kIn});
    torch::NoGradGuard no_grad;
    return {x, teacher_->forward(x)};
  }
  torch::Tensor Loss(const cupcake::examples::Batch& b) override {
    return torch::mse_loss(model_->forward(b.first), b.second);
  }

 private:
  torch::nn::Sequential teacher_{nullptr}, model_{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  Mlp job;
  return cupcake::examples::RunTrainingJob(argc, argv, job);
}

// train_embed: a model whose largest gradient is naturally sparse, trained data-parallel on the
// Cupcake runtime (the loop, flags and record mode: examples/common/training_job.h).
//
// A bag-of-words regressor: an embedding table of 200 000 x 32 (6.4 M parameters, 24.4 MiB of
// float32 gradient) averaged over each example's 16 tokens (EmbeddingBag, mean), then an MLP
// 32 -> 64 -> 16; the shape of recommendation and text models. Tokens follow a Zipf law (s = 1.1)
// over the vocabulary, so a batch of 32 examples touches at most 512 rows of the table: its
// gradient is zero on every other row (a density well under 1%, recorded by record mode), while
// the MLP's gradients are dense. Targets come from a fixed random teacher on the same tokens.
#include <torch/torch.h>

#include "../common/training_job.h"

namespace {

constexpr int64_t kVocab = 200000, kDim = 32, kHidden = 64, kOut = 16, kTokens = 16, kBatch = 32;

class Embed final : public cupcake::examples::TrainingJob {
 public:
  Embed() {
    torch::Tensor rank = torch::arange(1, kVocab + 1, torch::kFloat64);
    zipf_ = torch::pow(rank, -1.1).to(torch::kFloat32);
    torch::manual_seed(7);
    teacher_table_ = torch::randn({kVocab, 8});
    teacher_ = torch::nn::Linear(8, kOut);
    torch::manual_seed(42);  // the same initial weights on every rank
    table_ = model_.register_module(
        "table", torch::nn::EmbeddingBag(torch::nn::EmbeddingBagOptions(kVocab, kDim).mode(torch::kMean)));
    head_ = model_.register_module("head", torch::nn::Sequential(torch::nn::Linear(kDim, kHidden), torch::nn::ReLU(),
                                                                 torch::nn::Linear(kHidden, kOut)));
  }
  std::string name() const override { return "embed"; }
  torch::nn::Module& module() override { return model_; }
  cupcake::examples::Batch MakeBatch(int rank, int64_t index) override {
    torch::manual_seed(1000003 * (rank + 1) + index);
    torch::Tensor tokens = torch::multinomial(zipf_, kBatch * kTokens, /*replacement=*/true).view({kBatch, kTokens});
    torch::NoGradGuard no_grad;
    torch::Tensor target = torch::tanh(teacher_->forward(teacher_table_.index({tokens}).mean(1)));
    return {tokens, target};
  }
  torch::Tensor Loss(const cupcake::examples::Batch& b) override {
    return torch::mse_loss(head_->forward(table_->forward(b.first)), b.second);
  }

 private:
  torch::Tensor zipf_, teacher_table_;
  torch::nn::Linear teacher_{nullptr};
  torch::nn::EmbeddingBag table_{nullptr};
  torch::nn::Sequential head_{nullptr};
  torch::nn::Module model_;  // the table and the head
};

}  // namespace

int main(int argc, char** argv) {
  Embed job;
  return cupcake::examples::RunTrainingJob(argc, argv, job);
}

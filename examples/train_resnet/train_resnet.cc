// train_resnet: a small ResNet (many small tensors) trained data-parallel on the Cupcake runtime
// (the loop, flags and record mode: examples/common/training_job.h).
//
// A CIFAR-style ResNet-14 of width 32 on 3 x 16 x 16 images, 10 classes: a 3x3 stem, three
// stages of two basic blocks (32, 64, 128 channels, batch norm, 1x1 projections where the
// shape changes), global average pooling and a linear layer: 47 tensors, 0.7 M parameters, most
// of them under 40 k elements and 30 of them batch-norm vectors of 32-128. The images are noise;
// the labels come from a fixed random linear teacher on the pooled image, so the loss can fall.
#include <torch/torch.h>

#include "../common/training_job.h"

namespace {

namespace nn = torch::nn;

constexpr int64_t kWidth = 32, kClasses = 10, kImage = 16, kBatch = 32;

struct BlockImpl : nn::Module {
  BlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(
            register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2", nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      project = register_module("project", nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
      project_bn = register_module("project_bn", nn::BatchNorm2d(out));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = bn2(conv2(torch::relu(bn1(conv1(x)))));
    return torch::relu(y + (project ? project_bn(project(x)) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Conv2d project{nullptr};
  nn::BatchNorm2d project_bn{nullptr};
};
TORCH_MODULE(Block);

struct ResNetImpl : nn::Module {
  ResNetImpl()
      : stem(register_module("stem", nn::Conv2d(nn::Conv2dOptions(3, kWidth, 3).padding(1).bias(false)))),
        stem_bn(register_module("stem_bn", nn::BatchNorm2d(kWidth))),
        blocks(register_module("blocks", nn::Sequential())),
        fc(register_module("fc", nn::Linear(4 * kWidth, kClasses))) {
    int64_t in = kWidth;
    for (int64_t stage = 0; stage < 3; ++stage) {
      const int64_t out = kWidth << stage;
      blocks->push_back(Block(in, out, stage == 0 ? 1 : 2));
      blocks->push_back(Block(out, out, 1));
      in = out;
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = blocks->forward(torch::relu(stem_bn(stem(x))));
    return fc(x.mean({2, 3}));
  }
  nn::Conv2d stem;
  nn::BatchNorm2d stem_bn;
  nn::Sequential blocks;
  nn::Linear fc;
};
TORCH_MODULE(ResNet);

class ResNetJob final : public cupcake::examples::TrainingJob {
 public:
  ResNetJob() {
    torch::manual_seed(7);
    teacher_ = torch::randn({3, kClasses});
    torch::manual_seed(42);  // the same initial weights on every rank
    model_ = ResNet();
  }
  std::string name() const override { return "resnet"; }
  torch::nn::Module& module() override { return *model_; }
  cupcake::examples::Batch MakeBatch(int rank, int64_t index) override {
    torch::manual_seed(1000003 * (rank + 1) + index);
    torch::Tensor x = torch::randn({kBatch, 3, kImage, kImage});
    return {x, x.mean({2, 3}).matmul(teacher_).argmax(1)};
  }
  torch::Tensor Loss(const cupcake::examples::Batch& b) override {
    return torch::cross_entropy_loss(model_->forward(b.first), b.second);
  }

 private:
  torch::Tensor teacher_;
  ResNet model_{nullptr};
};

}  // namespace

int main(int argc, char** argv) {
  ResNetJob job;
  return cupcake::examples::RunTrainingJob(argc, argv, job);
}

// The LibTorch examples' side of the shared training loop (training_loop.h, which the replay
// job runs too): a job supplies its model, its batches and its loss (TrainingJob);
// RunTrainingJob does the rest on the Cupcake runtime (libruntime/README.md), the same way for
// every model:
//
//   record:  CUPCAKE_RECORD=model.json [CUPCAKE_RECORD_ITERATIONS=20] mpirun -np 4 JOB
//            (what `cupcake-profile compute --db DB -- mpirun -np 4 JOB` sets up)
//   train:   mpirun -np 4 JOB --plan plan.pb [--epochs 5] [--steps 10] [--lr X] [--warmup N]
//                [--timing FILE.json] [--timeline FILE.json] [--threads N] [--batches N] [--adapt W]
//
// Every rank starts from the same weights (the job seeds them) and trains on its own batches,
// made before the loop (`--batches` per rank, used in turn), so an iteration is forward,
// backward, synchronization and the optimizer step, nothing else. Each parameter's gradient
// hook copies the gradient into a slice of one flat buffer (plan order, so the runtime works on
// it in place) and marks it ready; after Synchronize the averaged gradients are copied back and
// SGD steps. Record mode does the same work with a Recorder instead of a Session, so the times
// it records (forward, each gradient's gap, update) are those of the training loop; after each
// iteration it also samples every gradient's share of non-zeros (the model's densities, which
// make the planner offer zen_sparse for naturally sparse gradients).
//
// Rank 0 prints the loss on the job's evaluation batch before training and after every epoch
// (`epoch E loss L`). `--timing FILE` (rank 0) writes, after training, every iteration's time
// (the slowest rank's, forward start to step end), the losses and whether the ranks ended with
// bitwise identical parameters; the job exits 1 when they did not. `--timeline FILE` writes
// what the runtime did in the last iteration, per group, next to the iteration's own marks.
// `--adapt W` (the plan a ladder file) lets GraVAC choose the rung every W steps with its default
// thresholds (docs/ADAPTIVE.md); rank 0 prints each window's decision (`gravac: steps ...`).
#pragma once

#include <torch/torch.h>

#include <string>
#include <utility>

namespace cupcake::examples {

using Batch = std::pair<torch::Tensor, torch::Tensor>;  // input, target

class TrainingJob {
 public:
  virtual ~TrainingJob() = default;
  // The model file's name (record mode) and the name in messages.
  virtual std::string name() const = 0;
  // The model, with the same initial weights on every rank.
  virtual torch::nn::Module& module() = 0;
  // Rank `rank`'s batch number `index` (deterministic).
  virtual Batch MakeBatch(int rank, int64_t index) = 0;
  // Forward pass and loss of one batch.
  virtual torch::Tensor Loss(const Batch& batch) = 0;
};

// Runs the job (main's whole body after the job is made); returns main's exit code.
int RunTrainingJob(int argc, char** argv, TrainingJob& job);

}  // namespace cupcake::examples

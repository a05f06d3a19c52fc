"""A data-parallel PyTorch job on Cupcake (docs/PYTHON.md): a small CNN learning a fixed random
teacher CNN's labels from synthetic 3x32x32 images, one rank per process (mpirun or torchrun).

  record:  cupcake-profile compute --db local.db -- mpirun -np 2 python3 train.py
           (CUPCAKE_RECORD set, no --plan: DistributedOptimizer records the model 'cnn' and exits)
  train:   mpirun -np 2 python3 train.py --plan cnn.pb [--epochs 5] [--steps 20]
           or torchrun --nproc_per_node 2 train.py --plan cnn.pb (gloo, no MPI)
  fp32:    mpirun -np 2 python3 train.py --fp32      (no plan: torch DDP over gloo, uncompressed,
           the loss to compare with)
Every rank starts from the same weights and draws its own batches; rank 0 prints the loss on a
fixed evaluation set after every epoch.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

MODEL_NAME = "cnn"


class Cnn(torch.nn.Module):
    """Three conv blocks and two linear layers; `width` scales the channels, `hidden` the first
    linear layer's outputs (default 4 * width; width 32: 0.36 M parameters, 1.4 MiB of
    gradients)."""

    def __init__(self, width=32, hidden=None, classes=10):
        super().__init__()
        hidden = hidden or 4 * width
        self.conv1 = torch.nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(width, 2 * width, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(2 * width, 4 * width, 3, padding=1)
        self.fc1 = torch.nn.Linear(4 * width * 4 * 4, hidden)
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Data:
    """Synthetic data: 10 classes, each a fixed random 3x32x32 prototype image; a sample is its
    class's prototype plus N(0, NOISE^2) noise per pixel, its label the class. The loss starts at
    ln 10 = 2.30 and falls as the CNN learns the prototypes."""

    NOISE = 1.0

    def __init__(self, batch, classes=10):
        self.prototypes = torch.randn(classes, 3, 32, 32, generator=torch.Generator().manual_seed(7))
        self.batch = batch

    def get(self, rank, step):
        g = torch.Generator().manual_seed(1000003 * (rank + 1) + step)
        y = torch.randint(0, self.prototypes.shape[0], (self.batch,), generator=g)
        x = self.prototypes[y] + self.NOISE * torch.randn(self.batch, 3, 32, 32, generator=g)
        return x, y

    def eval_loss(self, model):
        x, y = self.get(1 << 20, 0)  # a fixed set, the same on every rank
        with torch.no_grad():
            return F.cross_entropy(model(x), y).item()


def rank_and_size():
    """From mpirun's variables, else torchrun's (RANK, WORLD_SIZE), else one rank."""
    env = os.environ
    return (int(env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", "0"))),
            int(env.get("OMPI_COMM_WORLD_SIZE", env.get("WORLD_SIZE", "1"))))


def make_model(width, hidden=None):
    torch.manual_seed(42)  # the same initial weights on every rank
    return Cnn(width, hidden)


def ddp_model(model, rank, size, bucket_mib=25):
    """torch DDP over gloo on the MPI ranks (MASTER_ADDR, default 127.0.0.1; MASTER_PORT, default 29500)."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=size)
    return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mib)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", help="a plan from cupcake-plan search for model 'cnn'")
    parser.add_argument("--fp32", action="store_true", help="no plan: torch DDP over gloo (uncompressed fp32)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--width", type=int, default=32, help="channels of the first conv layer")
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    recording = bool(os.environ.get("CUPCAKE_RECORD"))
    if sum([args.plan is not None, args.fp32, recording]) != 1:
        parser.error("expected exactly one of --plan PLAN.pb, --fp32, or CUPCAKE_RECORD in the environment "
                     "(cupcake-profile compute)")
    if args.epochs < 1 or args.steps < 1 or args.batch < 1 or args.width < 1:
        parser.error("--epochs, --steps, --batch and --width must be >= 1")

    torch.set_num_threads(1)  # several ranks share the cores
    rank, size = rank_and_size()
    data = Data(args.batch)
    model = make_model(args.width)
    if args.fp32:
        model = ddp_model(model, rank, size)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    else:
        import cupcake.torch
        opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
                                                 model.named_parameters(), plan=args.plan, model_name=MODEL_NAME)
    if rank == 0:
        print("epoch 0 loss %.6f" % data.eval_loss(model), flush=True)
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        for step in range(args.steps):
            x, y = data.get(rank, epoch * args.steps + step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if rank == 0:
            ms = (time.perf_counter() - start) * 1e3 / args.steps
            print("epoch %d loss %.6f (%.1f ms/step)" % (epoch, data.eval_loss(model), ms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

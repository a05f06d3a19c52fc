"""The model the Python tests train: a small CNN on synthetic data (docs/PYTHON.md). Every rank
builds the same initial weights; each rank draws its own batches of noisy class prototypes, so the
loss can fall. Model and batches live on CUPCAKE_TEST_DEVICE (default cpu; cuda on a GPU machine):
the same numbers drawn on the host, then moved."""

import os

import torch

MODEL_NAME = "pycnn"
BATCH = 16
DEVICE = torch.device(os.environ.get("CUPCAKE_TEST_DEVICE", "cpu"))


class Cnn(torch.nn.Module):
    def __init__(self, channels=8, head2=True):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(channels, 16, 3, padding=1)
        self.fc1 = torch.nn.Linear(16 * 4 * 4, 32)
        self.fc2 = torch.nn.Linear(32, 10)
        # A second head, used unless forward(use_head2=False): a gradient the error test withholds.
        self.head2 = torch.nn.Linear(32, 10) if head2 else None

    def forward(self, x, use_head2=True):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        y = self.fc2(x)
        if self.head2 is not None and use_head2:
            y = y + 0.5 * self.head2(x)
        return y


def make_model(seed=42, **kwargs):
    torch.manual_seed(seed)
    return Cnn(**kwargs).to(DEVICE)


_prototypes = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(7))


def batch(rank, step):
    """Rank `rank`'s batch for step `step`: class y's fixed random prototype image plus N(0, 1)
    noise per pixel, labelled y (balanced classes; the loss starts near ln 10)."""
    g = torch.Generator().manual_seed(1000003 * (rank + 1) + step)
    y = torch.randint(0, 10, (BATCH,), generator=g)
    return (_prototypes[y] + torch.randn(BATCH, 3, 16, 16, generator=g)).to(DEVICE), y.to(DEVICE)


def eval_loss(model):
    x, y = batch(1 << 20, 0)  # a fixed set, the same on every rank
    x, y = torch.cat([x, batch(1 << 20, 1)[0]]), torch.cat([y, batch(1 << 20, 1)[1]])
    with torch.no_grad():
        return torch.nn.functional.cross_entropy(model(x), y).item()


def mpi_rank_size():
    """This process's rank and world size from Open MPI's environment, else torchrun's (1 rank
    without a launcher)."""
    env = os.environ
    return (int(env.get("OMPI_COMM_WORLD_RANK", env.get("RANK", "0"))),
            int(env.get("OMPI_COMM_WORLD_SIZE", env.get("WORLD_SIZE", "1"))))


def init_gloo(store_file):
    """torch.distributed over gloo on the same ranks (a file store: no port to collide on)."""
    rank, size = mpi_rank_size()
    torch.distributed.init_process_group("gloo", init_method="file://" + store_file, rank=rank, world_size=size)
    return rank, size

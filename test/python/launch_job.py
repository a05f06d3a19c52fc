"""Trains test/python/cnn.py's model with a plan for STEPS steps and writes this rank's final
parameters (float32, in named_parameters order, raw bytes) to OUT.rank<r>, for python_test.sh's
launch stage to compare bit for bit between a job under mpirun and one under torchrun. The job
initializes nothing itself: the package picks its launch from the environment (cupcake.init),
and it must be the one given (mpi or gloo). With --init-dist the job first initializes
torch.distributed itself (gloo, from torchrun's variables), and the package uses its store.
Usage: launch_job.py PLAN OUT mpi|gloo [--init-dist]"""

import sys

import torch
import torch.distributed as dist

import cnn
import cupcake
import cupcake.torch

STEPS = 5


def main():
    plan, out, expected = sys.argv[1], sys.argv[2], sys.argv[3]
    init_dist = sys.argv[4:] == ["--init-dist"]
    torch.set_num_threads(1)
    if init_dist:
        dist.init_process_group("gloo", init_method="env://")
    # Differently seeded replicas: the initial broadcast must make them equal.
    model = cnn.make_model(seed=42 + 1000 * cupcake.torch.rank())
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                             model.named_parameters(), plan=plan)
    launched = cupcake.launch()
    kind = "mpi" if isinstance(launched, cupcake.Mpi) else "gloo" if isinstance(launched, cupcake.Gloo) else "?"
    rank, size = cupcake.torch.rank(), cupcake.torch.size()
    if kind != expected or size != 2:
        sys.exit("FAIL: rank %d: launched by %s over %d ranks; expected %s over 2" % (rank, kind, size, expected))
    initial = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
    for step in range(STEPS):
        opt.zero_grad()
        x, y = cnn.batch(rank, step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    final = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if torch.equal(final, initial):
        sys.exit("FAIL: rank %d: the parameters did not change in %d steps" % (rank, STEPS))
    opt.close()
    with open("%s.rank%d" % (out, rank), "wb") as f:
        f.write(final.numpy().tobytes())
    if rank == 0:
        print("ok: %s: %d steps over %d ranks (%s%s), parameters in %s.rank*"
              % (plan, STEPS, size, kind, ", torch.distributed initialized by the job" if init_dist else "", out))


if __name__ == "__main__":
    main()

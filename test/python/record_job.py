"""Record mode under `cupcake-profile compute -- mpirun -np 2 python3 record_job.py ORDER_FILE`:
DistributedOptimizer with no plan and CUPCAKE_RECORD set records the gradient-ready times, merges
the ranks, writes the model and ends the job. Rank 0 first writes ORDER_FILE: the gradient-ready
order found independently, from plain tensor hooks in one backward pass (as train_mlp does), for
the check to compare with the model the profiler imported."""

import json
import sys

import torch

import cnn
import cupcake.torch


def main():
    order_file = sys.argv[1]
    torch.set_num_threads(1)
    rank, _ = cnn.mpi_rank_size()
    model = cnn.make_model()

    # The order from tensor hooks (they fire as each parameter's gradient is computed).
    order = []
    handles = [p.register_hook(lambda g, n=n: order.append(n)) for n, p in model.named_parameters()]
    x, y = cnn.batch(rank, -1)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for h in handles:
        h.remove()
    model.zero_grad(set_to_none=True)
    if rank == 0:
        params = dict(model.named_parameters())
        with open(order_file, "w") as f:
            json.dump([[n, params[n].numel(), list(params[n].shape)] for n in order], f)

    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                             model.named_parameters(), model_name=cnn.MODEL_NAME)
    for step in range(1000):
        x, y = cnn.batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()  # ends the job once CUPCAKE_RECORD_ITERATIONS iterations are recorded
    print("FAIL: record mode did not end the job after 1000 steps", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()

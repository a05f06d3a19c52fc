"""Replicas start equal, under mpirun with 2 ranks: each rank seeds its model and its optimizer
differently (other weights, its own momentum buffers and learning rate); DistributedOptimizer
broadcasts rank 0's at construction, so every parameter, momentum buffer and hyperparameter is
rank 0's, and after training with the fp32 plan the weights are equal on both ranks. With
broadcast=False the same ranks stay different (the check can fail). broadcast_parameters covers
a state_dict with buffers of other dtypes; rank(), size(), local_rank() and local_size() agree
with torch.distributed (both ranks on this host).
Usage: replicas_job.py PLAN STORE_FILE"""

import sys

import torch
import torch.distributed as dist

import cnn
import cupcake.torch
from expect import check

STEPS = 4


def gathered(t):
    """Every rank's copy of `t` (float64 on the CPU), rank order, through gloo (the reference)."""
    t = t.detach().reshape(-1).to(torch.float64)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return out


def equal_on_ranks(t):
    copies = gathered(t)
    return all(torch.equal(copies[0], c) for c in copies[1:])


def seeded_per_rank(rank):
    """A model and an SGD optimizer whose weights, momentum buffers and lr differ between ranks."""
    model = cnn.make_model(seed=100 + rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * (rank + 1), momentum=0.9)
    x, y = cnn.batch(rank, 0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()  # momentum buffers of this rank's own gradient
    opt.zero_grad()
    return model, opt


def main():
    plan, store = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank, size = cnn.init_gloo(store)
    check((cupcake.torch.rank(), cupcake.torch.size()) == (rank, size),
          "rank(), size() = %r, expected %r as torch.distributed" % ((cupcake.torch.rank(), cupcake.torch.size()),
                                                                    (rank, size)), rank)
    check((cupcake.torch.local_rank(), cupcake.torch.local_size()) == (rank, size),
          "local_rank(), local_size() = %r, expected %r (one host)" % ((cupcake.torch.local_rank(),
                                                                        cupcake.torch.local_size()), (rank, size)),
          rank)

    # Without the broadcast the replicas differ: what the test below must change.
    model, opt = seeded_per_rank(rank)
    check(not equal_on_ranks(model.fc1.weight), "differently seeded ranks have equal weights", rank)
    unsynced = cupcake.torch.DistributedOptimizer(opt, model.named_parameters(), plan=plan, broadcast=False)
    check(not equal_on_ranks(model.fc1.weight), "broadcast=False changed the weights", rank)
    unsynced.close()

    model, opt = seeded_per_rank(rank)
    reference, _ = seeded_per_rank(0)  # rank 0's weights, rebuilt locally
    opt = cupcake.torch.DistributedOptimizer(opt, model.named_parameters(), plan=plan)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        check(torch.equal(p.detach(), q.detach()), "parameter '%s' is not rank 0's after construction" % name, rank)
        check(equal_on_ranks(opt.state[p]["momentum_buffer"]), "momentum of '%s' differs between ranks" % name, rank)
    check(opt.param_groups[0]["lr"] == 0.01, "lr %r, expected rank 0's 0.01" % opt.param_groups[0]["lr"], rank)
    for step in range(STEPS):
        x, y = cnn.batch(rank, step + 1)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for name, p in model.named_parameters():
        check(equal_on_ranks(p), "parameter '%s' differs between ranks after %d steps" % (name, STEPS), rank)
    opt.close()

    # A state_dict with buffers of other dtypes and odd sizes (alignment inside the one broadcast).
    state = {"a": torch.full((3,), float(rank), dtype=torch.float32),
             "b": torch.full((5,), rank + 7, dtype=torch.int64),
             "c": torch.full((2, 3), rank * 0.5, dtype=torch.float64),
             "d": torch.tensor([rank == 0, rank == 1])}
    cupcake.torch.broadcast_parameters(state, root_rank=1)
    want = {"a": torch.full((3,), 1.0), "b": torch.full((5,), 8, dtype=torch.int64),
            "c": torch.full((2, 3), 0.5, dtype=torch.float64), "d": torch.tensor([False, True])}
    for k, t in state.items():
        check(torch.equal(t, want[k]), "broadcast_parameters from rank 1: '%s' is %r, expected %r" % (k, t, want[k]),
              rank)
    try:
        cupcake.torch.broadcast_parameters(state, root_rank=2)
        check(False, "root_rank 2 of 2 accepted", rank)
    except ValueError as e:
        check("root_rank: out of range; got 2" in str(e), "message: %s" % e, rank)
    if rank == 0:
        print("ok: replicas equal after construction (parameters, momentum, lr) and after %d steps; broadcast=False "
              "leaves them apart; broadcast_parameters over mixed dtypes" % STEPS)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

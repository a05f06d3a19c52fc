"""A ladder plan under mpirun with 2 ranks: the optimizer starts on the fp32 rung (every gradient
the exact average, as gloo computes it), the job switches to the most compressed rung with
use_ratio (the averaged gradients then differ from the dense average, the same on both ranks),
and the weights stay equal on both ranks. A ratio that is not a rung raises, naming the rungs.
Usage: ladder_job.py LADDER STORE_FILE"""

import copy
import sys

import torch
import torch.distributed as dist

import cnn
import cupcake.torch
from expect import check


def gathered(t):
    t = t.detach().reshape(-1).to(torch.float64)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return out


def step(model, opt, rank, it):
    """One step; returns (each gradient as averaged by the plan, gloo's dense average of it). The
    local gradients come from a twin of the model: the runtime may average the model's own in
    place while backward still runs."""
    x, y = cnn.batch(rank, it)
    twin = copy.deepcopy(model)
    torch.nn.functional.cross_entropy(twin(x), y).backward()
    local = [p.grad.detach().clone() for p in twin.parameters()]
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.synchronize()
    dense = []
    for g in local:
        dist.all_reduce(g)
        dense.append(g / dist.get_world_size())
    averaged = [p.grad.detach().clone() for p in model.parameters()]
    with opt.skip_synchronize():
        opt.step()
    return averaged, dense


def main():
    plan, store = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank, _ = cnn.init_gloo(store)
    model = cnn.make_model()
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                                             plan=plan)
    check(opt.ratios == [1.0, 0.1, 0.01], "ratios %r, expected [1, 0.1, 0.01]" % opt.ratios, rank)
    for it in range(2):
        averaged, dense = step(model, opt, rank, it)
        check(all(torch.equal(a, d) for a, d in zip(averaged, dense)), "the fp32 rung is not the exact average", rank)
    opt.use_ratio(0.01)
    differs = False
    for it in range(2, 5):
        averaged, dense = step(model, opt, rank, it)
        differs = differs or not all(torch.equal(a, d) for a, d in zip(averaged, dense))
        for a in averaged:
            copies = gathered(a)
            check(torch.equal(copies[0], copies[1]), "ranks hold different averaged gradients at step %d" % it, rank)
    check(differs, "the rung at 0.01 sent every gradient exactly", rank)
    for name, p in model.named_parameters():
        copies = gathered(p)
        check(torch.equal(copies[0], copies[1]), "parameter '%s' differs between ranks" % name, rank)
    try:
        opt.use_ratio(0.5)
        check(False, "use_ratio(0.5) accepted", rank)
    except ValueError as e:
        check("got 0.5, expected one of 1, 0.1, 0.01" in str(e), "message: %s" % e, rank)
    opt.close()
    if rank == 0:
        print("ok: ladder: the fp32 rung exact for 2 steps, then the 0.01 rung, ranks equal")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

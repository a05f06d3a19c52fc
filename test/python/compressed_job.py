"""A compressed plan (efsignsgd, topk), under mpirun with 2 ranks: after every synchronization the
ranks hold identical gradients (gathered with torch.distributed over gloo and compared bit for
bit), which differ from a rank's own local gradient (so the runtime did change them), the weights
stay identical, and the evaluation loss falls by at least 10% over the steps.
Usage: compressed_job.py PLAN STORE_FILE"""

import sys

import torch
import torch.distributed as dist

import cnn
import cupcake.torch

STEPS = 40


def flat_grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def identical_on_ranks(t):
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def main():
    plan, store = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank, _ = cnn.init_gloo(store)
    model, shadow = cnn.make_model(), cnn.make_model()
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                             model.named_parameters(), plan=plan)
    first = cnn.eval_loss(model)
    changed = 0
    for step in range(STEPS):
        x, y = cnn.batch(rank, step)
        shadow.load_state_dict(model.state_dict())  # this rank's local gradient, for comparison
        shadow.zero_grad()
        torch.nn.functional.cross_entropy(shadow(x), y).backward()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        g = flat_grads(model)
        if not identical_on_ranks(g):
            sys.exit("FAIL: %s: rank %d step %d: the ranks' synchronized gradients differ" % (plan, rank, step))
        changed += int(not torch.equal(g, flat_grads(shadow)))
        opt.step()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if not identical_on_ranks(weights):
        sys.exit("FAIL: %s: rank %d: the ranks' weights differ after %d steps" % (plan, rank, STEPS))
    if changed == 0:
        sys.exit("FAIL: %s: rank %d: the synchronized gradient equalled the local one at every step" % (plan, rank))
    last = cnn.eval_loss(model)
    if not last < 0.9 * first:
        sys.exit("FAIL: %s: the loss did not fall by 10%%; got %.4f -> %.4f after %d steps" % (plan, first, last, STEPS))
    if rank == 0:
        print("ok: %s: %d steps, identical gradients and weights on both ranks, loss %.4f -> %.4f"
              % (plan, STEPS, first, last))
    opt.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

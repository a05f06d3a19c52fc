"""One arm of bench/python/ddp_compare.sh, run under mpirun: trains examples/python/train.py's CNN
for WARMUP + ITERS steps and reports the iteration times and the loss (docs/PYTHON.md).

  ddp_compare.py --arm ddp-fp32|ddp-fp16|ddp-powersgd [--bucket-mib 25] [--powersgd-rank 4]
  ddp_compare.py --arm cupcake --plan PLAN.pb        (or CUPCAKE_RECORD set: record the model)

An iteration is zero_grad, forward, backward and step (synchronization included), timed on every
rank with time.perf_counter; its time is the slowest rank's (gathered over gloo after the timed
loop, never inside it). Rank 0 prints one JSON line: median, p10 and p90 over the ITERS timed
iterations, the evaluation loss before and after all the steps, and the arm's settings.
torch.distributed (gloo) is initialized in every arm (DDP uses it; Cupcake's arm only gathers the
times with it afterwards): MASTER_ADDR (default 127.0.0.1) and MASTER_PORT (default 29500).
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
import train  # noqa: E402  (the example's model and data)
from arms import DDP_ARMS, finish, percentile, wrap  # noqa: E402  (the arms, shared with tta.py)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", required=True, choices=list(DDP_ARMS) + ["cupcake"])
    parser.add_argument("--plan")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--bucket-mib", type=float, default=25)
    parser.add_argument("--powersgd-rank", type=int, default=4)
    parser.add_argument("--model-name", default="ddpbench")
    args = parser.parse_args()
    recording = bool(os.environ.get("CUPCAKE_RECORD"))
    if args.arm == "cupcake" and (args.plan is None) == (not recording):
        parser.error("--arm cupcake: expected --plan PLAN.pb, or CUPCAKE_RECORD set (record mode)")

    torch.set_num_threads(1)
    rank, size = train.rank_and_size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=size)
    data = train.Data(args.batch)
    model = train.make_model(args.width, args.hidden)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9)  # noqa: E731
    model, opt = wrap(args.arm, model, sgd, bucket_mib=args.bucket_mib, powersgd_rank=args.powersgd_rank,
                      plan=args.plan, model_name=args.model_name)
    first = data.eval_loss(model)
    times = []
    for step in range(args.warmup + args.iters):
        x, y = data.get(rank, step)  # made before the clock starts: the data is not what is timed
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - start)
    timed = torch.tensor(times[args.warmup:], dtype=torch.float64)
    dist.all_reduce(timed, op=dist.ReduceOp.MAX)  # each iteration: the slowest rank's time
    last = data.eval_loss(model)
    ms = [t * 1e3 for t in timed.tolist()]
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(json.dumps({"arm": args.arm, "plan": args.plan, "ranks": size, "batch_per_rank": args.batch,
                          "params": params, "gradient_mib": round(params * 4 / 2**20, 2), "warmup": args.warmup,
                          "iters": args.iters, "median_ms": round(statistics.median(ms), 2),
                          "p10_ms": round(percentile(ms, 0.1), 2), "p90_ms": round(percentile(ms, 0.9), 2),
                          "loss_start": round(first, 4), "loss_end": round(last, 4),
                          "steps": args.warmup + args.iters}), flush=True)
    finish(args.arm, opt)


if __name__ == "__main__":
    main()

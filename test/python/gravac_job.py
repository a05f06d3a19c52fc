"""GraVAC under mpirun with 2 ranks (docs/ADAPTIVE.md): a topk ladder with
adapt=cupcake.torch.GraVAC(window=2, ...); every rank holds the same decisions (one per window,
each window sending the rung the previous one chose), rank 0's JSON-lines log holds them too, the
weights stay equal on both ranks, and misuse of adapt raises.
Usage: gravac_job.py LADDER STORE_FILE LOG"""

import json
import sys

import torch
import torch.distributed as dist

import cnn
import cupcake.torch
from expect import check

KEYS = {"step", "steps", "ratio", "ratio_min", "ratio_c", "gain_min", "gain_c", "groups_skipped", "predicted_ms",
        "measured_ms", "bytes_sent", "probe_ms", "next_ratio"}


def main():
    plan, store, log = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    rank, world = cnn.init_gloo(store)
    model = cnn.make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05)
    for bad, expected in ((dict(adapt="gravac", plan=plan), "expected None or cupcake.torch.GraVAC"),
                          (dict(adapt=cupcake.torch.GraVAC()), "needs a plan")):
        try:
            cupcake.torch.DistributedOptimizer(sgd, model.named_parameters(), **bad)
            check(False, "DistributedOptimizer accepted %r" % bad, rank)
        except ValueError as e:
            check(expected in str(e), "message: %s" % e, rank)
    opt = cupcake.torch.DistributedOptimizer(sgd, model.named_parameters(), plan=plan,
                                             adapt=cupcake.torch.GraVAC(window=2, epsilon=0.3, omega=0.01, log=log))
    for it in range(12):
        x, y = cnn.batch(rank, it)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    decisions = opt.decisions
    check(len(decisions) == 6, "%d decisions after 12 steps of window 2, expected 6" % len(decisions), rank)
    check(all(set(d) == KEYS for d in decisions), "keys %r, expected %r" % (sorted(decisions[0]), sorted(KEYS)), rank)
    check(decisions[0]["ratio"] == 1.0, "the first window sent %r, expected the fp32 rung" % decisions[0]["ratio"], rank)
    for a, b in zip(decisions, decisions[1:]):
        check(b["ratio"] == a["next_ratio"], "window at step %d sent %r, the decision before chose %r"
              % (b["step"], b["ratio"], a["next_ratio"]), rank)
        check(b["step"] == a["step"] + 2, "windows at steps %d then %d" % (a["step"], b["step"]), rank)
    check(all(0 < d["gain_c"] <= d["gain_min"] <= 1 for d in decisions), "gains out of order: %r" % decisions, rank)
    # Every field that must agree (not bytes_sent or probe_ms: this rank's own), gathered as float64.
    shared = torch.tensor([[d[k] for k in sorted(KEYS - {"bytes_sent", "probe_ms"})] for d in decisions],
                          dtype=torch.float64)
    everyone = [torch.empty_like(shared) for _ in range(world)]
    dist.all_gather(everyone, shared)
    check(torch.equal(everyone[0], everyone[1]), "the ranks' decisions differ:\n%r\n%r" % (everyone[0], everyone[1]),
          rank)
    for name, p in model.named_parameters():
        copies = [torch.empty_like(p.detach()) for _ in range(world)]
        dist.all_gather(copies, p.detach())
        check(torch.equal(copies[0], copies[1]), "parameter '%s' differs between ranks" % name, rank)
    opt.close()
    check(opt.decisions == decisions, "decisions lost at close", rank)
    dist.barrier()
    if rank == 0:
        with open(log) as f:
            logged = [json.loads(line) for line in f]
        check(logged == decisions, "the log holds %d decisions, not the session's" % len(logged), rank)
        print("ok: gravac: %d windows, ratios sent %s, the same on both ranks"
              % (len(decisions), [d["ratio"] for d in decisions]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""cupcake.torch.Checkpointer under mpirun with 2 ranks (docs/CHECKPOINT.md): trains test/python/cnn.py
for --steps steps, committing a snapshot after every optimizer step, and
  --no-ckpt       trains without a Checkpointer (the uninterrupted reference) and saves the weights;
  --kill-at K     ends the process with os._exit right after commit(K), mid-copy or not, as a crash
                  (--wait-before-kill: once the copy of step K is done, so the restart must resume from K);
  --compare REF   after restore() and the remaining steps, compares every parameter with REF's bit for
                  bit and exits 1 naming the first that differs (the test's verdict);
  --expect-start  the step restore() must return (a set: "6,7"), else exit 1;
  --wrong-model   builds the model with 4 channels instead of 8: restore() must raise cupcake.Error naming
                  the first entry whose size differs (and write nothing), else exit 1;
  --replica-chunk-bytes N, --replica-group-hosts M  the Checkpointer's options of those names;
  --bad-options   checks that out-of-range replica_chunk_bytes and replica_group_hosts raise ValueError
                  naming the argument, then exits (0: as expected).
PLAN: a plan file (DistributedOptimizer over SGD with momentum: its error feedback is part of the
snapshot), or "-" for no DistributedOptimizer (each rank's own Adam: tensor state, tuple betas; and a
StepLR scheduler made after the Checkpointer, its state added with add_state).
Usage: checkpoint_job.py PLAN OUT --steps N [--name NAME] [--kill-at K [--wait-before-kill]]
       [--persist DIR --persist-every P] [--replicate [--replica-chunk-bytes N] [--replica-group-hosts M]]
       [--no-ckpt] [--compare REF] [--expect-start S,...] [--remove] [--wrong-model] [--bad-options]"""

import argparse
import os
import sys

import torch

import cnn
import cupcake.torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("plan")
    p.add_argument("out")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--name", default="job")
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--persist", default=None)
    p.add_argument("--persist-every", type=int, default=0)
    p.add_argument("--no-ckpt", action="store_true")
    p.add_argument("--compare", default=None)
    p.add_argument("--expect-start", default=None)
    p.add_argument("--remove", action="store_true", help="delete this job's segments at the end")
    p.add_argument("--wrong-model", action="store_true")
    p.add_argument("--wait-before-kill", action="store_true")
    p.add_argument("--replicate", action="store_true")
    p.add_argument("--replica-chunk-bytes", type=int, default=0)
    p.add_argument("--replica-group-hosts", type=int, default=2)
    p.add_argument("--bad-options", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(1)
    rank = cupcake.torch.rank()
    model = cnn.make_model(channels=4) if a.wrong_model else cnn.make_model()
    if a.plan == "-":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                                 model.named_parameters(), plan=a.plan)
    if a.bad_options:
        check_bad_options(model, opt, a.name)
        return
    ckpt = None
    start = 0
    if not a.no_ckpt:
        ckpt = cupcake.torch.Checkpointer(model, opt, name=a.name, persist_dir=a.persist, persist_every=a.persist_every,
                                          replicate=a.replicate, replica_chunk_bytes=a.replica_chunk_bytes,
                                          replica_group_hosts=a.replica_group_hosts)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5) if a.plan == "-" else None
    if ckpt is not None and scheduler is not None:
        ckpt.add_state("scheduler", scheduler)
    if ckpt is not None:
        if a.wrong_model:
            before = {n: t.clone() for n, t in model.state_dict().items()}
            try:
                ckpt.restore()
            except cupcake.Error as e:
                want = "]: entries[3].size_bytes: does not match the job; got 864, expected 432 ('model.conv1.weight')"
                if want not in str(e) or str(e).find(cupcake.Checkpointer.segment_name(a.name, rank)) < 0:
                    sys.exit("FAIL: rank %d: restore() into another model: got '%s', expected the segment and '%s'"
                             % (rank, e, want))
                if any(not torch.equal(before[n], t) for n, t in model.state_dict().items()):
                    sys.exit("FAIL: rank %d: a refused restore changed the model" % rank)
                if rank == 0:
                    print("ok: restore() into another model refused: %s" % str(e).splitlines()[0], flush=True)
                return
            sys.exit("FAIL: rank %d: restore() into a model of other shapes did not raise" % rank)
        start = ckpt.restore()
    where = " from %s (refused: %s)" % (ckpt.source, "; ".join(ckpt.refused) or "none") if start > 0 else ""
    print("checkpoint_job: %s: rank %d: start at step %d%s" % (a.plan, rank, start, where), flush=True)
    if a.expect_start is not None and str(start) not in a.expect_start.split(","):
        sys.exit("FAIL: %s: rank %d: restore() returned step %d, expected one of %s"
                 % (a.plan, rank, start, a.expect_start))
    for step in range(start + 1, a.steps + 1):
        x, y = cnn.batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        if ckpt is not None:
            ckpt.commit(step)
        if step == a.kill_at:
            if a.wait_before_kill:
                ckpt.wait()
            os._exit(3)  # a crash: no cleanup, no MPI_Finalize, the copy of this step maybe half done
    weights = {n: t.detach().clone() for n, t in model.state_dict().items()}
    path = "%s-rank%d.pt" % (a.out, rank)
    torch.save(weights, path)
    if a.compare is not None:
        reference = torch.load("%s-rank%d.pt" % (a.compare, rank))
        for n, want in reference.items():
            got = weights[n]
            # Bitwise: the same bytes (so -0.0 differs from 0.0, and NaNs compare).
            if got.shape != want.shape or not torch.equal(got.view(torch.int32), want.view(torch.int32)):
                diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else float("nan")
                sys.exit("FAIL: %s: rank %d: '%s' after a restart at step %d differs from the uninterrupted run's "
                         "(max |difference| %g); expected bitwise equal" % (a.plan, rank, n, start, diff))
        if rank == 0:
            print("ok: %s: restarted at step %d, %d tensors bitwise equal to the uninterrupted run after %d steps"
                  % (a.plan, start, len(reference), a.steps), flush=True)
    if ckpt is not None:
        ckpt.close()
        if a.remove:
            cupcake.torch.Checkpointer.remove(a.name)
    if a.plan != "-":
        opt.close()


def check_bad_options(model, opt, name):
    """replica_chunk_bytes and replica_group_hosts out of range: ValueError naming the argument."""
    cases = [
        ({"replica_chunk_bytes": -1}, "Checkpointer: replica_chunk_bytes: out of range; got -1, expected an int >= 0 "
                                      "(0: whole replicas)"),
        ({"replica_chunk_bytes": 1.5}, "Checkpointer: replica_chunk_bytes: out of range; got 1.5, expected an int "
                                       ">= 0 (0: whole replicas)"),
        ({"replica_group_hosts": 1}, "Checkpointer: replica_group_hosts: out of range; got 1, expected an int >= 2 "
                                     "(a host and at least one that keeps its replicas)"),
        ({"replica_group_hosts": True}, "Checkpointer: replica_group_hosts: out of range; got True, expected an int "
                                        ">= 2 (a host and at least one that keeps its replicas)"),
        ({"shared_state": "yes"}, "Checkpointer: shared_state: got 'yes', expected None, True or False"),
    ]
    for kwargs, want in cases:
        try:
            cupcake.torch.Checkpointer(model, opt, name=name, replicate=True, **kwargs)
        except ValueError as e:
            if str(e) != want:
                sys.exit("FAIL: Checkpointer(%s): got '%s', expected '%s'" % (kwargs, e, want))
            continue
        sys.exit("FAIL: Checkpointer(%s) did not raise ValueError" % (kwargs,))
    if cupcake.torch.rank() == 0:
        print("ok: %d out-of-range Checkpointer options refused naming the argument" % len(cases), flush=True)


if __name__ == "__main__":
    main()

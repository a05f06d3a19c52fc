"""cupcake.torch.Checkpointer under mpirun with 2 ranks (docs/CHECKPOINT.md): trains test/python/cnn.py
for --steps steps, committing a snapshot after every optimizer step, and
  --no-ckpt       trains without a Checkpointer (the uninterrupted reference) and saves the weights;
  --kill-at K     ends the process with os._exit right after commit(K), mid-copy or not, as a crash
                  (--wait-before-kill: once the copy of step K, the persist and the replica exchanges in
                  flight are done (ckpt.flush()), so the restart must resume from K or its newest file);
  --compare REF   after restore() and the remaining steps, compares every parameter with REF's bit for
                  bit and exits 1 naming the first that differs (the test's verdict);
  --expect-start  the step restore() must return (a set: "6,7"), else exit 1;
  --wrong-model   builds the model with 4 channels instead of 8: restore() must raise cupcake.Error naming
                  the first entry whose size differs (and write nothing), else exit 1;
  --replica-chunk-bytes N, --replica-group-hosts M  the Checkpointer's options of those names;
  --strided       fc1.weight laid out transposed (the same values; Adam's state for it too): the
                  Checkpointer registers it through a host copy, as it does a CUDA tensor;
  --persist-chunk-bytes B  persists in pieces of B bytes in the session's idle time; at the end, the
                  gate counted at least a piece per B bytes of the last file written, else exit 1;
  --bad-options   checks that out-of-range replica_chunk_bytes and replica_group_hosts raise ValueError
                  naming the argument, then exits (0: as expected);
  --check-gate    (with --replicate and a plan) at the end: the Checkpointer's gate is the session's, one
                  exchange per commit went through it, the session's collectives entered it (at least one
                  per step), no exchange started during one and the last commit sent the whole replica
                  of the step before it (replicated_step), else exit 1;
  --diverge-at K  rank 1 flips one bit of conv1.weight after the optimizer step of K (its parameters then
                  differ from rank 0's): commit(K + 1) must raise cupcake.Error on every rank naming that
                  entry and step K, else exit 1.
PLAN: a plan file (DistributedOptimizer over SGD with momentum: its error feedback is part of the
snapshot), or "-" for no DistributedOptimizer (each rank's own Adam: tensor state, tuple betas; and a
StepLR scheduler made after the Checkpointer, its state added with add_state).
Usage: checkpoint_job.py PLAN OUT --steps N [--name NAME] [--kill-at K [--wait-before-kill]]
       [--persist DIR --persist-every P [--persist-chunk-bytes B]] [--replicate [--replica-chunk-bytes N] [--replica-group-hosts M]]
       [--no-ckpt] [--compare REF] [--expect-start S,...] [--remove] [--wrong-model] [--bad-options]
       [--check-gate] [--diverge-at K] [--strided]"""

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
    p.add_argument("--persist-chunk-bytes", type=int, default=0)
    p.add_argument("--strided", action="store_true")
    p.add_argument("--bad-options", action="store_true")
    p.add_argument("--check-gate", action="store_true")
    p.add_argument("--diverge-at", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    rank = cupcake.torch.rank()
    model = cnn.make_model(channels=4) if a.wrong_model else cnn.make_model()
    if a.strided:
        model.fc1.weight = torch.nn.Parameter(model.fc1.weight.detach().t().contiguous().t())
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
                                          replica_group_hosts=a.replica_group_hosts,
                                          persist_chunk_bytes=a.persist_chunk_bytes)
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
    collectives = ckpt.gate.collectives if a.check_gate and ckpt.gate is not None else 0
    for step in range(start + 1, a.steps + 1):
        x, y = cnn.batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
        if step == a.diverge_at and rank == 1:
            model.conv1.weight.detach().view(-1).view(torch.int32)[0] ^= 1
        if ckpt is not None and a.diverge_at and step == a.diverge_at + 1:
            check_diverged(ckpt, opt, rank, a)
            return
        if ckpt is not None:
            ckpt.commit(step)
        if step == a.kill_at:
            if a.wait_before_kill:
                ckpt.flush()
            os._exit(3)  # a crash: no cleanup, no MPI_Finalize, the copy of this step maybe half done
    if a.strided and model.fc1.weight.is_contiguous():
        sys.exit("FAIL: rank %d: --strided: fc1.weight is contiguous at the end; expected the transposed layout" % rank)
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
    if a.check_gate:
        check_gate(ckpt, opt, rank, a.steps, a.steps - start, collectives)
    if a.persist_chunk_bytes > 0:
        check_pieces(ckpt, rank, a)
    if ckpt is not None:
        ckpt.close()
        if a.remove:
            cupcake.torch.Checkpointer.remove(a.name)
    if a.plan != "-":
        opt.close()


def check_pieces(ckpt, rank, a):
    """Every byte of the newest file before its 24-byte trailer went out in a piece of at most
    --persist-chunk-bytes through the session's gate (the gate counts the pieces of every persist)."""
    ckpt.flush()
    step = ckpt.persisted_step
    path = os.path.join(a.persist, "%s-%d-%d.ckpt" % (a.name, rank, step))
    least = -(-(os.path.getsize(path) - 24) // a.persist_chunk_bytes)
    if step == 0 or ckpt.gate is None or ckpt.gate.idle_transfers < least:
        sys.exit("FAIL: rank %d: persist pieces: got %s through the gate for step %d's file, expected at least %d"
                 % (rank, ckpt.gate.idle_transfers if ckpt.gate is not None else "no gate", step, least))
    if rank == 0:
        print("ok: persist pieces: %d through the gate, at least %d for step %d's file"
              % (ckpt.gate.idle_transfers, least, step), flush=True)


def check_diverged(ckpt, opt, rank, a):
    """commit(K + 1) raises naming conv1.weight (entries[3], after the session's three) and step K."""
    want = ("entries[3]: registered Scope::kShared ('model.conv1.weight'), but its bytes differ between the ranks at "
            "step %d; got fingerprint " % a.diverge_at)
    try:
        ckpt.commit(a.diverge_at + 1)
    except cupcake.Error as e:
        if want not in str(e) or "; the snapshot of step %d is dropped on every rank" % a.diverge_at not in str(e):
            sys.exit("FAIL: rank %d: commit(%d) after rank 1's parameters diverged: got '%s', expected '%s...'"
                     % (rank, a.diverge_at + 1, e, want))
        if ckpt.agreed_step != a.diverge_at - 1:
            sys.exit("FAIL: rank %d: agreed_step %d after the failed commit, expected %d"
                     % (rank, ckpt.agreed_step, a.diverge_at - 1))
        if rank == 0:
            print("ok: diverged shared state refused at commit(%d): %s" % (a.diverge_at + 1, e), flush=True)
        ckpt.close()
        if a.remove:
            cupcake.torch.Checkpointer.remove(a.name)
        opt.close()
        return
    sys.exit("FAIL: rank %d: commit(%d) did not raise although rank 1's conv1.weight differs"
             % (rank, a.diverge_at + 1))


def check_gate(ckpt, opt, rank, steps, commits, collectives):
    """The replica exchanges and the session's collectives went through one gate, never at once;
    the last commit (of `steps`) sent the whole replica of the step before it."""
    gate = ckpt.gate
    if gate is None or opt._cupcake.session.gate is None:
        sys.exit("FAIL: rank %d: Checkpointer(replicate=True) with a DistributedOptimizer has no gate" % rank)
    if gate.transfers != commits:
        sys.exit("FAIL: rank %d: gate.transfers %d, expected %d (one exchange per commit)"
                 % (rank, gate.transfers, commits))
    if opt._cupcake.session.gate.transfers != commits:
        sys.exit("FAIL: rank %d: the session's gate saw %d exchanges, expected %d (the Checkpointer's gate is "
                 "another)" % (rank, opt._cupcake.session.gate.transfers, commits))
    if gate.collectives - collectives < commits:
        sys.exit("FAIL: rank %d: %d of the session's collectives entered the gate in %d steps, expected >= 1 per step"
                 % (rank, gate.collectives - collectives, commits))
    if gate.transfers_during_collectives != 0:
        sys.exit("FAIL: rank %d: %d exchanges started during a collective, expected 0"
                 % (rank, gate.transfers_during_collectives))
    ckpt.flush()  # the last commit's exchange too
    if ckpt.replicated_step != steps - 1:
        sys.exit("FAIL: rank %d: replicated_step %d after commit(%d), expected %d (each commit sends the whole "
                 "replica of the step before it)" % (rank, ckpt.replicated_step, steps, steps - 1))
    if rank == 0:
        print("ok: gated: %d exchanges, %d session collectives, %d waited" % (
            gate.transfers, gate.collectives - collectives, gate.collectives_waited), flush=True)


def check_bad_options(model, opt, name):
    """replica_chunk_bytes, replica_group_hosts and replica_max_commits out of range: ValueError naming the
    argument."""
    cases = [
        ({"replica_chunk_bytes": -1}, "Checkpointer: replica_chunk_bytes: out of range; got -1, expected an int >= 0 "
                                      "(0: whole replicas)"),
        ({"replica_chunk_bytes": 1.5}, "Checkpointer: replica_chunk_bytes: out of range; got 1.5, expected an int "
                                       ">= 0 (0: whole replicas)"),
        ({"replica_group_hosts": 1}, "Checkpointer: replica_group_hosts: out of range; got 1, expected an int >= 2 "
                                     "(a host and at least one that keeps its replicas)"),
        ({"replica_group_hosts": True}, "Checkpointer: replica_group_hosts: out of range; got True, expected an int "
                                        ">= 2 (a host and at least one that keeps its replicas)"),
        ({"replica_max_commits": -1}, "Checkpointer: replica_max_commits: out of range; got -1, expected an int >= 0 "
                                      "(0: no bound)"),
        ({"persist_chunk_bytes": -1}, "Checkpointer: persist_chunk_bytes: out of range; got -1, expected an int >= 0 "
                                      "(0: the whole file in one write)"),
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
    # Pieces wait for a session's collectives: without a DistributedOptimizer there are none.
    want = ("Checkpointer: persist_chunk_bytes: got 64 without a gate; expected a DistributedOptimizer whose host "
            "session's collectives the pieces wait for")
    try:
        cupcake.torch.Checkpointer(model, torch.optim.SGD(model.parameters(), lr=0.1), name=name,
                                   persist_dir="/tmp", persist_every=2, persist_chunk_bytes=64)
        sys.exit("FAIL: Checkpointer(persist_chunk_bytes=64) without a DistributedOptimizer did not raise")
    except ValueError as e:
        if str(e) != want:
            sys.exit("FAIL: Checkpointer(persist_chunk_bytes=64): got '%s', expected '%s'" % (e, want))
    if cupcake.torch.rank() == 0:
        print("ok: %d out-of-range Checkpointer options refused naming the argument" % (len(cases) + 1), flush=True)


if __name__ == "__main__":
    main()

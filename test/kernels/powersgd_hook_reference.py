#!/usr/bin/env python3
"""Writes what PyTorch's DDP PowerSGD hook computes, as the expected values of
test/kernels/powersgd_hook_test.cc (the file test/kernels/data/powersgd_hook.json).

Runs torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook itself (Debian's torch 1.13)
over two gloo ranks on one bucket of tensors of several shapes, for two steps (the first draws
Q from the hook's seeded generator, the second warm-starts from the kept Q and adds the error
feedback), and records per case: the shapes, the hook's initial Q (drawn as the hook draws it:
numpy RandomState(random_seed).randint(1e9) seeds torch, then one randn per compressed tensor in
the hook's order, before orthogonalization), and per step and rank the input gradient, the
hook's output (the averaged approximation) and its error-feedback memory afterwards. The
batched cases run batched_powerSGD_hook (with the 2-D fix of orthogonalize_2d below).

Usage: powersgd_hook_reference.py OUT.json
       powersgd_hook_reference.py --check COMMITTED.json
         (regenerates the file and compares: prints "ok: ..." and exits 0 when every number is
         within 1e-6 of the committed one, exits 1 naming the first difference; 77 without torch)
"""
import json
import math
import os
import sys
import tempfile
from collections import defaultdict

try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as hook
except ImportError as e:  # ctest's SKIP_RETURN_CODE: no torch here
    print("skip: %s" % e)
    sys.exit(77)

WORLD = 2
SEED = 0
# name, rank, shapes: matrices, a conv weight reshaped as DDP does, a repeated shape (the hook
# groups equal shapes), vectors and a matrix too small to compress (min_compression_rate = 2).
# batched: batched_powerSGD_hook, the bucket as one square matrix padded with zeros.
CASES = [
    ("rank1", 1, False, [[6, 4], [5], [3, 2, 2, 2], [6, 4], [2, 2], [7, 9]]),
    ("rank2", 2, False, [[16, 12], [4], [8, 3, 3], [16, 12], [3, 3], [10, 7]]),
    # rank > 2: the hook orthogonalizes with torch.linalg.qr instead of Gram-Schmidt; equal up to
    # rounding and the columns' signs, which P Q^T does not see.
    ("rank4", 4, False, [[20, 16], [6], [12, 4, 3, 3]]),
    ("batched_rank1", 1, True, [[6, 4], [5], [3, 2, 2, 2]]),  # 53 elements: side 8, 11 padded
    ("batched_rank2", 2, True, [[8, 6], [4], [4, 3, 3]]),  # 88 elements: side 10
]


def orthogonalize_2d(matrices, epsilon=0):
    """torch 1.13's batched_powerSGD_hook hands _orthogonalize a 2-D matrix, which fails its
    3-D assertion; this runs the same procedure on it as a batch of one (in place, as a view)."""
    if matrices.dim() == 2:
        matrices = matrices.unsqueeze(0)
    _orthogonalize_3d(matrices, epsilon)


_orthogonalize_3d = hook._orthogonalize
hook._orthogonalize = orthogonalize_2d


class Bucket:
    """What the hook reads of a dist.GradBucket: one flat buffer and per-tensor views of it."""

    def __init__(self, buffer, shapes):
        self._buffer = buffer
        self._views = []
        offset = 0
        for s in shapes:
            numel = int(np.prod(s))
            self._views.append(buffer[offset:offset + numel].view(*s))
            offset += numel

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._views

    def index(self):
        return 0

    def is_last(self):
        return True


def floats(t):
    """A float32 tensor as a list; 9 significant digits give every float32 back exactly."""
    return [float("%.9g" % x) for x in t.tolist()]


def initial_q(rank, batched, shapes):
    """The hook's random Q before orthogonalization, flat, in the hook's order."""
    rng = np.random.RandomState(SEED)
    if batched:
        side = math.ceil(math.sqrt(sum(int(np.prod(s)) for s in shapes)))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(rng.randint(1_000_000_000))
            return torch.randn(side, rank).reshape(-1)
    by_shape = defaultdict(list)
    for s in shapes:
        n = s[0]
        m = int(np.prod(s[1:])) if len(s) > 1 else 1
        r = min(n, m, rank)
        if hook._should_compress(n, m, r, 2)[0]:
            by_shape[(n, m)].append(r)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.randint(1_000_000_000))
        qs = [torch.randn(1, m, r) for (n, m), rs in by_shape.items() for r in rs]
    return torch.cat([q.reshape(-1) for q in qs]) if qs else torch.zeros(0)


def run(rank, init_file, out_path):
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=WORLD)
    cases = []
    for name, approx_rank, batched, shapes in CASES:
        step = hook.batched_powerSGD_hook if batched else hook.powerSGD_hook
        state = hook.PowerSGDState(process_group=None, matrix_approximation_rank=approx_rank,
                                   start_powerSGD_iter=2, random_seed=SEED)
        state.iter = 2  # compress from the first call
        total = sum(int(np.prod(s)) for s in shapes)
        gen = torch.Generator().manual_seed(1000 + 17 * rank + approx_rank)
        steps = []
        for _ in range(2):
            grad = torch.randn(total, generator=gen)
            buffer = grad.clone()
            out = step(state, Bucket(buffer, shapes)).wait()
            error = state.error_dict[0]  # batched: the padded length
            gathered = [[torch.zeros(total) for _ in range(WORLD)] for _ in range(3)]
            gathered[2] = [torch.zeros(error.numel()) for _ in range(WORLD)]
            for g, t in zip(gathered, (grad, out, error)):
                dist.all_gather(g, t.contiguous())
            steps.append({"grads": [floats(t) for t in gathered[0]],
                          "outputs": [floats(t) for t in gathered[1]],
                          "errors": [floats(t) for t in gathered[2]]})
        cases.append({"name": name, "rank": approx_rank, "batched": batched, "world_size": WORLD,
                      "shapes": shapes, "min_compression_rate": 2,
                      "q0": floats(initial_q(approx_rank, batched, shapes)),
                      "steps": steps})
    if rank == 0:
        doc = {"generator": "test/kernels/powersgd_hook_reference.py", "torch": torch.__version__,
               "cases": cases}
        with open(out_path, "w") as f:
            json.dump(doc, f, indent=None)
            f.write("\n")
    dist.destroy_process_group()


def first_difference(got, want, where="$"):
    """Where two JSON values differ beyond 1e-6 (numbers) or at all (the rest); None if nowhere."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in want:
            d = first_difference(got.get(k), want[k], "%s.%s" % (where, k))
            if d:
                return d
        return None
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return "%s: %d entries, committed %d" % (where, len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            d = first_difference(g, w, "%s[%d]" % (where, i))
            if d:
                return d
        return None
    if isinstance(want, float) and isinstance(got, (int, float)):
        return None if abs(got - want) <= 1e-6 else "%s: %r, committed %r" % (where, got, want)
    return None if got == want else "%s: %r, committed %r" % (where, got, want)


def main():
    check = len(sys.argv) == 3 and sys.argv[1] == "--check"
    if len(sys.argv) != 2 and not check:
        sys.exit(__doc__)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.json") if check else sys.argv[1]
        mp.spawn(run, args=(os.path.join(d, "init"), out), nprocs=WORLD)
        if check:
            with open(out) as f, open(sys.argv[2]) as c:
                diff = first_difference(json.load(f), json.load(c))
            if diff:
                print("FAIL: %s differs from torch %s's hook: %s" % (sys.argv[2], torch.__version__, diff))
                sys.exit(1)
            print("ok: %s is what torch %s's hook computes" % (sys.argv[2], torch.__version__))


if __name__ == "__main__":
    main()

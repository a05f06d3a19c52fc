"""One process, no launcher: the launch choices and errors of cupcake.init (docs/PYTHON.md),
each case in a fresh interpreter (the choice is per process). Prints ok or exits with FAIL.
Usage: launch_check.py [CASE]   (no CASE: runs every case in a child process)"""

import os
import subprocess
import sys

from expect import expect_raises


def incomplete_torchrun_variables():
    import cupcake
    os.environ.update(RANK="0", WORLD_SIZE="2")
    expect_raises("incomplete torchrun variables", cupcake.launch, ValueError,
                  contains="cupcake: launch: torchrun's variables are incomplete; got RANK, WORLD_SIZE, missing "
                           "MASTER_ADDR, MASTER_PORT; expected all of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT "
                           "(torchrun)")


def unknown_backend():
    import cupcake
    os.environ["CUPCAKE_BACKEND"] = "ucc"
    expect_raises("unknown backend", cupcake.launch, ValueError,
                  contains="CUPCAKE_BACKEND: unknown backend; got 'ucc', expected auto, mpi or gloo")


def gloo_without_torchrun():
    import cupcake
    expect_raises("gloo without torchrun", lambda: cupcake.init(backend="gloo"), ValueError,
                  contains="cupcake: backend gloo: torch.distributed is not initialized and RANK, WORLD_SIZE, "
                           "MASTER_ADDR, MASTER_PORT not set; expected a job under torchrun")


def initialized_torch_distributed_is_gloo():
    """A job that initialized torch.distributed (one rank here) gets gloo over its store; the
    choice then holds."""
    import torch.distributed as dist
    import cupcake
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    launched = cupcake.launch()
    if not isinstance(launched, cupcake.Gloo) or (launched.rank, launched.size) != (0, 1):
        sys.exit("FAIL: initialized torch.distributed: got %r, expected a Gloo of rank 0 of 1" % launched)
    if cupcake.layout() != (0, 1, 0, 1):
        sys.exit("FAIL: layout %r, expected (0, 1, 0, 1)" % (cupcake.layout(),))
    expect_raises("a second choice", lambda: cupcake.init(backend="mpi"), ValueError,
                  contains="cupcake.init: backend: already chosen; got 'mpi', expected 'gloo'")
    dist.destroy_process_group()


def peer_never_arrives():
    """Rank 0 of 2 over a store rank 1 never writes to: DEADLINE_EXCEEDED naming the key and the
    world, after the timeout."""
    import socket
    import torch.distributed as dist
    import cupcake
    gloo = cupcake.Gloo(dist.HashStore(), 0, 2, hostname="127.0.0.1", timeout_s=0.5)
    e = expect_raises("peer never arrives", gloo.world, cupcake.Error,
                      contains="gloo communicator: rendezvous: torch.distributed store: wait 'world0/world/1': ")
    if e.code != "DEADLINE_EXCEEDED" or not str(e).endswith("(rank 0 of 2 on %s)" % socket.gethostname()):
        sys.exit("FAIL: peer never arrives: %s %r, expected DEADLINE_EXCEEDED ending with the world" % (e.code, str(e)))
    expect_raises("bad timeout", lambda: cupcake.Gloo(dist.HashStore(), 0, 2, timeout_s=0), cupcake.Error,
                  contains="cupcake: Gloo: timeout_s: out of range; got 0.000000, expected 0 < timeout_s <= 86400")


CASES = [incomplete_torchrun_variables, unknown_backend, gloo_without_torchrun, initialized_torch_distributed_is_gloo,
         peer_never_arrives]


def main():
    if len(sys.argv) == 2:
        {c.__name__: c for c in CASES}[sys.argv[1]]()
        return
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUPCAKE_BACKEND")
           and not k.startswith(("OMPI_", "PMI_", "PMIX_"))}
    for case in CASES:
        if subprocess.run([sys.executable, __file__, case.__name__], env=env).returncode != 0:
            sys.exit("FAIL: %s" % case.__name__)
        print("ok: launch: %s" % case.__name__)


if __name__ == "__main__":
    main()

"""A stand-in for `torchrun --standalone --nproc_per_node N` (Debian 12's torchrun, torch 1.13,
fails at start in torch.distributed.elastic): starts N copies of a command on this host with the
variables torchrun sets for each worker (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
GROUP_RANK, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID), and no
MPI variable. Exits 0 when every worker does; else, once a worker fails, stops the others and
exits with the first failure's status (as torchrun does).
Usage: torchrun_like.py --nproc_per_node N [--timeout S] -- CMD ARG..."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc_per_node", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=300, help="seconds before the workers are killed")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.nproc_per_node < 1 or not cmd:
        parser.error("expected --nproc_per_node >= 1 and a command after --")
    n, port = args.nproc_per_node, free_port()
    workers = []
    for rank in range(n):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OMPI_", "PMI_", "PMIX_"))}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), GROUP_RANK="0",
                   ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TORCHELASTIC_RUN_ID="torchrun-like-%d" % os.getpid())
        workers.append(subprocess.Popen(cmd, env=env))
    deadline = time.monotonic() + args.timeout
    status = 0
    while any(w.poll() is None for w in workers):
        failed = [w.returncode for w in workers if w.returncode not in (None, 0)]
        if failed or time.monotonic() > deadline:
            status = failed[0] if failed else 124
            print("torchrun_like.py: %s; stopping the other workers" %
                  ("a worker exited %d" % status if failed else "timed out after %g s" % args.timeout),
                  file=sys.stderr)
            for w in workers:
                if w.poll() is None:
                    w.send_signal(signal.SIGTERM)
            for w in workers:
                try:
                    w.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    w.kill()
            break
        time.sleep(0.05)
    if status == 0:
        status = next((w.returncode for w in workers if w.returncode != 0), 0)
    sys.exit(status)


if __name__ == "__main__":
    main()

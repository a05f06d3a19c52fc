"""bench/python/tta.py --model lstm, smoke: two ranks under mpirun train a small character LSTM for
a few steps (DDP fp32) on a hand-made text file, and the result line is checked: the model's
parameter count worked out by hand, the steps, and the target's direction (a held-out loss is
reached at or below --target-loss: 100 at the first evaluation, 0.001 never). Bad flags and a bad
data file are named, without MPI.

  tta_lstm_check.py MPIEXEC      (PYTHONPATH must reach bench/python)

Exit 0 pass, 1 fail (naming the check), 77 skip when the interpreter has no torch.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile

from expect import expect_eq, fail

TTA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "python", "tta.py")
SMALL = ["--model", "lstm", "--arm", "ddp-fp32", "--embed", "8", "--hidden", "16", "--seq-len", "16", "--batch", "4",
         "--eval-every", "2"]
# embedding 97*8 = 776; LSTM 4*16*8 + 4*16*16 + 2*4*16 = 512 + 1024 + 128 = 1664; decoder 16*97 + 97 = 1649.
SMALL_PARAMS = 776 + 1664 + 1649


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(mpiexec, corpus, flags):
    """The result line of a 2-rank tta.py job (rank 0's JSON on stdout)."""
    cmd = [mpiexec, "--oversubscribe", "--bind-to", "none", "-np", "2"]
    if os.getuid() == 0:
        cmd.append("--allow-run-as-root")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    p = subprocess.run(cmd + [sys.executable, TTA, "--data", corpus] + SMALL + flags, capture_output=True, text=True,
                       env=env, timeout=240)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or len(lines) != 1:
        print(p.stdout + p.stderr)
        fail("2-rank job %s" % " ".join(flags), (p.returncode, len(lines)), (0, 1))
    return json.loads(lines[0])


def check_errors(corpus):
    """One process, no MPI: tta.py fails before torch.distributed starts."""
    missing = os.path.join(os.path.dirname(corpus), "nope.txt")
    cases = [
        (["--data", missing], 1, "tta.py: --data: %s: no such file\n" % missing),
        (["--data", corpus, "--target", "0.9", "--target-loss", "2"], 2, "--target, --target-loss: expected one "
         "of them; got both"),
        (["--data", corpus, "--target-loss", "0"], 2, "--target-loss: out of range; got 0, expected > 0"),
        (["--data", corpus, "--seq-len", "0"], 2, "--seq-len: out of range; got 0, expected >= 1"),
    ]
    for flags, code, message in cases:
        p = subprocess.run([sys.executable, TTA, "--model", "lstm", "--arm", "ddp-fp32"] + flags, capture_output=True,
                           text=True, timeout=120)
        expect_eq("exit of %s" % " ".join(flags), p.returncode, code)
        if code == 1:
            expect_eq("message of %s" % " ".join(flags), p.stderr, message)
        elif not p.stderr.rstrip().endswith("error: " + message):
            fail("message of %s" % " ".join(flags), p.stderr, "...error: " + message)


def main():
    if len(sys.argv) != 2:
        print("usage: tta_lstm_check.py MPIEXEC", file=sys.stderr)
        return 2
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("skip: %s (tta.py needs torch)" % e)
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "fox.txt")
        with open(corpus, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog\n" * 100)  # 4400 bytes: 258 blocks of 17
        check_errors(corpus)
        met = run_ranks(sys.argv[1], corpus, ["--target-loss", "100", "--max-steps", "4"])
        expect_eq("model", (met["model"], met["params"], met["ranks"], met["target_metric"]),
                  ("lstm", SMALL_PARAMS, 2, "loss"))
        expect_eq("loss 100: reached at the first evaluation", (met["reached"], met["steps_to_target"],
                                                                 met["steps"]), (True, 2, 2))
        missed = run_ranks(sys.argv[1], corpus, ["--target-loss", "0.001", "--max-steps", "4"])
        expect_eq("loss 0.001: not reached", (missed["reached"], missed["steps_to_target"], missed["steps"]),
                  (False, None, 4))
        if not 0 < missed["final_loss"] < 100:
            fail("final loss", missed["final_loss"], "a cross-entropy in (0, 100)")
    print("ok: tta.py --model lstm, 2 ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())

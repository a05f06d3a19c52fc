#!/usr/bin/env python3
"""Kills a process with SIGKILL while it is inside a checkpoint's copy or persist, and proves it.

checkpoint_faults_test.sh's cases (c) and (d) (docs/CHECKPOINT.md). It polls, without pausing,
for the sign that PID is inside the operation:

  --slot SEGMENT   a slot of the segment (/dev/shm/cupcake-<name>-<rank>) in state writing: the
                   background copy has begun that slot and not yet flipped it to valid
                   (libruntime/src/checkpoint_format.h: SegmentHeader, SlotHeader);
  --persist DIR NAME RANK
                   DIR/<NAME>-<RANK>-<step>.ckpt.tmp.<PID>: the persist has opened its temporary
                   file and not yet renamed it over the target.

When it sees the sign it stops PID (SIGSTOP to each thread) and waits until every thread has stopped; if the
sign is still there the process can no longer move past it, so the SIGKILL that follows lands
inside the operation. Otherwise it lets PID go on (SIGCONT) and polls again. Only a step >=
--min-step counts (the operation's step: a torn slot's is one past the other slot's valid step).

Prints one line, `landed: ...` (the slot or file and the step), and exits 0; exits 1 if PID ended
or --timeout seconds passed first. No product code waits for it: the landing is checked, not
arranged.
"""
import argparse
import mmap
import os
import re
import signal
import struct
import sys
import time

SLOT_WRITING, SLOT_VALID = 1, 2
SLOTS_AT = 32  # offsetof(SegmentHeader, slots): magic 8, version 4, zero 4, capacity 8, rank 4, world 4
SLOT_BYTES = 32  # SlotHeader: state u64, step i64, payload_bytes u64, checksum u64


def slot_sign(segment, min_step):
    """(torn slot index, its step, the other slot's valid step) while a copy is in a slot."""
    states = [struct.unpack_from("=Qq", segment, SLOTS_AT + SLOT_BYTES * i) for i in range(2)]
    for i, (state, _) in enumerate(states):
        if state != SLOT_WRITING:
            continue
        other_state, other_step = states[1 - i]
        valid = other_step if other_state == SLOT_VALID else 0
        if valid + 1 >= min_step:
            return i, valid + 1, valid
    return None


def persist_sign(directory, pattern, min_step):
    """(path, step) of PID's temporary file of a persist, if one exists."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return None
    for name in names:
        m = pattern.match(name)
        if m and int(m.group(1)) >= min_step:
            return os.path.join(directory, name), int(m.group(1))
    return None


def all_stopped(pid):
    """Whether every thread of pid is stopped (state T or t); False once pid is gone."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                    return False
    except (FileNotFoundError, ProcessLookupError):
        return False
    return True


def stop(pid):
    """SIGSTOP to pid, addressed to each of its threads, newest first; False once pid is gone.

    A stop sent to the process wakes one thread to begin the group stop, which may be one that
    waits for a CPU while the copy thread runs on. kill() on a thread's ID wakes that thread
    itself (a running one at once); the copy's thread is new at each commit, so the newest
    ID is tried first."""
    try:
        tids = sorted((int(t) for t in os.listdir(f"/proc/{pid}/task")), reverse=True)
    except FileNotFoundError:
        return False
    for tid in tids:
        try:
            os.kill(tid, signal.SIGSTOP)
        except ProcessLookupError:
            pass  # a thread that has just ended
    return alive(pid)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pid", type=int, required=True)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--slot", metavar="SEGMENT")
    which.add_argument("--persist", nargs=3, metavar=("DIR", "NAME", "RANK"))
    p.add_argument("--min-step", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args()
    deadline = time.monotonic() + a.timeout

    if a.slot:
        # Made at the first commit: the file, then its size.
        while not os.path.exists(a.slot) or os.path.getsize(a.slot) < 4096:
            if not alive(a.pid) or time.monotonic() > deadline:
                print(f"kill_during: {a.slot}: no segment before pid {a.pid} ended", file=sys.stderr)
                return 1
            time.sleep(0.001)
        with open(a.slot, "rb") as f:
            segment = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        sign = lambda: slot_sign(segment, a.min_step)
        describe = lambda s: f"{a.slot} slots[{s[0]}] writing (step {s[1]}), slots[{1 - s[0]}] valid at step {s[2]}"
    else:
        directory, name, rank = a.persist
        pattern = re.compile(re.escape(f"{name}-{rank}-") + r"(\d+)\.ckpt\.tmp\." + str(a.pid) + "$")
        sign = lambda: persist_sign(directory, pattern, a.min_step)
        describe = lambda s: f"{s[0]} (step {s[1]})"

    attempts = polls = 0
    while True:
        seen = sign()
        polls += 1
        if seen is None:
            if polls % 1000 == 0 and (not alive(a.pid) or time.monotonic() > deadline):
                break
            continue
        attempts += 1
        if not stop(a.pid):
            break
        while alive(a.pid) and not all_stopped(a.pid):
            pass
        if not alive(a.pid):
            break
        still = sign()
        if still is not None and still[:2] == seen[:2]:
            os.kill(a.pid, signal.SIGKILL)
            print(f"landed: {describe(still)}; pid {a.pid} killed there (try {attempts})", flush=True)
            return 0
        os.kill(a.pid, signal.SIGCONT)
    print(f"kill_during: pid {a.pid}: never caught inside the operation ({attempts} tries in {polls} polls) "
          f"before it ended or {a.timeout} s passed", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())

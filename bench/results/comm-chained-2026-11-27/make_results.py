#!/usr/bin/env python3
"""results.json of this experiment from its raw files (raw.tar.xz unpacked into RAW):
- evaluation_4x1_1gbit: evaluate.sh's rows (raw/eval-4x1-1gbit/results.json);
- buckets: per run of raw/buckets (train_replay on the evaluation's fp32 plans at compute scale
  10.1 and 0.01), each group of at least 2 MiB: its collective's predicted and measured ms;
- chained: per hosts and floats, per run, back_to_back's median ms per spacing (raw/chained);
- barrier_attempt: the same, 25 MiB at 4 hosts, libcomm without (old) and with (new) a barrier
  before each chunked allreduce (raw/barrier-attempt/ab), reverted.
Usage: make_results.py RAW > results.json"""

import glob
import json
import os
import re
import sys

raw = sys.argv[1]


def spacing_medians(path):
    out = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] in ("gap", "barrier", "chained"):
                out[parts[0]] = float(parts[1])
    return out


def buckets():
    runs = {}
    for path in sorted(glob.glob(os.path.join(raw, "buckets", "*.timeline.json"))):
        name = os.path.basename(path)[: -len(".timeline.json")]
        strategy, scale, _ = name.rsplit("-", 2)
        plan = json.load(open(os.path.join(raw, "eval-4x1-1gbit", "plans", "resnet50-%s.json" % strategy)))
        run = json.load(open(path))
        groups = [{"mib": round(g["payload_bytes"] / 2**20, 2),
                   "predicted_ms": (g["comm_end_us"] - g["comm_start_us"]) / 1e3,
                   "measured_ms": (m["comm_end_us"] - m["comm_start_us"]) / 1e3}
                  for g, m in zip(plan["groups"], run["groups"]) if g["payload_bytes"] >= 2 << 20]
        runs.setdefault("%s scale %s" % (strategy, scale), []).append(groups)
    return runs


def chained():
    out = {}
    for path in sorted(glob.glob(os.path.join(raw, "chained", "h*-f*-r*.txt"))):
        hosts, floats, _ = re.match(r"h(\d+)-f(\d+)-r(\d+)\.txt", os.path.basename(path)).groups()
        out.setdefault(hosts, {}).setdefault(floats, []).append(spacing_medians(path))
    return out


def barrier_attempt():
    out = {}
    for path in sorted(glob.glob(os.path.join(raw, "barrier-attempt", "ab", "*-r*.txt"))):
        out.setdefault(os.path.basename(path).split("-")[0], []).append(spacing_medians(path))
    return out


print(json.dumps({
    "machine": "Intel Xeon VM, 2 cores; testbed of 4 (or 2) hosts x 1 rank, 1 Gbit/s, 1.5 ms emulated start-up",
    "evaluation_4x1_1gbit": json.load(open(os.path.join(raw, "eval-4x1-1gbit", "results.json"))),
    "buckets": buckets(),
    "chained": chained(),
    "barrier_attempt": barrier_attempt(),
}, indent=1))

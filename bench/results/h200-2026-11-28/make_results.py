#!/usr/bin/env python3
"""results.json of this experiment from its raw files (raw.tar.xz unpacked into RAW): the suites'
lines and the Python checks (call 1), runtime_gpu_bench's rows (call 1, one run per compressor),
and the checkpoint's arms on the machine's testbed (call 1: four arms, two rounds; call 2: three
arms, three rounds, its last persist round cut by the call's time limit), each call's summary by
bench/testbed/checkpoint_report.py and the per-round overheads of both calls together.
Usage: make_results.py RAW > results.json"""

import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "../../testbed"))
sys.path.insert(0, os.path.join(here, "../../gpu"))  # its summarize.py, not the testbed's
import checkpoint_report  # noqa: E402
import summarize  # noqa: E402

raw = sys.argv[1]


def lines(path, prefix):
    with open(os.path.join(raw, path)) as f:
        return [l.rstrip("\n") for l in f if l.startswith(prefix)]


calls = {"call1": (os.path.join(raw, "call1/gpu-all/checkpoint/checkpoint"), ["none", "snapshot", "replicas", "persist"]),
         "call2": (os.path.join(raw, "call2/ck/checkpoint"), ["none", "snapshot", "persist"])}
checkpoint = {c: checkpoint_report.report(d, arms)["summary"] for c, (d, arms) in calls.items()}
pooled = {arm: [x for c in checkpoint.values() if arm in c for x in c[arm]["round_overheads_pct"]]
          for arm in ("snapshot", "replicas", "persist")}
bench = "call1/gpu-all/run/runtime_gpu_bench_%s.txt"
print(json.dumps({
    "device": "NVIDIA H200 (one GPU), Intel Xeon host, 16 cores",
    "suites": [l for l in lines("call1/summary.txt", "") if ": exit " in l],
    "python": lines("call1/summary.txt", "ok: "),
    "runtime_gpu_bench": summarize.runtime(["%s=%s" % (c, os.path.join(raw, bench % c)) for c in ("efsignsgd", "topk")]),
    "checkpoint": {"per_call": checkpoint, "round_overheads_pct_both_calls": pooled},
}, indent=1))

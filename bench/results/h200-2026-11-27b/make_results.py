#!/usr/bin/env python3
"""results.json of this experiment from its raw files (raw.tar.xz unpacked into RAW):
the suites' lines (calls 1, 3 and 5), the Python checks (call 1), the gain probe's rows before and
after (calls 2 and 3, three runs each, bench/gpu/summarize.py's spreads), the top-k encode
beside them (call 3, one run), and the 4 x 1 testbed evaluation (call 4).
Usage: make_results.py RAW > results.json"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../gpu"))
import summarize  # noqa: E402

raw = sys.argv[1]


def lines(path, prefix):
    with open(os.path.join(raw, path)) as f:
        return [l.rstrip("\n") for l in f if l.startswith(prefix)]


def runs(call, name):
    return [os.path.join(raw, call, "%s%d.txt" % (name, i)) for i in (1, 2, 3)]


rows = json.load(open(os.path.join(raw, "call4/results.json")))
print(json.dumps({
    "device": "NVIDIA H200 (one GPU), Intel Xeon host, 16 cores",
    "suites": {"call1": [l for l in lines("call1/summary.txt", "") if ": exit " in l],
               "call3": lines("call3/tests.log", ""),
               "call5": lines("call5/tests.log", "")},
    "python": lines("call1/summary.txt", "ok: "),
    "gain_probe": {"before": summarize.kernels(runs("call2", "gain")),
                   "after": summarize.kernels(runs("call3", "gain"))},
    "topk_encode_after": summarize.kernels([os.path.join(raw, "call3/topk.txt")]),
    "testbed_4x1": {"within_10pct": sum(abs(r["measured_over_predicted"] - 1) <= 0.1 for r in rows),
                    "runs": len(rows), "rows": rows},
}, indent=1))

#!/usr/bin/env python3
"""bench/planner/fixed_cost.sh on resnet50 with efsignsgd: the second profile is the shipped V100
profile with each GPU encode and decode curve less its fixed cost (efsignsgd's encode 130 us at
one element becomes 1 us; its decode at 2^30 elements 1146880 - 1120 = 1145760 us), every other
curve unchanged; results.json has one row per profile; and the plan's predicted gain over
layer-wise falls without the fixed costs (161 tensors x 1.25 ms of fixed cost against a 63.5 ms
backward as shipped). A bad argument exits 2 with the usage line.
Usage: fixed_cost_test.py SOURCE_DIR BUILD_DIR"""

import json
import os
import subprocess
import sys
import tempfile

if len(sys.argv) != 3:
    sys.exit(__doc__)
SRC, BUILD = map(os.path.abspath, sys.argv[1:])
SCRIPT = os.path.join(SRC, "bench", "planner", "fixed_cost.sh")
failures = []


def curves(path):
    """A profile's curves: their points by their other fields (as sorted JSON)."""
    with open(path) as f:
        return {json.dumps({k: v for k, v in c.items() if k != "points"}, sort_keys=True): c["points"]
                for c in json.load(f)["curves"]}

with tempfile.TemporaryDirectory() as out:
    p = subprocess.run(["bash", SCRIPT, out, "--build", BUILD, "--models", "resnet50", "--compressors", "efsignsgd"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: fixed_cost.sh: exit {p.returncode}:\n{p.stdout}{p.stderr}")
    shipped = curves(os.path.join(SRC, "examples", "profiles", "v100-8x8-pcie-25g.json"))
    changed = curves(os.path.join(out, "no-fixed-cost.json"))
    enc = json.dumps({"kind": "encode", "compressor": "efsignsgd", "device": "gpu"}, sort_keys=True)
    dec = json.dumps({"kind": "decode", "compressor": "efsignsgd", "device": "gpu"}, sort_keys=True)
    if changed[enc][0] != [1, 1.0]:
        failures.append(f"efsignsgd's GPU encode at one element: {changed[enc][0]}, expected [1, 1.0]")
    if changed[dec][-1] != [1073741824, 1145760.0]:
        failures.append(f"efsignsgd's GPU decode at 2^30: {changed[dec][-1]}, expected [1073741824, 1145760.0]")
    kept = [k for k in shipped if '"device": "gpu"' not in k or '"kind": "copy"' in k]
    if any(changed[k] != shipped[k] for k in kept) or len(changed) != len(shipped):
        failures.append("a curve other than the GPU encodes and decodes changed")
    with open(os.path.join(out, "results.json")) as f:
        rows = {r["profile"]: r for r in json.load(f)}
    if sorted(rows) != ["no-fixed-cost", "shipped"]:
        failures.append(f"results.json profiles: {sorted(rows)}")
    elif not rows["shipped"]["speedup"]["layerwise"] > 2 > rows["no-fixed-cost"]["speedup"]["layerwise"]:
        failures.append(f"over layer-wise: shipped {rows['shipped']['speedup']['layerwise']:.2f}x, without the fixed "
                        f"costs {rows['no-fixed-cost']['speedup']['layerwise']:.2f}x; expected above and below 2x")
    p = subprocess.run(["bash", SCRIPT, out, "--bogus"], capture_output=True, text=True)
    if p.returncode != 2 or "fixed_cost.sh OUT [--build DIR]" not in p.stderr:
        failures.append(f"--bogus: exit {p.returncode}, stderr {p.stderr!r}; expected 2 and the usage line")

for f in failures:
    print("FAIL: " + f)
if not failures:
    print("ok: fixed_cost.sh")
sys.exit(1 if failures else 0)

#!/bin/bash
# Re-prices the plans of bench/results/replay-2026-11-27's three evaluations on their own profiles
# without the busy comm curves (the emulated accelerator leaves the cores free during backward),
# and compares with the measured times. Reads that experiment's raw.tar.xz; no testbed, no timing.
# Usage (from the repository root, after scripts/build.sh): bench/results/replay-2026-11-27b/reprice-nobusy/reprice.sh
set -euo pipefail
here=bench/results/replay-2026-11-27b/reprice-nobusy
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tar -xJf bench/results/replay-2026-11-27/raw.tar.xz -C "$tmp"
python3 - "$tmp/replay-2026-11-27" "$here" <<'PY'
import json, re, shutil, sqlite3, subprocess, sys
base, here = sys.argv[1], sys.argv[2]
res = []
for E in ("2hosts-1gbit", "2hosts-1gbit-startup1000us", "2hosts-1gbit-startup1000us-cold"):
    db = f"{base}/{E}-nobusy.db"
    shutil.copy(f"{base}/{E}/profile.db", db)
    with sqlite3.connect(db) as c:
        c.execute("DELETE FROM points WHERE curve_id IN (SELECT id FROM curves WHERE busy = 1)")
        c.execute("DELETE FROM curves WHERE busy = 1")
    for r in json.load(open(f"{base}/{E}/results.json")):
        plan = f"{base}/{E}/plans/{r['model']}-{r['strategy']}-{r['compressor']}.pb"
        out = subprocess.run(["build/tools/cupcake-plan", "simulate", "--plan", plan, "--model-name", r["model"],
                              "--profile", db], capture_output=True, text=True, check=True).stdout
        res.append(dict(eval=E, model=r["model"], strategy=r["strategy"], compressor=r["compressor"],
                        measured_ms=r["measured_ms"], predicted_ms=r["predicted_ms"],
                        nobusy_ms=float(re.search(r"^iteration\s+([0-9.]+) ms", out, re.M).group(1))))
json.dump(res, open(f"{here}/reprice.json", "w"), indent=1)
with open(f"{here}/summary.txt", "w") as f:
    for E in dict.fromkeys(x["eval"] for x in res):
        rows = [x for x in res if x["eval"] == E]
        within = lambda k: sum(abs(x["measured_ms"] / x[k] - 1) <= 0.10 for x in rows)
        print(f"{E}: {len(rows)} runs within 10%: as planned {within('predicted_ms')}, without busy curves {within('nobusy_ms')}", file=f)
    for x in res:
        print(f"{x['eval']:32s} {x['model']:9s} {x['strategy']:12s} {x['compressor']:9s} measured {x['measured_ms']:8.1f}  "
              f"planned {x['predicted_ms']:8.1f} ({x['measured_ms'] / x['predicted_ms']:.2f})  "
              f"no busy {x['nobusy_ms']:8.1f} ({x['measured_ms'] / x['nobusy_ms']:.2f})", file=f)
PY
head -3 "$here/summary.txt"

#!/usr/bin/env python3
"""Re-prices every run of evaluate.sh output directories with a cupcake-plan binary
(`simulate` on the run's plan, model and profile.db) and prints predicted (committed and now),
measured, measured / now, and how many runs are within 10%.
Usage: resimulate.py CUPCAKE_PLAN DIR..."""
import json, os, subprocess, sys

binary, dirs = sys.argv[1], sys.argv[2:]
total = within = 0
for d in dirs:
    for x in json.load(open(os.path.join(d, "results.json"))):
        plan = os.path.join(d, "plans", f"{x['model']}-{x['strategy']}-{x['compressor']}.pb")
        out = subprocess.run([binary, "simulate", "--plan", plan, "--model-name", x["model"], "--profile",
                              os.path.join(d, "profile.db"), "--format", "json"],
                             capture_output=True, text=True, check=True)
        now = json.loads(out.stdout)["iteration_us"] / 1000
        ratio = x["measured_ms"] / now
        total += 1
        within += abs(ratio - 1) <= 0.10
        print(os.path.basename(d.rstrip("/")), x["model"], x["strategy"], x["compressor"],
              f"{x['predicted_ms']:.1f}", f"{now:.1f}", f"{x['measured_ms']:.1f}", f"{ratio:.2f}")
print(f"within 10%: {within} of {total}")

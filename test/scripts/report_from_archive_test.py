#!/usr/bin/env python3
"""bench/testbed/report.py draws an evaluation's report again from an experiment's archive, as
bench/results/README.md promises (the archives keep no plots): a replay evaluation's raw.tar.xz
unpacked into a temporary directory and reported from there (not from the repository's root,
so the model file named in machine.txt must be found under the repository). The results must
equal the committed results.json, the replay table must have the model's row, and every plot
must be drawn (PNG where rsvg-convert is installed, else SVG).
Usage: report_from_archive_test.py SOURCE_DIR"""

import json
import os
import subprocess
import sys
import tarfile
import tempfile

SRC = os.path.abspath(sys.argv[1]) if len(sys.argv) == 2 else sys.exit(__doc__)
EXPERIMENT = os.path.join(SRC, "bench", "results", "replay-200mbit-4hosts-2026-11-28d")
failures = []

with tempfile.TemporaryDirectory() as tmp:
    with tarfile.open(os.path.join(EXPERIMENT, "raw.tar.xz")) as t:
        t.extractall(tmp)
    run = os.path.join(tmp, "raw", "b4h200")
    with open(os.path.join(EXPERIMENT, "results.json")) as f:
        committed = json.load(f)
    os.remove(os.path.join(run, "results.json"))
    p = subprocess.run([sys.executable, os.path.join(SRC, "bench", "testbed", "report.py"), run],
                       cwd=tmp, capture_output=True, text=True)
    if p.returncode != 0:
        failures.append(f"report.py: exit {p.returncode}:\n{p.stdout}{p.stderr}")
    else:
        with open(os.path.join(run, "results.json")) as f:
            if json.load(f) != committed:
                failures.append("results.json differs from the committed one")
        with open(os.path.join(run, "README.md")) as f:
            readme = f.read()
        if "| bert_base | 0.0 / " not in readme:
            failures.append("README.md: no replay row for bert_base:\n" + readme[:2000])
        names = os.listdir(run)
        plots = [n for n in names if n.endswith((".png", ".svg"))]
        # One predicted-vs-measured plot, and a timeline per run that recorded one (12 here).
        stems = {os.path.splitext(n)[0] for n in plots}
        if "predicted-vs-measured" not in stems or len([s for s in stems if s.startswith("timeline-")]) != 12:
            failures.append(f"plots drawn: {sorted(stems)}; expected predicted-vs-measured and 12 timelines")

for f in failures:
    print("FAIL: " + f)
if not failures:
    print("ok: the report and its plots are drawn again from the archive")
sys.exit(1 if failures else 0)

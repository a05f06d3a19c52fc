#!/usr/bin/env python3
"""scripts/check-results.py against doctored copies of the committed results: the tree as
committed passes, and each change below (a measured time in a results.json, a number or spread
on the page, a row removed, a row the script does not know, a raw file named that does not
exist, a date on a reference page, a cell of the headline table or its marker, a raw file's
point) must fail naming what is wrong.
Usage: check_results_test.py SOURCE_DIR"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.path.abspath(sys.argv[1]) if len(sys.argv) == 2 else sys.exit(__doc__)
SCRIPT = os.path.join(SRC, "scripts", "check-results.py")
failures = []


def check(root):
    p = subprocess.run([sys.executable, SCRIPT, "--root", root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def copy_tree(dst):
    os.makedirs(os.path.join(dst, "docs"))
    shutil.copy(os.path.join(SRC, "docs", "RESULTS.md"), os.path.join(dst, "docs"))
    results = os.path.join(SRC, "bench", "results")
    # The archives are large: linked, not copied (no case below edits them).
    shutil.copytree(results, os.path.join(dst, "bench", "results"),
                    ignore=shutil.ignore_patterns("*.tar.xz"))
    for d, _, files in os.walk(results):
        for f in files:
            if f.endswith(".tar.xz"):
                rel = os.path.relpath(os.path.join(d, f), SRC)
                os.symlink(os.path.join(SRC, rel), os.path.join(dst, rel))


def edit(path, old, new):
    with open(path) as f:
        text = f.read()
    if old not in text:
        failures.append(f"test setup: '{old}' not in {path}")
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


def doctor_results_json(root):
    path = os.path.join(root, "bench/results/evaluation-2026-11-25/2hosts-1gbit/results.json")
    with open(path) as f:
        runs = json.load(f)
    for r in runs:
        if (r["model"], r["strategy"], r["compressor"]) == ("resnet", "plan", "efsignsgd"):
            r["measured_ms"] *= 1.05
    with open(path, "w") as f:
        json.dump(runs, f)


def page(root):
    return os.path.join(root, "docs", "RESULTS.md")


CASES = [
    ("a measured time in a results.json", doctor_results_json,
     ["R1 value", "evaluation-2026-11-25/2hosts-1gbit/results.json", "expected 'resnet "]),
    ("a number on the page", lambda r: edit(page(r), "14 of 17 sizes", "15 of 17 sizes"),
     ["R12 value: got '15 of 17 sizes", "expected '14 of 17 sizes"]),
    ("a spread on the page", lambda r: edit(page(r), "gravac overlapping (within noise)", "gravac apart"),
     ["R15 spread"]),
    ("a row removed", lambda r: edit(page(r), "| R13 |", "| x13 |"), ["R13: row missing"]),
    ("a row the script does not know", lambda r: edit(page(r), "| R13 |", "| R99 | a | b | c | d |\n| R13 |"),
     ["R99: no check recomputes this row"]),
    ("a raw file the page names that does not exist",
     lambda r: edit(page(r), "| zen-2026-11-25/4x2hosts-1gbit.txt |", "| zen-2026-11-25/4x2hosts-1gbit.txt, zen-2026-11-25/none.txt |"),
     ["R13 raw files: bench/results/zen-2026-11-25/none.txt: no such file"]),
    ("a date on a reference page",
     lambda r: open(os.path.join(r, "docs", "FORMATS.md"), "w").write("# Formats\n\nChanged on 2026-11-26.\n"),
     ["docs/FORMATS.md:3: a date (2026-11-26) on a reference page"]),
    ("a cell of the headline table",
     lambda r: edit(page(r), "| bert_base | 4 x 200 Mbit/s | 0.99 / 1.00 |", "| bert_base | 4 x 200 Mbit/s | 1.99 / 1.00 |"),
     ["headline efsignsgd/topk line 10: got '| bert_base | 4 x 200 Mbit/s | 1.99 / 1.00",
      "expected '| bert_base | 4 x 200 Mbit/s | 0.99 / 1.00"]),
    ("the headline table's marker removed",
     lambda r: edit(page(r), "<!-- headline dgc/fp16: scripts/check-results.py --headline -->", ""),
     ["headline: no line '<!-- headline dgc/fp16"]),
    ("a point of a raw text file",
     lambda r: edit(os.path.join(r, "bench/results/busy-2026-11-26/allreduce-pinned.txt"),
                    "spin2: 0.029 10 8.05 8.01 10", "spin2: 0.029 10 8.05 8.01 0.05"),
     ["R12 value", "allreduce-pinned.txt"]),
]

with tempfile.TemporaryDirectory() as tmp:
    clean = os.path.join(tmp, "clean")
    copy_tree(clean)
    rc, out = check(clean)
    if rc != 0:
        failures.append(f"the committed results: exit {rc}, expected 0:\n{out}")
    for i, (what, doctor, expected) in enumerate(CASES):
        root = os.path.join(tmp, f"case{i}")
        copy_tree(root)
        doctor(root)
        rc, out = check(root)
        missing = [e for e in expected if e not in out]
        if rc != 1 or missing:
            failures.append(f"{what}: exit {rc} (expected 1), missing {missing} in:\n{out}")
        else:
            print(f"ok: {what}: fails as expected")

for f in failures:
    print("FAIL: " + f)
sys.exit(1 if failures else 0)

#!/usr/bin/env python3
"""Counts the tests a ctest run skipped, per label, and fails when a label this machine can run
skipped: a green run must not hide that the MPI, Python, LibTorch or testbed suites never ran.

Usage: skip-report.py BUILD_DIR JUNIT_XML
Reads the run's JUnit file (ctest --output-junit) and the tests' labels (ctest --show-only=json-v1
in BUILD_DIR). What this machine can run, checked here the way the tests' own skips decide:
  mpi      an mpiexec on PATH
  python   /usr/bin/python3 (or $CUPCAKE_PYTHON) imports torch
  torch    the LibTorch examples were built (BUILD_DIR/examples/train_mlp/train_mlp)
  testbed  scripts/testbed.sh probe succeeds (root, network namespaces, tc)
A skipped test that also carries a label this machine cannot run (gpu here without a device) is
expected. Exit 0, or 1 listing the unexpected skips."""

import collections
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def runnable(build):
    python = os.environ.get("CUPCAKE_PYTHON", "/usr/bin/python3")
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {
        "mpi": shutil.which("mpiexec") is not None,
        "python": subprocess.run([python, "-c", "import torch"], **quiet).returncode == 0,
        "torch": os.access(os.path.join(build, "examples", "train_mlp", "train_mlp"), os.X_OK),
        "testbed": subprocess.run([os.path.join(ROOT, "scripts", "testbed.sh"), "probe"], **quiet).returncode == 0,
    }


def labels(build):
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True, capture_output=True, text=True)
    found = {}
    for t in json.loads(out.stdout)["tests"]:
        values = [p["value"] for p in t.get("properties", []) if p["name"] == "LABELS"]
        found[t["name"]] = values[0] if values else []
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build, junit = sys.argv[1], sys.argv[2]
    try:
        cases = ET.parse(junit).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        sys.exit("skip-report: %s: cannot read the JUnit file: %s" % (junit, e))
    skipped = [c.get("name") for c in cases if c.get("status") in ("skipped", "notrun", "disabled")]
    by_name = labels(build)
    can = runnable(build)
    counts = collections.Counter()
    unexpected = []
    for name in skipped:
        tags = by_name.get(name, [])
        for tag in tags or ["(no label)"]:
            counts[tag] += 1
        expected_elsewhere = any(t not in can for t in tags)  # gpu, or a label not checked here
        if not expected_elsewhere and any(can.get(t, False) for t in tags):
            unexpected.append((name, tags))
    print("skip-report: %d tests skipped; per label: %s" %
          (len(skipped), ", ".join("%s %d" % kv for kv in sorted(counts.items())) or "none"))
    print("skip-report: this machine runs: %s" % ", ".join(sorted(k for k, v in can.items() if v)))
    if unexpected:
        for name, tags in unexpected:
            print("skip-report: UNEXPECTED skip: %s (labels %s)" % (name, ";".join(tags)))
        sys.exit("skip-report: %d tests skipped that this machine can run" % len(unexpected))


if __name__ == "__main__":
    main()

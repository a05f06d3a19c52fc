#!/usr/bin/env python3
"""Summarizes alternated planner_bench runs: per benchmark row and binary, the median, min and max
of the wall time (google-benchmark's "Time") and of the CPU time over the runs, whether every
counter (plan, nodes, proof) is the same in every run of both binaries, and the load average
each run started and ended under. Writes results.json and prints a Markdown table.

  summarize.py RAW_DIR OUT_JSON      (RAW_DIR: {options,plan}-{old,new}-{1,2,3}.txt)
"""
import json
import re
import statistics
import sys
from pathlib import Path

UNIT = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
ROW = re.compile(r"^(\S+)\s+([\d.]+) (ns|us|ms|s)\s+([\d.]+) (ns|us|ms|s)\s+(\d+)\s*(.*)$")


def parse(path):
    rows, loads = {}, []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            m = re.search(r"load average: ([\d.]+)", line)
            if m:
                loads.append(float(m.group(1)))
            continue
        m = ROW.match(line)
        if m and "/" in m.group(1):
            counters = dict(kv.split("=", 1) for kv in m.group(7).split())
            rows[m.group(1)] = {
                "wall_ms": float(m.group(2)) * UNIT[m.group(3)],
                "cpu_ms": float(m.group(4)) * UNIT[m.group(5)],
                "counters": counters,
            }
    return rows, loads


def stats(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    raw, out = Path(sys.argv[1]), Path(sys.argv[2])
    result = {"binaries": {"old": "b4ecda3", "new": "969befb"}, "runs": {}, "rows": {}}
    data = {}
    for f in sorted(raw.glob("*-*-*.txt")):
        suite, binary, run = f.stem.split("-")
        rows, loads = parse(f)
        result["runs"][f.name] = {"load_start_end": loads, "rows": len(rows)}
        for name, r in rows.items():
            data.setdefault(name, {}).setdefault(binary, []).append(r)
    for name, by_binary in data.items():
        entry = {}
        counters = {json.dumps(r["counters"], sort_keys=True) for runs in by_binary.values() for r in runs}
        entry["counters_identical"] = len(counters) == 1
        entry["counters"] = by_binary[next(iter(by_binary))][0]["counters"]
        for binary, runs in by_binary.items():
            entry[binary] = {
                "runs": len(runs),
                "wall_ms": stats([r["wall_ms"] for r in runs]),
                "cpu_ms": stats([r["cpu_ms"] for r in runs]),
            }
        if "old" in entry and "new" in entry:
            entry["new_over_old_cpu_median"] = entry["new"]["cpu_ms"]["median"] / entry["old"]["cpu_ms"]["median"]
        result["rows"][name] = entry
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print("| row | old CPU ms median [min, max] | new CPU ms median [min, max] | new/old | wall ms medians old, new | counters same |")
    print("|---|---:|---:|---:|---:|---|")
    for name, e in result["rows"].items():
        if "old" not in e or "new" not in e:
            continue
        o, n = e["old"]["cpu_ms"], e["new"]["cpu_ms"]
        print(f"| {name} | {o['median']:.3g} [{o['min']:.3g}, {o['max']:.3g}] | {n['median']:.3g} "
              f"[{n['min']:.3g}, {n['max']:.3g}] | {e['new_over_old_cpu_median']:.2f} | "
              f"{e['old']['wall_ms']['median']:.3g}, {e['new']['wall_ms']['median']:.3g} | "
              f"{'yes' if e['counters_identical'] else 'NO'} |")
    loads = [l for r in result["runs"].values() for l in r["load_start_end"]]
    print(f"\nload average (1 min) at the runs' starts and ends: {min(loads):.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()

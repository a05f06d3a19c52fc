#!/usr/bin/env python3
"""Median and range over repeated runs of gpu_kernels_bench and runtime_gpu_bench (bench/gpu/run.sh's
outputs), and the issue's targets read off them, as JSON on stdout.
Usage: summarize.py --kernels RUN.txt... --runtime C=RUN.txt... (C: the compressor of that run)"""

import argparse
import json
import statistics
import sys


def rows(path, width):
    """The table rows of one output: the lines that do not start with '#', split in `width` fields
    (a runtime row's name has spaces: everything before the last width - 1 fields)."""
    out = []
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            parts = line.split()
            if len(parts) < width:
                sys.exit("summarize.py: %s: a row with %d fields, expected %d: %r" % (path, len(parts), width, line))
            out.append([" ".join(parts[:len(parts) - width + 1])] + parts[len(parts) - width + 1:])
    return out


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}


def kernels(paths):
    """Per (name, op, n): the median over runs of each run's median_us, and of_copy_bw."""
    runs = {}
    for path in paths:
        for name, op, n, median_us, _p10, _p90, _bytes, _gbs, of_copy, _x in rows(path, 10):
            key = "%s %s %s" % (name, op, n)
            runs.setdefault(key, {"us": [], "of_copy_bw": []})
            runs[key]["us"].append(float(median_us))
            runs[key]["of_copy_bw"].append(float(of_copy.rstrip("%")) / 100)
    return {k: {"us": spread(v["us"]), "of_copy_bw": spread(v["of_copy_bw"])} for k, v in runs.items()}


def runtime(specs):
    """Per compressor and row: the median over runs of each run's median_us."""
    out = {}
    for spec in specs:
        compressor, path = spec.split("=", 1)
        for name, groups, median_us, _mean, _min, _vs, _check in rows(path, 7):
            out.setdefault(compressor, {}).setdefault(name, {"groups": int(groups), "us": []})["us"].append(float(median_us))
    return {c: {name: {"groups": r["groups"], "us": spread(r["us"])} for name, r in t.items()} for c, t in out.items()}


def targets(k, r):
    """The targets of docs/KERNELS.md and docs/RUNTIME_BENCH.md at n = 32 Mi (kernels) and on resnet50 (runtime)."""
    n = max(int(key.split()[2]) for key in k)
    t = {"decode_of_copy_bw_at_least_0.7": {}, "dgc_encode_x_copy_at_most_4": None}
    for c in ("signsgd", "efsignsgd", "signum", "onebit", "randk", "terngrad"):
        t["decode_of_copy_bw_at_least_0.7"][c] = k["%s decode %d" % (c, n)]["of_copy_bw"]["median"]
    t["dgc_encode_x_copy_at_most_4"] = k["dgc encode %d" % n]["us"]["median"] / k["copy d2d %d" % n]["us"]["median"]
    base = None
    for c, rows_ in r.items():
        one = next(v for name, v in rows_.items() if name == "runtime %s one_group" % c)
        layer = next(v for name, v in rows_.items() if name == "runtime %s layerwise" % c)
        t["per_group_fixed_us_at_most_10_" + c] = (layer["us"]["median"] - one["us"]["median"]) / (layer["groups"] - 1)
        base = rows_["ncclAllReduce in place + divide (baseline)"]["us"]["median"]
        t["fp32_separate_x_baseline_at_most_1.2_" + c] = rows_["runtime fp32 one_group, separate buffers"]["us"]["median"] / base
    return t


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", required=True)
    parser.add_argument("--runtime", nargs="+", required=True)
    args = parser.parse_args()
    k, r = kernels(args.kernels), runtime(args.runtime)
    json.dump({"kernels": k, "runtime": r, "targets": targets(k, r)}, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()

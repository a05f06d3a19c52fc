#!/usr/bin/env python3
"""Summarizes several evaluations (bench/testbed/evaluate.sh output directories) as the tables of
docs/EVALUATION.md.

Per testbed and model: fp32 in 25 MiB buckets (predicted / measured), and per compressor the
plan's measured median with its distance to the fastest other fusion strategy of the compressor
(layer-wise, one group, 25 MiB buckets) and its speed-up over fp32 buckets; the options plan's
measured median and its measured / predicted ratio. Then per testbed: runs within 10% of their
prediction, and how often the plan is the fastest, inside the fastest one's p10-p90, or outside.
Usage: summarize.py DIR...   (each DIR holds results.json; its name labels the rows)
"""
import json
import os
import sys

OTHERS = {"layerwise": "layer-wise", "one_group": "one group", "bucket": "buckets"}


def main():
    dirs = sys.argv[1:]
    if not dirs:
        raise SystemExit("usage: summarize.py DIR...")
    runs = {d: json.load(open(os.path.join(d, "results.json"))) for d in dirs}
    present = {r["compressor"] for rs in runs.values() for r in rs if r["compressor"] != "fp32"}
    compressors = [c for c in ("efsignsgd", "topk", "fp16") if c in present] + sorted(
        present - {"efsignsgd", "topk", "fp16"})
    print("| testbed | model | fp32 buckets ms, pred / meas | "
          + " | ".join(f"{c} plan ms: vs fastest other, vs fp32" for c in compressors)
          + " | options plans ms (meas / pred) |")
    print("|---|---|---|" + "---|" * len(compressors) + "---|")
    verdicts = []
    for d, rs in runs.items():
        name = os.path.basename(os.path.normpath(d))
        counts = {"fastest": 0, "inside": 0, "outside": 0}
        for m in sorted({r["model"] for r in rs}):
            mine = [r for r in rs if r["model"] == m]
            fp32 = next(r for r in mine if r["strategy"] == "fp32_bucket")
            cells, options = [], []
            for c in compressors:
                by = {r["strategy"]: r for r in mine if r["compressor"] == c}
                plan = by["plan"]
                best = min((by[s] for s in OTHERS if s in by), key=lambda r: r["measured_ms"])
                if plan["measured_ms"] <= best["measured_ms"]:
                    counts["fastest"] += 1
                elif plan["measured_ms"] <= best["measured_p90_ms"]:
                    counts["inside"] += 1
                else:
                    counts["outside"] += 1
                gap = plan["measured_ms"] / best["measured_ms"] - 1
                cells.append(f"{plan['measured_ms']:.1f}: {gap * 100:+.0f}% vs {OTHERS[best['strategy']]}, "
                             f"{fp32['measured_ms'] / plan['measured_ms']:.2f}x")
                if "options" in by:
                    o = by["options"]
                    options.append(f"{c} {o['measured_ms']:.1f} ({o['measured_over_predicted']:.2f})")
            print(f"| {name} | {m} | {fp32['predicted_ms']:.1f} / {fp32['measured_ms']:.1f} | " + " | ".join(cells)
                  + f" | {', '.join(options) or '-'} |")
        within = sum(1 for r in rs if abs(r["measured_over_predicted"] - 1) <= 0.10)
        verdicts.append(f"{name}: {within} of {len(rs)} runs within 10% of their prediction; the plan fastest of "
                        f"its compressor's fusion strategies {counts['fastest']}, inside the fastest one's p10-p90 "
                        f"{counts['inside']}, outside {counts['outside']}")
    print()
    for v in verdicts:
        print(f"- {v}")


if __name__ == "__main__":
    main()

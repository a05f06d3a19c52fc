#!/usr/bin/env python3
"""Summarizes zen_vs_planner.sh output files (docs/ZEN.md, "Zen's phases").

For each row (ranks, density, indices): the median [min, max] over the runs of zen's and the
allgather scheme's medians, their prices (zen's with the row's measured union), the pick of each
run; then each phase of zen's exchange, the median over the runs of its measured median beside
the planner's price of it (measured/price, ms).

    bench/comm/zen_phases_summary.py OUT.txt [OUT.txt ...]
"""
import statistics
import sys

PHASES = ["counts", "pairs", "work", "sizes", "partitions", "decode"]
MAIN_COLUMNS = 20  # zen_time's main table with --profile


def summarize(path):
    main, phases = {}, {}
    with open(path) as f:
        for line in f:
            t = line.split()
            if not t or line.startswith("#") or t[0] == "P":
                continue
            key = tuple(t[:3])
            if len(t) == MAIN_COLUMNS:
                main.setdefault(key, []).append(
                    {"zen": float(t[7]), "ag": float(t[9]), "ag_pred": float(t[13]), "zen_pred_u": float(t[17]),
                     "check_u": t[19]})
            elif len(t) == 3 + 2 * len(PHASES):
                phases.setdefault(key, []).append([float(x) for x in t[3:]])
            else:
                sys.exit(f"{path}: a line of {len(t)} fields; expected {MAIN_COLUMNS} or {3 + 2 * len(PHASES)}")
    print(path)
    for key, rows in main.items():
        zen = [r["zen"] for r in rows]
        ag = [r["ag"] for r in rows]
        print(f"{' '.join(key)}: zen {statistics.median(zen):.1f} [{min(zen):.1f}, {max(zen):.1f}] "
              f"pred_u {rows[0]['zen_pred_u']:.1f} | ag {statistics.median(ag):.1f} [{min(ag):.1f}, {max(ag):.1f}] "
              f"pred {rows[0]['ag_pred']:.1f} | picks {','.join(r['check_u'] for r in rows)}")
        runs = phases.get(key, [])
        if runs:
            parts = [f"{name} {statistics.median(r[2 * i] for r in runs):.1f}/{runs[0][2 * i + 1]:.1f}"
                     for i, name in enumerate(PHASES)]
            print("    " + "; ".join(parts))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    for p in sys.argv[1:]:
        summarize(p)

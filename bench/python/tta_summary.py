"""The summary of a bench/python/tta.sh run: one row per arm over its seeds, on stdout, and
results.json with the header, every run and the summary.

  tta_summary.py [--header header.txt] [--runs DIR] results.jsonl results.json

results.jsonl: tta.py's JSON lines (status "ok"), or lines with another status (an unavailable
arm, a failed run). --runs: the directory with each run's full record (NAME-seedS.json: step
times, evaluations), put into results.json in place of the line when present.

Per arm: runs (ok / all), reached (runs that reached the target), and the median [min-max] over
the seeds of: time to target (s, training only; over the runs that reached it), steps to target,
final held-out accuracy and loss ("-" for a record without final_loss), the median step time, and the bytes sent per rank (each run's largest
rank; "-" where not measured). "vs ddp-fp32": ddp-fp32's median time to target over the arm's.
A second table compares progress per step: the held-out loss at steps LOSS_STEPS, median [min-max]
over the seeds, from the runs' evaluations (in --runs' records); "-" where some run of the arm had
stopped before that step or has no evaluation there.
"""

import argparse
import json
import os
import statistics
import sys

LOSS_STEPS = (10, 30, 60, 100)


def spread(values, fmt):
    """'median [min-max]' of the non-None values, '-' when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    m = fmt % statistics.median(values)
    return m if len(values) == 1 else "%s [%s-%s]" % (m, fmt % min(values), fmt % max(values))


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(rows):
    """{arm: summary} in the order arms first appear."""
    arms = {}
    for r in rows:
        arms.setdefault(r["name"], []).append(r)
    out = {}
    for name, runs in arms.items():
        ok = [r for r in runs if r.get("status") == "ok"]
        others = sorted({r["status"] for r in runs if r.get("status") != "ok"})
        reached = [r for r in ok if r["reached"]]
        sent = [max(r["bytes_sent_per_rank"]) if r.get("bytes_sent_per_rank") else None for r in ok]
        losses = [{e[0]: e[2] for e in r.get("evals", []) if len(e) > 2} for r in ok]
        out[name] = {
            "runs": len(runs), "ok": len(ok), "reached": len(reached), "other_status": others,
            "seeds": [r["seed"] for r in runs],
            "time_to_target_s": [r["time_to_target_s"] for r in reached],
            "steps_to_target": [r["steps_to_target"] for r in reached],
            "final_accuracy": [r["final_accuracy"] for r in ok],
            "final_loss": [r.get("final_loss") for r in ok],
            "step_median_ms": [r["step_median_ms"] for r in ok],
            "bytes_sent_per_rank": sent,
            "median_time_to_target_s": median_or_none([r["time_to_target_s"] for r in reached]),
            # step -> every ok run's held-out loss there; only steps that every ok run evaluated
            "heldout_loss": {str(step): [d[step] for d in losses] for step in LOSS_STEPS
                             if losses and all(step in d for d in losses)},
        }
    return out


def table(summary):
    lines = ["%-16s %7s %7s %-22s %-16s %-22s %-22s %-22s %-24s %9s" % (
        "arm", "ok/runs", "reached", "time_to_target_s", "steps_to_target", "final_accuracy", "final_loss",
        "step_median_ms", "bytes_sent_per_rank", "vs_ddp32")]
    base = summary.get("ddp-fp32", {}).get("median_time_to_target_s")
    for name, s in summary.items():
        if s["ok"] == 0:
            lines.append("%-16s %7s %7s %s" % (name, "0/%d" % s["runs"], "-", "; ".join(s["other_status"])))
            continue
        mine = s["median_time_to_target_s"]
        vs = "%.2fx" % (base / mine) if base and mine else "-"
        lines.append("%-16s %7s %7s %-22s %-16s %-22s %-22s %-22s %-24s %9s" % (
            name, "%d/%d" % (s["ok"], s["runs"]), "%d/%d" % (s["reached"], s["ok"]),
            spread(s["time_to_target_s"], "%.2f"), spread(s["steps_to_target"], "%d"),
            spread(s["final_accuracy"], "%.4f"), spread(s["final_loss"], "%.4f"), spread(s["step_median_ms"], "%.1f"),
            spread(s["bytes_sent_per_rank"], "%d"), vs))
        if s["other_status"]:
            lines.append("%-16s also: %s" % ("", "; ".join(s["other_status"])))
    return lines


def footer(r):
    """The line under the table: the job's shape and its target, with the target's direction (a
    record without target_metric is the CNN's: held-out accuracy)."""
    goal = "held-out loss <= %g" if r.get("target_metric") == "loss" else "held-out accuracy >= %g"
    return ("(%s%d ranks, batch %d per rank, %d parameters = %.2f MiB of gradients, lr %g, target %s, "
            "evaluation every %d steps, at most %d steps; time: training steps only, slowest rank)"
            % ("%s, " % r["model"] if r.get("model") else "", r["ranks"], r["batch_per_rank"], r["params"],
               r["gradient_mib"], r["lr"], goal % r["target"], r["eval_every"], r["max_steps"]))


def loss_table(summary):
    """The held-out loss at LOSS_STEPS per arm with a run that is ok (see the module's doc)."""
    lines = ["held-out loss at step  " + " ".join("%-24s" % s for s in LOSS_STEPS)]
    for name, s in summary.items():
        if s["ok"]:
            cells = [spread(s["heldout_loss"].get(str(step), []), "%.4f") for step in LOSS_STEPS]
            lines.append("%-22s " % name + " ".join("%-24s" % c for c in cells))
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--header")
    parser.add_argument("--runs")
    parser.add_argument("results_jsonl")
    parser.add_argument("results_json")
    args = parser.parse_args()
    rows = []
    try:
        with open(args.results_jsonl) as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    row = json.loads(line)
                    if "name" not in row or "status" not in row:
                        raise ValueError("missing 'name' or 'status'")
                    rows.append(row)
    except (OSError, ValueError) as e:
        where = args.results_jsonl if isinstance(e, OSError) else "%s:%d" % (args.results_jsonl, number)
        print("tta_summary.py: %s: %s" % (where, e), file=sys.stderr)
        return 1
    if not rows:
        print("tta_summary.py: %s: no runs" % args.results_jsonl, file=sys.stderr)
        return 1
    runs = []
    for r in rows:
        full = os.path.join(args.runs, "%s-seed%s.json" % (r["name"], r["seed"])) if args.runs else None
        if r.get("status") == "ok" and full and os.path.exists(full):
            with open(full) as f:
                r = json.load(f)
        runs.append(r)
    summary = summarize(runs)
    lines = table(summary)
    ok = [r for r in rows if r.get("status") == "ok"]
    if ok:
        lines.append(footer(ok[0]))
    lines += [""] + loss_table(summary)
    print("\n".join(lines))
    header = open(args.header).read().splitlines() if args.header else []
    with open(args.results_json, "w") as f:
        json.dump({"header": header, "summary": summary, "table": lines, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""checkpoint.sh's report: DIR/results.json and the per-arm lines from DIR/runs/ARM.rK.json (and,
with --recovery, DIR/logs/recovery-CLASS.rK.log). Also over a run that stopped early: each arm's
rounds that finished.

Usage: checkpoint_report.py DIR ARM... (none first)"""
import json, statistics, sys, glob, os, re
from report import percentile  # the evaluation's percentiles (bench/testbed/report.py)


def report(out, arms):
    """results.json's content: the runs, each arm's summary, the restarts."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "runs", "*.json"))):
        arm, rnd = os.path.basename(path)[:-5].split(".r")
        t = json.load(open(path))
        ms = [x / 1e3 for x in t["iteration_us"][t["warmup"]:]]
        row = {"arm": arm, "round": int(rnd), "iterations": len(ms), "median_ms": statistics.median(ms),
               "mean_ms": statistics.mean(ms), "p10_ms": percentile(sorted(ms), 0.1),
               "p90_ms": percentile(sorted(ms), 0.9),
               "ranks_agree": t["ranks_agree"]}
        # Where the time goes: each phase's median over the timed iterations (its slowest rank's).
        row["phase_medians_ms"] = {name: statistics.median(v[t["warmup"]:]) / 1e3 for name, v in t["phases_us"].items()}
        if "durable_steps" in t:
            # The durable checkpoints of the timed iterations (step s is iteration s - 1's).
            timed = [(s, a) for s, a in zip(t["durable_steps"], t["durable_after_ms"]) if s > t["warmup"]]
            steps = [s for s, _ in timed]
            row["durable_steps"] = steps
            row["durable_after_ms"] = [a for _, a in timed]
            row["achieved_period_steps"] = (steps[-1] - steps[0]) / (len(steps) - 1) if len(steps) > 1 else None
            # Per step the loop notes its save (blocking) or its persist's wait: the iterations that
            # carry it, s - 1 (blocking, the save's step) and s (persist: the next step's wait).
            carry = [s - 1 if arm == "blocking" else s for s in steps]
            carried = [t["iteration_us"][i] / 1e3 for i in carry if i < len(t["iteration_us"])]
            rest = [t["iteration_us"][i] / 1e3 for i in range(t["warmup"], len(t["iteration_us"])) if i not in carry]
            row["carrying_iterations_mean_ms"] = statistics.mean(carried) if carried else None
            row["other_iterations_mean_ms"] = statistics.mean(rest) if rest else None
        log = os.path.join(out, "logs", f"train-{arm}.r{rnd}.log")
        text = open(log).read() if os.path.exists(log) else ""
        exchange = replica_line(text)
        if exchange is not None:
            row["replica"] = exchange
        pieces = pieces_line(text)
        if pieces is not None:
            row["pieces"] = pieces
        rows.append(row)
    summary = {}
    for arm in arms:
        med = [r["median_ms"] for r in rows if r["arm"] == arm]
        replica = [r["replica"] for r in rows if r["arm"] == arm and "replica" in r]
        mean = [r["mean_ms"] for r in rows if r["arm"] == arm]
        summary[arm] = {"median_of_round_medians_ms": statistics.median(med), "round_medians_ms": med,
                        "median_of_round_means_ms": statistics.median(mean), "round_means_ms": mean,
                        "round_phase_medians_ms": [r["phase_medians_ms"] for r in rows if r["arm"] == arm]}
        if replica:
            summary[arm]["round_replica"] = replica
        pieces = [r["pieces"] for r in rows if r["arm"] == arm and "pieces" in r]
        if pieces:
            summary[arm]["round_pieces"] = pieces
        periods = [r["achieved_period_steps"] for r in rows if r["arm"] == arm and "durable_steps" in r]
        if periods:
            summary[arm]["round_achieved_period_steps"] = periods
            summary[arm]["round_durable_checkpoints"] = [len(r["durable_steps"]) for r in rows if r["arm"] == arm]
            summary[arm]["round_durable_after_max_ms"] = [max(r["durable_after_ms"], default=None)
                                                          for r in rows if r["arm"] == arm]
            summary[arm]["round_carrying_iterations_mean_ms"] = [r["carrying_iterations_mean_ms"]
                                                                 for r in rows if r["arm"] == arm]
            summary[arm]["round_other_iterations_mean_ms"] = [r["other_iterations_mean_ms"]
                                                              for r in rows if r["arm"] == arm]
    base = summary["none"]["median_of_round_medians_ms"]
    for arm in arms:
        summary[arm]["overhead_pct"] = (summary[arm]["median_of_round_medians_ms"] / base - 1) * 100
        # Per round against that round's none: the spread of the overhead, of the medians and of the
        # means (a save every N steps moves the mean, not the median).
        for key, stat in (("round_overheads_pct", "median_ms"), ("round_mean_overheads_pct", "mean_ms")):
            summary[arm][key] = [
                (r[stat] / n[stat] - 1) * 100 for r in rows if r["arm"] == arm
                for n in rows if n["arm"] == "none" and n["round"] == r["round"]]
    # --recovery: rank 0's restore line and source in each restart's log.
    recovery = []
    for path in sorted(glob.glob(os.path.join(out, "logs", "recovery-*.r*.log"))):
        kind, rnd = os.path.basename(path)[len("recovery-"):-4].split(".r")
        if kind == "start":
            continue
        text = open(path).read()
        restored = re.search(r"^checkpoint: restored step (\d+) from (.*)$", text, re.M)
        took = re.search(r"^checkpoint: restore took ([\d.]+) ms, done ([\d.]+) ms after the job's start$", text, re.M)
        if not restored or not took:
            sys.exit(f"checkpoint: {path}: no restore line (expected 'checkpoint: restored step N from ...')")
        recovery.append({"class": kind, "round": int(rnd), "step": int(restored[1]), "source": restored[2],
                         "restore_ms": float(took[1]), "done_after_start_ms": float(took[2])})
    recovery_summary = {k: {"round_restore_ms": [r["restore_ms"] for r in recovery if r["class"] == k],
                            "round_done_after_start_ms": [r["done_after_start_ms"] for r in recovery if r["class"] == k]}
                        for k in ("processes", "host", "all-hosts") if any(r["class"] == k for r in recovery)}
    return {"runs": rows, "summary": summary, "recovery": recovery, "recovery_summary": recovery_summary}


REPLICA_LINE = re.compile(r"^checkpoint: rank 0: (\d+) replica exchanges; (\d+) collectives waited for one; "
                          r"(\d+) gaps skipped(?:; the newest replica sent in full is of step (\d+), of (\d+) committed)?$",
                          re.M)


def replica_line(log):
    """A run's replica exchanges from the training loop's line in its log's text (None: no such
    line): exchanges, collectives that waited, gaps skipped and, where the line has them, the
    newest replica sent in full and the steps committed."""
    m = REPLICA_LINE.search(log)
    if m is None:
        return None
    got = {"exchanges": int(m[1]), "collectives_waited": int(m[2]), "gaps_skipped": int(m[3])}
    if m[4] is not None:
        got.update({"replicated_step": int(m[4]), "committed": int(m[5])})
    return got


PIECES_LINE = re.compile(r"^checkpoint: rank 0: (\d+) persist pieces in the network's idle time; (\d+) collectives "
                         r"waited for a piece or an exchange$", re.M)


def pieces_line(log):
    """A run's persist pieces (--persist-chunk-bytes) from the training loop's line in its log's
    text (None: no such line): the pieces written and the collectives that waited for one."""
    m = PIECES_LINE.search(log)
    return None if m is None else {"pieces": int(m[1]), "collectives_waited": int(m[2])}


def print_lines(result, arms):
    """Per arm: the overhead, the phases and, for persist and blocking, the durable checkpoints; each
    restart."""
    for arm in arms:
        s = result["summary"][arm]
        print(f"{arm:9s} median of rounds {s['median_of_round_medians_ms']:8.1f} ms  overhead {s['overhead_pct']:+6.1f}%  "
              f"per round {', '.join(f'{x:+.1f}%' for x in s['round_overheads_pct'])}; means per round "
              f"{', '.join(f'{x:.1f}' for x in s['round_means_ms'])} ms "
              f"({', '.join(f'{x:+.1f}%' for x in s['round_mean_overheads_pct'])})")
        phases = s["round_phase_medians_ms"]
        print(f"{'':9s} phases, median of round medians: " +
              ", ".join(f"{name} {statistics.median(p[name] for p in phases):.1f}" for name in phases[0]) + " ms")
        if "round_replica" in s:
            print(f"{'':9s} replicas per round (rank 0): " + "; ".join(
                f"{x['exchanges']} exchanges, {x['gaps_skipped']} gaps skipped, {x['collectives_waited']} collectives "
                f"waited" + (f", newest replica step {x['replicated_step']} of {x['committed']}" if "committed" in x else "")
                for x in s["round_replica"]))
        if "round_pieces" in s:
            print(f"{'':9s} persist pieces per round (rank 0): " + "; ".join(
                f"{x['pieces']} pieces, {x['collectives_waited']} collectives waited" for x in s["round_pieces"]))
        if "round_achieved_period_steps" in s:
            print(f"{'':9s} durable checkpoints per round {s['round_durable_checkpoints']}, achieved period "
                  f"{s['round_achieved_period_steps']} steps, known durable at most "
                  f"{', '.join('-' if x is None else f'{x:.1f}' for x in s['round_durable_after_max_ms'])} ms after their "
                  f"step's end; the iterations that carry them {', '.join('-' if x is None else f'{x:.1f}' for x in s['round_carrying_iterations_mean_ms'])} ms, "
                  f"the others {', '.join('-' if x is None else f'{x:.1f}' for x in s['round_other_iterations_mean_ms'])} ms")
    for r in result["recovery"]:
        print(f"recovery: {r['class']:9s} round {r['round']}: step {r['step']} restored in {r['restore_ms']:.1f} ms "
              f"({r['done_after_start_ms']:.1f} ms after the job's start) from {r['source']}")


if __name__ == "__main__":
    out, arms = sys.argv[1], sys.argv[2:]
    result = report(out, arms)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    print_lines(result, arms)

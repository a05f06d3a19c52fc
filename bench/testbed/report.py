#!/usr/bin/env python3
"""The evaluation's report (bench/testbed/evaluate.sh writes its inputs into DIR).

Reads DIR/plans/NAME.json (`cupcake-plan show --format json`), DIR/runs/NAME.rK.json (a training
job's --timing file, one per round K), DIR/runs/NAME.timeline.json (--timeline) and
DIR/machine.txt, where NAME is MODEL-STRATEGY-COMPRESSOR. Writes DIR/results.json, DIR/README.md, DIR/summary.txt and plots:
DIR/predicted-vs-measured.png (per model, each strategy's predicted and measured time) and
DIR/timeline-MODEL-[STRATEGY-]COMPRESSOR.png (each run's predicted and measured timeline of one iteration;
the plan's without STRATEGY).
Plots are SVG converted with rsvg-convert (librsvg2-bin); without it the SVG files stay.
Usage: report.py DIR
"""
import json
import os
import shutil
import subprocess
import sys

STRATEGY_ORDER = ["fp32_bucket", "layerwise", "one_group", "bucket", "plan", "options"]
STRATEGY_TEXT = {
    "fp32_bucket": "fp32, 25 MiB buckets",
    "layerwise": "layer-wise",
    "one_group": "one group",
    "bucket": "25 MiB buckets",
    "plan": "plan (optimal fusion)",
    "options": "options plan (fusion and per-group options)",
}


def percentile(sorted_values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(path):
    with open(path) as f:
        return json.load(f)


def read_machine(d):
    info = {}
    with open(os.path.join(d, "machine.txt")) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                info[k] = v
    return info


def collect(d):
    results = []
    for fn in sorted(os.listdir(os.path.join(d, "plans"))):
        if not fn.endswith(".json"):
            continue
        name = fn[: -len(".json")]
        model, rest = name.split("-", 1)
        strategy, compressor = rest.rsplit("-", 1)
        rounds = sorted(f for f in os.listdir(os.path.join(d, "runs")) if f.startswith(name + ".r") and f.endswith(".json"))
        if not rounds:
            raise SystemExit(f"report: {d}/runs/{name}.r*.json: missing (the runs of plan {fn} did not finish)")
        plan = load(os.path.join(d, "plans", fn))
        runs = [load(os.path.join(d, "runs", f)) for f in rounds]
        # Every round's timed iterations (after its own warm-up), pooled.
        timed = sorted(t for run in runs for t in run["iteration_us"][run["warmup"]:])
        if not timed:
            raise SystemExit(f"report: {d}/runs/{name}.r*.json: iteration_us: no timed iteration after the warm-up")
        run = runs[-1]  # the losses and the agreement of the last round
        r = {
            "model": model,
            "strategy": strategy,
            "compressor": compressor,
            "groups": len(plan["groups"]),
            "predicted_ms": plan["predicted"]["iteration_us"] / 1e3,
            "measured_ms": percentile(timed, 0.5) / 1e3,
            "measured_p10_ms": percentile(timed, 0.1) / 1e3,
            "measured_p90_ms": percentile(timed, 0.9) / 1e3,
            "iterations": len(timed),
            "rounds": len(runs),
            "ranks_agree": all(r["ranks_agree"] for r in runs),
            "loss_first": run["loss_first"],
            "loss_last": run["loss_last"],
        }
        r["measured_over_predicted"] = r["measured_ms"] / r["predicted_ms"]
        if all("replay" in run for run in runs):
            # The emulation's own cost (train_replay): the worst round's median lateness of a
            # sleep and of the hand-back from the device thread, the slowest rank's.
            r["replay_wake_late_median_us"] = max(run["replay"]["wake_late"]["median_us"] for run in runs)
            r["replay_handoff_median_us"] = max(run["replay"]["handoff"]["median_us"] for run in runs)
            r["replay_handback_median_us"] = max(run["replay"]["handback"]["median_us"] for run in runs)
            r["exact_checked"] = all(run["replay"]["exact"] for run in runs)
        results.append(r)
    key = lambda r: (r["model"], r["compressor"] != "fp32", r["compressor"], STRATEGY_ORDER.index(r["strategy"]))
    return sorted(results, key=key)


def verdicts(results):
    """Per model and compressor: is each plan the fastest of its compressor, and faster than fp32?"""
    lines = []
    for model in sorted({r["model"] for r in results}):
        rows = [r for r in results if r["model"] == model]
        fp32 = next((r for r in rows if r["strategy"] == "fp32_bucket"), None)
        for c in sorted({r["compressor"] for r in rows if r["compressor"] != "fp32"}):
            mine = [r for r in rows if r["compressor"] == c]
            best = min(mine, key=lambda r: r["measured_ms"])
            for plan in (r for r in mine if r["strategy"] in ("plan", "options")):
                text = f"{model} {c}: {'plan' if plan['strategy'] == 'plan' else 'options plan'} {plan['measured_ms']:.1f} ms measured"
                if best is plan:
                    text += ", the fastest of its compressor"
                else:
                    text += f"; fastest: {STRATEGY_TEXT[best['strategy']]} {best['measured_ms']:.1f} ms"
                if fp32 is not None:
                    text += f"; fp32 buckets {fp32['measured_ms']:.1f} ms ({fp32['measured_ms'] / plan['measured_ms']:.2f}x)"
                lines.append(text)
    within = sum(1 for r in results if abs(r["measured_over_predicted"] - 1) <= 0.10)
    lines.append(f"predicted within 10% of measured: {within} of {len(results)} runs")
    return lines


def loss_text(r):
    """The losses, or n/a for a job without one (the replay job)."""
    if r["loss_first"] is None or r["loss_last"] is None:
        return "n/a"
    return f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"


def replay_lines(d, machine, results):
    """With --replay: per model, the times the model file gives (scaled) against those record
    mode measured on the replay (what the plans are priced with), and the emulation's wake-up
    costs over the training runs."""
    if "replay" not in machine:
        return []
    scale = float(machine.get("compute_scale", "1"))
    recorded = {m["name"]: m for m in load(os.path.join(d, "logs", "recorded.json")).get("models", [])}
    lines = [f"Replay (compute scale {scale:g}): the model file's times x scale against record mode's "
             "measurement of the replay (the plans' inputs); wake-up: the median lateness of a sleep, of the "
             "hand-off of backward to the device thread and of the hand-back, per run the worse of its rounds "
             "(slowest rank), as the range over the model's runs.", "",
             "| model | forward ms file / recorded | backward ms file / recorded | update ms file / recorded | "
             "sleep late us | hand-off us | hand-back us |",
             "|---|---|---|---|---|---|---|"]
    for f in machine["replay"].split(","):
        # machine.txt keeps --replay as given, relative to where evaluate.sh ran: usually the
        # repository's root, which is also where the shipped models are when the report is drawn
        # again elsewhere (from an experiment's archive).
        found = [p for p in (f, os.path.join(REPO, f)) if os.path.isfile(p)]
        if not found:
            lines.append(f"| {f} | (the model file is not found here nor under {REPO}: no row) |")
            continue
        m = load(found[0])
        rec = recorded.get(m["name"], {})
        rows = [r for r in results if r["model"] == m["name"] and "replay_wake_late_median_us" in r]
        def span(key):
            vals = [r[key] for r in rows]
            return f"{min(vals):.0f}-{max(vals):.0f}" if vals else "?"
        cells = [f"{m.get('forward_us', 0) * scale / 1e3:.1f} / {rec.get('forward_us', 0) / 1e3:.1f}",
                 f"{sum(t['backward_us'] for t in m['tensors']) * scale / 1e3:.1f} / "
                 f"{sum(t['backward_us'] for t in rec.get('tensors', [])) / 1e3:.1f}",
                 f"{m.get('update_us', 0) * scale / 1e3:.1f} / {rec.get('update_us', 0) / 1e3:.1f}",
                 span("replay_wake_late_median_us"), span("replay_handoff_median_us"),
                 span("replay_handback_median_us")]
        lines.append(f"| {m['name']} | " + " | ".join(cells) + " |")
    return lines + [""]


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def bars_svg(results):
    """Per model a panel: per strategy the predicted and the measured median (p10-p90 whisker)."""
    models = sorted({r["model"] for r in results})
    panel_h, bar_h, left, width = 0, 9, 230, 760
    parts, y = [], 30
    for model in models:
        rows = [r for r in results if r["model"] == model]
        top = max(max(r["predicted_ms"], r["measured_p90_ms"]) for r in rows) * 1.05
        scale = (width - left - 20) / top
        parts.append(f'<text x="10" y="{y}" font-size="14" font-weight="bold">{esc(model)}</text>')
        y += 10
        for r in rows:
            label = f"{STRATEGY_TEXT[r['strategy']]} ({r['compressor']}, {r['groups']} groups)"
            parts.append(f'<text x="{left - 6}" y="{y + 14}" font-size="11" text-anchor="end">{esc(label)}</text>')
            parts.append(f'<rect x="{left}" y="{y + 2}" width="{r["predicted_ms"] * scale:.1f}" height="{bar_h}" fill="#9ecae1"/>')
            parts.append(f'<rect x="{left}" y="{y + 2 + bar_h}" width="{r["measured_ms"] * scale:.1f}" height="{bar_h}" fill="#e6550d"/>')
            wy = y + 2 + 1.5 * bar_h
            parts.append(f'<line x1="{left + r["measured_p10_ms"] * scale:.1f}" x2="{left + r["measured_p90_ms"] * scale:.1f}" '
                         f'y1="{wy}" y2="{wy}" stroke="black"/>')
            parts.append(f'<text x="{left + max(r["predicted_ms"], r["measured_p90_ms"]) * scale + 4:.1f}" y="{y + 14}" '
                         f'font-size="10">{r["predicted_ms"]:.1f} / {r["measured_ms"]:.1f} ms</text>')
            y += 2 * bar_h + 6
        y += 24
    legend = ('<rect x="10" y="8" width="12" height="8" fill="#9ecae1"/><text x="26" y="16" font-size="11">predicted</text>'
              '<rect x="100" y="8" width="12" height="8" fill="#e6550d"/>'
              '<text x="116" y="16" font-size="11">measured median (line: p10-p90)</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" font-family="sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>{legend}{"".join(parts)}</svg>')


def timeline_svg(title, predicted, measured):
    """Two panels of one iteration from the start of backward: the plan's groups and what ran."""
    width, left, row, lanes = 900, 90, 16, ["backward", "encode", "comm", "decode"]
    colors = {"backward": "#bdbdbd", "encode": "#31a354", "comm": "#3182bd", "decode": "#e6550d"}
    end = max(predicted["end"], measured["end"]) * 1.02
    scale = (width - left - 20) / end
    parts, y = [f'<text x="10" y="20" font-size="14" font-weight="bold">{esc(title)}</text>'], 36
    for label, tl in (("predicted", predicted), ("measured", measured)):
        parts.append(f'<text x="10" y="{y + 12}" font-size="12" font-weight="bold">{label}: {tl["end"] / 1e3:.1f} ms</text>')
        y += 18
        for lane in lanes:
            parts.append(f'<text x="{left - 6}" y="{y + 12}" font-size="11" text-anchor="end">{lane}</text>')
            for i, (a, b) in enumerate(tl[lane]):
                shade = 0.55 + 0.45 * (i % 2)
                parts.append(f'<rect x="{left + a * scale:.2f}" y="{y + 2}" width="{max(0.8, (b - a) * scale):.2f}" '
                             f'height="{row - 4}" fill="{colors[lane]}" fill-opacity="{shade}"/>')
            y += row
        y += 12
    for ms in range(0, int(end / 1e3) + 1, max(1, int(end / 1e3 / 10))):
        x = left + ms * 1e3 * scale
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="40" y2="{y}" stroke="#eeeeee"/>'
                     f'<text x="{x:.1f}" y="{y + 12}" font-size="10" text-anchor="middle">{ms}</text>')
    parts.append(f'<text x="{left}" y="{y + 26}" font-size="11">ms from the start of backward</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 36}" font-family="sans-serif">'
            f'<rect width="100%" height="100%" fill="white"/>{"".join(parts)}</svg>')


def lanes_of(groups, backward_end, end):
    tl = {"backward": [(0, backward_end)], "end": end}
    for lane in ("encode", "comm", "decode"):
        tl[lane] = [(g[lane + "_start_us"], g[lane + "_end_us"]) for g in groups]
    return tl


def timeline_plots(d):
    written = []
    for fn in sorted(os.listdir(os.path.join(d, "runs"))):
        if not fn.endswith(".timeline.json"):
            continue
        name = fn[: -len(".timeline.json")]
        plan, run = load(os.path.join(d, "plans", name + ".json")), load(os.path.join(d, "runs", fn))
        backward = plan["predicted"]["backward_us"]
        predicted_end = max([backward] + [g["decode_end_us"] for g in plan["groups"]])
        predicted = lanes_of(plan["groups"], backward, predicted_end)
        measured = lanes_of(run["groups"], run["backward_end_us"], run["synchronized_us"])
        model, rest = name.split("-", 1)
        strategy, compressor = rest.rsplit("-", 1)
        title = (f"{model}, {compressor}: {STRATEGY_TEXT[strategy]}, {len(plan['groups'])} groups, one iteration "
                 "(forward and update not shown)")
        stem = f"timeline-{model}-{compressor}" if strategy == "plan" else f"timeline-{model}-{strategy}-{compressor}"
        written.append((stem, timeline_svg(title, predicted, measured)))
    return written


def phases(d):
    """Per run with a timeline (every strategy's last round): each term of the iteration, predicted and measured (ms)."""
    lines = ["| model | strategy | compressor | forward | backward | synchronized (D_K) | update | iteration |",
             "|---|---|---|---|---|---|---|---|"]
    for fn in sorted(os.listdir(os.path.join(d, "runs"))):
        if not fn.endswith(".timeline.json"):
            continue
        name = fn[: -len(".timeline.json")]
        plan, run = load(os.path.join(d, "plans", name + ".json")), load(os.path.join(d, "runs", fn))
        model = plan["model"]["model"]
        pred = [model.get("forward_us", 0), plan["predicted"]["backward_us"],
                max([plan["predicted"]["backward_us"]] + [g["decode_end_us"] for g in plan["groups"]]),
                model.get("update_us", 0), plan["predicted"]["iteration_us"]]
        meas = [-run["forward_start_us"], run["backward_end_us"], run["synchronized_us"],
                run["iteration_end_us"] - run["synchronized_us"], run["iteration_end_us"] - run["forward_start_us"]]
        cells = " | ".join(f"{p / 1e3:.1f} / {m / 1e3:.1f}" for p, m in zip(pred, meas))
        model_name, rest = name.split("-", 1)
        strategy, compressor = rest.rsplit("-", 1)
        lines.append(f"| {model_name} | {STRATEGY_TEXT[strategy]} | {compressor} | {cells} |")
    return lines


def write_plot(d, stem, svg):
    svg_path = os.path.join(d, stem + ".svg")
    with open(svg_path, "w") as f:
        f.write(svg)
    if shutil.which("rsvg-convert"):
        subprocess.run(["rsvg-convert", "-o", os.path.join(d, stem + ".png"), svg_path], check=True)
        os.remove(svg_path)
        return stem + ".png"
    return stem + ".svg"


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: report.py DIR")
    d = sys.argv[1]
    machine = read_machine(d)
    results = collect(d)
    with open(os.path.join(d, "results.json.tmp"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    os.replace(os.path.join(d, "results.json.tmp"), os.path.join(d, "results.json"))
    plots = [write_plot(d, "predicted-vs-measured", bars_svg(results))]
    plots += [write_plot(d, stem, svg) for stem, svg in timeline_plots(d)]
    summary = verdicts(results)
    lines = [
        f"# Evaluation: {machine.get('hosts', '?')} hosts x {machine.get('ranks_per_host', '?')} ranks, "
        f"rate {machine.get('rate', '?')}, {machine.get('date', '?')}",
        "",
        "```",
        machine.get("command", ""),
        "```",
        f"Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores; load average before "
        f"{machine.get('load_before', '?')}, after {machine.get('load_after', '?')}; commit {machine.get('commit', '?')}; "
        f"testbed TCP congestion control {machine.get('tcp_cc', '?')}.",
        "Measured: the slowest rank's time per iteration (forward start to optimizer step end), "
        "median and p10/p90 over the timed iterations of every round (each after its own warm-up; the "
        "strategies run round-robin). Predicted: the plan's iteration_us.",
        "",
        "| model | strategy | compressor | groups | predicted ms | measured ms (p10-p90) | meas/pred | loss first -> last | ranks agree |",
        "|---|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {STRATEGY_TEXT[r['strategy']]} | {r['compressor']} | {r['groups']} | {r['predicted_ms']:.1f} | "
            f"{r['measured_ms']:.1f} ({r['measured_p10_ms']:.1f}-{r['measured_p90_ms']:.1f}) | "
            f"{r['measured_over_predicted']:.2f} | {loss_text(r)} | "
            f"{'yes' if r['ranks_agree'] else 'NO'} |")
    lines += ["", *[f"- {s}" for s in summary], "", *replay_lines(d, machine, results),
              "Each strategy's terms, predicted / measured in ms (measured: rank 0's last iteration of the last "
              "round, from its timeline; backward and synchronized from the start of backward):", "",
              *phases(d), "", *[f"![{p}]({p})" for p in plots], ""]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(d, "summary.txt"), "w") as f:
        f.write("\n".join(summary) + "\n")


if __name__ == "__main__":
    main()

"""Draws a GraVAC run's decisions (tta.py --decisions FILE: cupcake.torch's opt.decisions, one JSON
object per line, docs/ADAPTIVE.md) over the steps: the ratio sent in each window (log scale), the
gains the controller weighed (gain_min, gain_c), and the predicted against the measured step time.

  plot_decisions.py DECISIONS.jsonl OUT.png|OUT.svg

Each line must be an object with numeric step, ratio, gain_min and gain_c; predicted_ms and
measured_ms are drawn where present. The file is checked before anything is drawn (every bad line
named, exit 1). Drawing needs matplotlib (Debian's python3-matplotlib); without it the script
says so and exits 0 having written nothing, so a harness can call it unconditionally.
"""

import json
import sys

USAGE = "usage: plot_decisions.py DECISIONS.jsonl OUT.png|OUT.svg"
REQUIRED = ("step", "ratio", "gain_min", "gain_c")
OPTIONAL = ("predicted_ms", "measured_ms")


def number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def load(path):
    """The decisions, or SystemExit(1) naming each bad line (FILE:LINE: problem)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise SystemExit("plot_decisions.py: %s: cannot read: %s" % (path, e.strerror))
    rows, problems = [], []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            problems.append("%s:%d: not JSON: %s" % (path, n, e))
            continue
        if not isinstance(row, dict):
            problems.append("%s:%d: got %s, expected a JSON object" % (path, n, type(row).__name__))
            continue
        bad = [k for k in REQUIRED if not number(row.get(k))]
        if bad:
            problems.append("%s:%d: missing or not a number: %s; got %s" % (path, n, ", ".join(bad),
                                                                              {k: row.get(k) for k in bad}))
            continue
        rows.append(row)
    if problems:
        raise SystemExit("\n".join("plot_decisions.py: " + p for p in problems[:5])
                         + ("\nplot_decisions.py: ... and %d more" % (len(problems) - 5) if len(problems) > 5 else ""))
    if not rows:
        raise SystemExit("plot_decisions.py: %s: no decisions; expected JSON lines with %s" % (path, ", ".join(REQUIRED)))
    return sorted(rows, key=lambda r: r["step"])


def draw(rows, out):
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in rows]
    # The ratio sent during each window, drawn to the window's end: the last window too, when the
    # decisions carry their length (steps).
    ratio_x, ratio_y = steps + [], [r["ratio"] for r in rows]
    if number(rows[-1].get("steps")):
        ratio_x.append(steps[-1] + rows[-1]["steps"])
        ratio_y.append(ratio_y[-1])
    fig, (ax_ratio, ax_gain, ax_ms) = plt.subplots(3, 1, sharex=True, figsize=(8, 8))
    ax_ratio.step(ratio_x, ratio_y, where="post")
    ax_ratio.set_yscale("log")
    ax_ratio.set_ylabel("ratio (kept share)")
    ax_ratio.set_title("GraVAC decisions")
    ax_gain.plot(steps, [r["gain_c"] for r in rows], label="gain_c")
    ax_gain.plot(steps, [r["gain_min"] for r in rows], label="gain_min")
    ax_gain.set_ylabel("gain")
    ax_gain.legend()
    for key in OPTIONAL:
        pts = [(r["step"], r[key]) for r in rows if number(r.get(key))]
        if pts:
            ax_ms.plot([s for s, _ in pts], [v for _, v in pts], label=key)
    ax_ms.set_ylabel("step time (ms)")
    ax_ms.set_xlabel("step (a window's first, as the decisions count them)")
    if ax_ms.lines:
        ax_ms.legend()
    fig.tight_layout()
    fig.savefig(out)


def main(argv):
    if len(argv) != 3:
        print(USAGE, file=sys.stderr)
        return 2
    rows = load(argv[1])
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_decisions.py: skipped: matplotlib is not installed (apt-get install python3-matplotlib); "
              "%s not written" % argv[2], file=sys.stderr)
        return 0
    draw(rows, argv[2])
    print("plot_decisions.py: %d decisions, steps %d-%d, drawn to %s" % (len(rows), rows[0]["step"], rows[-1]["step"],
                                                                        argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

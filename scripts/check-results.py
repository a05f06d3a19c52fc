#!/usr/bin/env python3
"""Recomputes every headline number of docs/RESULTS.md from the committed results under
bench/results, and fails when the page and the results disagree.

Usage: check-results.py [--root DIR]   (DIR: a tree with docs/RESULTS.md and bench/results;
                                         default: this repository)
       check-results.py --headline       (prints the headline tables as the page must have them)

The page's headlines are the table rows whose first cell is an id (`| R7 | ...`); this script
has one function per id that recomputes the row's `value` and `spread` cells from results.json,
a summary or a raw text file (for one check, plan files read out of an experiment's raw.tar.xz),
and formats them as the page must state them. Each row's last cell names its raw files (under
bench/results/, with {a,b} alternatives and globs); each must exist. The headline tables (one
per compressor pair, each after its `<!-- headline ... -->` line) must be the lines
headline_table() computes. And the reference pages
(REFERENCE_PAGES below) must carry no dates: dated changes go to docs/CHANGELOG.md.

Exit 0 when every row matches, every id on either side has its counterpart, every raw file
exists and no reference page has a date; 1 listing each problem, e.g.
  docs/RESULTS.md: R7 value: got '...'; expected '...' (recomputed from FILES)
2 on a usage error. Standard library only (CI runs it with /usr/bin/python3)."""

import glob
import json
import os
import re
import sys
import tarfile

EVAL25 = "bench/results/evaluation-2026-11-25"
EVAL26 = "bench/results/evaluation-2026-11-26"
IDLE = ["2hosts-1gbit", "2hosts-200mbit", "4hosts-1gbit", "4hosts-200mbit"]
BUSY = ["2hosts-1gbit-busy", "2hosts-200mbit-busy", "4hosts-1gbit-busy", "2x2-1gbit-busy"]


class Source:
    """Reads files under the root and remembers which, for the messages."""

    def __init__(self, root):
        self.root = root
        self.used = []

    def path(self, rel):
        self.used.append(rel)
        return os.path.join(self.root, rel)

    def json(self, rel):
        with open(self.path(rel)) as f:
            return json.load(f)

    def text(self, rel):
        with open(self.path(rel)) as f:
            return f.read()


def within10(runs):
    return sum(1 for r in runs if abs(r["measured_over_predicted"] - 1) <= 0.10)


def run(runs, model, strategy, compressor):
    found = [r for r in runs if (r["model"], r["strategy"], r["compressor"]) == (model, strategy, compressor)]
    if len(found) != 1:
        raise ValueError(f"{len(found)} runs of {model} {strategy} {compressor}, expected 1")
    return found[0]


def apart(fast, slow):
    """True when the faster run's p90 is below the slower run's p10 (p10-p90 ranges apart)."""
    return fast["measured_p90_ms"] < slow["measured_p10_ms"]


def span(values, fmt="{:.2f}", unit="x"):
    lo, hi = min(values), max(values)
    a, b = fmt.format(lo), fmt.format(hi)
    return (a if a == b else f"{a}-{b}") + unit


# --- The evaluation on the testbed (bench/testbed/evaluate.sh, results.json per testbed) ---

def plans_over_fp32(src, testbed):
    runs = src.json(f"{EVAL25}/{testbed}/results.json")
    parts, apart_n, total = [], 0, 0
    for model in ("resnet", "wide"):
        fp32 = run(runs, model, "fp32_bucket", "fp32")
        ratios = []
        for c in ("efsignsgd", "topk"):
            plan = run(runs, model, "plan", c)
            ratios.append(fp32["measured_ms"] / plan["measured_ms"])
            apart_n += apart(plan, fp32)
            total += 1
        parts.append(f"{model} {span(ratios)}")
    return ", ".join(parts), f"p10-p90 apart from fp32 buckets' in {apart_n} of {total}"


def fp16_over_fp32(src):
    ratios, apart_n = [], 0
    for t in IDLE:
        runs = src.json(f"{EVAL25}/{t}/results.json")
        for model in ("resnet", "wide"):
            fp32, plan = run(runs, model, "fp32_bucket", "fp32"), run(runs, model, "plan", "fp16")
            ratios.append(fp32["measured_ms"] / plan["measured_ms"])
            apart_n += apart(plan, fp32)
    return span(ratios), f"p10-p90 apart from fp32 buckets' in {apart_n} of {len(ratios)}"


def within_ten(src, base, testbeds):
    per = [src.json(f"{base}/{t}/results.json") for t in testbeds]
    counts = [within10(runs) for runs in per]
    value = f"{sum(counts)} of {sum(len(runs) for runs in per)}"
    if len(testbeds) > 1:
        value += " (" + ", ".join(str(c) for c in counts) + ")"
    return value, inside_spread([r for runs in per for r in runs])


def inside_spread(runs):
    inside = sum(r["measured_p10_ms"] <= r["predicted_ms"] <= r["measured_p90_ms"] for r in runs)
    return f"prediction inside the measured p10-p90 in {inside} of {len(runs)}"


def fp32_bucket_error(src):
    errors, fp32 = {2: [], 4: []}, []
    for t in IDLE:
        for r in src.json(f"{EVAL25}/{t}/results.json"):
            if r["strategy"] == "fp32_bucket":
                errors[int(t[0])].append(abs(r["measured_over_predicted"] - 1) * 100)
                fp32.append(r)
    value = f"{max(errors[2]):.1f}% (2 hosts), {max(errors[4]):.1f}% (4 hosts)"
    return value, inside_spread(fp32)


def hierarchical(src):
    """Plans with a hier* group at 2 x 2 ranks, pinned busy curves: how many within 10%."""
    testbed = "2x2-1gbit-pinned"
    runs = src.json(f"{EVAL26}/{testbed}/results.json")
    schemes = {}
    with tarfile.open(src.path(f"{EVAL26}/raw.tar.xz"), "r:xz") as tar:
        for m in tar:
            name = m.name
            if name.startswith(f"{testbed}/plans/") and name.endswith(".json"):
                plan = json.load(tar.extractfile(m))
                key = os.path.basename(name)[:-len(".json")]
                schemes[key] = {g["options"]["scheme"] for g in plan["groups"] if "options" in g}
    hier = []
    for key, s in sorted(schemes.items()):
        if any(x.startswith("hier") for x in s):
            hier.append(run(runs, *key.split("-")))
    ratios = [r["measured_over_predicted"] for r in hier]
    inside = sorted(r for r in ratios if abs(r - 1) <= 0.10)
    outside = [r for r in ratios if abs(r - 1) > 0.10]
    value = (f"{len(inside)} of {len(ratios)} within 10% ("
             + ", ".join(f"{r:.2f}" for r in inside) + f"); the other {len(outside)} {span(outside)}")
    return value, inside_spread(hier)


def embed_over_fp32(src):
    parts, apart_n, total = [], 0, 0
    for rate in ("1gbit", "200mbit"):
        runs = src.json(f"{EVAL26}/embed-2hosts-{rate}/results.json")
        fp32 = run(runs, "embed", "fp32_bucket", "fp32")
        options = [r for r in runs if r["strategy"] == "options"]
        ratios = [fp32["measured_ms"] / r["measured_ms"] for r in options]
        parts.append(f"{span(ratios, '{:.1f}')} at {rate}")
        apart_n += sum(apart(r, fp32) for r in options)
        total += len(options)
    return ", ".join(parts), f"4 options plans per rate; p10-p90 apart from fp32 buckets' in {apart_n} of {total}"


def embed_lossless_lead(src):
    parts, spreads = [], []
    for rate in ("1gbit", "200mbit"):
        runs = src.json(f"{EVAL26}/embed-2hosts-{rate}/results.json")
        options = run(runs, "embed", "options", "fp32")
        # The fastest other strategy whose loss fell below fp32 buckets' start and is not an
        # options plan (those are the same plan).
        others = [r for r in runs if r["strategy"] not in ("options", "fp32_bucket") and r["loss_last"] < r["loss_first"]]
        best = min(others, key=lambda r: r["measured_ms"])
        parts.append(f"{best['measured_ms'] / options['measured_ms']:.2f}x at {rate} "
                     f"(over {best['compressor']} {best['strategy']})")
        spreads.append(("apart" if apart(options, best) else "overlapping (within noise)") + f" at {rate}")
    return ", ".join(parts), "p10-p90 " + ", ".join(spreads)


# --- Busy curves, pinned (raw text file) ---

def pinned_busy(src):
    rel = "bench/results/busy-2026-11-26/allreduce-pinned.txt"
    lines = src.text(rel).splitlines()
    sizes = [int(x) for x in next(l for l in lines if l.startswith("# sizes")).split(":")[1].split()]
    rows = {}
    for l in lines:
        m = re.match(r"\s+(spin\d):\s+(.*)", l)
        if m:
            rows[m.group(1)] = [float(x) for x in m.group(2).split()]
    def label(n):
        return f"{n // 2**20} MiB" if n >= 2**20 else f"{n // 2**10} KiB" if n >= 2**10 else f"{n} B"
    agree, misses = 0, []
    considered = [i for i, s in enumerate(sizes) if s >= 128]
    for i in considered:
        v = [rows[k][i] for k in sorted(rows)]
        ratio = max(v) / min(v)
        if round(ratio, 2) <= 1.25:
            agree += 1
        else:
            misses.append(f"{label(sizes[i])} {ratio:.3g}x")
    value = f"{agree} of {len(considered)} sizes (128 B-{label(sizes[-1])}); not " + ", ".join(misses)
    small = sorted(rows[k][i] for k in sorted(rows) for i, s in enumerate(sizes) if 128 <= s <= 65536)
    return value, (f"{len(rows)} sweeps; 128 B-64 KiB: median {small[len(small) // 2]:.3g} ms, "
                   f"range {small[0]:.3g}-{small[-1]:.3g} ms")


# --- Zen against the allgather scheme (zen_time, raw text) ---

def zen_eight_ranks(src):
    rel = "bench/results/zen-2026-11-25/4x2hosts-1gbit.txt"
    parts, spreads = [], []
    for line in src.text(rel).splitlines():
        f = line.split()
        if len(f) == 12 and f[0] == "8" and f[1] == "0.100":
            zen, zlo, zhi = float(f[7]), *map(float, f[8].split("-"))
            ag, alo, ahi = float(f[9]), *map(float, f[10].split("-"))
            parts.append(f"{f[2]} {ag / zen:.2f}x")
            spreads.append(f"{f[2]} " + ("apart" if zhi < alo or ahi < zlo else "overlapping (within noise)"))
    return ", ".join(parts), "p10-p90 " + ", ".join(spreads)


# --- Python: cupcake.torch against DDP (ddp_compare.sh, table per run) ---

def ddp_rounds(src, directory):
    rows = {}
    for line in src.text(f"bench/results/ddp-2026-11-25/{directory}/table.txt").splitlines():
        f = line.split()
        if len(f) == 7 and f[1].isdigit():
            rows[(f[0], int(f[1]))] = (float(f[2]), float(f[3]), float(f[4]))
    return rows


def ddp_lead(src):
    fp32, psgd, apart_n, total = [], [], 0, 0
    for d in ("1gbit-lr05", "1gbit-lr01-200", "1gbit-lr02-200"):
        rows = ddp_rounds(src, d)
        for (arm, rnd), (med, p10, p90) in rows.items():
            if arm in ("efsignsgd", "topk"):
                for base, out in (("ddp-fp32", fp32), ("ddp-powersgd", psgd)):
                    b = rows[(base, rnd)]
                    out.append(b[0] / med)
                    apart_n += p90 < b[1]
                    total += 1
    return (f"{span(fp32)} over DDP fp32, {span(psgd)} over the PowerSGD hook",
            f"per round; p10-p90 apart in {apart_n} of {total}")


# --- Time to accuracy (tta.sh, results.json summary per rate) ---

def overlap(arm, base):
    """Whether two arms' min-max over the seeds are apart."""
    return "apart" if max(arm) < min(base) or min(arm) > max(base) else "overlapping"


def tta(src, directory="tta-2026-11-26", static=("topk-0.1", "topk-0.01")):
    """The faster static topk arm and GraVAC against DDP fp32: DDP's median time to target over
    the arm's, per rate."""
    parts, spreads = [], []
    for rate in ("1gbit", "200mbit"):
        s = src.json(f"bench/results/{directory}/{rate}/results.json")["summary"]
        base = s["ddp-fp32"]["median_time_to_target_s"]
        best = max(static, key=lambda a: base / s[a]["median_time_to_target_s"])
        g = base / s["gravac"]["median_time_to_target_s"]
        t = base / s[best]["median_time_to_target_s"]
        parts.append(f"{rate}: {best} {t:.2f}x, gravac {g:.2f}x")
        ddp = s["ddp-fp32"]["time_to_target_s"]
        def versus(arm):
            apart = overlap(s[arm]["time_to_target_s"], ddp)
            return apart if apart == "apart" else "overlapping (within noise)"
        spreads.append(f"{rate}: {best} {versus(best)}, gravac {versus('gravac')}")
    return "; ".join(parts), "min-max over 3 seeds against DDP fp32's: " + "; ".join(spreads)


def tta_powersgd(src, directory="tta-powersgd-2026-11-26", ranks=(1, 2, 4)):
    """Cupcake's PowerSGD plans (powersgd-K) against DDP's hook at the same rank (ddp-powersgd-K):
    the hook's median time to target over the plan's, per rate and rank."""
    parts, spreads = [], []
    for rate in ("1gbit", "200mbit"):
        s = src.json(f"bench/results/{directory}/{rate}/results.json")["summary"]
        ratios, apart = [], []
        for k in ranks:
            hook, plan = s[f"ddp-powersgd-{k}"], s[f"powersgd-{k}"]
            ratios.append(f"rank {k} {hook['median_time_to_target_s'] / plan['median_time_to_target_s']:.2f}x")
            apart.append(f"rank {k} {overlap(plan['time_to_target_s'], hook['time_to_target_s'])}")
        parts.append(f"{rate}: " + ", ".join(ratios))
        spreads.append(f"{rate}: " + ", ".join(apart))
    return "; ".join(parts), "min-max over 3 seeds against the hook's: " + "; ".join(spreads)


def tta_fastest(src, directory):
    """The arm with the shortest median time to target, against DDP fp32, per rate."""
    parts, spreads = [], []
    for rate in ("1gbit", "200mbit"):
        s = src.json(f"bench/results/{directory}/{rate}/results.json")["summary"]
        base = s["ddp-fp32"]["median_time_to_target_s"]
        best = min((a for a in s if s[a].get("median_time_to_target_s")), key=lambda a: s[a]["median_time_to_target_s"])
        parts.append(f"{rate}: {best} {base / s[best]['median_time_to_target_s']:.2f}x")
        spreads.append(f"{rate}: {overlap(s[best]['time_to_target_s'], s['ddp-fp32']['time_to_target_s'])}")
    return "; ".join(parts), "min-max over 3 seeds against DDP fp32's: " + "; ".join(spreads)


def tta_shape(src, rel, arms):
    """One testbed shape (bench/results/REL/results.json): the arm first to the target, then each
    other of ARMS (of a tuple, the faster: the best static ratio), against DDP fp32: DDP's median
    time to target over the arm's, and whether their min-max over the seeds are apart."""
    s = src.json(f"bench/results/{rel}/results.json")["summary"]
    base = s["ddp-fp32"]
    def ratio(arm):
        return base["median_time_to_target_s"] / s[arm]["median_time_to_target_s"]
    first = min((a for a in s if s[a].get("median_time_to_target_s")), key=lambda a: s[a]["median_time_to_target_s"])
    named = [max(a, key=ratio) if isinstance(a, tuple) else a for a in arms]
    named = [a for a in named if a != first]
    value = f"first {first} {ratio(first):.2f}x; " + ", ".join(f"{a} {ratio(a):.2f}x" for a in named)
    spread = ", ".join(f"{a} {overlap(s[a]['time_to_target_s'], base['time_to_target_s'])}" for a in [first] + named)
    return value, "min-max over 3 seeds against DDP fp32's: " + spread


# --- GPU (one H100, raw bench output) ---

def gpu_runtime_topk(src):
    rel = "bench/results/h100-2026-11-23/runtime_gpu_bench_topk.txt"
    rows = {}
    for line in src.text(rel).splitlines():
        m = re.match(r"(runtime topk \w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", line)
        if m:
            rows[m.group(1)] = (int(m.group(3)), int(m.group(5)))
    planned, layer, one = rows["runtime topk planned"], rows["runtime topk layerwise"], rows["runtime topk one_group"]
    value = f"planned {planned[0]} us, one group {one[0]} us, layer-wise {layer[0]} us"
    return value, f"one run of 50 iterations (median; min {planned[1]}, {one[1]}, {layer[1]} us)"


def gpu_topk_encode(src):
    xs = []
    for name in ("gpu_kernels_bench.txt", "gpu_kernels_bench_2.txt", "gpu_kernels_bench_3.txt"):
        for line in src.text(f"bench/results/h100-2026-11-25/after/{name}").splitlines():
            f = line.split()
            if f[:3] == ["topk", "encode", "33554432"]:
                xs.append(float(f[-1]))
    return f"{span(xs)} a device copy at 32 Mi elements", f"{len(xs)} runs of 30 calls (median per run)"


# --- Recorded models replayed on an emulated accelerator (evaluate.sh --replay) ---

REPLAY = "bench/results/replay-2026-11-27"
# Each evaluation's directory and label: kernels swept warm (the first two) and cold.
REPLAY_TESTBEDS = {"2hosts-1gbit": "no start-up", "2hosts-1gbit-startup1000us": "1 ms start-up",
                   "2hosts-1gbit-startup1000us-cold": "1 ms start-up, cold curves"}
REPLAY_COMPRESSORS = ("efsignsgd", "topk", "dgc", "fp16")


def replay_plan_over(src, base):
    """The plan's speed-up over strategy `base` per testbed, every model and compressor."""
    values, spreads = [], []
    for t, label in REPLAY_TESTBEDS.items():
        runs = src.json(f"{REPLAY}/{t}/results.json")
        ratios, apart_n = [], 0
        for model in ("resnet50", "bert_base"):
            for c in REPLAY_COMPRESSORS:
                plan = run(runs, model, "plan", c)
                other = run(runs, model, base, "fp32" if base == "fp32_bucket" else c)
                ratios.append(other["measured_ms"] / plan["measured_ms"])
                apart_n += apart(plan, other)
        values.append(f"{label} {span(ratios)}")
        spreads.append(f"{apart_n} of {len(ratios)}")
    what = "fp32 buckets'" if base == "fp32_bucket" else "layer-wise's"
    return "; ".join(values), f"p10-p90 apart from {what} in " + ", ".join(spreads)


def replay_within_ten(src):
    """Runs within 10% per evaluation as planned, and the warm ones re-priced with cold curves."""
    per = {t: src.json(f"{REPLAY}/{t}/results.json") for t in REPLAY_TESTBEDS}
    rows = src.json(f"{REPLAY}/reprice/reprice.json")
    repriced = dict(zip(REPLAY_TESTBEDS, ("r1", "r3")))  # reprice.sh's names of the warm ones
    parts = []
    for t, label in REPLAY_TESTBEDS.items():
        part = f"{label}: {within10(per[t])} of {len(per[t])}"
        if t in repriced:
            cold = [r for r in rows if r["eval"] == repriced[t]]
            part += f" (re-priced cold: {sum(abs(r['measured_ms'] / r['cold_ms'] - 1) <= 0.10 for r in cold)})"
        parts.append(part)
    return "; ".join(parts), inside_spread([r for runs in per.values() for r in runs])


def replay_nobusy(src):
    """The same plans re-priced on their profiles without the busy comm curves (reprice-nobusy)."""
    rows = src.json("bench/results/replay-2026-11-27b/reprice-nobusy/reprice.json")
    near = lambda rs, k: sum(abs(r["measured_ms"] / r[k] - 1) <= 0.10 for r in rs)
    parts = []
    for t, label in REPLAY_TESTBEDS.items():
        rs = [r for r in rows if r["eval"] == t]
        parts.append(f"{label}: {near(rs, 'predicted_ms')} -> {near(rs, 'nobusy_ms')} of {len(rs)}")
    dense = [r for r in rows if r["compressor"] in ("fp16", "fp32")]
    return "; ".join(parts), (f"fp16 and fp32 runs within 10%: {near(dense, 'predicted_ms')} -> "
                              f"{near(dense, 'nobusy_ms')} of {len(dense)} (R29's measured medians)")


REPLAY_B = "bench/results/replay-2026-11-27b"


def replay_model_plan(src, model):
    """One model's plan against layer-wise and fp32 buckets, per compressor (replay-2026-11-27b)."""
    runs = src.json(f"{REPLAY_B}/{model}-2hosts-1gbit-startup1000us-cold/results.json")
    value, spread = [], []
    for base, label, whose in (("layerwise", "layer-wise", "layer-wise's"), ("fp32_bucket", "fp32 buckets", "fp32 buckets'")):
        ratios, apart_n = [], 0
        for c in REPLAY_COMPRESSORS:
            plan = run(runs, model, "plan", c)
            other = run(runs, model, base, "fp32" if base == "fp32_bucket" else c)
            ratios.append(other["measured_ms"] / plan["measured_ms"])
            apart_n += apart(plan, other) or apart(other, plan)
        value.append(f"over {label} {span(ratios)}")
        spread.append(f"{whose} in {apart_n} of {len(ratios)}")
    return "; ".join(value), "p10-p90 apart from " + ", ".join(spread)


def replay_model_within_ten(src, model):
    runs = src.json(f"{REPLAY_B}/{model}-2hosts-1gbit-startup1000us-cold/results.json")
    dense = [r for r in runs if r["compressor"] in ("fp32", "fp16", "efsignsgd")]
    return (f"{within10(runs)} of {len(runs)} (fp32, fp16 and efsignsgd: {within10(dense)} of {len(dense)})",
            inside_spread(runs))


SELECTION = f"{REPLAY_B}/selection-2hosts-1gbit-startup1000us-cold/results.json"


def replay_selection_content(src):
    """topk's and dgc's runs within 10% on the new replay content, against the same strategies of
    replay-2026-11-27's cold evaluation (the old content)."""
    new = [r for r in src.json(SELECTION) if r["compressor"] in ("topk", "dgc")]
    old = [r for r in src.json(f"{REPLAY}/2hosts-1gbit-startup1000us-cold/results.json")
           if r["compressor"] in ("topk", "dgc")]
    worst = lambda runs: max(r["measured_over_predicted"] for r in runs)
    return (f"{within10(new)} of {len(new)} (the old content: {within10(old)} of {len(old)}); "
            f"worst {worst(new):.2f} (old {worst(old):.2f})"), inside_spread(new)


# --- One H200 and its 16-core host (bench/results/h200-2026-11-27/results.json) ---

H200 = "bench/results/h200-2026-11-27/results.json"


def gpu_cold_over_warm(src):
    cw = src.json(H200)["gpu_cold_over_warm"]
    large = [x for k in ("event", "kernel") for key, x in cw[k].items() if int(key.split()[-1]) >= 8388608]
    return (f"event time {span(cw['event'].values())}, kernel-only {span(cw['kernel'].values())}; "
            f"from 8 Mi elements up {span(large)}"), "one sweep each, 10 timed calls per point (median)"


def gpu_host_testbed(src):
    evals = src.json(H200)["testbed_4x2"]
    fusion = [r["measured_over_predicted"] for e in evals for r in e["rows"]
              if r["compressor"] == "efsignsgd" and r["strategy"] != "options"]
    rows = [dict(r) for e in evals for r in e["rows"]]
    value = (", ".join(f"{e['within_10pct']} of {e['runs']}" for e in evals) +
             f" within 10%; efsignsgd's fusion strategies {span(fusion)}")
    return value, f"two evaluations; {inside_spread(rows)}"


def gpu_terngrad_decode(src):
    d = src.json(H200)["decodes_us"]
    before, after = d["terngrad terngrad decode 33554432 before"], d["terngrad terngrad decode 33554432 after"]
    copy = d["terngrad copy d2d 33554432 after"]["median"]
    # The decode moves 6n bytes (W = 8 payloads of n/4 read, 4n written), the copy 8n.
    value = (f"{before['median']:.1f} -> {after['median']:.1f} us at 32 Mi elements "
             f"({0.75 * copy / after['median']:.0%} of the copy's bandwidth)")
    return value, (f"3 alternating runs each: before {before['min']:.1f}-{before['max']:.1f}, "
                   f"after {after['min']:.1f}-{after['max']:.1f} us")


H200B = "bench/results/h200-2026-11-27b/results.json"


def gpu_gain_probe(src):
    d = src.json(H200B)
    before, after = d["gain_probe"]["before"], d["gain_probe"]["after"]
    big, small = "gain_top probe 33554432", "gain_top probe 1048576"
    copy = after["copy d2d 33554432"]["us"]["median"]
    topk = d["topk_encode_after"]["topk encode 33554432"]["us"]["median"]
    value = (f"{before[big]['us']['median']:.1f} -> {after[big]['us']['median']:.1f} us at 32 Mi elements "
             f"({after[big]['us']['median'] / copy:.1f}x a copy; the topk encode {topk:.1f} us); "
             f"{before[small]['us']['median']:.1f} -> {after[small]['us']['median']:.1f} us at 1 Mi")
    return value, (f"3 runs each: before {before[big]['us']['min']:.1f}-{before[big]['us']['max']:.1f}, "
                   f"after {after[big]['us']['min']:.1f}-{after[big]['us']['max']:.1f} us at 32 Mi")


def replay_plan_ratios(rows, compressors=("efsignsgd", "topk"), options="topk"):
    """A replay evaluation's plans over layer-wise and fp32 buckets per compressor (for `options`,
    its options plan's too), and its fidelity count."""
    ms = {(r["strategy"], r["compressor"]): r["measured_ms"] for r in rows}
    fp32 = ms[("fp32_bucket", "fp32")]
    within = sum(abs(r["measured_over_predicted"] - 1) <= 0.1 for r in rows)

    def over(c, strategy):
        return f"{ms[('layerwise', c)] / ms[(strategy, c)]:.2f}x layer-wise, {fp32 / ms[(strategy, c)]:.2f}x fp32 buckets"

    parts = [f"{c} {over(c, 'plan')}" + (f" (the options plan {over(c, 'options')})" if c == options else "")
             for c in compressors]
    value = "; ".join(parts) + f"; {within} of {len(rows)} within 10%"
    return value, f"one evaluation, 2 rounds; {inside_spread(rows)}"


def gpu_host_four_hosts(src):
    return replay_plan_ratios(src.json(H200B)["testbed_4x1"]["rows"])


CHAINED = "bench/results/comm-chained-2026-11-27/results.json"
REPLAY4 = "bench/results/replay-4hosts-2026-11-27/results.json"


def chained_over_spaced(src):
    c = src.json(CHAINED)["chained"]

    def ratios(hosts, floats):
        return [r["chained"] / r["gap"] for r in c[hosts][floats]]

    value = (f"4 hosts: 25 MiB {span(ratios('4', '6553600'))}, 16 MiB {span(ratios('4', '4194304'))}, "
             f"64 MiB {span(ratios('4', '16777216'))}; 2 hosts: {span(ratios('2', '6553600') + ratios('2', '4194304') + ratios('2', '16777216'))}")
    runs = {k: len(v) for k, v in c["4"].items()}
    return value, (f"per run, the median of 16 calls each spacing; 4 hosts: {runs['6553600']} runs at 25 MiB, "
                   f"{runs['4194304']} at 16 MiB, {runs['16777216']} at 64 MiB; 2 hosts: 1 each")


CHAINED4 = "bench/results/chained-4hosts-2026-11-27/results.json"
REPLAY200 = "bench/results/replay-200mbit-2026-11-28/results.json"
REPLAY200B = "bench/results/replay-200mbit-2026-11-28b/results.json"
REPLAY200C = "bench/results/replay-200mbit-2026-11-28c/results.json"
REPLAY200_4H = "bench/results/replay-200mbit-4hosts-2026-11-28/results.json"
REPLAY200D = "bench/results/replay-200mbit-2026-11-28d/results.json"
REPLAY200E = "bench/results/replay-200mbit-2026-11-28e/results.json"
REPLAY200_4H_VGG = "bench/results/replay-200mbit-4hosts-2026-11-28b/results.json"
REPLAY200_4H_GPT2 = "bench/results/replay-200mbit-4hosts-2026-11-28c/results.json"
REPLAY200_4H_BERT = "bench/results/replay-200mbit-4hosts-2026-11-28d/results.json"

# --- The headline table: every recorded model on every testbed at the paper's ratio ---
# Per compressor pair, testbed and model, the evaluation whose runs the table reads; dgc and fp16
# ran at 2 hosts only.
HEADLINE_MODELS = ("resnet50", "bert_base", "gpt2", "vgg16")
# The ratio columns: (slower strategy, faster strategy, which time), the slower's time over the faster's.
HEADLINE_RATIOS = (("layerwise", "plan", "measured_ms"), ("layerwise", "plan", "predicted_ms"),
                   ("layerwise", "options", "measured_ms"), ("one_group", "plan", "measured_ms"),
                   ("bucket", "plan", "measured_ms"), ("fp32_bucket", "plan", "measured_ms"))
TWO_HOSTS_1GBIT = {"resnet50": f"{REPLAY}/2hosts-1gbit-startup1000us-cold/results.json",
                   "bert_base": f"{REPLAY}/2hosts-1gbit-startup1000us-cold/results.json",
                   "gpt2": f"{REPLAY_B}/gpt2-2hosts-1gbit-startup1000us-cold/results.json",
                   "vgg16": f"{REPLAY_B}/vgg16-2hosts-1gbit-startup1000us-cold/results.json"}
HEADLINE = {
    ("efsignsgd", "topk"): {
        "2 x 1 Gbit/s": TWO_HOSTS_1GBIT,
        "4 x 1 Gbit/s": dict.fromkeys(HEADLINE_MODELS, CHAINED4),
        "2 x 200 Mbit/s": {"resnet50": REPLAY200, "bert_base": REPLAY200, "gpt2": REPLAY200, "vgg16": REPLAY200B},
        "4 x 200 Mbit/s": {"resnet50": REPLAY200_4H, "bert_base": REPLAY200_4H_BERT, "gpt2": REPLAY200_4H_GPT2,
                           "vgg16": REPLAY200_4H_VGG},
    },
    ("dgc", "fp16"): {
        "2 x 1 Gbit/s": TWO_HOSTS_1GBIT,
        "2 x 200 Mbit/s": {"resnet50": REPLAY200B, "bert_base": REPLAY200C, "gpt2": REPLAY200D, "vgg16": REPLAY200E},
    },
}


def headline_marker(compressors):
    return f"<!-- headline {'/'.join(compressors)}: scripts/check-results.py --headline -->"


def headline_table(src, compressors):
    """The markdown table of docs/RESULTS.md's headline section for `compressors` (two of them):
    per model and testbed, the plan's speed-ups over layer-wise (measured and predicted), one
    group, 25 MiB buckets and fp32 buckets and the options plan's over layer-wise, each as
    'first / second' compressor; how
    many of the two plans' p10-p90 ranges are apart from layer-wise's and fp32 buckets'; and the
    runs within 10% of their predictions (those compressors' five strategies each, and the two
    fp32 runs)."""
    head = (f"| model | testbed | plan over layer-wise ({' / '.join(compressors)}) | predicted | "
            "options plan over layer-wise | over one group | over 25 MiB buckets | over fp32 buckets | "
            "p10-p90 apart | within 10% |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for model in HEADLINE_MODELS:
        for testbed, files in HEADLINE[compressors].items():
            data = src.json(files[model])
            runs = [r for r in (data[model] if isinstance(data, dict) else data) if r["model"] == model]
            of = lambda strategy, c: run(runs, model, strategy, "fp32" if strategy == "fp32_bucket" else c)
            cells = [" / ".join(f"{of(slow, c)[key] / of(fast, c)[key]:.2f}" for c in compressors)
                     for slow, fast, key in HEADLINE_RATIOS]
            layer = sum(apart(of("plan", c), of("layerwise", c)) or apart(of("layerwise", c), of("plan", c))
                        for c in compressors)
            fp32 = sum(apart(of("plan", c), of("fp32_bucket", c)) for c in compressors)
            counted = [r for r in runs if r["compressor"] in compressors + ("fp32",)]
            lines.append(f"| {model} | {testbed} | " + " | ".join(cells)
                         + f" | layer-wise {layer} of 2, fp32 buckets {fp32} of 2 | {within10(counted)} of {len(counted)} |")
    return lines


def headline_problems(root, text):
    """The headline section's tables as the page has them against the committed results."""
    problems = []
    for compressors in HEADLINE:
        name, marker = "/".join(compressors), headline_marker(compressors)
        if marker not in text:
            problems.append(f"docs/RESULTS.md: headline: no line '{marker}' before the table")
            continue
        got = text.split(marker, 1)[1].lstrip("\n").splitlines()
        src = Source(root)
        try:
            expected = headline_table(src, compressors)
        except (OSError, KeyError, ValueError) as e:
            problems.append(f"docs/RESULTS.md: headline {name}: cannot recompute from "
                            f"{', '.join(dict.fromkeys(src.used))}: {type(e).__name__}: {e}")
            continue
        for n, line in enumerate(expected):
            if n >= len(got) or got[n] != line:
                problems.append(f"docs/RESULTS.md: headline {name} line {n + 1}: got "
                                f"'{got[n] if n < len(got) else ''}'; expected '{line}' (recomputed from "
                                f"{', '.join(dict.fromkeys(src.used))})")
                break
    return problems


def chained_fidelity(rows):
    """One evaluation planned with chained curves: its runs within 10% of their predictions, and of
    the same plans re-priced without the chained curves; fp32 buckets' measured over predicted."""
    within = sum(abs(r["measured_over_predicted"] - 1) <= 0.1 for r in rows)
    spaced = sum(abs(r["measured_over_spaced_only"] - 1) <= 0.1 for r in rows)
    fp32 = next(r for r in rows if r["strategy"] == "fp32_bucket")
    value = (f"{within} of {len(rows)} within 10% ({spaced} of {len(rows)} without the chained curves); fp32 "
             f"buckets {fp32['measured_over_predicted']:.2f}x their prediction "
             f"({fp32['measured_over_spaced_only']:.2f}x without)")
    return value, f"one evaluation, 2 rounds; {inside_spread(rows)}"


def held_tail(src):
    """R45-R48's runs re-priced by the planner that holds a chained curve's excess above its last
    point: per model, the runs within 10% as planned and re-priced; vgg16's fp32 buckets."""
    models = src.json(CHAINED4)

    def count(rows, key):
        return sum(abs(r[key] - 1) <= 0.1 for r in rows)

    fp32 = next(r for r in models["vgg16"] if r["strategy"] == "fp32_bucket")
    value = ", ".join(f"{m} {count(rows, 'measured_over_predicted')} -> {count(rows, 'measured_over_held_tail')}"
                      for m, rows in models.items())
    value += (f" of {len(models['vgg16'])} within 10%; vgg16's fp32 buckets {fp32['measured_over_predicted']:.2f}x -> "
              f"{fp32['measured_over_held_tail']:.2f}x their prediction")
    return value, "the same runs as R45-R48, re-priced (`cupcake-plan simulate`)"


FIXED_COST = "bench/results/fixed-cost-2026-11-28/results.json"


def fixed_cost(src):
    """The search's predicted plan over layer-wise on the sample V100 cluster, per model over the
    four compressors, as shipped and with the GPU codecs' fixed costs removed."""
    rows = src.json(FIXED_COST)
    parts = []
    for profile, label in (("shipped", "as shipped"), ("no-fixed-cost", "without the GPU codecs' fixed costs")):
        ratios = {m: [r["speedup"]["layerwise"] for r in rows if (r["profile"], r["model"]) == (profile, m)]
                  for m in HEADLINE_MODELS}
        parts.append(f"{label}: " + ", ".join(f"{m} {span(v)}" for m, v in ratios.items()))
    proven = sum(r["optimal"] for r in rows)
    return "; ".join(parts), f"predictions, not measurements; {proven} of {len(rows)} searches proven optimal"


QUIET_TTA = "tta-quiet-2026-11-27"
QUIET_LSTM = "tta-lstm-quiet-2026-11-27"
GRAVAC = "tta-gravac-2026-11-27"

CHECKS = {
    "R1": lambda s: plans_over_fp32(s, "2hosts-1gbit"),
    "R2": lambda s: plans_over_fp32(s, "2hosts-200mbit"),
    "R3": lambda s: plans_over_fp32(s, "4hosts-1gbit"),
    "R4": lambda s: plans_over_fp32(s, "4hosts-200mbit"),
    "R18": fp16_over_fp32,
    "R5": lambda s: within_ten(s, EVAL25, IDLE),
    "R6": fp32_bucket_error,
    "R7": lambda s: within_ten(s, EVAL25, BUSY),
    "R8": lambda s: within_ten(s, EVAL26, ["2x2-1gbit-pinned"]),
    "R9": hierarchical,
    "R10": embed_over_fp32,
    "R11": embed_lossless_lead,
    "R12": pinned_busy,
    "R13": zen_eight_ranks,
    "R14": ddp_lead,
    "R15": tta,
    "R19": tta_powersgd,
    "R20": lambda s: tta_powersgd(s, QUIET_TTA, ranks=(2, 4)),
    "R21": lambda s: tta_fastest(s, QUIET_TTA),
    "R22": lambda s: tta(s, QUIET_TTA, static=("topk-0.1", "topk-0.01", "topk-0.001")),
    "R23": lambda s: tta_powersgd(s, QUIET_LSTM, ranks=(2, 4)),
    "R24": lambda s: tta_fastest(s, QUIET_LSTM),
    "R25": lambda s: tta_shape(s, f"{GRAVAC}/cnn-4hosts-200mbit",
                               [("topk-0.1", "topk-0.01"), "powersgd-2", "gravac", "gravac-powersgd"]),
    "R26": lambda s: tta_shape(s, f"{GRAVAC}/lstm-2hosts-1gbit",
                               ["topk-0.1", "powersgd-4", "gravac", "gravac-powersgd"]),
    "R27": lambda s: replay_plan_over(s, "layerwise"),
    "R28": lambda s: replay_plan_over(s, "fp32_bucket"),
    "R29": replay_within_ten,
    "R30": replay_nobusy,
    "R31": gpu_cold_over_warm,
    "R32": gpu_host_testbed,
    "R33": gpu_terngrad_decode,
    "R39": gpu_gain_probe,
    "R40": gpu_host_four_hosts,
    "R41": lambda s: replay_plan_ratios(s.json(CHAINED)["evaluation_4x1_1gbit"]),
    "R42": chained_over_spaced,
    "R43": lambda s: replay_plan_ratios(s.json(REPLAY4)["bert_base"]),
    "R44": lambda s: replay_plan_ratios(s.json(REPLAY4)["gpt2"]),
    "R45": lambda s: chained_fidelity(s.json(CHAINED4)["resnet50"]),
    "R46": lambda s: chained_fidelity(s.json(CHAINED4)["bert_base"]),
    "R47": lambda s: chained_fidelity(s.json(CHAINED4)["gpt2"]),
    "R48": lambda s: replay_plan_ratios(s.json(CHAINED4)["vgg16"]),
    "R49": held_tail,
    "R50": lambda s: replay_plan_ratios(s.json(REPLAY200)["resnet50"]),
    "R51": lambda s: replay_plan_ratios(s.json(REPLAY200)["bert_base"]),
    "R52": lambda s: replay_plan_ratios(s.json(REPLAY200)["gpt2"]),
    "R53": lambda s: replay_plan_ratios(s.json(REPLAY200B)["resnet50"], ("dgc", "fp16"), "dgc"),
    "R54": lambda s: replay_plan_ratios(s.json(REPLAY200B)["vgg16"]),
    "R55": lambda s: replay_plan_ratios(s.json(REPLAY200C), ("dgc", "fp16"), "fp16"),
    "R56": lambda s: replay_plan_ratios(s.json(REPLAY200_4H)),
    "R57": lambda s: replay_plan_ratios(s.json(REPLAY200D), ("dgc", "fp16"), "dgc"),
    "R58": lambda s: replay_plan_ratios(s.json(REPLAY200E), ("dgc", "fp16"), "dgc"),
    "R59": lambda s: replay_plan_ratios(s.json(REPLAY200_4H_VGG)),
    "R60": lambda s: replay_plan_ratios(s.json(REPLAY200_4H_GPT2)),
    "R61": lambda s: replay_plan_ratios(s.json(REPLAY200_4H_BERT)),
    "R62": fixed_cost,
    "R34": lambda s: replay_model_plan(s, "gpt2"),
    "R35": lambda s: replay_model_within_ten(s, "gpt2"),
    "R36": replay_selection_content,
    "R37": lambda s: replay_model_plan(s, "vgg16"),
    "R38": lambda s: replay_model_within_ten(s, "vgg16"),
    "R16": gpu_runtime_topk,
    "R17": gpu_topk_encode,
}


# Reference pages carry no dates (dated changes: docs/CHANGELOG.md; experiments: their
# bench/results/<experiment>/README.md). A date inside a path (results-2026-11-25/) is a name.
REFERENCE_PAGES = ["ARCHITECTURE", "FORMATS", "MODEL", "PYTHON", "PROFILER", "TESTBED", "GETTING_STARTED",
                   "HARDENING", "CHECKPOINT", "ADAPTIVE", "RESULTS"]
DATE = re.compile(r"(?<![\w/.-])20\d\d-\d\d-\d\d")


def page_rows(text):
    """{id: (value, spread, raw files)} from the rows `| Rn | claim | value | spread | ... | raw |`."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\|\s*(R\d+)\s*\|", line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 5:
                raise ValueError(f"row {m.group(1)}: {len(cells)} cells, expected at least 5")
            rows[m.group(1)] = (cells[2], cells[3], cells[-1])
    return rows


def expand(pattern):
    """'a/{x,y}/b' -> ['a/x/b', 'a/y/b'] (one level of braces per group, as the page writes them)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [q for alt in m.group(1).split(",") for q in expand(pattern[:m.start()] + alt + pattern[m.end():])]


def missing_raw(root, cell):
    """The paths of a row's raw-files cell (under bench/results/) that do not exist."""
    missing = []
    for item in re.split(r",\s+(?![^{]*\})", cell):
        item = item.strip()
        for path in expand(item):
            if not glob.glob(os.path.join(root, "bench", "results", path)):
                missing.append(path)
    return missing


def dated_lines(root):
    problems = []
    for name in REFERENCE_PAGES:
        rel = f"docs/{name}.md"
        try:
            with open(os.path.join(root, rel)) as f:
                for n, line in enumerate(f, 1):
                    m = DATE.search(line)
                    if m:
                        problems.append(f"{rel}:{n}: a date ({m.group(0)}) on a reference page; "
                                        "expected none (dated changes: docs/CHANGELOG.md)")
        except FileNotFoundError:
            pass
    return problems


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    args = argv[1:]
    if args[:1] == ["--root"] and len(args) == 2:
        root = args[1]
    elif args == ["--headline"]:
        for compressors in HEADLINE:
            print(headline_marker(compressors))
            print("\n".join(headline_table(Source(root), compressors)) + "\n")
        return 0
    elif args:
        print(__doc__, file=sys.stderr)
        return 2
    page = os.path.join(root, "docs", "RESULTS.md")
    try:
        with open(page) as f:
            rows = page_rows(f.read())
    except (OSError, ValueError) as e:
        print(f"check-results: docs/RESULTS.md: {e}", file=sys.stderr)
        return 1
    problems = []
    for rid in sorted(set(rows) - set(CHECKS), key=lambda r: int(r[1:])):
        problems.append(f"docs/RESULTS.md: {rid}: no check recomputes this row (scripts/check-results.py CHECKS)")
    for rid in sorted(CHECKS, key=lambda r: int(r[1:])):
        if rid not in rows:
            problems.append(f"docs/RESULTS.md: {rid}: row missing; expected a row '| {rid} | ... |'")
            continue
        src = Source(root)
        try:
            value, spread = CHECKS[rid](src)
        except (OSError, KeyError, ValueError, IndexError, StopIteration, tarfile.TarError) as e:
            problems.append(f"docs/RESULTS.md: {rid}: cannot recompute from {', '.join(dict.fromkeys(src.used))}: "
                            f"{type(e).__name__}: {e}")
            continue
        sources = ", ".join(dict.fromkeys(src.used))
        for path in missing_raw(root, rows[rid][2]):
            problems.append(f"docs/RESULTS.md: {rid} raw files: bench/results/{path}: no such file")
        for field, got, expected in (("value", rows[rid][0], value), ("spread", rows[rid][1], spread)):
            if got != expected:
                problems.append(f"docs/RESULTS.md: {rid} {field}: got '{got}'; expected '{expected}' "
                                f"(recomputed from {sources})")
    with open(page) as f:
        problems += headline_problems(root, f.read())
    problems += dated_lines(root)
    for p in problems:
        print("check-results: " + p, file=sys.stderr)
    if problems:
        return 1
    print(f"check-results: {len(CHECKS)} headline numbers of docs/RESULTS.md match bench/results")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

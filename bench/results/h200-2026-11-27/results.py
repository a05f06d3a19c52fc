#!/usr/bin/env python3
"""results.json of this experiment from raw.tar.xz: the suites' counts, the decodes before and
after (medians and ranges over three alternating runs), cold over warm GPU curves, and each
testbed evaluation's fidelity. Usage (from the repository root):
bench/results/h200-2026-11-27/results.py > bench/results/h200-2026-11-27/results.json"""
import io, json, re, statistics, sys, tarfile

here = "bench/results/h200-2026-11-27"
raw = tarfile.open(f"{here}/raw.tar.xz")
text = lambda name: raw.extractfile(name).read().decode()


def inner(outer, member):
    """A member of one of the calls' logs.tgz."""
    t = tarfile.open(fileobj=io.BytesIO(raw.extractfile(outer).read()))
    return t.extractfile(member).read().decode()


out = {"device": "NVIDIA H200 (sm_90, 132 SMs, 60 MiB L2), driver 580.159.04, CUDA 13.0; host Intel Xeon, 16 cores"}
# Suites (call 1, CUPCAKE_REQUIRE_GPU=1) and the script-driven NCCL ctests (call 2).
out["suites"] = {m.group(1): int(m.group(3)) for m in re.finditer(
    r"^(\w+): exit (\d+) \(\[  PASSED  \] (\d+) tests", text("gpu/call1/summary.txt"), re.M)}
out["nccl_ctests"] = dict(re.findall(r"^(tools_profile_comm_nccl\w+): exit (\d+)", text("gpu/call2/summary.txt"), re.M))
out["python"] = re.findall(r"^ok: .*", text("gpu/call2/tb/summary.txt"), re.M)
# The decodes, before (d943e9e) and after, alternating.
runs = {}
cur = None
for line in text("gpu/call2/kernels-ab.txt").splitlines():
    m = re.match(r"== (\S+) --only (\S+) run", line)
    if m:
        cur = ("before" if ".gpu-base" in m.group(1) else "after", m.group(2))
        continue
    f = line.split()
    if cur and len(f) >= 9 and f[1] in ("decode", "d2d"):
        runs.setdefault(f"{cur[1]} {f[0]} {f[1]} {f[2]} {cur[0]}", []).append(float(f[3]))
out["decodes_us"] = {k: {"median": statistics.median(v), "min": min(v), "max": max(v), "runs": len(v)}
                     for k, v in sorted(runs.items())}
# Cold over warm (one sweep each; event and kernel-only time).
cw = {}
for block in text("gpu/call1/extra.txt").split("== cold over warm")[1:]:
    which = "kernel" if block.startswith(".kernel") else "event"
    for line in block.splitlines()[1:]:
        f = line.split()
        if len(f) >= 10 and f[0] in ("encode", "decode"):
            cw.setdefault(which, {})[f"{f[0]} {f[1]} {f[3]}"] = float(f[9])
out["gpu_cold_over_warm"] = cw
# The testbed evaluations on the GPU machine.
out["testbed_4x2"] = []
for call in ("call3", "call4"):
    rows = json.loads(text(f"gpu/{call}/tb/testbed-results.json"))
    out["testbed_4x2"].append({
        "call": call,
        "within_10pct": sum(abs(r["measured_over_predicted"] - 1) <= 0.10 for r in rows), "runs": len(rows),
        "rows": [{k: r[k] for k in ("strategy", "compressor", "groups", "predicted_ms", "measured_ms",
                                    "measured_p10_ms", "measured_p90_ms", "measured_over_predicted")} for r in rows]})
json.dump(out, sys.stdout, indent=1)
print()

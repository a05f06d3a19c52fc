#!/usr/bin/env bash
# testbed_evaluate: bench/testbed/evaluate.sh end to end at a small scale (2 hosts x 1 rank at
# 1gbit, the models mlp and resnet, efsignsgd, --quick sweeps, 5 timed iterations): every stage
# runs, every run's ranks end with identical parameters, every run trains (fp32: the loss fell;
# compressed: it moved and did not diverge), and results.json has every strategy with the keys
# docs/EVALUATION.md names. Correctness only: no time is checked. Exit 77 (skip) only where the machine refuses the testbed (evaluate.sh's probe).
# Usage: evaluate_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
out=$(mktemp -d /tmp/cupcake-evaluate-test.XXXXXX)
trap 'rm -rf "$out"' EXIT
CUPCAKE_BUILD_DIR=$build CUPCAKE_TESTBED_DIR=/run/cupcake-evaluate-test CUPCAKE_TESTBED_PREFIX=ccevt \
  CUPCAKE_TESTBED_NET=10.76.0 "$src/bench/testbed/evaluate.sh" --hosts 2 --ranks-per-host 1 --rate 1gbit \
  --out "$out" --models mlp,resnet --compressors efsignsgd --iterations 5 --warmup 2 --record-iterations 3 --rounds 1 --quick
rc=$?
[ "$rc" = 0 ] || exit "$rc"
python3 - "$out/results.json" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))
want = {(m, s, c) for m in ("mlp", "resnet")
        for s, c in [("fp32_bucket", "fp32")] + [(s, "efsignsgd") for s in ("layerwise", "one_group", "bucket", "plan", "options")]}
got = {(r["model"], r["strategy"], r["compressor"]) for r in results}
problems = [f"missing run {k}" for k in sorted(want - got)] + [f"unexpected run {k}" for k in sorted(got - want)]
keys = {"model", "strategy", "compressor", "groups", "predicted_ms", "measured_ms", "measured_p10_ms",
        "measured_p90_ms", "iterations"}
for r in results:
    name = f"{r['model']} {r['strategy']} {r['compressor']}"
    if not keys <= r.keys():
        problems.append(f"{name}: missing keys {sorted(keys - r.keys())}")
    if r["iterations"] != 5:
        problems.append(f"{name}: iterations: got {r['iterations']}, expected 5")
    if r["ranks_agree"] is not True:
        problems.append(f"{name}: the ranks ended with different parameters")
    # Trains: fp32 averages exactly, so its loss falls; a compressed run's parameters move (the
    # loss changes) without diverging (its grouping, and so its scale factors, come from timings).
    if r["compressor"] == "fp32" and not r["loss_last"] < 0.99 * r["loss_first"]:
        problems.append(f"{name}: the loss did not fall by 1%: {r['loss_first']} -> {r['loss_last']}")
    if r["compressor"] != "fp32" and not (r["loss_last"] != r["loss_first"] and r["loss_last"] < 1.5 * r["loss_first"]):
        problems.append(f"{name}: the loss did not move, or diverged: {r['loss_first']} -> {r['loss_last']}")
    if not (0 < r["measured_p10_ms"] <= r["measured_ms"] <= r["measured_p90_ms"] and r["predicted_ms"] > 0):
        problems.append(f"{name}: times out of order or not positive: {r}")
    if r["strategy"] == "layerwise" and r["groups"] != {"mlp": 6, "resnet": 47}[r["model"]]:
        problems.append(f"{name}: groups: got {r['groups']}, expected one per tensor")
print("\n".join(problems) if problems else f"ok: {len(results)} runs, every one trained and its ranks agree")
sys.exit(1 if problems else 0)
PY
status=$?
for f in README.md predicted-vs-measured.png; do
  [ -s "$out/$f" ] || { echo "FAIL: $out/$f missing or empty"; status=1; }
done
exit $status

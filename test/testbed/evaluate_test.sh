#!/usr/bin/env bash
# testbed_evaluate: bench/testbed/evaluate.sh end to end at a small scale (2 hosts x 1 rank at
# 1gbit, the models mlp, resnet and embed, topk, --quick sweeps, 5 timed iterations): every
# stage runs, every run's ranks end with identical parameters, every run trains (fp32: the loss
# fell; compressed: it moved and did not diverge), results.json has every strategy with the keys
# docs/EVALUATION.md names, and embed's options plan of fp32 sums its embedding table's naturally
# sparse gradient with zen_sparse (recorded density, the scan profiled, the exact mean). topk, not
# efsignsgd: a sign compressor over a group holding the table barely moves it (its scale is the
# mean magnitude over mostly zeros). The profile has a chained twin of every spaced collective
# curve (docs/MODEL.md, "Chained collectives"). Correctness only: no time is checked. Exit 77 (skip) only
# where the machine refuses the testbed (evaluate.sh's probe).
# Usage: evaluate_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
out=$(mktemp -d /tmp/cupcake-evaluate-test.XXXXXX)
trap 'rm -rf "$out"' EXIT
CUPCAKE_BUILD_DIR=$build CUPCAKE_TESTBED_DIR=/run/cupcake-evaluate-test CUPCAKE_TESTBED_PREFIX=ccevt \
  CUPCAKE_TESTBED_NET=10.76.0 "$src/bench/testbed/evaluate.sh" --hosts 2 --ranks-per-host 1 --rate 1gbit \
  --out "$out" --models mlp,resnet,embed --compressors topk --iterations 5 --warmup 2 --record-iterations 3 --rounds 1 --quick
rc=$?
[ "$rc" = 0 ] || exit "$rc"
python3 - "$out/results.json" "$out/plans/embed-options-fp32.json" "$out/profile.db" <<'PY'
import json, sqlite3, sys
results = json.load(open(sys.argv[1]))
want = {(m, s, c) for m in ("mlp", "resnet", "embed")
        for s, c in [("fp32_bucket", "fp32"), ("options", "fp32")] + [(s, "topk") for s in ("layerwise", "one_group", "bucket", "plan", "options")]}
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
    if r["strategy"] == "layerwise" and r["groups"] != {"mlp": 6, "resnet": 47, "embed": 5}[r["model"]]:
        problems.append(f"{name}: groups: got {r['groups']}, expected one per tensor")
curves = sqlite3.connect(sys.argv[3]).execute(
    "SELECT c.op, c.scope, c.dtype, c.busy, c.chained, count(p.size) FROM curves c JOIN points p ON p.curve_id = c.id "
    "WHERE c.kind = 'comm' GROUP BY c.id").fetchall()
spaced = {(op, scope, dtype) for op, scope, dtype, busy, chained, _ in curves if not busy and not chained}
chained = {(op, scope, dtype) for op, scope, dtype, busy, chained, _ in curves if chained}
if not spaced or spaced != chained:
    problems.append(f"profile: chained curves {sorted(chained)}, expected a twin of each spaced one {sorted(spaced)}")
schemes = [g.get("options", {}).get("scheme") for g in json.load(open(sys.argv[2]))["groups"]]
if "zen_sparse" not in schemes:
    problems.append(f"embed options fp32: no zen_sparse group; schemes {schemes}")
print("\n".join(problems) if problems else f"ok: {len(results)} runs, every one trained and its ranks agree")
sys.exit(1 if problems else 0)
PY
status=$?
for f in README.md predicted-vs-measured.png; do
  [ -s "$out/$f" ] || { echo "FAIL: $out/$f missing or empty"; status=1; }
done
exit $status

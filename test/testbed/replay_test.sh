#!/usr/bin/env bash
# testbed_replay: bench/testbed/evaluate.sh --replay end to end at a small scale (2 hosts x 1
# rank at 1gbit, resnet50's recorded model at compute scale 0.5, topk, --quick sweeps, one
# round of 5 timed iterations): every stage runs; results.json has every strategy with the
# keys docs/EVALUATION.md names; every run's ranks ended with bitwise equal buffers; a run's
# average was checked against the exact one exactly where its plan's groups are all lossless
# (worked out here from the plan's groups; fp32 buckets always); the model record mode measured
# on the replay (one iteration, so its gaps are not medians) has the file's tensors, each ready
# no earlier than the file's cumulative time x the scale; the report shows the replay's section. Correctness only: no time is checked against
# a target. Exit 77 (skip) only where the machine refuses the testbed (evaluate.sh's probe).
# Usage: replay_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
out=$(mktemp -d /tmp/cupcake-replay-test.XXXXXX)
trap 'rm -rf "$out"' EXIT
model=$src/examples/models/resnet50.json scale=0.5
CUPCAKE_BUILD_DIR=$build CUPCAKE_TESTBED_DIR=/run/cupcake-replay-test CUPCAKE_TESTBED_PREFIX=ccrpl \
  CUPCAKE_TESTBED_NET=10.73.0 "$src/bench/testbed/evaluate.sh" --hosts 2 --ranks-per-host 1 --rate 1gbit \
  --out "$out" --replay "$model" --compute-scale "$scale" --compressors topk --iterations 5 --warmup 2 \
  --record-iterations 1 --rounds 1 --quick
rc=$?
[ "$rc" = 0 ] || exit "$rc"
PYTHONPATH="$src/examples/train_replay" python3 - "$out" "$model" "$scale" <<'PY'
import json, os, sys
from recorded_check import recorded_problems
out, model_file, scale = sys.argv[1], sys.argv[2], float(sys.argv[3])
given = json.load(open(model_file))
m = given["name"]
results = json.load(open(os.path.join(out, "results.json")))
want = {(m, s, c) for s, c in [("fp32_bucket", "fp32"), ("options", "fp32")] +
        [(s, "topk") for s in ("layerwise", "one_group", "bucket", "plan", "options")]}
got = {(r["model"], r["strategy"], r["compressor"]) for r in results}
problems = [f"missing run {k}" for k in sorted(want - got)] + [f"unexpected run {k}" for k in sorted(got - want)]
keys = {"model", "strategy", "compressor", "groups", "predicted_ms", "measured_ms", "measured_p10_ms",
        "measured_p90_ms", "iterations", "ranks_agree", "exact_checked", "replay_wake_late_median_us"}
for r in results:
    name = f"{r['model']}-{r['strategy']}-{r['compressor']}"
    if not keys <= r.keys():
        problems.append(f"{name}: missing keys {sorted(keys - r.keys())}")
        continue
    if r["iterations"] != 5:
        problems.append(f"{name}: iterations: got {r['iterations']}, expected 5")
    if r["ranks_agree"] is not True:
        problems.append(f"{name}: the ranks ended with different buffers")
    # Lossless groups (docs/FORMATS.md: a group without a scheme is flat when compressed, else flat_fp32).
    plan = json.load(open(os.path.join(out, "plans", name + ".json")))
    compressor = plan["compressor"]["name"]
    def lossless(g):
        o = g.get("options", {})
        scheme = o.get("scheme") or ("flat" if o.get("compress") else "flat_fp32")
        return scheme in ("flat_fp32", "hier_fp32", "zen_sparse") or (scheme in ("flat", "hier") and compressor == "fp32")
    exact = all(lossless(g) for g in plan["groups"])
    if r["strategy"] == "fp32_bucket" and not exact:
        problems.append(f"{name}: fp32 buckets: a group is not lossless")
    if r["exact_checked"] is not exact:
        problems.append(f"{name}: exact_checked: got {r['exact_checked']}, expected {exact} from the plan's groups")
    if r["strategy"] == "layerwise" and r["groups"] != len(given["tensors"]):
        problems.append(f"{name}: groups: got {r['groups']}, expected one per tensor ({len(given['tensors'])})")
    if not (0 < r["measured_p10_ms"] <= r["measured_ms"] <= r["measured_p90_ms"] and r["predicted_ms"] > 0):
        problems.append(f"{name}: times out of order or not positive: {r}")
recorded = {x["name"]: x for x in json.load(open(os.path.join(out, "logs", "recorded.json")))["models"]}
rec = recorded.get(m)
if rec is None:
    problems.append(f"recorded.json: no model {m!r}")
else:
    problems += recorded_problems(given, rec, scale, "recorded.json")[0]
readme = open(os.path.join(out, "README.md")).read()
if "Replay (compute scale 0.5)" not in readme:
    problems.append("README.md: no replay section")
print("\n".join(problems) if problems else f"ok: {len(results)} runs, every one's ranks agree, exact where lossless")
sys.exit(1 if problems else 0)
PY
status=$?
for f in README.md predicted-vs-measured.png; do
  [ -s "$out/$f" ] || { echo "FAIL: $out/$f missing or empty"; status=1; }
done
exit $status

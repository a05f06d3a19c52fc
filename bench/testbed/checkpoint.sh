#!/usr/bin/env bash
# checkpoint.sh: what a snapshot every iteration costs (docs/CHECKPOINT.md, issue 32's
# measurement). On a testbed of H hosts x R ranks at RATE (scripts/testbed.sh): profile it, record
# the model on it, plan it (topk at --ratio, the optimal fusion search), read the replica chunk
# that fits the plan's idle gap after Commit (`cupcake-plan show --profile`), then train the same
# plan in three arms, round-robin (every arm once per round: its own warm-up, then the timed
# iterations):
#   none        no checkpointer;
#   snapshot    --checkpoint: a snapshot of every parameter, its momentum and the session's
#               state every iteration into host memory, copied in the background;
#   replicas    the same with --replicate --replica-chunk-bytes (the schedule's chunk): the
#               snapshots also stream to the other host between the collectives.
# An iteration's time is the slowest rank's, from forward to the end of Commit.
#
#   bench/testbed/checkpoint.sh --out DIR [--hosts 2] [--ranks-per-host 1] [--rate 1gbit]
#       [--model wide] [--ratio 0.01] [--iterations 30] [--warmup 5] [--rounds 3]
#
# Writes DIR/profile.db, DIR/plan.pb, DIR/schedule.json, DIR/runs/ARM.rK.json (iteration times),
# DIR/logs/, DIR/results.json (per arm and round: median, mean, p10, p90 in ms) and DIR/machine.txt.
# Exit: 0; 1 a stage failed (its log is named); 2 usage; 77 the machine refuses the testbed.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd) me=checkpoint
. "$repo/bench/testbed/common.sh"
build=${CUPCAKE_BUILD_DIR:-$repo/build}
hosts=2 rph=1 rate=1gbit out="" model=wide ratio=0.01 iterations=30 warmup=5 rounds=3
usage() { sed -n '15,16p' "$0" | sed 's/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=${2:-}; shift 2 ;;
    --ranks-per-host) rph=${2:-}; shift 2 ;;
    --rate) rate=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --model) model=${2:-}; shift 2 ;;
    --ratio) ratio=${2:-}; shift 2 ;;
    --iterations) iterations=${2:-}; shift 2 ;;
    --warmup) warmup=${2:-}; shift 2 ;;
    --rounds) rounds=${2:-}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "checkpoint: unknown flag $1" >&2; usage ;;
  esac
done
[ -n "$out" ] || { echo "checkpoint: --out DIR is required" >&2; usage; }
for n in hosts rph iterations warmup rounds; do
  [[ "${!n}" =~ ^[0-9]+$ ]] || { echo "checkpoint: $n: got '${!n}', expected an integer" >&2; exit 2; }
done
train=$build/examples/train_$model/train_$model
[ -x "$train" ] || { echo "checkpoint: --model: no job $train (LibTorch examples built?)" >&2; exit 2; }
mkdir -p "$out/runs" "$out/logs"
out=$(cd "$out" && pwd)
db=$out/profile.db
tag="cpbench$$"
testbed probe || exit $?
trap 'testbed down >/dev/null 2>&1 || true; rm -f /dev/shm/cupcake-$tag-*' EXIT
stage testbed-up testbed up --hosts "$hosts" --ranks-per-host "$rph" --rate "$rate"
{
  machine_header "$hosts" "$rph" "$rate"
  echo "command=bench/testbed/checkpoint.sh --out DIR --hosts $hosts --ranks-per-host $rph --rate $rate --model $model --ratio $ratio --iterations $iterations --warmup $warmup --rounds $rounds"
} >"$out/machine.txt"

log "profile: comm across the testbed; kernels; record $model"
stage profile-comm testbed run -- "$build/tools/cupcake-profile" comm --db "$db" --ops allreduce,allgather \
  --warmup 1 --iters 3 --rounds 3 --max-bytes 33554432
stage profile-kernels testbed run -- "$build/tools/cupcake-profile" kernels --db "$db" --device cpu \
  --world-size $((hosts * rph)) --compressors topk --ratios "$ratio" --max-elements 8388608
stage record "$build/tools/cupcake-profile" compute --db "$db" --iterations 10 -- \
  "$repo/scripts/testbed.sh" run -- "$train"
stage plan "$build/tools/cupcake-plan" search --model-name "$model" --profile "$db" --compressor topk \
  --ratio "$ratio" --device cpu -o "$out/plan.pb"
"$build/tools/cupcake-plan" show "$out/plan.pb" --profile "$db" >"$out/schedule.txt"
"$build/tools/cupcake-plan" show "$out/plan.pb" --profile "$db" --format json |
  python3 -c 'import json,sys; json.dump(json.load(sys.stdin)["replica_schedule"], sys.stdout, indent=1)' \
  >"$out/schedule.json"
chunk=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit_chunk_bytes"])' "$out/schedule.json")
log "the schedule's chunk after Commit: $chunk bytes"
arms=(none snapshot replicas)
[ "$chunk" -gt 0 ] || { log "no chunk fits the gap after Commit: the replicas arm is left out"; arms=(none snapshot); }

for ((round = 1; round <= rounds; round++)); do
  for arm in "${arms[@]}"; do
    flags=()
    case "$arm" in
      snapshot) flags=(--checkpoint "$tag-$arm-r$round") ;;
      replicas) flags=(--checkpoint "$tag-$arm-r$round" --replicate --replica-chunk-bytes "$chunk") ;;
    esac
    log "train: $arm, round $round of $rounds ($warmup + $iterations iterations)"
    stage "train-$arm.r$round" testbed run -- "$train" --plan "$out/plan.pb" --epochs 1 \
      --steps $((warmup + iterations)) --warmup "$warmup" --lr 0.01 --timing "$out/runs/$arm.r$round.json" "${flags[@]}"
    rm -f /dev/shm/cupcake-"$tag"-*
  done
done
machine_footer

PYTHONPATH="$repo/bench/testbed${PYTHONPATH:+:$PYTHONPATH}" python3 - "$out" "${arms[@]}" <<'PY'
import json, statistics, sys, glob, os
from report import percentile  # the evaluation's percentiles (bench/testbed/report.py)
out, arms = sys.argv[1], sys.argv[2:]
rows = []
for path in sorted(glob.glob(os.path.join(out, "runs", "*.json"))):
    arm, rnd = os.path.basename(path)[:-5].split(".r")
    t = json.load(open(path))
    ms = [x / 1e3 for x in t["iteration_us"][t["warmup"]:]]
    rows.append({"arm": arm, "round": int(rnd), "iterations": len(ms), "median_ms": statistics.median(ms),
                 "mean_ms": statistics.mean(ms), "p10_ms": percentile(sorted(ms), 0.1),
                 "p90_ms": percentile(sorted(ms), 0.9),
                 "ranks_agree": t["ranks_agree"]})
summary = {}
for arm in arms:
    med = [r["median_ms"] for r in rows if r["arm"] == arm]
    summary[arm] = {"median_of_round_medians_ms": statistics.median(med), "round_medians_ms": med}
base = summary["none"]["median_of_round_medians_ms"]
for arm in arms:
    summary[arm]["overhead_pct"] = (summary[arm]["median_of_round_medians_ms"] / base - 1) * 100
    # Per round against that round's none: the spread of the overhead.
    summary[arm]["round_overheads_pct"] = [
        (r["median_ms"] / n["median_ms"] - 1) * 100 for r in rows if r["arm"] == arm
        for n in rows if n["arm"] == "none" and n["round"] == r["round"]]
json.dump({"runs": rows, "summary": summary}, open(os.path.join(out, "results.json"), "w"), indent=1)
for arm in arms:
    s = summary[arm]
    print(f"{arm:9s} median of rounds {s['median_of_round_medians_ms']:8.1f} ms  overhead {s['overhead_pct']:+6.1f}%  "
          f"per round {', '.join(f'{x:+.1f}%' for x in s['round_overheads_pct'])}")
PY

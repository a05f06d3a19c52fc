#!/usr/bin/env bash
# Cupcake's plans against torch DDP (docs/PYTHON.md): the same model (examples/python/train.py's
# CNN, --width 16 --hidden 1024: 1.08 M parameters, 4.1 MiB of gradients), batch and ranks, five
# arms: DDP over gloo fp32 (25 MiB buckets), DDP with the fp16 compression hook, DDP with the
# PowerSGD hook (rank 4), and Cupcake with a plan for efsignsgd and one for topk (ratio 0.01),
# both planned from this machine's profile and the model recorded here. Each arm: WARMUP steps,
# then ITERS timed steps; an iteration's time is the slowest rank's (ddp_compare.py); printed:
# median, p10, p90, and the evaluation loss after WARMUP + ITERS steps. Numbers, not pass/fail.
#
# Usage: bench/python/ddp_compare.sh [--np 2] [--warmup 10] [--iters 200] [--batch 32]
#          [--width 16] [--hidden 1024] [--lr 0.01] [--rounds 1] [--testbed] [--build DIR] [--out DIR]
#   --testbed  run every MPI job on the testbed (scripts/testbed.sh up ... first; docs/TESTBED.md):
#              DDP's MASTER_ADDR is host 1's address, 10.77.0.1 (CUPCAKE_TESTBED_NET.1)
#   --rounds R run the five arms R times, interleaved (each round all five in turn)
# Environment: PYTHON (default /usr/bin/python3, Debian's, which has python3-torch).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
np=2 warmup=10 iters=200 batch=32 width=16 hidden=1024 lr=0.01 rounds=1 testbed=0
build="$root/build" out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --np) np="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --hidden) hidden="$2"; shift 2 ;;
    --lr) lr="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --testbed) testbed=1; shift ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "ddp_compare.sh: unknown flag $1" >&2; exit 2 ;;
  esac
done
python="${PYTHON:-/usr/bin/python3}"
out="${out:-$build/bench/python/ddp_compare}"
mkdir -p "$out"
db="$out/profile.db"
export MASTER_PORT="${MASTER_PORT:-29517}"
plan_tool="$build/tools/cupcake-plan"
# shellcheck source=bench/python/common.sh
. "$root/bench/python/common.sh"
bench_launch
"$python" -c "import torch, cupcake.torch" || { echo "ddp_compare.sh: $python cannot import torch and cupcake.torch (python3-torch; scripts/build.sh)" >&2; exit 1; }
bench=("$python" "$root/bench/python/ddp_compare.py" --warmup "$warmup" --iters "$iters" --batch "$batch"
       --width "$width" --hidden "$hidden" --lr "$lr")
bench_header "bench/python/ddp_compare.sh --np $np --warmup $warmup --iters $iters --batch $batch --width $width --hidden $hidden --lr $lr --rounds $rounds$([ "$testbed" = 1 ] && echo " --testbed")"

# 1. Profile this cluster and record the model (Cupcake's arm in record mode), then plan.
bench_profile "$db" "--compressors fp32,efsignsgd,topk" -- "${bench[@]}" --arm cupcake --warmup 1 --iters 25
for c in efsignsgd topk; do
  "$plan_tool" search --model-name ddpbench --profile "$db" --compressor "$c" -o "$out/$c.pb" >"$out/plan-$c.txt"
  sed -n 's/^groups *//p; s/^predicted *//p' "$out/plan-$c.txt" | tr '\n' ' ' | sed "s/^/# plan $c: groups /; s/$/\n/"
done | tee -a "$out/header.txt"

# 2. The arms, interleaved over the rounds.
results="$out/results.jsonl"
: >"$results"
for r in $(seq 1 "$rounds"); do
  for arm in ddp-fp32 ddp-fp16 ddp-powersgd efsignsgd topk; do
    case "$arm" in
      ddp-*) args=(--arm "$arm") ;;
      *) args=(--arm cupcake --plan "$out/$arm.pb") ;;
    esac
    "${launch[@]}" "${bench[@]}" "${args[@]}" | grep '^{' | sed "s/^{/{\"round\": $r, \"name\": \"$arm\", /" | tee -a "$results"
  done
done
echo "# load after: $(uptime)" | tee -a "$out/header.txt"

# 3. The table.
"$python" - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%-13s %5s %10s %8s %8s %11s %9s" % ("arm", "round", "median_ms", "p10_ms", "p90_ms", "loss_start", "loss_end"))
for r in rows:
    print("%-13s %5d %10.1f %8.1f %8.1f %11.4f %9.4f" % (r["name"], r["round"], r["median_ms"], r["p10_ms"],
                                                       r["p90_ms"], r["loss_start"], r["loss_end"]))
r = rows[0]
print("(%d ranks, batch %d per rank, %d parameters = %.2f MiB of gradients, %d warm-up + %d timed steps)"
      % (r["ranks"], r["batch_per_rank"], r["params"], r["gradient_mib"], r["warmup"], r["iters"]))
PY

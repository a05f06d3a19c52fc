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
cores="$(nproc --all)"
out="${out:-$build/bench/python/ddp_compare}"
mkdir -p "$out"
db="$out/profile.db"
rm -f "$db"
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS=1
export MASTER_PORT="${MASTER_PORT:-29517}"
profile_tool="$build/tools/cupcake-profile" plan_tool="$build/tools/cupcake-plan"
"$python" -c "import torch, cupcake.torch" || { echo "ddp_compare.sh: $python cannot import torch and cupcake.torch (python3-torch; scripts/build.sh)" >&2; exit 1; }

# How an MPI job is launched: loopback mpirun, or across the testbed's hosts.
if [ "$testbed" = 1 ]; then
  export MASTER_ADDR="${CUPCAKE_TESTBED_NET:-10.77.0}.1"
  export GLOO_SOCKET_IFNAME=eth0  # the testbed's link (gloo would resolve the host name otherwise)
  launch=("$root/scripts/testbed.sh" run)
  for v in PYTHONPATH OMP_NUM_THREADS MASTER_ADDR MASTER_PORT GLOO_SOCKET_IFNAME; do
    launch+=(--mpirun-arg -x --mpirun-arg "$v")
  done
  # The record job also needs what `cupcake-profile compute` sets.
  record_launch=("${launch[@]}" --mpirun-arg -x --mpirun-arg CUPCAKE_RECORD --mpirun-arg -x
                 --mpirun-arg CUPCAKE_RECORD_ITERATIONS --)
  launch+=(--)
  where="testbed: $("$root/scripts/testbed.sh" status 2>&1 | tr '\n' ' ')"
else
  export MASTER_ADDR=127.0.0.1
  launch=(mpirun --oversubscribe --bind-to none -np "$np")
  if [ "$(id -u)" = 0 ]; then launch+=(--allow-run-as-root); fi
  record_launch=("${launch[@]}")
  where="loopback: $np ranks on one host (mpirun --bind-to none)"
fi
bench=("$python" "$root/bench/python/ddp_compare.py" --warmup "$warmup" --iters "$iters" --batch "$batch"
       --width "$width" --hidden "$hidden" --lr "$lr")

{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ)  $(lscpu | sed -n 's/^Model name: *//p') ($cores cores)"
  echo "# command: bench/python/ddp_compare.sh --np $np --warmup $warmup --iters $iters --batch $batch --width $width --hidden $hidden --lr $lr --rounds $rounds$([ "$testbed" = 1 ] && echo " --testbed")"
  echo "# $where"
  echo "# torch $("$python" -c 'import torch; print(torch.__version__)'), $(mpirun --version | head -1)"
  echo "# load before: $(uptime)"
} | tee "$out/header.txt"

# 1. Profile this cluster and record the model (Cupcake's arm in record mode), then extend the
#    curves to the model's size (--max-bytes/--max-elements auto) and plan.
"${launch[@]}" "$profile_tool" comm --db "$db" --quick --ops allreduce,allgather >"$out/comm.log"
"$profile_tool" kernels --db "$db" --device cpu --quick --compressors fp32,efsignsgd,topk >"$out/kernels.log"
"$profile_tool" compute --db "$db" --iterations 20 -- "${record_launch[@]}" "${bench[@]}" --arm cupcake --warmup 1 --iters 25 \
  >"$out/record.log" 2>&1 || { cat "$out/record.log" >&2; exit 1; }
"${launch[@]}" "$profile_tool" comm --db "$db" --ops allreduce,allgather --min-bytes 1048576 --max-bytes auto >>"$out/comm.log"
"$profile_tool" kernels --db "$db" --device cpu --compressors efsignsgd,topk --max-elements auto >>"$out/kernels.log"
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

#!/usr/bin/env bash
# Time to accuracy: how long each arm trains a model until its held-out evaluation reaches a
# target, data-parallel over NP ranks (bench/python/tta.py: the models, the data, what is timed):
# --model cnn (default), a CNN on the handwritten digits (python3-sklearn's file,
# bench/python/digits.py) to a held-out accuracy; --model lstm, a character LSTM on base-files'
# license texts (bench/python/text.py) to a held-out loss. Arms:
#   ddp-fp32, ddp-fp16                 torch DDP over gloo, as ddp_compare.sh runs them (arms.py)
#   ddp-powersgd-K for K in RANKS      DDP with torch's powerSGD_hook at rank K
#   cupcake-fp32                       a plan searched with compressor fp32
#   topk-R for R in RATIOS             a plan searched with compressor topk, --ratio R
#   powersgd-K for K in RANKS          a plan whose groups are PowerSGD at rank K per tensor (the
#                                      powersgd scheme: powerSGD_hook's math), or fp32 where the
#                                      planner finds compression does not pay: --compressor fp32
#                                      --search-space options --rank K --schemes powersgd
#   gravac                             the ladder (fp32 and topk at RATIOS) under cupcake.torch.GraVAC
#   gravac-powersgd                    the ladder of PowerSGD ranks (RANKS and 1, each rung searched as
#                                      powersgd-K is, over an fp32 rung) under cupcake.torch.GraVAC
# The plans come from a profile of this cluster measured first on the same ranks (comm and
# kernels, --quick, extended to the model's size) and the model recorded there by the Cupcake arm
# in record mode, as ddp_compare.sh makes its plans (common.sh). Each seed runs every arm in turn.
# Numbers, not pass/fail. Output in OUT: results.jsonl (one JSON line per run), runs/ (each run
# with its step times and evaluations; gravac's decisions as JSON lines, drawn by
# plot_decisions.py when matplotlib is installed), results.json (header, runs, summary),
# header.txt, the profile, plans and logs; the summary table on stdout.
#
# Usage: bench/python/tta.sh [--model cnn|lstm] [--np 2] [--seeds 1,2,3] [--target A | --target-loss L]
#          [--max-steps 3000] [--eval-every 10] [--batch B] [--width 32] [--hidden H] [--lr LR]
#          [--clip C] [--embed 32] [--layers 1] [--seq-len 32] [--ratios 0.1,0.01,0.001] [--ranks 4]
#          [--gravac-window 10] [--arms A,B,...] [--data FILE[,FILE...]] [--run-timeout S] [--testbed]
#          [--build DIR] [--out DIR]
#   --model    cnn: the digits CNN (batch 32, hidden 2048, lr 0.02, target accuracy 0.95); lstm: the
#              character LSTM (batch 8, hidden 384, lr 1.0, clip 1.0, target loss 1.8); a flag left
#              out takes the model's default (tta.py's MODEL_DEFAULTS); --embed, --layers,
#              --seq-len are the LSTM's
#   --target   held-out accuracy to reach (>=); 0.95 is what DDP fp32 reaches on the CNN in ~130 steps
#   --target-loss  held-out cross-entropy to reach (<=), nats per character for the LSTM; 1.8 is
#              what DDP fp32 reaches on the LSTM in ~150-200 steps (docs/TTA.md)
#   --ranks    PowerSGD's ranks, comma-separated: an arm of each kind per rank
#   --arms     run only these arms (names as above), e.g. for a smoke run
#   --run-timeout  a run still going after S seconds (default 600 + MAX_STEPS: 1 s a step, 5-10x a
#              step's time here) is killed and recorded as failed (exit non-zero), so a hung job
#              cannot stall the evaluation
#   --testbed  every MPI job on the testbed (scripts/testbed.sh up --hosts NP --ranks-per-host 1
#              --rate RATE first; docs/TESTBED.md); each rank's bytes sent are then its host's eth0
#              transmit counter (one rank per host)
# Environment: PYTHON (default /usr/bin/python3, Debian's, which has python3-torch); MASTER_PORT
# (default 29537). Exit: 0 every run finished (reaching the target or not), 1 a run or the set-up
# failed (the others still run), 2 usage error.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
np=2 seeds=1,2,3 model=cnn target="" target_loss="" max_steps=3000 eval_every=10 batch="" width=32 hidden="" lr=""
clip="" embed=32 layers=1 seq_len=32
ratios=0.1,0.01,0.001 ranks=4 gravac_window=10 arms="" data="" testbed=0 build="$root/build" out="" run_timeout=""
usage() { sed -n '/^# Usage:/,/^# Environment:/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
need() { [ $# -ge 2 ] || { echo "tta.sh: $1: expected a value" >&2; exit 2; }; }
# shellcheck disable=SC2034  # batch, hidden, lr, clip are read as ${!v} below
while [ $# -gt 0 ]; do
  case "$1" in
    --np) need "$@"; np="$2"; shift 2 ;;
    --seeds) need "$@"; seeds="$2"; shift 2 ;;
    --model) need "$@"; model="$2"; shift 2 ;;
    --target) need "$@"; target="$2"; shift 2 ;;
    --target-loss) need "$@"; target_loss="$2"; shift 2 ;;
    --clip) need "$@"; clip="$2"; shift 2 ;;
    --embed) need "$@"; embed="$2"; shift 2 ;;
    --layers) need "$@"; layers="$2"; shift 2 ;;
    --seq-len) need "$@"; seq_len="$2"; shift 2 ;;
    --max-steps) need "$@"; max_steps="$2"; shift 2 ;;
    --eval-every) need "$@"; eval_every="$2"; shift 2 ;;
    --batch) need "$@"; batch="$2"; shift 2 ;;
    --width) need "$@"; width="$2"; shift 2 ;;
    --hidden) need "$@"; hidden="$2"; shift 2 ;;
    --lr) need "$@"; lr="$2"; shift 2 ;;
    --ratios) need "$@"; ratios="$2"; shift 2 ;;
    --ranks) need "$@"; ranks="$2"; shift 2 ;;
    --gravac-window) need "$@"; gravac_window="$2"; shift 2 ;;
    --arms) need "$@"; arms="$2"; shift 2 ;;
    --run-timeout) need "$@"; run_timeout="$2"; shift 2 ;;
    --data) need "$@"; data="$2"; shift 2 ;;
    --testbed) testbed=1; shift ;;
    --build) need "$@"; build="$2"; shift 2 ;;
    --out) need "$@"; out="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    *) echo "tta.sh: unknown flag $1" >&2; usage ;;
  esac
done

# Validate every flag before any job starts (tta.py checks ranges again, per run).
bad() { echo "tta.sh: $1: $2" >&2; exit 2; }
[[ "$seeds" =~ ^[0-9]+(,[0-9]+)*$ ]] || bad --seeds "expected comma-separated integers; got '$seeds'"
[[ "$ratios" =~ ^[0-9.eE-]+(,[0-9.eE-]+)*$ ]] || bad --ratios "expected comma-separated ratios in (0, 1); got '$ratios'"
[[ "$ranks" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || bad --ranks "expected comma-separated integers >= 1; got '$ranks'"
case "$model" in cnn|lstm) ;; *) bad --model "expected cnn or lstm; got '$model'" ;; esac
for v in np max_steps eval_every batch width hidden embed layers seq_len gravac_window run_timeout; do
  [ "$v" = run_timeout ] && run_timeout="${run_timeout:-$((600 + max_steps))}"  # max_steps checked by now
  case "$v" in batch|hidden) [ -z "${!v}" ] && continue ;; esac  # unset: the model's default
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || bad "--${v//_/-}" "expected an integer >= 1; got '${!v}'"
done
[ -z "$target" ] || [ -z "$target_loss" ] || bad "--target, --target-loss" "expected one of them; got both"
[ -z "$target" ] || awk -v t="$target" 'BEGIN { exit !(t + 0 == t && t > 0 && t <= 1) }' \
  || bad --target "expected 0 < target <= 1; got '$target'"
[ -z "$target_loss" ] || awk -v t="$target_loss" 'BEGIN { exit !(t + 0 == t && t > 0) }' \
  || bad --target-loss "expected a number > 0; got '$target_loss'"
[ -z "$lr" ] || awk -v l="$lr" 'BEGIN { exit !(l + 0 == l && l > 0) }' || bad --lr "expected a number > 0; got '$lr'"
[ -z "$clip" ] || awk -v c="$clip" 'BEGIN { exit !(c + 0 == c && c >= 0) }' || bad --clip "expected a number >= 0; got '$clip'"
all_arms=(ddp-fp32 ddp-fp16)
for k in ${ranks//,/ }; do all_arms+=("ddp-powersgd-$k"); done
all_arms+=(cupcake-fp32)
for r in ${ratios//,/ }; do all_arms+=("topk-$r"); done
for k in ${ranks//,/ }; do all_arms+=("powersgd-$k"); done
all_arms+=(gravac gravac-powersgd)
if [ -n "$arms" ]; then
  run_arms=(${arms//,/ })
  for a in "${run_arms[@]}"; do
    [[ " ${all_arms[*]} " == *" $a "* ]] || bad --arms "unknown arm '$a'; expected some of ${all_arms[*]}"
  done
else
  run_arms=("${all_arms[@]}")
fi
python="${PYTHON:-/usr/bin/python3}"
if [ "$model" = lstm ]; then
  model_name=ttatext
  # shellcheck disable=SC2086  # --data: comma-separated files; empty: text.py's default list
  "$python" "$root/bench/python/text.py" --seq-len "$seq_len" ${data//,/ } >/dev/null \
    || { echo "tta.sh: --data: unusable (above); base-files ships the default texts, or pass --data FILE[,FILE...]" >&2; exit 1; }
else
  model_name=ttadigits
  data="${data:-/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz}"
  "$python" "$root/bench/python/digits.py" "$data" >/dev/null \
    || { echo "tta.sh: --data: unusable (above); install python3-sklearn (scripts/install-deps.sh) or pass --data FILE" >&2; exit 1; }
fi

out="${out:-$build/bench/python/tta}"
mkdir -p "$out/runs"
db="$out/profile.db"
export MASTER_PORT="${MASTER_PORT:-29537}"
plan_tool="$build/tools/cupcake-plan"
# shellcheck source=bench/python/common.sh
. "$root/bench/python/common.sh"
bench_launch
"$python" -c "import torch, cupcake.torch" || { echo "tta.sh: $python cannot import torch and cupcake.torch (python3-torch; scripts/build.sh)" >&2; exit 1; }
# tta: every job's command without its target; a flag left unset takes tta.py's default for the
# model. The runs add the target (`goal`); the record job adds an unreachable one.
tta=("$python" "$root/bench/python/tta.py" --model "$model" --max-steps "$max_steps" --eval-every "$eval_every"
     --width "$width" --embed "$embed" --layers "$layers" --seq-len "$seq_len" --gravac-window "$gravac_window")
model_flags=""
for v in batch hidden lr clip data; do
  if [ -n "${!v}" ]; then tta+=("--$v" "${!v}"); model_flags+=" --$v ${!v}"; fi
done
goal=()
if [ -n "$target" ]; then goal=(--target "$target"); elif [ -n "$target_loss" ]; then goal=(--target-loss "$target_loss"); fi
testbed_flag=""
if [ "$testbed" = 1 ]; then tta+=(--bytes-iface eth0); testbed_flag=" --testbed"; fi
command_line="bench/python/tta.sh --model $model --np $np --seeds $seeds${goal[*]:+ ${goal[*]}} --max-steps $max_steps --eval-every $eval_every --width $width --embed $embed --layers $layers --seq-len $seq_len$model_flags --ratios $ratios --ranks $ranks --gravac-window $gravac_window --run-timeout $run_timeout${arms:+ --arms $arms}$testbed_flag"
bench_header "$command_line"

# 1. Profile this cluster, record the model (the Cupcake arm in record mode; compute records 20
#    iterations, then the job ends: no evaluation before, so no target ends it sooner; argparse
#    takes the last of a repeated flag), and plan: fp32, topk at each ratio, the ladder and
#    PowerSGD at each rank. PowerSGD's kernel curves are timed at the largest rank and read at
#    each group's work (docs/MODEL.md, "PowerSGD"), which covers the smaller ranks.
max_rank=$(tr , '\n' <<<"$ranks" | sort -n | tail -1)
bench_profile "$db" "--compressors fp32,topk,powersgd --ratios $ratios --rank $max_rank" -- "${tta[@]}" --arm cupcake --max-steps 40 \
  --eval-every 40 --target 1
search() {  # NAME SEARCH_FLAGS...: plan NAME.pb, its groups and predicted time into the header
  local name="$1"; shift
  "$plan_tool" search --model-name "$model_name" --profile "$db" "$@" -o "$out/$name.pb" >"$out/plan-$name.txt"
  sed -n 's/^groups *//p; s/^predicted *//p' "$out/plan-$name.txt" | tr '\n' ' ' | sed "s/^/# plan $name: groups /; s/$/\n/"
}
{
  search cupcake-fp32 --compressor fp32
  for r in ${ratios//,/ }; do search "topk-$r" --compressor topk --ratio "$r"; done
  "$plan_tool" search --model-name "$model_name" --profile "$db" --compressor topk --ratios "$ratios" -o "$out/ladder.pb" \
    >"$out/plan-ladder.txt"
  echo "# ladder: topk at $ratios and fp32 ($out/ladder.pb)"
  for k in ${ranks//,/ }; do
    search "powersgd-$k" --compressor fp32 --search-space options --rank "$k" --schemes powersgd
  done
  # The rank ladder, only for its arm: the search refuses a rank whose plan has no PowerSGD group
  # (over loopback it does not pay), and then only this arm fails.
  if [[ " ${run_arms[*]} " == *" gravac-powersgd "* ]]; then
    rank_rungs=$(tr , '\n' <<<"$ranks,1" | sort -nru | paste -sd,)
    if "$plan_tool" search --model-name "$model_name" --profile "$db" --compressor fp32 --search-space options \
        --schemes powersgd --ranks "$rank_rungs" -o "$out/ladder-powersgd.pb" >"$out/plan-ladder-powersgd.txt" 2>&1; then
      echo "# ladder-powersgd: PowerSGD at ranks $rank_rungs and fp32 ($out/ladder-powersgd.pb)"
    else
      echo "# ladder-powersgd: not made: $(tail -1 "$out/plan-ladder-powersgd.txt")"
    fi
  fi
} | tee -a "$out/header.txt"

# 2. The runs: each seed, every arm in turn. A failed run is recorded and the others go on.
results="$out/results.jsonl"
: >"$results"
failed=0
for seed in ${seeds//,/ }; do
  for arm in "${run_arms[@]}"; do
    case "$arm" in
      ddp-powersgd-*) args=(--arm ddp-powersgd --powersgd-rank "${arm#ddp-powersgd-}") ;;
      ddp-*) args=(--arm "$arm") ;;
      gravac) args=(--arm gravac --plan "$out/ladder.pb" --decisions "$out/runs/gravac-seed$seed.decisions.jsonl") ;;
      gravac-powersgd) args=(--arm gravac --plan "$out/ladder-powersgd.pb"
                             --decisions "$out/runs/gravac-powersgd-seed$seed.decisions.jsonl") ;;
      *) args=(--arm cupcake --plan "$out/$arm.pb") ;;
    esac
    if [ "$arm" = gravac-powersgd ] && [ ! -s "$out/ladder-powersgd.pb" ]; then
      failed=1
      echo "{\"name\": \"$arm\", \"seed\": $seed, \"status\": \"failed: no ladder, see plan-ladder-powersgd.txt\"}" \
        | tee -a "$results"
      continue
    fi
    log="$out/runs/$arm-seed$seed.log" rc=0
    # Each rank ends itself after run_timeout s (tta.py --deadline-s, SIGALRM: exit 142 or mpirun's
    # abort); the outer timeout, a minute later, is for a launcher that hangs.
    timeout --kill-after=30 "$((run_timeout + 60))" "${launch[@]}" "${tta[@]}" "${goal[@]}" "${args[@]}" --name "$arm" \
      --seed "$seed" --record "$out/runs/$arm-seed$seed.json" --deadline-s "$run_timeout" >"$log" 2>&1 || rc=$?
    if [ "$rc" = 0 ] && grep -q '^{' "$log"; then
      grep '^{' "$log" | tee -a "$results"
      decisions="$out/runs/$arm-seed$seed.decisions.jsonl"
      if [ -s "$decisions" ]; then  # gravac, once cupcake.torch has it: the ratio and gains drawn
        "$python" "$root/bench/python/plot_decisions.py" "$decisions" "${decisions%.jsonl}.png" || failed=1
      fi
    else
      failed=1
      echo "{\"name\": \"$arm\", \"seed\": $seed, \"status\": \"failed: exit $rc, see runs/$arm-seed$seed.log\"}" \
        | tee -a "$results"
      tail -5 "$log" >&2
    fi
  done
done
echo "# load after: $(uptime)" | tee -a "$out/header.txt"

# 3. The summary: the table on stdout, everything in results.json.
"$python" "$root/bench/python/tta_summary.py" --header "$out/header.txt" --runs "$out/runs" "$results" "$out/results.json"
exit "$failed"

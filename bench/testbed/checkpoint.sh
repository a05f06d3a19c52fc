#!/usr/bin/env bash
# checkpoint.sh: what a snapshot every iteration costs (docs/CHECKPOINT.md, issue 32's
# measurement). On a testbed of H hosts x R ranks at RATE (scripts/testbed.sh): profile it, record
# the model on it, plan it (topk at --ratio, the optimal fusion search), read the replica schedule
# (`cupcake-plan show --profile`): the chunk that fits the plan's idle gap after Commit, and the
# chunks of every idle gap between the plan's collectives; then train the same
# plan in the arms of --arms, round-robin (every arm once per round: its own warm-up, then the
# timed iterations):
#   none        no checkpointer;
#   snapshot    --checkpoint: a snapshot of every parameter, its momentum and the session's
#               state every iteration into host memory, copied in the background;
#   replicas    the same with --replicate and the schedule's chunks: the per-rank state also
#               streams to the other host between the collectives, in every gap
#               (--replica-gaps) where the gaps carry more per iteration than the gap after
#               Commit, else in that one (--replica-chunk-bytes); --replica-max-commits K
#               passes the training loop's bound on a replica's age (0: none);
#   persist     the snapshot with --persist --persist-every N (--save-every): every N steps each
#               rank also writes its snapshot to a file in STORE, after the copy, in the background;
#   pieces      persist, written in pieces of --persist-chunk-bytes B (default 4 MiB), each synced
#               in the network's idle time between the session's collectives;
#   blocking    --blocking-save --save-every N: every N steps, after the update, rank 0 gathers
#               the ranks' own state and writes the whole state to one file in STORE durably
#               while the others wait (no checkpointer).
# An iteration's time is the slowest rank's, from forward to the end of Commit (or of the save).
# --replay MODEL.json trains examples/train_replay instead of a LibTorch job: the recorded model's
# compute played on an emulated accelerator at --compute-scale S (sleeps: the cores stay free for
# the copy and the exchanges, as on a GPU job's host), its parameters and momentum updated on the
# host (--sgd); not with the blocking arm (built for the LibTorch jobs only).
# --recovery N then times recovery N times per failure class, with a snapshot every step,
# --persist-every --save-every and the replicas where a gap fits a chunk: a run killed right after
# commit(10) (--crash-at) is restarted and killed after commit(11) (processes: the hosts' memory
# survives); host 2's segments are removed and it is restarted, killed after commit(12) (a host
# lost: its ranks' state from a replica or their persisted share, the shared state from host 1);
# every segment is removed and it is restarted (every host lost: the persisted shares). Each
# restart's restored step, source and rank 0's restore time (`checkpoint: restore took X ms, done
# Y ms after the job's start`) go to results.json's "recovery".
# For persist and blocking, the durable checkpoints of the timed iterations (the job's
# `durable_steps`: a step written to storage and known durable) give the achieved period, in
# steps between them, and how long after its step's end each was known durable.
#
#   bench/testbed/checkpoint.sh --out DIR [--hosts 2] [--ranks-per-host 1] [--rate 1gbit]
#       [--model wide | --replay MODEL.json [--compute-scale 1]] [--ratio 0.01] [--iterations 30]
#       [--warmup 5] [--rounds 3]
#       [--arms none,snapshot,replicas] [--save-every 5] [--store DIR/store] [--recovery 0]
#       [--replica-max-commits K] [--persist-chunk-bytes 4194304]
#
# Writes DIR/profile.db, DIR/plan.pb, DIR/schedule.json, DIR/runs/ARM.rK.json (iteration times),
# DIR/logs/ (recovery: DIR/logs/recovery-CLASS.rK.log), DIR/results.json (per arm and round:
# median, mean, p10, p90 in ms; each phase's median (examples/common/training_loop.h: forward,
# backward, synchronize, copy_wait, step, commit); for persist and blocking the durable
# checkpoints; with --recovery, each restart) and DIR/machine.txt. STORE/ARM.rK holds a run's files while
# it runs and is removed after it.
# Exit: 0; 1 a stage failed (its log is named); 2 usage; 77 the machine refuses the testbed.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd) me=checkpoint
. "$repo/bench/testbed/common.sh"
build=${CUPCAKE_BUILD_DIR:-$repo/build}
hosts=2 rph=1 rate=1gbit out="" model=wide ratio=0.01 iterations=30 warmup=5 rounds=3
arms_flag=none,snapshot,replicas save_every=5 store="" replay="" scale=1 recovery=0 max_commits=0 piece_bytes=4194304
usage() { sed -n '/^#   bench\/testbed\/checkpoint.sh/,/^#$/p' "$0" | sed 's/^# *//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=${2:-}; shift 2 ;;
    --ranks-per-host) rph=${2:-}; shift 2 ;;
    --rate) rate=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --model) model=${2:-}; shift 2 ;;
    --replay) replay=${2:-}; shift 2 ;;
    --compute-scale) scale=${2:-}; shift 2 ;;
    --ratio) ratio=${2:-}; shift 2 ;;
    --iterations) iterations=${2:-}; shift 2 ;;
    --warmup) warmup=${2:-}; shift 2 ;;
    --rounds) rounds=${2:-}; shift 2 ;;
    --arms) arms_flag=${2:-}; shift 2 ;;
    --save-every) save_every=${2:-}; shift 2 ;;
    --store) store=${2:-}; shift 2 ;;
    --recovery) recovery=${2:-}; shift 2 ;;
    --replica-max-commits) max_commits=${2:-}; shift 2 ;;
    --persist-chunk-bytes) piece_bytes=${2:-}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "checkpoint: unknown flag $1" >&2; usage ;;
  esac
done
[ -n "$out" ] || { echo "checkpoint: --out DIR is required" >&2; usage; }
for n in hosts rph iterations warmup rounds save_every recovery max_commits piece_bytes; do
  [[ "${!n}" =~ ^[0-9]+$ ]] || { echo "checkpoint: $n: got '${!n}', expected an integer" >&2; exit 2; }
done
[ "$save_every" -ge 1 ] || { echo "checkpoint: --save-every: got '$save_every', expected >= 1" >&2; exit 2; }
[ "$piece_bytes" -ge 1 ] || { echo "checkpoint: --persist-chunk-bytes: got '$piece_bytes', expected >= 1" >&2; exit 2; }
IFS=, read -r -a arms <<<"$arms_flag"
for arm in "${arms[@]}"; do
  case "$arm" in none | snapshot | replicas | persist | pieces | blocking) ;;
    *) echo "checkpoint: --arms: got '$arm', expected none, snapshot, replicas, persist, pieces or blocking" >&2; exit 2 ;;
  esac
done
[ "${arms[0]:-}" = none ] ||
  { echo "checkpoint: --arms: got '$arms_flag', expected none first (the others are compared with it)" >&2; exit 2; }
if [ -n "$replay" ]; then
  model=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["name"])' "$replay" 2>/dev/null) ||
    { echo "checkpoint: --replay: $replay: not a readable model file with a \"name\"" >&2; exit 2; }
  [[ " ${arms[*]} " != *" blocking "* ]] || { echo "checkpoint: --arms: blocking: not with --replay" >&2; exit 2; }
  train=$build/examples/train_replay/train_replay
  job=("$train" --model "$(cd "$(dirname "$replay")" && pwd)/$(basename "$replay")" --compute-scale "$scale")
  lr=(--sgd 0.01)
else
  [ "$scale" = 1 ] || { echo "checkpoint: --compute-scale: needs --replay" >&2; exit 2; }
  train=$build/examples/train_$model/train_$model
  job=("$train")
  lr=(--lr 0.01)
fi
[ -x "$train" ] || { echo "checkpoint: no job $train (examples built?)" >&2; exit 2; }
mkdir -p "$out/runs" "$out/logs"
out=$(cd "$out" && pwd)
store=${store:-$out/store}
mkdir -p "$store"
db=$out/profile.db
tag="cpbench$$"
testbed probe || exit $?
trap 'testbed down >/dev/null 2>&1 || true; rm -f /dev/shm/cupcake-$tag-*' EXIT
stage testbed-up testbed up --hosts "$hosts" --ranks-per-host "$rph" --rate "$rate"
{
  machine_header "$hosts" "$rph" "$rate"
  echo "command=bench/testbed/checkpoint.sh --out DIR --hosts $hosts --ranks-per-host $rph --rate $rate $([ -n "$replay" ] && echo "--replay $replay --compute-scale $scale" || echo "--model $model") --ratio $ratio --iterations $iterations --warmup $warmup --rounds $rounds --arms $arms_flag --save-every $save_every$([ "$max_commits" = 0 ] || echo " --replica-max-commits $max_commits")$([[ " ${arms[*]} " != *" pieces "* ]] || echo " --persist-chunk-bytes $piece_bytes")"
  echo "store=$store ($(df -PT "$store" | awk 'NR == 2 {print $2 " on " $1}'))"
} >"$out/machine.txt"

log "profile: comm across the testbed; kernels; record $model"
stage profile-comm testbed run -- "$build/tools/cupcake-profile" comm --db "$db" --ops allreduce,allgather \
  --warmup 1 --iters 3 --rounds 3 --max-bytes 33554432
stage profile-kernels testbed run -- "$build/tools/cupcake-profile" kernels --db "$db" --device cpu \
  --world-size $((hosts * rph)) --compressors topk --ratios "$ratio" --max-elements $([ -n "$replay" ] && echo 33554432 || echo 8388608)
stage record "$build/tools/cupcake-profile" compute --db "$db" --iterations 10 -- \
  "$repo/scripts/testbed.sh" run -- "${job[@]}"
stage plan "$build/tools/cupcake-plan" search --model-name "$model" --profile "$db" --compressor topk \
  --ratio "$ratio" --device cpu -o "$out/plan.pb"
"$build/tools/cupcake-plan" show "$out/plan.pb" --profile "$db" >"$out/schedule.txt"
"$build/tools/cupcake-plan" show "$out/plan.pb" --profile "$db" --format json |
  python3 -c 'import json,sys; json.dump(json.load(sys.stdin)["replica_schedule"], sys.stdout, indent=1)' \
  >"$out/schedule.json"
# The replica flags: every gap's chunk (GROUP:BYTES) where they add up to more than the chunk
# after Commit, else that chunk; none where no gap fits a byte.
replica=()
read -r chunk gaps gap_bytes < <(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
gaps = [g for g in s["gaps"] if g["chunk_bytes"] > 0]
print(s["commit_chunk_bytes"], ",".join("%d:%d" % (g["after_group"], g["chunk_bytes"]) for g in gaps) or "-",
      sum(g["chunk_bytes"] for g in gaps))' "$out/schedule.json")
if [ "$gap_bytes" -gt "$chunk" ]; then
  replica=(--replicate --replica-gaps "$gaps")
  log "replicas in the schedule's gaps: $gap_bytes bytes per iteration (the gap after Commit: $chunk)"
elif [ "$chunk" -gt 0 ]; then
  replica=(--replicate --replica-chunk-bytes "$chunk")
  log "replicas in the gap after Commit: $chunk bytes per iteration"
fi
[ ${#replica[@]} = 0 ] || [ "$max_commits" = 0 ] || replica+=(--replica-max-commits "$max_commits")
if [ ${#replica[@]} = 0 ] && [[ " ${arms[*]} " == *" replicas "* ]]; then
  log "no gap fits a chunk: the replicas arm is left out"
  read -r -a arms <<<"$(printf '%s ' "${arms[@]}" | sed 's/replicas //')"
fi

for ((round = 1; round <= rounds; round++)); do
  for arm in "${arms[@]}"; do
    flags=()
    files="$store/$arm.r$round"
    case "$arm" in
      snapshot) flags=(--checkpoint "$tag-$arm-r$round") ;;
      replicas) flags=(--checkpoint "$tag-$arm-r$round" "${replica[@]}") ;;
      persist) flags=(--checkpoint "$tag-$arm-r$round" --persist "$files" --persist-every "$save_every") ;;
      pieces) flags=(--checkpoint "$tag-$arm-r$round" --persist "$files" --persist-every "$save_every"
        --persist-chunk-bytes "$piece_bytes") ;;
      blocking) flags=(--blocking-save "$files" --save-every "$save_every") ;;
    esac
    mkdir -p "$files"
    log "train: $arm, round $round of $rounds ($warmup + $iterations iterations)"
    stage "train-$arm.r$round" testbed run -- "${job[@]}" --plan "$out/plan.pb" --epochs 1 \
      --steps $((warmup + iterations)) --warmup "$warmup" "${lr[@]}" --timing "$out/runs/$arm.r$round.json" "${flags[@]}"
    rm -f /dev/shm/cupcake-"$tag"-*
    rm -rf "$files"
  done
done

# --recovery: the restarts of each failure class (see the header), one round at a time.
# recover CLASS STEPS CRASH_AT: one run of round $round with $flags, its log
# logs/recovery-CLASS.rROUND.log; with CRASH_AT > 0 it must crash there, with 0 it must end well.
recover() {
  local crash=() rc=0
  [ "$3" -gt 0 ] && crash=(--crash-at "$3")
  testbed run -- "${job[@]}" "${flags[@]}" --steps "$2" "${crash[@]}" >"$out/logs/recovery-$1.r$round.log" 2>&1 || rc=$?
  if { [ "$3" -gt 0 ] && [ "$rc" = 0 ]; } || { [ "$3" = 0 ] && [ "$rc" != 0 ]; }; then
    echo "checkpoint: recovery: $1 exited $rc (log: $out/logs/recovery-$1.r$round.log)" >&2
    exit 1
  fi
}
for ((round = 1; round <= recovery; round++)); do
  name="$tag-rec-r$round" files="$store/rec.r$round"
  mkdir -p "$files"
  flags=(--plan "$out/plan.pb" --epochs 1 "${lr[@]}" --checkpoint "$name" --persist "$files" --persist-every "$save_every")
  flags+=("${replica[@]}")
  log "recovery: round $round of $recovery"
  recover start 12 10
  recover processes 12 11
  for ((r = rph; r < 2 * rph; r++)); do rm -f "/dev/shm/cupcake-$name-$r" /dev/shm/cupcake-"$name-$r"-*; done
  recover host 13 12
  rm -f /dev/shm/cupcake-"$name"-*
  recover all-hosts 13 0
  rm -rf "$files"
done
machine_footer

python3 "$repo/bench/testbed/checkpoint_report.py" "$out" "${arms[@]}"

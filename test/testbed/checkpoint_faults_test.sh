#!/usr/bin/env bash
# testbed_checkpoint_faults (label testbed): the fault cases of docs/CHECKPOINT.md other than a
# whole host (checkpoint_host_test.sh). A 2-host testbed (scripts/testbed.sh) of 1 rank per host
# at 1 Gbit/s trains train_mlp with a topk plan (error feedback: each rank's residuals are its
# own), 6 epochs of 100 steps, with --checkpoint. One uninterrupted run gives every rank's final
# parameters (the checkpoint's options do not change the arithmetic). Each case is a faulted run,
# SIGKILL from outside, and its restart on the same testbed:
#   (a) rank 1 killed at a random moment of the second epoch; the hosts keep their memory. Each
#       rank restores from its own segment a step >= 99 (rank 0 printed epoch 1 after commit(100),
#       which rank 1 entered only after its copy of 99 was in).
#   (b) every host killed (both ranks and MPI daemons) at a random moment of the second epoch and
#       every segment deleted (all host memory gone); --persist every 10 steps. Each rank restores
#       its file of one step, divisible by 10 and >= 90: its own entries, and the shared ones
#       assembled from both ranks' files (each holds half of them).
#   (c) rank 1 killed inside a background copy (kill_during.py --slot: a slot in state writing,
#       the process stopped there first, then killed). Afterwards the slot is still writing. The
#       restart refuses it (its line names the slot) and restores on every rank the step that
#       rank 1's other slot holds.
#   (d) rank 1 killed inside a persist written in pieces between the session's collectives
#       (--persist-chunk-bytes 16384; kill_during.py --persist: its temporary file of step s
#       exists, the process stopped there, then killed), then every segment deleted so that the
#       files are the only copy. Every rank restores its file of s - 10 (with the shared entries
#       from both ranks' files of s - 10); the half-written file is
#       never loaded, and the restart's rank 1 removes it (its writer is gone).
# In (c) and (d) a faulted run that ends before a kill lands is followed by another, 5 at most;
# none landing fails the test. For each case: every rank's final parameters byte for byte the
# uninterrupted run's (cmp), the restart's lines naming the step and where each rank restored it
# from, and its recovery time (from its launch to rank 0's restore line, and the job's own
# restore times), printed at the end.
# Exit 77 (skip) only where the machine refuses the testbed or the LibTorch job is not built.
# Usage: checkpoint_faults_test.sh SOURCE_DIR BUILD_DIR [CASES]   (CASES: default "a b c d")
set -u -o pipefail
src=$1 build=$2 cases=${3:-a b c d}
for c in $cases; do
  case $c in a | b | c | d) ;; *) echo "checkpoint_faults_test.sh: CASES: got '$c', expected a, b, c or d" >&2; exit 2 ;; esac
done
tag="tbfault-$$"
. "$src/test/testbed/checkpoint_common.sh"
ckpt_setup 2 1
# At the highest priority, so that it polls while the job's ranks spin in their collectives.
kill_during=(nice -n -20 python3 "$src/test/testbed/kill_during.py")

# Six epochs: a kill up to 0.3 s after epoch 1's line (0.1 s to see it, then 0-199 ms) must
# land before training ends, and an epoch of train_mlp takes as little as 0.1-0.15 s on an idle
# machine.
epochs=6
job=("$train" --plan "$plan" --epochs "$epochs" --steps 100 --lr 0.01)
ckpt_run "$work/ref.log" "${job[@]}" --checkpoint "$tag-ref" --weights "$work/ref.bin" ||
  { tail -20 "$work/ref.log"; echo "FAIL: the uninterrupted run" >&2; exit 1; }

status=0
declare -A recovery
fail() { echo "FAIL: ($1) ${*:2}" >&2; status=1; }

# faulted CASE ARGS...: the faulted run of CASE in the background (runner: its PID).
faulted() {
  local c=$1
  shift
  ckpt_run "$work/$c-faulted.log" "${job[@]}" --checkpoint "$tag-$c" "$@" &
  runner=$!
}

# victim: rank 1's PID (host 1's train_mlp) once it runs; empty if the run ended first.
victim() {
  local p
  for _ in $(seq 300); do
    p=$(rank_pids 1)
    [ -n "$p" ] && { echo "$p"; return; }
    kill -0 "$runner" 2>/dev/null || return
    sleep 0.1
  done
}

# random_moment CASE: waits for the faulted run's first epoch, then a random 0-199 ms.
random_moment() {
  wait_for_line "$work/$1-faulted.log" '^epoch 1 loss' "$runner" || { fail "$1" "no epoch 1 before the kill"; return 1; }
  local ms=$((RANDOM % 200))
  echo "($1) killing $ms ms after epoch 1"
  sleep "$(printf '0.%03d' "$ms")"
}

# ended CASE: waits for the faulted run; 1 (a FAIL) unless the kill ended it during training.
ended() {
  if wait "$runner"; then fail "$1" "the faulted run exited 0 (it ended before the kill)"; return 1; fi
  if grep -q "^epoch $epochs loss" "$work/$1-faulted.log"; then
    fail "$1" "the faulted run finished its training before the kill"
    return 1
  fi
}

# restart CASE ARGS...: the restart; its checkpoint lines, the comparison with the uninterrupted
# run and its recovery time. 1 if it did not run.
restart() {
  local c=$1 started
  shift
  started=$EPOCHREALTIME
  ckpt_run "$work/$c.log" "${job[@]}" --checkpoint "$tag-$c" "$@" --weights "$work/$c.bin" ||
    { tail -20 "$work/$c.log"; fail "$c" "the restart"; return 1; }
  grep '^checkpoint:' "$work/$c.log" | sed "s/^/($c) /"
  same_weights "$work/ref.bin" "$work/$c.bin" 0 1 || fail "$c" "not bitwise the uninterrupted run's parameters"
  recovery[${c:0:1}]=$(recovery_times "$work/$c.log" "$started") || fail "$c" "${recovery[${c:0:1}]}"
}

# expect_sources CASE PATTERN: each rank's source matches PATTERN with RANK replaced by the rank.
expect_sources() {
  local r from
  for r in 0 1; do
    from=$(restored_from "$work/$1.log" "$r")
    [[ "$from" =~ ^${2//RANK/$r}$ ]] || fail "$1" "rank $r restored from '$from', expected ${2//RANK/$r}"
  done
}

# (a) one rank killed at a random moment; restored from each host's memory.
case_a() {
  local v s
  faulted a
  if random_moment a; then
    v=$(rank_pids 1)
    if [ -z "$v" ]; then fail a "no rank on host 1 to kill"; else kill -9 "$v"; fi
    if ended a && restart a; then
      s=$(restored_step "$work/a.log")
      [ -n "$s" ] && [ "$s" -ge 99 ] && [ "$s" -lt $((epochs * 100)) ] ||
        fail a "restored step '$s', expected 99..$((epochs * 100 - 1))"
      expect_sources a "/dev/shm/cupcake-$tag-a-RANK slots\[[01]\]"
    fi
  fi
}

# Where a rank restored from its persisted file names the shared entries' source: both files.
shares="its shared entries from every rank's persisted share"

# (b) every host killed at a random moment, every host's memory gone; restored from the files.
case_b() {
  local persist s
  mkdir -p "$work/persist-b"
  persist=(--persist "$work/persist-b" --persist-every 10)
  faulted b "${persist[@]}"
  if random_moment b; then
    # shellcheck disable=SC2046  # the PIDs, one word each
    kill -9 $(host_pids 0) $(host_pids 1)
    ended b && rm -f /dev/shm/cupcake-"$tag"-b-* && restart b "${persist[@]}" && {
      s=$(restored_step "$work/b.log")
      [ -n "$s" ] && [ "$s" -ge 90 ] && [ "$s" -lt $((epochs * 100)) ] && [ $((s % 10)) = 0 ] ||
        fail b "restored step '$s', expected a multiple of 10 in 90..$((epochs * 100 - 10))"
      expect_sources b "$work/persist-b/$tag-b-RANK-$s\.ckpt, $shares"
    }
  fi
}

# land CASE WATCH...: up to 5 faulted runs of CASE (labels CASE1 ... CASE5: a checkpoint name
# each, with the arguments in the array extra), each watched by kill_during.py WATCH; an @ in
# extra and WATCH stands for the label. Sets run (the label of the run the kill landed in) and
# landed (kill_during's line); 1 if it landed in none (each run ended first).
land() {
  local c=$1 k v
  shift
  for k in 1 2 3 4 5; do
    run=$c$k
    faulted "$run" "${extra[@]//@/$run}"
    v=$(victim)
    if [ -n "$v" ] && landed=$("${kill_during[@]}" --pid "$v" "${@//@/$run}"); then
      echo "($c) $landed"
      return 0
    fi
    wait "$runner"
    echo "($c) run $k ended before a kill landed inside the operation"
  done
  return 1
}

# (c) rank 1 killed inside its background copy of a snapshot; restored from the other slot.
case_c() {
  local run landed seg slot valid state s extra=()
  land c --slot "/dev/shm/cupcake-$tag-@-1" --min-step 20 --timeout 120 ||
    { fail c "the kill did not land inside a copy in 5 runs"; return; }
  seg=/dev/shm/cupcake-$tag-$run-1
  slot=$(sed -n 's/.* slots\[\([01]\)\] writing.*/\1/p' <<<"$landed")
  valid=$(sed -n 's/.* valid at step \([0-9]*\);.*/\1/p' <<<"$landed")
  # The process is gone: the slot stays as the kill left it (SlotHeader.state, 1: writing).
  state=$(od -An -t u8 -j $((32 + 32 * slot)) -N 8 "$seg" | tr -d ' ')
  [ "$state" = 1 ] || fail c "$seg slots[$slot].state after the kill: got '$state', expected 1 (writing)"
  if ended "$run" && restart "$run"; then
    s=$(restored_step "$work/$run.log")
    [ "$s" = "$valid" ] || fail c "restored step '$s', expected $valid (rank 1's other slot)"
    grep -q "^checkpoint: rank 1 refused $seg: slots\[$slot\]\.state: torn" "$work/$run.log" ||
      fail c "the restart did not refuse rank 1's torn slots[$slot]"
    expect_sources "$run" "/dev/shm/cupcake-$tag-$run-RANK slots\[[01]\]"
  fi
}

# (d) rank 1 killed inside a persist, then every host's memory gone; restored from the files
# before it.
case_d() {
  local run landed tmp step s extra=(--persist "$work/persist-@" --persist-every 10 --persist-chunk-bytes 16384)
  mkdir -p "$work"/persist-d{1,2,3,4,5}
  land d --persist "$work/persist-@" "$tag-@" 1 --min-step 30 --timeout 120 ||
    { fail d "the kill did not land inside a persist in 5 runs"; return; }
  tmp=${landed#landed: }
  tmp=${tmp%% (step *}
  step=$(sed -n 's/.*(step \([0-9]*\)).*/\1/p' <<<"$landed")
  [ -e "$tmp" ] || fail d "no temporary file $tmp after the kill"
  if ended "$run" && rm -f /dev/shm/cupcake-"$tag-$run"-* && restart "$run" "${extra[@]//@/$run}"; then
    s=$(restored_step "$work/$run.log")
    [ "$s" = $((step - 10)) ] || fail d "restored step '$s', expected $((step - 10)) (the file before step $step's)"
    expect_sources "$run" "$work/persist-$run/$tag-$run-RANK-$((step - 10))\.ckpt, $shares"
    [ ! -e "$tmp" ] || fail d "the half-written $tmp is still there after the restart (expected removed: its writer is gone)"
  fi
}

for c in $cases; do "case_$c"; done
for c in $cases; do echo "recovery ($c): ${recovery[$c]:-none}"; done
[ $status = 0 ] && echo "testbed_checkpoint_faults: OK: ($cases) restarted bitwise equal to the uninterrupted run"
exit $status

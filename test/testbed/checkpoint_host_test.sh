#!/usr/bin/env bash
# testbed_checkpoint_host (label testbed): "kill a whole host" (docs/CHECKPOINT.md). A 2-host
# testbed (scripts/testbed.sh) of 2 ranks per host at 1 Gbit/s trains train_mlp with a topk plan
# (error feedback: each rank's residuals are its own) and --checkpoint --replicate. Once rank 0
# has printed its first epoch's loss, every process of host 1 (its two ranks and its MPI daemon)
# is killed with SIGKILL and host 1's memory is wiped (all segments of ranks 2 and 3); mpirun
# then ends the job. The restart on the same testbed must restore ranks 2 and 3 from host 0's
# replicas of their own state (ranks 0 and 1: placement on the other host) and the parameters and
# momentum those ranks hold themselves (shared), and every rank's final parameters must
# be byte for byte those of an uninterrupted run. Exit 77 (skip) only where the machine refuses
# the testbed or the LibTorch job is not built.
# Usage: checkpoint_host_test.sh SOURCE_DIR BUILD_DIR
set -u -o pipefail
src=$1 build=$2
tag="tbhost-$$"
. "$src/test/testbed/checkpoint_common.sh"
ckpt_setup 2 2

job=("$train" --plan "$plan" --epochs 3 --steps 100 --lr 0.01)
timeout 300 "$tb" run -- "${job[@]}" --checkpoint "$tag-ref" --weights "$work/ref.bin" >"$work/ref.log" 2>&1 ||
  { tail -20 "$work/ref.log"; echo "FAIL: the uninterrupted run" >&2; exit 1; }

# The run whose host 1 dies: in the background, killed once its first epoch (100 commits) is done.
timeout 300 "$tb" run -- "${job[@]}" --checkpoint "$tag" --replicate >"$work/killed.log" 2>&1 &
runner=$!
wait_for_line "$work/killed.log" '^epoch 1 loss' "$runner" ||
  { cat "$work/killed.log"; echo "FAIL: no epoch 1 before the kill" >&2; exit 1; }
pids=$(host_pids 1)
[ -n "$pids" ] || { echo "FAIL: no process on host 1 to kill (the run ended before the kill)" >&2; exit 1; }
echo "killing host 1: $(echo $pids | wc -w) processes"
kill -9 $pids
if wait "$runner"; then echo "FAIL: the run whose host died exited 0" >&2; exit 1; fi
rm -f /dev/shm/cupcake-"$tag"-2 /dev/shm/cupcake-"$tag"-2-* /dev/shm/cupcake-"$tag"-3 /dev/shm/cupcake-"$tag"-3-*

started=$EPOCHREALTIME
ckpt_run "$work/resumed.log" "${job[@]}" --checkpoint "$tag" --replicate --weights "$work/resumed.bin" ||
  { tail -20 "$work/resumed.log"; echo "FAIL: the restart" >&2; exit 1; }
grep '^checkpoint:' "$work/resumed.log"
echo "recovery: $(recovery_times "$work/resumed.log" "$started")"
restored=$(restored_step "$work/resumed.log")
status=0
[ -n "$restored" ] && [ "$restored" -ge 1 ] || { echo "FAIL: no step restored" >&2; status=1; }
for r in 2 3; do
  from="rank $((r - 2))'s /dev/shm/cupcake-$tag-$((r - 2))-replica-$r, its shared entries from rank $((r - 2))"
  grep -q "^checkpoint: rank $r restored from $from\$" "$work/resumed.log" ||
    { echo "FAIL: rank $r did not restore from rank $((r - 2))'s replica and shared state" >&2; status=1; }
done
same_weights "$work/ref.bin" "$work/resumed.bin" 0 1 2 3 || status=1
[ $status = 0 ] && echo "testbed_checkpoint_host: OK: host 1 killed, restarted at step $restored, 4 ranks bitwise equal"
exit $status

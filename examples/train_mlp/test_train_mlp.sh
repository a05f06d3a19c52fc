#!/usr/bin/env bash
# The training path end to end with 2 ranks: profile this machine (comm --quick under mpirun,
# kernels --quick), record train_mlp's model with `cupcake-profile compute`, plan it with fp32,
# efsignsgd and topk, train 3 epochs x 10 steps with each plan and check the loss fell; then a
# topk ladder with --adapt 5 (GraVAC): the loss falls and every window printed its decision; then
# --checkpoint (docs/CHECKPOINT.md): topk with error feedback, a run that crashes right after
# commit(13) and its restart end with weights bitwise equal to an uninterrupted run's; the same
# with --replicate after rank 1's segments are deleted (its host lost): rank 1 rebuilds its
# snapshot from rank 0's replica of its residuals and rank 0's parameters and momentum; and
# with --replica-gaps (the replica in the plan's idle gaps between its collectives); and with
# --persist-every 5 after every segment is deleted (every host's memory gone): each rank rebuilds
# step 10 from its persisted share, the parameters and momentum assembled from both ranks'
# shares. With --persist-every 5 the run's line names the durable checkpoints it saw. --blocking-save: its bad
# input refused with messages naming the flag; every 5 steps rank 0 writes the whole state, and
# the last save holds the final parameters, their momentum and both ranks' residuals.
# Usage: test_train_mlp.sh TRAIN_MLP CUPCAKE_PROFILE CUPCAKE_PLAN MPIEXEC WORKDIR
set -euo pipefail
train="$1" profile_tool="$2" plan_tool="$3" mpiexec="$4" work="$5"
rm -rf "$work" && mkdir -p "$work"
db="$work/profile.db"
mpirun=("$mpiexec" --oversubscribe -np 2)
if [ "$(id -u)" = 0 ]; then mpirun+=(--allow-run-as-root); fi

"${mpirun[@]}" "$profile_tool" comm --db "$db" --quick --ops allreduce,allgather
"$profile_tool" kernels --db "$db" --device cpu --quick --compressors fp32,efsignsgd,topk
"$profile_tool" compute --db "$db" --iterations 5 -- "${mpirun[@]}" "$train"

status=0
expect_exit="$(dirname "${BASH_SOURCE[0]}")/../../test/expect_exit.sh"
expect() {  # expect CODE 'FIRST STDERR LINE' ARGS...: train_mlp ARGS (one process)
  sh "$expect_exit" "$1" "$2" "$work/err.txt" "$train" "${@:3}" || status=1
}
expect 2 "mlp: --blocking-save: needs --save-every N" --plan p.pb --blocking-save "$work"
expect 2 "mlp: --save-every: needs --blocking-save DIR" --plan p.pb --save-every 5
expect 2 "mlp: --save-every: got '0', expected an integer in [1, 1000000]" --plan p.pb --blocking-save "$work" \
  --save-every 0
expect 2 "mlp: --blocking-save: got '', expected a directory" --plan p.pb --blocking-save "" --save-every 5
expect 2 "mlp: --blocking-save: not with --checkpoint (the baseline it is compared against); expected one of them" \
  --plan p.pb --checkpoint x --blocking-save "$work" --save-every 5
expect 1 "mlp: --blocking-save: $work/missing: not a directory; expected an existing directory" \
  --plan p.pb --blocking-save "$work/missing" --save-every 5

for c in fp32 efsignsgd topk; do
  "$plan_tool" search --model-name mlp --profile "$db" --compressor "$c" -o "$work/mlp-$c.pb"
  "${mpirun[@]}" "$train" --plan "$work/mlp-$c.pb" --epochs 3 --steps 10 | tee "$work/$c.log"
  first="$(awk '/^epoch 0 loss/ {print $4}' "$work/$c.log")"
  last="$(awk '/^epoch 3 loss/ {print $4}' "$work/$c.log")"
  if [ -z "$first" ] || [ -z "$last" ] || ! awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.9 * a)}'; then
    echo "FAIL: $c: the loss did not fall by 10%; got epoch 0 '$first', epoch 3 '$last'"
    status=1
  else
    echo "ok: $c: loss $first -> $last"
  fi
done

"$plan_tool" search --model-name mlp --profile "$db" --compressor topk --ratios 0.1,0.01 -o "$work/mlp-ladder.pb"
"${mpirun[@]}" "$train" --plan "$work/mlp-ladder.pb" --epochs 3 --steps 10 --adapt 5 | tee "$work/adapt.log"
first="$(awk '/^epoch 0 loss/ {print $4}' "$work/adapt.log")"
last="$(awk '/^epoch 3 loss/ {print $4}' "$work/adapt.log")"
windows="$(grep -c '^gravac: steps ' "$work/adapt.log" || true)"
if [ -z "$first" ] || [ -z "$last" ] || ! awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.9 * a)}' ||
   [ "$windows" != 6 ]; then
  echo "FAIL: --adapt 5: expected the loss to fall by 10% and 6 decisions; got epoch 0 '$first', epoch 3 '$last', $windows decisions"
  status=1
else
  echo "ok: --adapt 5: loss $first -> $last, $windows decisions"
fi

tag="mlp-ckpt-$$"
trap 'rm -f /dev/shm/cupcake-$tag-*' EXIT
ckpt=("${mpirun[@]}" "$train" --plan "$work/mlp-topk.pb" --epochs 2 --steps 10)
mkdir -p "$work/persist"
"${ckpt[@]}" --checkpoint "$tag-ref" --persist "$work/persist" --persist-every 5 --weights "$work/ckpt-ref.bin" \
  >"$work/ckpt-ref.log"
# Steps 5, 10 and 15 seen durable in the next iteration (20, the last, is written at the end).
if ! grep -q "^durable: 3 checkpoints, steps 5 to 15, every 5.0 steps; known durable at most " "$work/ckpt-ref.log"; then
  echo "FAIL: --persist-every 5: expected the line 'durable: 3 checkpoints, steps 5 to 15, ...'; got '$(grep '^durable' "$work/ckpt-ref.log")'"
  status=1
fi
# crash_and_restart FLAG NAME LOSE ARGS...: the job with --checkpoint $tag-NAME ARGS crashes after
# commit(13) (exit non-zero, else FLAG's failure), rank 1's segments are deleted when LOSE is 1
# (its host's memory gone), every rank's when LOSE is all, and the restart runs to the end, its log $work/ckpt-NAME.log and its
# weights $work/ckpt-NAME.bin-rank*; sets `restored`, the step it resumed from.
crash_and_restart() {
  local flag=$1 name=$2 lose=$3
  shift 3
  if "${ckpt[@]}" --checkpoint "$tag-$name" "$@" --crash-at 13 >"$work/ckpt-$name-crash.log" 2>&1; then
    echo "FAIL: $flag: the run that crashes at step 13 exited 0"
    status=1
  fi
  [ "$lose" = 1 ] && rm -f /dev/shm/cupcake-"$tag-$name"-1 /dev/shm/cupcake-"$tag-$name"-1-*
  [ "$lose" = all ] && rm -f /dev/shm/cupcake-"$tag-$name"-*
  "${ckpt[@]}" --checkpoint "$tag-$name" "$@" --weights "$work/ckpt-$name.bin" | tee "$work/ckpt-$name.log"
  restored="$(awk '/^checkpoint: restored step/ {print $4}' "$work/ckpt-$name.log")"
}
# same_weights NAME: each rank's final weights after restart NAME are the uninterrupted run's.
same_weights() {
  cmp "$work/ckpt-ref.bin-rank0" "$work/ckpt-$1.bin-rank0" && cmp "$work/ckpt-ref.bin-rank1" "$work/ckpt-$1.bin-rank1"
}

crash_and_restart --checkpoint resumed 0
# Step 13 when both copies finished before the crash, else 12 (a torn slot is never restored).
if [ "$restored" != 12 ] && [ "$restored" != 13 ]; then
  echo "FAIL: --checkpoint: expected a restart from step 12 or 13; got '$restored'"
  status=1
elif ! same_weights resumed; then
  echo "FAIL: --checkpoint: the weights after a restart at step $restored differ from the uninterrupted run's"
  status=1
else
  echo "ok: --checkpoint: restarted at step $restored, weights bitwise equal to the uninterrupted run's"
fi

# --replicate: rank 1's host loses its memory after the crash (all its segments); its snapshot
# comes back from rank 0's replica. Commit(s) sends step s-1 whole, between the collectives
# (gated), so the newest complete replica at the crash after commit(13) is 12, or 11 when the
# exchange of 12 was cut short.
crash_and_restart --replicate rep 1 --replicate
if [ "$restored" != 11 ] && [ "$restored" != 12 ]; then
  echo "FAIL: --replicate: expected a restart from step 11 or 12; got '$restored'"
  status=1
elif ! grep -q "^checkpoint: rank 1 restored from rank 0's /dev/shm/cupcake-$tag-rep-0-replica-1, its shared entries from rank 0\$" \
    "$work/ckpt-rep.log"; then
  echo "FAIL: --replicate: rank 1 did not restore from rank 0's replica (its residuals) and rank 0's shared state"
  status=1
elif ! same_weights rep; then
  echo "FAIL: --replicate: the weights after a restart at step $restored differ from the uninterrupted run's"
  status=1
else
  echo "ok: --replicate: rank 1's host lost, restarted at step $restored from rank 0's replica, weights bitwise equal"
fi

# --persist-every 5, every host's memory gone after the crash at 13: the files of step 10 (the
# copy of 10, its file included, ended before commit(11) returned) are each rank's own entries and
# half of the shared ones; both ranks rebuild 10 from them.
mkdir -p "$work/persist-crash"
crash_and_restart --persist persisted all --persist "$work/persist-crash" --persist-every 5
shares="its shared entries from every rank's persisted share"
if [ "$restored" != 10 ]; then
  echo "FAIL: --persist: expected a restart from step 10 (the files of 10); got '$restored'"
  status=1
elif ! grep -q "^checkpoint: restored step 10 from $work/persist-crash/$tag-persisted-0-10.ckpt, $shares\$" \
    "$work/ckpt-persisted.log" ||
  ! grep -q "^checkpoint: rank 1 restored from $work/persist-crash/$tag-persisted-1-10.ckpt, $shares\$" \
    "$work/ckpt-persisted.log"; then
  echo "FAIL: --persist: the ranks did not restore from their shares; got '$(grep '^checkpoint: .*restored' "$work/ckpt-persisted.log")'"
  status=1
elif ! same_weights persisted; then
  echo "FAIL: --persist: the weights after a restart at step $restored differ from the uninterrupted run's"
  status=1
else
  echo "ok: --persist: every host's memory lost, restarted at step 10 from the ranks' shares, weights bitwise equal"
fi

# --blocking-save: 20 steps, a save every 5; the file after the last (step 20) against the
# final parameters each rank wrote, entry by entry (its layout: name, NUL, 8-byte size, bytes).
mkdir -p "$work/save"
"${ckpt[@]}" --blocking-save "$work/save" --save-every 5 --weights "$work/save.bin" | tee "$work/save.log"
saves="$(grep -c '^blocking save: step ' "$work/save.log" || true)"
if [ "$saves" != 4 ] ||
   ! grep -qx "durable: 4 checkpoints, steps 5 to 20, every 5.0 steps; known durable at most 0.0 ms (median 0.0 ms) after their step's end" \
     "$work/save.log"; then
  echo "FAIL: --blocking-save: expected 4 saves and their durable line; got $saves saves, '$(grep '^durable' "$work/save.log")'"
  status=1
elif ! python3 - "$work/save/blocking-save.bin" "$work/save.bin-rank0" "$work/save.bin-rank1" <<'PY'
import struct, sys
data, at, entries = open(sys.argv[1], "rb").read(), 0, {}
while at < len(data):
    end = data.index(b"\0", at)
    name = data[at:end].decode()
    (size,) = struct.unpack_from("<Q", data, end + 1)
    entries[name] = data[end + 9:end + 9 + size]
    at = end + 9 + size
params = b"".join(v for k, v in entries.items() if k.startswith("param."))
momentum = [v for k, v in entries.items() if k.startswith("momentum.")]
problems = []
for r in (0, 1):
    if open(sys.argv[2 + r], "rb").read() != params:
        problems.append(f"the saved parameters are not rank {r}'s final ones")
    if len(entries.get(f"rank{r}.session.error_feedback", b"")) != len(params):
        problems.append(f"rank{r}.session.error_feedback: not one float per parameter")
if entries.get("rank0.session.error_feedback") == entries.get("rank1.session.error_feedback"):
    problems.append("the two ranks' residuals are the same bytes (expected each rank's own)")
if sum(map(len, momentum)) != len(params) or not any(any(m) for m in momentum):
    problems.append("momentum: expected one nonzero buffer per parameter")
if entries.get("session.iteration") != struct.pack("<Q", 20):
    problems.append(f"session.iteration: got {entries.get('session.iteration')!r}, expected 20")
print("\n".join(problems) or f"ok: {len(entries)} entries, {len(data)} bytes")
sys.exit(1 if problems else 0)
PY
then
  echo "FAIL: --blocking-save: the file after step 20 does not hold the job's state"
  status=1
else
  echo "ok: --blocking-save: 4 saves, the last holding the final parameters, momentum and both ranks' residuals"
fi

# --replica-gaps: the same loss with the replica in every idle gap of the plan that `show
# --profile --format json` lists (before the first collective, between and after the groups'),
# each gap an equal share of half the replica (its state_bytes), so a replica takes about two
# iterations. Rank 1 restores from rank 0's replica, weights bitwise equal, and the restart made
# more exchanges than commits (the gaps after groups carried chunks).
gaps="$("$plan_tool" show "$work/mlp-topk.pb" --profile "$db" --format json | python3 -c '
import json, sys
s = json.load(sys.stdin)["replica_schedule"]
share = s["state_bytes"] // (2 * len(s["gaps"])) + 1
print(",".join("%d:%d" % (g["after_group"], share) for g in s["gaps"]))')"
crash_and_restart --replica-gaps gaps 1 --replicate --replica-gaps "$gaps"
exchanges="$(awk '/^checkpoint: rank 0: .* replica exchanges/ {print $4}' "$work/ckpt-gaps.log")"
if ! grep -q "^checkpoint: rank 1 restored from rank 0's /dev/shm/cupcake-$tag-gaps-0-replica-1, its shared entries from rank 0\$" \
    "$work/ckpt-gaps.log"; then
  echo "FAIL: --replica-gaps ($gaps): rank 1 did not restore from rank 0's replica and shared state"
  status=1
elif ! same_weights gaps; then
  echo "FAIL: --replica-gaps: the weights after a restart at step $restored differ from the uninterrupted run's"
  status=1
elif [ -z "$exchanges" ] || [ "$exchanges" -le $((20 - restored)) ]; then
  echo "FAIL: --replica-gaps ($gaps): expected more exchanges than the restart's $((20 - restored)) commits; got '$exchanges'"
  status=1
else
  echo "ok: --replica-gaps ($gaps): restarted at step $restored from rank 0's replica, weights bitwise equal, $exchanges exchanges"
fi
exit $status

#!/usr/bin/env bash
# train_replay with 2 ranks on this machine (no testbed): bad input refused with messages that
# name the file or flag (exit 2 for usage, 1 for a bad file); record mode writes the model's
# tensors with gaps no shorter than the file's times the compute scale; an fp32 plan trains
# with the ranks agreeing and the average checked against the exact one; a topk plan (error
# feedback) trains with the ranks agreeing, the timing file's phases of each iteration summing to
# no less than its time and its backward no shorter than the file's; and ranks that fill their
# gradients with different seeds (so each rank's idea of the exact average is wrong) fail the
# exact check with exit 1, which shows the check can fail. Correctness only: no time is checked against a target.
# With --sgd, a run killed after a commit and restarted with --checkpoint ends bitwise equal to an
# uninterrupted one. Also evaluate.sh's usage errors for --replay and --compute-scale (they come before its testbed),
# and errors every rank finds alike printed once per job.
# Usage: test_train_replay.sh TRAIN_REPLAY CUPCAKE_PROFILE CUPCAKE_PLAN MPIEXEC MODEL.json WORKDIR EVALUATE_SH
set -uo pipefail
replay="$1" profile_tool="$2" plan_tool="$3" mpiexec="$4" model="$5" work="$6" evaluate="$7"
rm -rf "$work" && mkdir -p "$work"
mpirun=("$mpiexec" --oversubscribe)
if [ "$(id -u)" = 0 ]; then mpirun+=(--allow-run-as-root); fi
status=0
fail() { echo "FAIL: $*"; status=1; }

# 1. Bad input: exit code and the first line of stderr, pinned.
expect_exit="$(dirname "${BASH_SOURCE[0]}")/../../test/expect_exit.sh"
expect() {  # expect CODE 'FIRST STDERR LINE' ARGS...: train_replay ARGS; its stderr in $work/err.txt
  sh "$expect_exit" "$1" "$2" "$work/err.txt" "$replay" "${@:3}" || status=1
}
expect 2 "train_replay: --compute-scale: got '0', expected a number in (0, 1000]" \
  --model "$model" --plan p.pb --compute-scale 0
expect 2 "train_replay: --compute-scale: got 'fast', expected a number in (0, 1000]" \
  --model "$model" --plan p.pb --compute-scale fast
expect 2 "train_replay: --model: missing; expected a cupcake.model.v1 file" --plan p.pb
expect 2 "train_replay: --lr: not a flag of this job" --model "$model" --plan p.pb --lr 0.1
expect 2 "train_replay: --seed: got '-1', expected an integer >= 0" --model "$model" --plan p.pb --seed -1
expect 2 "train_replay: --sgd: got '0', expected a learning rate in (0, 1000)" --model "$model" --plan p.pb --sgd 0
expect 2 "train_replay: --checkpoint and --weights: need --sgd LR (the replay's parameters)" \
  --model "$model" --plan p.pb --checkpoint x
expect 2 "train_replay: --blocking-save: not a flag of this job" --model "$model" --plan p.pb --blocking-save d
printf '{"format": "cupcake.model.v1", "name": "m", "tensors": [\n' >"$work/bad.json"
printf '{"name": "a", "numel": 4, "dtype": "float16", "backward_us": 1.0},\n' >>"$work/bad.json"
printf '{"name": "b", "numel": 3, "dtype": "bfloat16", "backward_us": 1.0}]}\n' >>"$work/bad.json"
expect 1 "train_replay: --model: $work/bad.json: tensors[0].dtype: the replay plays float32 gradients only; got float16, expected float32" \
  --model "$work/bad.json" --plan p.pb
if ! grep -qx "$work/bad.json: tensors\[1\].dtype: the replay plays float32 gradients only; got bfloat16, expected float32" "$work/err.txt"; then
  fail "bad.json: the second tensor's dtype is not reported: $(cat "$work/err.txt")"
fi
printf '{"format": "cupcake.model.v1", "name": "m", "tensors": [{"name": "a", "numel": 0, "dtype": "float32", "backward_us": 1.0}]}\n' >"$work/zero.json"
expect 1 "train_replay: --model: $work/zero.json: tensors[0].numel: must be positive; got 0, expected > 0" \
  --model "$work/zero.json" --plan p.pb
printf '{"format": ' >"$work/trunc.json"
expect 1 "train_replay: --model: $work/trunc.json:1:12: not valid JSON: syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal" \
  --model "$work/trunc.json" --plan p.pb

# evaluate.sh's usage errors: exit 2 and the message.
expect_evaluate() {  # expect_evaluate 'MESSAGE' ARGS...
  CUPCAKE_BUILD_DIR="$(cd "$(dirname "$replay")/../.." && pwd)" sh "$expect_exit" 2 "$1" "$work/err.txt" \
    "$evaluate" --rate 1gbit --out "$work/eval" "${@:2}" || status=1
}
expect_evaluate "evaluate: --compute-scale: got '0', expected a number in (0, 1000]" --replay "$model" --compute-scale 0
expect_evaluate "evaluate: --compute-scale: needs --replay" --compute-scale 2
expect_evaluate "evaluate: --models and --replay: expected one of them" --models resnet --replay "$model"
expect_evaluate "evaluate: --replay: $work/trunc.json: not a readable model file with a \"name\"" --replay "$work/trunc.json"
printf '{"format": "cupcake.model.v1", "name": "res-net", "tensors": []}\n' >"$work/dash.json"
expect_evaluate "evaluate: --replay: $work/dash.json: name: got 'res-net', expected letters, digits, '_' or '.'" \
  --replay "$work/dash.json"
expect_evaluate "evaluate: --replay: two files name the model 'resnet50'" --replay "$model,$model"

# 2. Record one iteration (so the recorded gaps are that iteration's, not medians, whose sum
# is no ready time): the model's tensors, each ready no earlier than the file's cumulative time
# x scale (the emulation may be late, never early).
scale=0.5
db="$work/profile.db"
"${mpirun[@]}" -np 2 "$profile_tool" comm --db "$db" --quick --ops allreduce,allgather >"$work/comm.log" 2>&1 ||
  { fail "profile comm (log $work/comm.log)"; exit 1; }
"$profile_tool" kernels --db "$db" --device cpu --quick --compressors fp32,topk >"$work/kernels.log" 2>&1 ||
  { fail "profile kernels (log $work/kernels.log)"; exit 1; }
"$profile_tool" compute --db "$db" --iterations 1 --model-file "$work/recorded.json" -- \
  "${mpirun[@]}" -np 2 "$replay" --model "$model" --compute-scale "$scale" >"$work/record.log" 2>&1 ||
  { fail "record (log $work/record.log)"; exit 1; }
PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" python3 - "$model" "$work/recorded.json" "$scale" <<'PY' || status=1
import json, sys
from recorded_check import recorded_problems
given, got, scale = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), float(sys.argv[3])
problems = []
if got["name"] != given["name"]:
    problems.append(f"name: got {got['name']!r}, expected {given['name']!r}")
found, want, have = recorded_problems(given, got, scale, "tensors")
problems += found
print("\n".join(f"FAIL: record: {p}" for p in problems) or f"ok: record: {len(got['tensors'])} tensors, backward {have / 1e3:.1f} ms recorded for {want / 1e3:.1f} ms replayed")
sys.exit(1 if problems else 0)
PY

# 3. Train: fp32 (exact) and topk (error feedback); every rank agrees.
name=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["name"])' "$model")
for c in fp32 topk; do
  ratio=(); [ "$c" = topk ] && ratio=(--ratio 0.01)
  "$plan_tool" search --model-name "$name" --profile "$db" --compressor "$c" --device cpu "${ratio[@]}" \
    -o "$work/$c.pb" >"$work/plan-$c.log" 2>&1 || { fail "plan $c (log $work/plan-$c.log)"; continue; }
  "${mpirun[@]}" -np 2 "$replay" --model "$model" --compute-scale "$scale" --plan "$work/$c.pb" --epochs 1 \
    --steps 6 --warmup 2 --timing "$work/$c.timing.json" >"$work/$c.log" 2>&1
  rc=$?
  python3 - "$work/$c.timing.json" "$c" "$rc" "$model" "$scale" <<'PY' || status=1
import json, sys
c, rc = sys.argv[2], int(sys.argv[3])
backward_us = sum(t["backward_us"] for t in json.load(open(sys.argv[4]))["tensors"]) * float(sys.argv[5])
problems = [] if rc == 0 else [f"exit {rc}"]
try:
    t = json.load(open(sys.argv[1]))
except OSError as e:
    t = {}
    problems.append(f"no timing file: {e}")
if t:
    if t["ranks_agree"] is not True:
        problems.append("the ranks ended with different buffers")
    if len(t["iteration_us"]) != 6 or not all(x > 0 for x in t["iteration_us"]):
        problems.append(f"iteration_us: expected 6 positive times; got {t['iteration_us']}")
    if t["replay"]["exact"] is not (c == "fp32"):
        problems.append(f"replay.exact: got {t['replay']['exact']}, expected {c == 'fp32'}")
    if t["replay"]["wake_late"]["count"] < 1 or t["replay"]["handoff"]["count"] != 6:
        problems.append(f"replay: expected sleeps and one hand-off per iteration; got {t['replay']}")
    # The phases: each iteration's, each phase on its slowest rank, so they sum to no less than
    # the slowest rank's iteration; backward sleeps through the file's times x the scale.
    phases = t.get("phases_us", {})
    names = ["forward", "backward", "synchronize", "copy_wait", "step", "commit"]
    if list(phases) != names or any(len(v) != 6 or min(v) < 0 for v in phases.values()):
        problems.append(f"phases_us: expected {names}, 6 times >= 0 each; got {phases}")
    else:
        for i, it in enumerate(t["iteration_us"]):
            total = sum(v[i] for v in phases.values())
            if total < it * (1 - 1e-9):
                problems.append(f"phases_us: iteration {i}: the phases sum to {total}, less than its time {it}")
            if phases["backward"][i] < backward_us:
                problems.append(f"phases_us.backward[{i}]: got {phases['backward'][i]}, expected >= {backward_us}")
print("\n".join(f"FAIL: train {c}: {p}" for p in problems) or f"ok: train {c}: ranks agree, exact checked: {t['replay']['exact']}")
sys.exit(1 if problems else 0)
PY
done

# 4. The exact check can fail: ranks seeded differently each expect the average of their own
# seed's content on every rank, which is not what the ranks summed.
"${mpirun[@]}" -np 1 "$replay" --model "$model" --plan "$work/fp32.pb" --epochs 1 --steps 2 --seed 1 : \
  -np 1 "$replay" --model "$model" --plan "$work/fp32.pb" --epochs 1 --steps 2 --seed 2 >"$work/seeds.log" 2>&1
rc=$?
if [ "$rc" = 0 ] || ! grep -q "elements of the last step differ from the exact average over the ranks" "$work/seeds.log"; then
  fail "ranks with different seeds: expected a failed exact check; got exit $rc: $(tail -n 3 "$work/seeds.log")"
else
  echo "ok: ranks with different seeds fail the exact check (exit $rc)"
fi

# 5. Errors every rank finds alike are printed once per job (rank 0's) and the job exits
# non-zero: a bad flag (every rank parses the same command line), the fp32 plan (for 2 ranks)
# run by 3 ranks (the ranks agree on it at Create), and a model whose tensor 1 is not the plan's
# (the ranks agree on it when registering their gradients).
once="$(dirname "${BASH_SOURCE[0]}")/../../test/expect_once.sh"
sh "$once" "train_replay: --seed: got '-1', expected an integer >= 0" \
  "${mpirun[@]}" -np 2 "$replay" --model "$model" --plan "$work/fp32.pb" --seed -1 || status=1
sh "$once" "$work/fp32.pb: world_size: does not match the job; got 2, expected 3 (ranks in the communicator)" \
  "${mpirun[@]}" -np 3 "$replay" --model "$model" --plan "$work/fp32.pb" --epochs 1 --steps 2 || status=1
python3 - "$model" "$work/other-model.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["tensors"][1]["numel"] += 1
json.dump(m, open(sys.argv[2], "w"))
PY
sh "$once" "$work/fp32.pb: tensor 1: the job's gradient is not the plan's" \
  "${mpirun[@]}" -np 2 "$replay" --model "$work/other-model.json" --plan "$work/fp32.pb" --epochs 1 --steps 2 ||
  status=1

# 6. --checkpoint: with --sgd's parameters and the topk plan's error feedback, a run that crashes
# right after commit(3) and is restarted (from step 2 or 3) ends with parameters bitwise equal to an uninterrupted
# run's, on each rank (the error feedback is each rank's own state: a restart that lost it would
# differ).
tag="replaytest$$"
ckpt_run() {  # ckpt_run NAME [FLAGS...]: 6 steps of the topk plan with a snapshot every step
  "${mpirun[@]}" -np 2 "$replay" --model "$model" --compute-scale "$scale" --plan "$work/topk.pb" --epochs 1 \
    --steps 6 --sgd 0.01 --checkpoint "$tag-$1" --weights "$work/w-$1" "${@:2}" >"$work/ckpt-$1.log" 2>&1
}
ckpt_run ref || fail "--checkpoint: the uninterrupted run failed (log $work/ckpt-ref.log)"
ckpt_run crash --crash-at 3
ckpt_run crash || fail "--checkpoint: the restarted run failed (log $work/ckpt-crash.log)"
# Step 3 when both copies finished before the crash, else 2 (a torn slot is never restored).
restored="$(awk '/^checkpoint: restored step/ {print $4}' "$work/ckpt-crash.log")"
if [ "$restored" != 2 ] && [ "$restored" != 3 ]; then
  fail "--checkpoint: expected a restart from step 2 or 3; got '$restored': $(grep checkpoint "$work/ckpt-crash.log")"
elif ! cmp -s "$work/w-ref-rank0" "$work/w-crash-rank0" || ! cmp -s "$work/w-ref-rank1" "$work/w-crash-rank1"; then
  fail "--checkpoint: the parameters after the restart at step $restored differ from the uninterrupted run's"
else
  echo "ok: --checkpoint: restarted at step $restored, parameters bitwise equal to the uninterrupted run's"
fi
rm -f /dev/shm/cupcake-"$tag"-*
exit $status

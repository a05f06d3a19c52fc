# Sourced by checkpoint_host_test.sh and checkpoint_faults_test.sh (docs/CHECKPOINT.md): the
# testbed, a topk plan of train_mlp made on it, and the helpers both tests use. Not run alone.
#
# Contract: the caller runs under `set -u -o pipefail` with src (the source tree), build (the
# build tree) and tag (the prefix of its checkpoint names; /dev/shm/cupcake-$tag-* is removed at
# exit) set, then calls ckpt_setup.
# After it: tb (scripts/testbed.sh), train (train_mlp), work (a directory removed at exit) and
# plan (the topk plan, $work/mlp-topk.pb). Exit 77 (skip) only where the machine refuses the
# testbed or the LibTorch job is not built.

tb="$src/scripts/testbed.sh"
train="$build/examples/train_mlp/train_mlp"

# ckpt_cleanup: the testbed down, the work directory and this test's segments removed.
ckpt_cleanup() {
  "$tb" down >/dev/null 2>&1
  rm -rf "$work"
  rm -f /dev/shm/cupcake-"$tag"-*
}

# ckpt_setup HOSTS RANKS_PER_HOST: a testbed of HOSTS hosts at 1 Gbit/s, profiled (collectives
# across it, kernels here), train_mlp's model recorded on it and planned with topk (error
# feedback: each rank's residuals are its own state) into $plan.
ckpt_setup() {
  [ -x "$train" ] || { echo "skip: $train not built (LibTorch)" >&2; exit 77; }
  export CUPCAKE_TESTBED_DIR="${CUPCAKE_TESTBED_DIR:-${TMPDIR:-/tmp}/cupcake-testbed-ckpt.$$}"
  export CUPCAKE_TESTBED_PREFIX="${CUPCAKE_TESTBED_PREFIX:-cpck$$}"
  export CUPCAKE_TESTBED_NET="${CUPCAKE_TESTBED_NET:-10.79.$(($$ % 250))}"
  work=$(mktemp -d)
  trap ckpt_cleanup EXIT
  trap 'exit 1' INT TERM
  "$tb" probe || exit $?
  "$tb" up --hosts "$1" --ranks-per-host "$2" --rate 1gbit || { echo "FAIL: up" >&2; exit 1; }
  local db="$work/profile.db"
  plan="$work/mlp-topk.pb"
  timeout 300 "$tb" run -- "$build/tools/cupcake-profile" comm --db "$db" --quick --ops allreduce,allgather \
    >"$work/comm.log" 2>&1 || { tail -20 "$work/comm.log"; echo "FAIL: profile comm" >&2; exit 1; }
  "$build/tools/cupcake-profile" kernels --db "$db" --device cpu --quick --compressors topk >"$work/kernels.log" 2>&1 ||
    { tail -20 "$work/kernels.log"; echo "FAIL: profile kernels" >&2; exit 1; }
  timeout 300 "$build/tools/cupcake-profile" compute --db "$db" --iterations 5 -- "$tb" run -- "$train" \
    >"$work/record.log" 2>&1 || { tail -20 "$work/record.log"; echo "FAIL: record" >&2; exit 1; }
  "$build/tools/cupcake-plan" search --model-name mlp --profile "$db" --compressor topk --device cpu \
    -o "$plan" >"$work/plan.log" 2>&1 || { cat "$work/plan.log"; echo "FAIL: plan" >&2; exit 1; }
}

# ckpt_run LOG CMD...: CMD on the testbed (at most 300 s), its output in LOG and, each line after
# the time it arrived (seconds since the epoch), in LOG.times; CMD's exit status.
ckpt_run() {
  local log=$1 line
  shift
  : >"$log"
  : >"$log.times"
  timeout 300 "$tb" run -- "$@" 2>&1 | while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    printf '%s %s\n' "$EPOCHREALTIME" "$line" >>"$log.times"
  done
}

# host_pids H: the processes of testbed host H (its ranks and its MPI daemon).
host_pids() { ip netns pids "$CUPCAKE_TESTBED_PREFIX-h$1"; }

# rank_pids H: those of them that are train_mlp (the host's ranks).
rank_pids() {
  local p want
  want=$(readlink -f "$train")
  for p in $(host_pids "$1"); do
    [ "$(readlink -f "/proc/$p/exe" 2>/dev/null)" = "$want" ] && echo "$p"
  done
}

# wait_for_line LOG PATTERN PID: waits (60 s at most) until LOG has a line matching PATTERN or PID
# has ended; 0 when the line is there.
wait_for_line() {
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$3" 2>/dev/null || break
    sleep 0.1
  done
  grep -q "$2" "$1" 2>/dev/null
}

# restored_step LOG: the step the restart's rank 0 says it restored (empty if none).
restored_step() { awk '/^checkpoint: restored step/ {print $4}' "$1"; }

# restored_from LOG RANK: where that rank's restart says it restored from.
restored_from() {
  if [ "$2" = 0 ]; then sed -n 's/^checkpoint: restored step [0-9]* from //p' "$1"
  else sed -n "s/^checkpoint: rank $2 restored from //p" "$1"; fi
}

# same_weights REF OUT RANKS...: each rank's parameters after the restart (OUT-rank<r>) byte for
# byte those of the uninterrupted run (REF-rank<r>); a FAIL line per rank that differs.
same_weights() {
  local ref=$1 out=$2 r status=0
  shift 2
  for r in "$@"; do
    cmp "$ref-rank$r" "$out-rank$r" ||
      { echo "FAIL: rank $r's parameters after the restart differ from the uninterrupted run's" >&2; status=1; }
  done
  return $status
}

# recovery_times LOG STARTED: the restart's recovery as seen from outside (STARTED, the time it was
# launched, to the arrival of rank 0's restore line in LOG.times) and by the job (its restore and
# the time from its start to the restore's end).
recovery_times() {
  local line arrived
  line=$(grep -m1 ' checkpoint: restore took ' "$1.times") || { echo "no restore-time line"; return 1; }
  arrived=${line%% *}
  awk -v a="$2" -v b="$arrived" -v l="${line#* checkpoint: restore took }" \
    'BEGIN {printf "%.0f ms from the launch to the restored state; in the job: restore %s\n", (b - a) * 1000, l}'
}

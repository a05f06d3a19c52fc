#!/usr/bin/env bash
# cupcake-profile kernels under torchrun's variables (test/python/torchrun_like.py: RANK,
# WORLD_SIZE, ..., no MPI) with --backend gloo --store DIR, as comm runs there:
#   1. two ranks sweep in step over gloo; rank 0 alone prints the report and writes the DB, which
#      holds the encode and decode curves of every compressor asked for, 3 sizes each, and the
#      cluster meta of a 2-rank sweep;
#   2. the flags' errors: --store without --backend gloo and --backend gloo without --store
#      (exit 2), an unknown --backend (exit 2), --backend gloo with no launcher (exit 1), and under
#      torchrun a flag every rank refuses alike, printed once (test/expect_once.sh);
#   3. under torchrun without --backend gloo (each worker would sweep alone and write the DB): a
#      usage error naming the flag, printed once, exit 2, no DB.
# Usage: kernels_torchrun_test.sh CUPCAKE_PROFILE PYTHON TORCHRUN_LIKE EXPECT_ONCE WORKDIR
set -uo pipefail
tool="$1" python="$2" torchrun_like="$3" expect_once="$4" work="$5"
rm -rf "$work" && mkdir -p "$work"
status=0
fail() { echo "FAIL: $*"; status=1; }
torchrun=("$python" "$torchrun_like" --nproc_per_node 2 --timeout 100 --)
db="$work/kernels.db"

# 1. The sweep.
"${torchrun[@]}" "$tool" kernels --db "$db" --backend gloo --store "$work/store" --compressors fp16,topk,zen \
  --world-size 2 --min-elements 1024 --max-elements 4096 --warmup 0 --iters 2 >"$work/sweep.log" 2>&1
rc=$?
reports=$(grep -c "2 ranks in step (the slowest rank's median): measured 24 points, skipped 0" "$work/sweep.log")
if [ "$rc" != 0 ] || [ "$reports" != 1 ]; then
  fail "kernels under torchrun: expected exit 0 and rank 0's report once; got exit $rc, $reports reports:"
  cat "$work/sweep.log"
else
  echo "ok: kernels under torchrun: 2 ranks in step, one report"
fi
"$tool" export --db "$db" >"$work/profile.json" 2>"$work/export.log" || fail "export: $(cat "$work/export.log")"
"$python" - "$work/profile.json" <<'PY' || status=1
import json, sys
p = json.load(open(sys.argv[1]))
problems = []
meta = p["cluster"].get("meta", {})
if meta.get("kernels.ranks") != "2 in step, the slowest rank's median":
    problems.append("cluster meta kernels.ranks: got %r, expected '2 in step, the slowest rank's median'"
                    % meta.get("kernels.ranks"))
if "--backend gloo" not in meta.get("kernels.command", ""):
    problems.append("cluster meta kernels.command: got %r, expected the command with --backend gloo"
                    % meta.get("kernels.command"))
for compressor in ("fp16", "topk", "zen"):
    for kind in ("encode", "decode"):
        curves = [c for c in p["curves"] if c["kind"] == kind and c.get("compressor") == compressor]
        if len(curves) != 1 or len(curves[0]["points"]) != 3:
            problems.append("%s %s: expected one curve of 3 points (1024, 2048, 4096 elements); got %s"
                            % (kind, compressor, [len(c["points"]) for c in curves]))
print("\n".join("FAIL: the DB: " + p for p in problems) or "ok: the DB holds the encode and decode curves")
sys.exit(1 if problems else 0)
PY

# 2. The flags' errors: exit code and the first line of stderr.
expect_exit="$(dirname "$expect_once")/expect_exit.sh"
expect() {  # expect CODE 'FIRST STDERR LINE' ARGS...: cupcake-profile kernels ARGS
  sh "$expect_exit" "$1" "$2" "$work/err.txt" "$tool" kernels --db "$work/flags.db" "${@:3}" || status=1
}
expect 2 "cupcake-profile kernels: --store: only with --backend gloo; got --backend mpi" --store "$work/store"
expect 2 "cupcake-profile kernels: --store: missing; expected a directory the ranks share (--backend gloo)" \
  --backend gloo
expect 2 "cupcake-profile kernels: --backend: unknown backend; got 'nccl', expected mpi or gloo" --backend nccl
sh "$expect_exit" 1 "--backend gloo: RANK and WORLD_SIZE: missing or out of range; expected a launch by torchrun (0 <= RANK < WORLD_SIZE) or by mpirun" \
  "$work/err.txt" env -u RANK -u WORLD_SIZE "$tool" kernels --db "$work/flags.db" --backend gloo --store "$work/store" ||
  status=1
[ -e "$work/flags.db" ] && fail "a refused command created $work/flags.db"
sh "$expect_once" "--device: gpu under a launcher with 2 ranks; expected cpu" \
  "${torchrun[@]}" "$tool" kernels --db "$work/flags.db" --backend gloo --store "$work/store" --device gpu ||
  status=1
sh "$expect_once" "--ratios: not a number; got 'x'" \
  "${torchrun[@]}" "$tool" kernels --db "$work/flags.db" --backend gloo --store "$work/store" --ratios x || status=1

# 3. No --backend under torchrun.
sh "$expect_once" --exit 2 "cupcake-profile kernels: --backend mpi: no MPI launcher, but torchrun's WORLD_SIZE is 2; expected --backend gloo --store DIR under torchrun, or a launch by mpirun" \
  "${torchrun[@]}" "$tool" kernels --db "$work/alone.db" --quick --compressors fp16 || status=1
[ -e "$work/alone.db" ] && fail "kernels under torchrun without --backend gloo created $work/alone.db"
exit $status

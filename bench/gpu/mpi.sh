#!/usr/bin/env bash
# On a GPU machine, from the repository root: a step that needs Open MPI, from a pack made by
# bench/gpu/pack.sh (its mpi/, netprobe/ and build/ folders), with its output in OUT_DIR.
#   nccl     the script-driven GPU ctests of test/tools/CMakeLists.txt, their commands as written
#            there, under CUPCAKE_REQUIRE_GPU=1: tools_profile_comm_nccl_np1 and
#            tools_profile_comm_nccl_failure_leaves_no_db (on a GPU machine: a non-empty DB).
#   testbed  bench/testbed/evaluate.sh on a testbed of that machine's namespaces, EVALUATE_ARGS
#            (default below: 4 hosts x 2 ranks, so that every rank has cores of its own), into
#            OUT_DIR/eval.
#   checkpoint  bench/testbed/checkpoint.sh (docs/CHECKPOINT.md) with CHECKPOINT_ARGS (default below:
#            resnet50's replay, 2 hosts x 1 rank at 1 Gbit/s, every arm but blocking, replicas within 5
#            commits, 2 rounds), into
#            OUT_DIR/checkpoint: what a snapshot every iteration costs where the copy threads have
#            cores of their own.
# Usage: bench/gpu/mpi.sh PACK OUT_DIR nccl|testbed|checkpoint [EVALUATE_ARGS... | CHECKPOINT_ARGS...]
set -uo pipefail
pack="$(cd "$1" && pwd)" out="$(mkdir -p "$2" && cd "$2" && pwd)" step="$3"
shift 3
source "$(dirname "${BASH_SOURCE[0]}")/libs.sh"
# The machine's own MPI settings are not this pack's: none of them reaches its mpirun or daemons.
for v in $(compgen -e | grep -E '^(OMPI_|OPAL_|PMIX_|ORTE_)'); do unset "$v"; done
source "$pack/mpi/env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 CUPCAKE_REQUIRE_GPU=1
mpirun=(mpirun --allow-run-as-root --oversubscribe)
profile="$pack/bin/cupcake-profile"
rc=0

case "$step" in
  nccl)
    sh test/gpu_or_skip.sh "comm: measured [1-9]" "${mpirun[@]}" -np 1 "$profile" comm --db "$out/nccl.db" \
      --force --quick --ops allreduce --backend nccl > "$out/tools_profile_comm_nccl_np1.txt" 2>&1
    r=$?; echo "tools_profile_comm_nccl_np1: exit $r"; [ $r = 0 ] || rc=1
    db="$out/nccl-untouched.db"
    rm -f "$db"
    if "${mpirun[@]}" -np 1 "$profile" comm --db "$db" --quick --ops allreduce --backend nccl \
      > "$out/tools_profile_comm_nccl_failure_leaves_no_db.txt" 2>&1; then test -s "$db"; else test ! -e "$db"; fi
    r=$?; echo "tools_profile_comm_nccl_failure_leaves_no_db: exit $r"; [ $r = 0 ] || rc=1
    ;;
  testbed | checkpoint)
    export PATH="$pack/netprobe:$PATH" LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$pack/netprobe/lib"
    export CUPCAKE_BUILD_DIR="$pack/build"
    # The testbed's TCP is cubic where the kernel has it, else the kernel's default.
    if ! grep -qw cubic /proc/sys/net/ipv4/tcp_available_congestion_control; then
      export CUPCAKE_TESTBED_TCP_CC="$(cat /proc/sys/net/ipv4/tcp_congestion_control)"
    fi
    ;;&
  checkpoint)
    [ $# -gt 0 ] || set -- --hosts 2 --rate 1gbit --replay examples/models/resnet50.json --compute-scale 6.75 \
      --arms none,snapshot,replicas,persist,pieces --replica-max-commits 5 --iterations 20 --warmup 3 --rounds 2
    echo "checkpoint.sh $*" > "$out/command.txt"
    bench/testbed/checkpoint.sh "$@" --out "$out/checkpoint"
    rc=$?; echo "checkpoint: exit $rc"
    ;;
  testbed)
    [ $# -gt 0 ] || set -- --hosts 4 --ranks-per-host 2 --rate 5gbit \
      --replay examples/models/resnet50.json --compute-scale 4.5 --compressors efsignsgd,topk \
      --iterations 6 --warmup 2 --rounds 2 --record-iterations 5 --quick \
      --max-bytes 33554432 --max-elements 8388608
    echo "evaluate.sh $*" > "$out/command.txt"
    bench/testbed/evaluate.sh "$@" --out "$out/eval"
    rc=$?; echo "evaluate: exit $rc"
    ;;
  *) echo "mpi.sh: unknown step '$step'; expected nccl, testbed or checkpoint" >&2; exit 2 ;;
esac
exit $rc

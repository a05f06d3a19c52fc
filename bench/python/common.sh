# Sourced by bench/python/ddp_compare.sh and tta.sh: how their MPI jobs are launched, the header
# they record, and the profile and model their Cupcake plans are searched from. Not run alone.
#
# Contract: the caller has set root (the repository), build (the build tree), python, np, testbed
# (0 or 1) and out (a directory that exists), and runs under `set -euo pipefail`.

# bench_launch: sets the arrays `launch` (prefix of every MPI job) and `record_launch` (the same,
# for the record job under `cupcake-profile compute`) and the string `where`. Loopback: mpirun
# with np ranks on this host. Testbed (scripts/testbed.sh up ... first; docs/TESTBED.md): one job
# across the testbed's hosts, with torch.distributed's MASTER_ADDR on host 1 (10.77.0.1, that is
# CUPCAKE_TESTBED_NET.1) over the testbed's link. Exports what every job reads.
bench_launch() {
  export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
  export OMP_NUM_THREADS=1
  if [ "$testbed" = 1 ]; then
    export MASTER_ADDR="${CUPCAKE_TESTBED_NET:-10.77.0}.1"
    export GLOO_SOCKET_IFNAME=eth0  # the testbed's link (gloo would resolve the host name otherwise)
    launch=("$root/scripts/testbed.sh" run)
    local v
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
}

# bench_header COMMAND_LINE: the machine, the command, where the jobs run and the versions, to
# stdout and $out/header.txt.
bench_header() {
  {
    echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ)  $(lscpu | sed -n 's/^Model name: *//p') ($(nproc --all) cores)"
    echo "# command: $1"
    echo "# commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' with uncommitted changes')"
    echo "# $where"
    echo "# torch $("$python" -c 'import torch; print(torch.__version__)'), $(mpirun --version | head -1)"
    echo "# load before: $(uptime)"
  } | tee "$out/header.txt"
}

# bench_profile DB KERNEL_FLAGS -- RECORD_JOB...: measures this cluster into DB (a new file) and
# records the model with RECORD_JOB (a job in record mode, launched with record_launch), then
# extends the curves to the model's size, so the plans price groups as large as the model.
# KERNEL_FLAGS (one word, split on spaces, e.g. "--compressors fp32,topk --ratios 0.1,0.01"):
# the compressors (and their ratios) `cupcake-profile kernels` times. Logs go to $out.
bench_profile() {
  local db="$1" kernel_flags="$2"
  [ "${3:-}" = -- ] || { echo "bench_profile: expected DB KERNEL_FLAGS -- RECORD_JOB...; got '$*'" >&2; return 2; }
  shift 3
  local profile_tool="$build/tools/cupcake-profile"
  rm -f "$db"
  "${launch[@]}" "$profile_tool" comm --db "$db" --quick --ops allreduce,allgather >"$out/comm.log"
  # shellcheck disable=SC2086  # KERNEL_FLAGS is a list of flags by contract
  "$profile_tool" kernels --db "$db" --device cpu --quick $kernel_flags >"$out/kernels.log"
  "$profile_tool" compute --db "$db" --iterations 20 -- "${record_launch[@]}" "$@" \
    >"$out/record.log" 2>&1 || { cat "$out/record.log" >&2; return 1; }
  "${launch[@]}" "$profile_tool" comm --db "$db" --ops allreduce,allgather --min-bytes 1048576 --max-bytes auto >>"$out/comm.log"
  # shellcheck disable=SC2086
  "$profile_tool" kernels --db "$db" --device cpu $kernel_flags --max-elements auto >>"$out/kernels.log"
}

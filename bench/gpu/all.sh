#!/usr/bin/env bash
# Everything a GPU machine's short lease is for, in one call from the repository root there, each
# step under its own timeout (issue: the GPU paths a user runs):
#   1. the machine (nvidia-smi, CPU, load, which MPI it has) and whether network namespaces, veth
#      and tc work there (scripts/testbed.sh needs them; the image has no iproute2: carry
#      bench/gpu/netprobe-pack.sh's .netprobe, which is used when present);
#   2. bench/gpu/python.sh: the Python module built there, PyTorch on CUDA through NCCL;
#   3. bench/gpu/run.sh: every GPU suite under CUPCAKE_REQUIRE_GPU=1, the kernel and runtime benches.
# PACK is bench/gpu/pack.sh's folder, or a .tgz of it (which is unpacked first). The logs go into
# OUT_DIR as logs.tgz (everything) and summary.txt (each step's exit and the suites' lines).
# Usage: bench/gpu/all.sh PACK OUT_DIR [PYTHON_S RUN_S]   (the two steps' timeouts, default 200, 300)
set -u
pack="$1" out="$2" python_s="${3:-200}" run_s="${4:-300}"
if [ -f "$pack" ]; then
  tar -xzf "$pack" -C /tmp && pack=/tmp/$(tar -tzf "$pack" | head -1 | cut -d/ -f1)
fi
work=/tmp/gpu-all
rm -rf "$work" && mkdir -p "$work" "$out"
summary="$out/summary.txt"
{ date -u; nvidia-smi; lscpu | grep -E 'Model name|^CPU\(s\)'; uptime
  echo "mpirun: $(command -v mpirun || echo none)"; mpirun --version 2>&1 | head -1
  python3 -c "import mpi4py; print('mpi4py', mpi4py.__version__, mpi4py.get_config())" 2>&1 | tail -1
} > "$work/machine.txt" 2>&1

# Namespaces, veth and tc: what scripts/testbed.sh builds hosts from.
( if [ -d .netprobe ]; then export PATH="$PWD/.netprobe:$PATH" LD_LIBRARY_PATH="$PWD/.netprobe/lib"; fi
  { ip netns add cupcake-probe && ip link add cupcake-p0 type veth peer name cupcake-p1 &&
    ip link set cupcake-p1 netns cupcake-probe &&
    tc qdisc add dev cupcake-p0 root tbf rate 1gbit burst 32kbit latency 50ms && echo "netns, veth, tc: work"
  } || echo "netns, veth, tc: failed (above)"
  ip link del cupcake-p0; ip netns del cupcake-probe ) > "$work/netns.txt" 2>&1

step() {  # NAME SECONDS CMD...: runs CMD under a timeout, its output in NAME.log
  local name="$1" seconds="$2" start rc
  shift 2
  start=$(date +%s)
  timeout "$seconds" "$@" > "$work/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - start )) s" >> "$summary"
}
: > "$summary"
grep "^netns, veth, tc:" "$work/netns.txt" >> "$summary"
grep -E "^(mpirun|mpi4py)" "$work/machine.txt" >> "$summary"
step python "$python_s" bash bench/gpu/python.sh "$pack" "$work/python"
grep -E "^(ok|FAIL)|python.sh: built" "$work/python.log" >> "$summary"
step run "$run_s" bash bench/gpu/run.sh "$pack" "$work/run"
grep -E ": exit " "$work/run.log" >> "$summary"
cp "$summary" "$work/"
tar -czf "$out/logs.tgz" --exclude="*.o" --exclude="*.so" -C /tmp gpu-all
cat "$summary"

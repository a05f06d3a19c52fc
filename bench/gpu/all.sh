#!/usr/bin/env bash
# Everything a GPU machine's short lease is for, in one call from the repository root there, each
# step under its own timeout (issue: the GPU paths a user runs):
#   the machine (nvidia-smi, CPU, load) and whether network namespaces, veth and tc work there
#   (the image has no iproute2: the pack's netprobe/ has it), then the steps named, in order:
#   python   bench/gpu/python.sh: the Python module built there, PyTorch on CUDA through NCCL;
#   run      bench/gpu/run.sh: every GPU suite under CUPCAKE_REQUIRE_GPU=1, the kernel and runtime benches;
#   nccl     bench/gpu/mpi.sh nccl: the script-driven GPU ctests, under the pack's Open MPI;
#   testbed  bench/gpu/mpi.sh testbed: the testbed evaluation on that machine's cores;
#   checkpoint  bench/gpu/mpi.sh checkpoint: a checkpoint every iteration, on that machine's cores.
# PACK is bench/gpu/pack.sh's folder, or a tarball of it (which is unpacked first). The logs go
# into OUT_DIR as logs.tgz (everything: gpu-all/STEP/ and gpu-all/STEP.log) and summary.txt (each
# step's exit and the suites' lines); the testbed's report also as testbed-README.md and
# testbed-results.json, the checkpoint's as checkpoint-results.json.
# Usage: bench/gpu/all.sh PACK OUT_DIR [STEP=SECONDS]...   (default python=200 run=300)
set -u
pack="$1" out="$2"
shift 2
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(python=200 run=300)
for s in "${steps[@]}"; do
  [[ "$s" =~ ^(python|run|nccl|testbed|checkpoint)=[0-9]+$ ]] ||
    { echo "all.sh: step '$s': expected python, run, nccl, testbed or checkpoint =SECONDS" >&2; exit 2; }
done
if [ -f "$pack" ]; then
  tar -xf "$pack" -C /tmp && pack=/tmp/$(tar -tf "$pack" | head -1 | cut -d/ -f1)
fi
work=/tmp/gpu-all
rm -rf "$work" && mkdir -p "$work" "$out"
summary="$out/summary.txt"
{ date -u; nvidia-smi; lscpu | grep -E 'Model name|^CPU\(s\)'; uptime
  echo "mpirun: $(command -v mpirun || echo none)"; mpirun --version 2>&1 | head -1
  python3 -c "import mpi4py; print('mpi4py', mpi4py.__version__, mpi4py.get_config())" 2>&1 | tail -1
} > "$work/machine.txt" 2>&1

# Namespaces, veth, bridges and tc: what scripts/testbed.sh builds hosts from.
( export PATH="$pack/netprobe:$PATH" LD_LIBRARY_PATH="$pack/netprobe/lib"; scripts/testbed.sh probe ) > "$work/netns.txt" 2>&1

step() {  # NAME SECONDS CMD...: runs CMD under a timeout, its output in NAME.log
  local name="$1" seconds="$2" start rc
  shift 2
  start=$(date +%s)
  timeout "$seconds" "$@" > "$work/$name.log" 2>&1
  rc=$?
  echo "$name: exit $rc in $(( $(date +%s) - start )) s" >> "$summary"
}
: > "$summary"
grep "^testbed:" "$work/netns.txt" >> "$summary"
grep -E "^(mpirun|mpi4py)" "$work/machine.txt" >> "$summary"
for s in "${steps[@]}"; do
  name=${s%=*} seconds=${s#*=}
  case "$name" in
    python) step python "$seconds" bash bench/gpu/python.sh "$pack" "$work/python"
            grep -E "^(ok|FAIL)|python.sh: built" "$work/python.log" >> "$summary" ;;
    run) step run "$seconds" bash bench/gpu/run.sh "$pack" "$work/run"
         grep -E ": exit " "$work/run.log" >> "$summary" ;;
    nccl) step nccl "$seconds" bash bench/gpu/mpi.sh "$pack" "$work/nccl" nccl
          grep -E ": exit " "$work/nccl.log" >> "$summary" ;;
    testbed) step testbed "$seconds" bash bench/gpu/mpi.sh "$pack" "$work/testbed" testbed
             grep -E "^evaluate: (exit|.*(stage|failed))" "$work/testbed.log" | tail -5 >> "$summary"
             for f in README.md results.json; do
               [ -f "$work/testbed/eval/$f" ] && cp "$work/testbed/eval/$f" "$out/testbed-$f"
             done ;;
    checkpoint) step checkpoint "$seconds" bash bench/gpu/mpi.sh "$pack" "$work/checkpoint" checkpoint
                grep -E "^checkpoint: exit|(median of rounds|phases, median|durable checkpoints)" "$work/checkpoint.log" >> "$summary"
                [ -f "$work/checkpoint/checkpoint/results.json" ] &&
                  cp "$work/checkpoint/checkpoint/results.json" "$out/checkpoint-results.json" ;;
  esac
done
cp "$summary" "$work/"
tar -czf "$out/logs.tgz" --exclude="*.o" --exclude="*.so" -C /tmp gpu-all
cat "$summary"

#!/usr/bin/env bash
# Issue 6's speed benchmark (docs/RUNTIME_BENCH.md), end to end on this machine:
#   1. profile it into a DB: `cupcake-profile comm` (NP ranks) and `kernels --device cpu`, both
#      --quick but with sizes up to the whole model (ResNet-50: 25.6M floats, 97.5 MiB), so
#      that the planner interpolates rather than extrapolates;
#   2. plan ResNet-50 for COMPRESSOR on it (`cupcake-plan search`);
#   3. run runtime_bench: the MPI_Allreduce baseline, the runtime's fp32 one-group plan, and the
#      compressor's layer-wise and planned plans (backward gaps none and emulated), beside the
#      planner's predictions.
# Usage: bench/runtime/run.sh [NP]   (default 2; CUPCAKE_BUILD_DIR picks the build, default build/)
# Environment: COMPRESSOR (efsignsgd), WARMUP (3), ITERS (20), WORK (a directory kept for the
# DB and plan; default a temporary one, removed at the end).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"
np="${1:-2}"
compressor="${COMPRESSOR:-efsignsgd}"
warmup="${WARMUP:-3}" iters="${ITERS:-20}"
model="$root/examples/models/resnet50.json"
mpirun=(mpirun -np "$np")
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
[ "$np" -gt "$(nproc)" ] && mpirun+=(--oversubscribe)
for bin in "$build/tools/cupcake-profile" "$build/tools/cupcake-plan" "$build/bench/runtime/runtime_bench"; do
  [ -x "$bin" ] || { echo "run.sh: $bin: not built; run scripts/build.sh (CUPCAKE_BUILD_DIR=$build)" >&2; exit 2; }
done
if [ -n "${WORK:-}" ]; then
  work="$WORK"; mkdir -p "$work"
else
  work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
fi

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), ${mpirun[*]}"
echo "# profiling into $work/profile.db" >&2
"${mpirun[@]}" "$build/tools/cupcake-profile" comm --db "$work/profile.db" --quick --ops allreduce,allgather \
  --max-bytes $((128 << 20)) >&2
"$build/tools/cupcake-profile" kernels --db "$work/profile.db" --device cpu --quick \
  --compressors "fp32,$compressor" --max-elements $((32 << 20)) >&2
echo "# planning: cupcake-plan search --model $model --profile $work/profile.db --compressor $compressor --device cpu" >&2
"$build/tools/cupcake-plan" search --model "$model" --profile "$work/profile.db" --compressor "$compressor" \
  --device cpu -o "$work/$compressor.pb" >&2
"${mpirun[@]}" "$build/bench/runtime/runtime_bench" --model "$model" --profile "$work/profile.db" \
  --plan "$work/$compressor.pb" --warmup "$warmup" --iters "$iters"

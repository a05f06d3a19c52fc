#!/usr/bin/env bash
# Runs the GPU tests, gpu_kernels_bench and runtime_gpu_bench from a pack made by bench/gpu/pack.sh, on a GPU
# machine, from the repository root; logs into OUT_DIR (default ./gpu-results).
# Libraries: bench/gpu/libs.sh.
# CUPCAKE_REQUIRE_GPU=1: a GPU case that would skip (no device, no driver, no CUPTI) fails
# instead (test/gpu_test.h), so a broken driver or CUPTI cannot leave this run green.
# ONLY (environment, space-separated; empty: everything) picks parts: a suite's name (e.g.
# runtime_gpu_test), kernels[:NAME] (gpu_kernels_bench, --only NAME), runtime (runtime_gpu_bench).
# KERNEL_SIZES (environment): gpu_kernels_bench's --sizes.
# Usage: bench/gpu/run.sh [PACK] [OUT_DIR]
set -u
pack="$(cd "${1:-.gpu-pack}" && pwd)"
out="${2:-gpu-results}"
mkdir -p "$out"
only=" ${ONLY:-} "
wanted() { [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]; }
kernels_only=$(grep -o ' kernels:[^ ]*' <<<"$only" | head -1 | cut -d: -f2)
source "$(dirname "${BASH_SOURCE[0]}")/libs.sh"
export CUPCAKE_REQUIRE_GPU=1
{ nvidia-smi; echo "nccl: $nccl"; echo "cupti: $cupti"; echo "cublas: $cublas"; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH";
  ldd "$pack"/bin/* | grep "not found"; } > "$out/env.txt" 2>&1
# Also the suites whose cases take another path where a GPU is present (the session's and the C
# API's device checks, the recorder's CUPTI kernel time, the kernels command's GPU refusal).
for t in kernels_compressor_test kernels_cuda_test kernels_zen_cuda_test kernels_powersgd_test comm_zen_device_test runtime_gpu_test profile_gpu_test profile_nccl_test comm_nccl_test \
         runtime_session_test runtime_recorder_test tools_profile_kernels_test; do
  wanted "$t" || continue
  timeout 300 "$pack/bin/$t" > "$out/$t.txt" 2>&1
  echo "$t: exit $? ($(grep -E '^\[  (PASSED|FAILED) ' "$out/$t.txt" | tr '\n' ' '))"
done
if wanted kernels || [ -n "$kernels_only" ]; then
  timeout 300 "$pack/bin/gpu_kernels_bench" ${kernels_only:+--only "$kernels_only"} \
    ${KERNEL_SIZES:+--sizes "$KERNEL_SIZES"} > "$out/gpu_kernels_bench.txt" 2>&1
  echo "gpu_kernels_bench: exit $?"
  cat "$out/gpu_kernels_bench.txt"
fi
wanted runtime || exit 0
for c in efsignsgd topk; do
  timeout 300 "$pack/bin/runtime_gpu_bench" --model examples/models/resnet50.json --compressor "$c" --iters 50 \
    > "$out/runtime_gpu_bench_$c.txt" 2>&1
  echo "runtime_gpu_bench $c: exit $?"
  cat "$out/runtime_gpu_bench_$c.txt"
done

#!/bin/sh
# Runs a command that needs a GPU (ctest label gpu) and judges how it ended, as gpu_test.h does
# for the C++ fixtures:
#   exit 0 and a line matching PASS_REGEX: pass;
#   exit 1 with a message naming absent hardware or support (cudaErrorNoDevice, 0 devices or
#   cudaErrorInsufficientDriver, each with no NVIDIA driver loaded; a build without CUDA or NCCL):
#   skip (exit 77, the test's SKIP_RETURN_CODE), or fail when CUPCAKE_REQUIRE_GPU=1;
#   anything else: fail.
# Usage: gpu_or_skip.sh PASS_REGEX COMMAND [ARG...]
pass="$1"
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then
  printf '%s\n' "$out" | grep -Eq "$pass" && exit 0
  echo "gpu_or_skip: FAIL: exit 0, but no line matches '$pass'"
  exit 1
fi
absent=""
case "$out" in
  *"this build has no NCCL"* | *"this build has no CUDA"*) absent="this build has no GPU support" ;;
  *cudaErrorNoDevice* | *"got 0 devices"*) [ -e /proc/driver/nvidia/version ] || absent="no CUDA device" ;;
  *cudaErrorInsufficientDriver*) [ -e /proc/driver/nvidia/version ] || absent="no GPU driver installed" ;;
esac
if [ "$rc" -ne 1 ] || [ -z "$absent" ]; then
  echo "gpu_or_skip: FAIL: exit $rc, and the output names no absent GPU"
  exit 1
fi
if [ -n "${CUPCAKE_REQUIRE_GPU:-}" ] && [ "$CUPCAKE_REQUIRE_GPU" != 0 ]; then
  echo "gpu_or_skip: FAIL: CUPCAKE_REQUIRE_GPU is set, but $absent"
  exit 1
fi
echo "gpu_or_skip: skipped: $absent"
exit 77

#!/usr/bin/env bash
# Builds the libFuzzer targets (clang-14, ASan + UBSan) into build-fuzz/ and runs each for
# SECONDS on a copy of its committed seed corpus (test/fuzz/corpus/<target>), then prints one
# line per target: executions, executions per second, corpus size, findings.
# Usage: scripts/fuzz.sh SECONDS [TARGET...]   (targets: model_json profile_json plan profile_db)
# A finding (crash, sanitizer report, failed property, leak, timeout) is saved under
# build-fuzz/findings/<target>/ and makes the script exit 1. CUPCAKE_FUZZ_SEED=N fixes
# libFuzzer's random seed (CI uses 1, so a run can be repeated); unset, libFuzzer picks one.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CUPCAKE_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}"
shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(model_json profile_json plan profile_db)
case "$seconds" in ''|*[!0-9]*) echo "fuzz.sh: SECONDS: not a whole number; got '$seconds'" >&2; exit 2;; esac

for tool in clang-14 clang++-14; do
  command -v "$tool" >/dev/null || { echo "fuzz.sh: $tool missing; run scripts/install-deps.sh" >&2; exit 1; }
done
mkdir -p "$build"
CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCUPCAKE_FUZZ=ON -DCUPCAKE_SANITIZE=address,undefined -DCUPCAKE_WITH_CUDA=OFF -DCUPCAKE_WITH_MPI=OFF \
  -DCUPCAKE_WITH_TORCH=OFF -DCUPCAKE_BUILD_TESTS=OFF -DCUPCAKE_BUILD_BENCHMARKS=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/%/_fuzz}"

status=0
printf '%-14s %12s %10s %8s %s\n' target executions exec/s corpus findings
for t in "${targets[@]}"; do
  work="$build/corpus/$t" findings="$build/findings/$t"
  mkdir -p "$work" "$findings"
  log="$build/$t.log"
  rc=0
  # -timeout: one input may take at most 10 s; -rss_limit_mb bounds memory.
  "$build/test/fuzz/${t}_fuzz" -max_total_time="$seconds" -seed="${CUPCAKE_FUZZ_SEED:-0}" -print_final_stats=1 \
    -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$findings/" "$work" "$root/test/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  found=$(find "$findings" -type f | wc -l)
  printf '%-14s %12s %10s %8s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$(find "$work" -type f | wc -l)" "$found"
  if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
    status=1
    echo "fuzz.sh: $t: finding (exit $rc); log $log, inputs in $findings:" >&2
    grep -E 'ERROR|SUMMARY|property failed|runtime error' "$log" | head -5 >&2 || true
  fi
done
exit $status

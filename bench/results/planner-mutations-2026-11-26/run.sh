#!/bin/bash
# Applies each patch of a folder (this one by default) to the working tree in turn, builds
# planner_test, runs it, records the failing tests, their failed expectations and the unseeded
# tests' count of wrong instances in result-<patch>.txt beside the patch, and reverts the patch.
# Run from the repository root with a configured build dir and a clean libplanner/:
#   bench/results/planner-mutations-2026-11-26/run.sh [BUILD_DIR [PATCH_FOLDER]]
set -u
build=${1:-build} here=${2:-$(dirname "$0")}
for patch in "$here"/*.patch; do
  name=$(basename "$patch" .patch)
  out=$here/result-$name.txt
  git apply "$patch" || { echo "$name: does not apply" >"$out"; continue; }
  {
    echo "# $name, on $(git rev-parse --short HEAD), $(date -u +%FT%TZ)"
    if cmake --build "$build" --target planner_test >/dev/null 2>&1; then
      start=$(date +%s.%N)
      "$build"/test/planner/planner_test --gtest_brief=1 >"$here/.log" 2>&1
      echo "# planner_test exit $?, $(echo "$(date +%s.%N) - $start" | bc) s"
      python3 - "$here/.log" <<'PY'
import re, sys
failures = 0
for line in open(sys.argv[1]):
    if line.rstrip().endswith(": Failure"):
        failures += 1
    m = re.match(r"\[  FAILED  \] (\S+) \(", line)
    if m:
        print(f"FAILED {m.group(1)}: {failures} failed expectations")
        failures = 0
PY
      grep -oE '[0-9]+ of [0-9]+ instances wrong' "$here/.log" | sed 's/^/  unseeded tests (in order): /'
      grep -E '^\[  PASSED  \]|FAILED TESTS?$' "$here/.log"
    else
      echo "build failed"
    fi
  } >"$out"
  rm -f "$here/.log"
  git apply -R "$patch"
done
cmake --build "$build" --target planner_test >/dev/null 2>&1

#!/bin/bash
# Applies each mutation patch of this folder to the working tree in turn, builds planner_test,
# runs it, records the failing tests (and the failing trials' count per test) in
# result-<patch>.txt, and reverts the patch. Run from the repository root with a configured
# build dir:
#   bench/results/planner-mutations-2026-11-26/run.sh [BUILD_DIR]
set -u
here=$(dirname "$0") build=${1:-build}
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

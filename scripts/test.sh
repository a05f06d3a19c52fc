#!/usr/bin/env bash
# Installs what is missing, builds, runs every test, then reports the skipped tests per label and
# fails when a suite this machine can run was skipped (scripts/skip-report.py).
# Usage: scripts/test.sh [extra cmake configure arguments]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"  # override to keep several build trees
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$@"
cd "$build"
status=0
ctest --output-on-failure --output-junit "$build/ctest-junit.xml" || status=$?
python3 "$root/scripts/skip-report.py" "$build" "$build/ctest-junit.xml" || status=1
exit "$status"

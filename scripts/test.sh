#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test.
# Usage: scripts/test.sh [extra cmake configure arguments]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"  # override to keep several build trees
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" "$@"
cd "$build"
ctest --output-on-failure

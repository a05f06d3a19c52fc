#!/usr/bin/env bash
# Configures and builds Cupcake into build/ (Ninja, Release). Extra arguments go to cmake's
# configure step, e.g. scripts/build.sh -DCUPCAKE_WITH_CUDA=OFF; a leading `--targets A,B` builds
# only those targets (and what they need) instead of everything.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"  # override to keep several build trees
targets=()
if [ "${1:-}" = --targets ]; then
  IFS=, read -r -a targets <<<"${2:?--targets: expected a comma-separated list}"
  shift 2
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j"$(nproc)" ${targets[@]+--target "${targets[@]}"}

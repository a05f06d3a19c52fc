#!/usr/bin/env bash
# Configures and builds Cupcake into build/ (Ninja, Release). Extra arguments go to cmake's
# configure step, e.g. scripts/build.sh -DCUPCAKE_WITH_CUDA=OFF.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"  # override to keep several build trees
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build "$build" -j"$(nproc)"

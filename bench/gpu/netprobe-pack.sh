#!/usr/bin/env bash
# Packs iproute2's `ip` and `tc` with the libraries they load (not the C library) into DIR
# (default .netprobe), for a GPU machine whose image has neither: bench/gpu/pack.sh puts it into
# the pack's netprobe/, which bench/gpu/all.sh and mpi.sh put on PATH (and DIR/lib on
# LD_LIBRARY_PATH) for scripts/testbed.sh.
# Usage: bench/gpu/netprobe-pack.sh [DIR]
set -euo pipefail
out="${1:-.netprobe}"
rm -rf "$out" && mkdir -p "$out/lib"
for tool in ip tc; do
  path=$(command -v "$tool") || { echo "netprobe-pack.sh: $tool: not installed (apt-get install iproute2)" >&2; exit 2; }
  cp "$path" "$out/"
done
ldd "$out/ip" "$out/tc" | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
echo "netprobe-pack.sh: $(du -sh "$out" | cut -f1) in $out"

#!/usr/bin/env bash
# Packs iproute2's `ip` and `tc` with the libraries they load (not the C library) into DIR
# (default .netprobe), for a GPU machine whose image has neither: bench/gpu/all.sh puts DIR on
# its PATH for the testbed probe (network namespaces, veth, tc), run there with
# LD_LIBRARY_PATH=DIR/lib.
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

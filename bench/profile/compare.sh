#!/usr/bin/env bash
# Checks `cupcake-profile comm` against an outside reference (osu_style.cc, the OSU method) at
# the same sizes on the same ranks, one after the other, and prints a table:
#   op, size, cupcake us (slowest rank's median of per-call times, each call after a barrier),
#   reference us (max over ranks of the mean of back-to-back calls), ratio cupcake / reference.
# Usage: bench/profile/compare.sh [NP]   (default 2; CUPCAKE_BUILD_DIR picks the build, default build/)
# Environment: MIN_BYTES (1024), MAX_BYTES (16777216), WARMUP (5), ITERS (20), REF_ITERS (100).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"
np="${1:-2}"
min="${MIN_BYTES:-1024}" max="${MAX_BYTES:-16777216}"
warmup="${WARMUP:-5}" iters="${ITERS:-20}" ref_iters="${REF_ITERS:-100}"
mpirun=(mpirun -np "$np")
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
[ "$np" -gt "$(nproc)" ] && mpirun+=(--oversubscribe)
for bin in "$build/tools/cupcake-profile" "$build/bench/profile/osu_style"; do
  [ -x "$bin" ] || { echo "compare.sh: $bin: not built; run scripts/build.sh (CUPCAKE_BUILD_DIR=$build)" >&2; exit 2; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname), $(nproc) cores, ${mpirun[*]}" >&2
"${mpirun[@]}" "$build/tools/cupcake-profile" comm --db "$work/p.db" --ops allreduce,allgather \
  --min-bytes "$min" --max-bytes "$max" --warmup "$warmup" --iters "$iters" >"$work/cupcake.txt"
"$build/tools/cupcake-profile" export --db "$work/p.db" -o "$work/p.json"
"${mpirun[@]}" "$build/bench/profile/osu_style" --ops allreduce,allgather --min-bytes "$min" \
  --max-bytes "$max" --warmup "$warmup" --iters "$ref_iters" >"$work/ref.txt"
head -1 "$work/cupcake.txt"
head -1 "$work/ref.txt"

python3 - "$work/p.json" "$work/ref.txt" <<'PY'
import json, sys
profile = json.load(open(sys.argv[1]))
cup = {}
for c in profile["curves"]:
    if c["kind"] == "comm" and c["scope"] == "global":
        for size, us in c["points"]:
            cup[(c["op"], size)] = us
ref = {}
for line in open(sys.argv[2]):
    if line.startswith("#") or not line.strip():
        continue
    op, size, us, _ = line.split("\t")
    ref[(op, int(size))] = float(us)

def human(b):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024:
            return f"{b} {unit}"
        b //= 1024
    return f"{b} TiB"

print(f"{'op':<10} {'size':>9} {'cupcake us':>11} {'reference us':>13} {'ratio':>6}")
worst = 0.0
for (op, size) in sorted(ref, key=lambda k: (k[0] != "allreduce", k[1])):
    if (op, size) not in cup:
        continue
    c, r = cup[(op, size)], ref[(op, size)]
    ratio = c / r if r > 0 else float("inf")
    mark = ""
    if size >= 65536:
        worst = max(worst, abs(ratio - 1))
        mark = "" if abs(ratio - 1) <= 0.15 else "  > 15%"
    print(f"{op:<10} {human(size):>9} {c:11.1f} {r:13.1f} {ratio:6.2f}{mark}")
print(f"largest |ratio - 1| at sizes >= 64 KiB: {worst:.2f} ({'within' if worst <= 0.15 else 'outside'} 15%)")
PY

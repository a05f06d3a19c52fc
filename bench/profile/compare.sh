#!/usr/bin/env bash
# Checks `cupcake-profile comm` against an outside reference (osu_style.cc, written against MPI
# directly) at the same sizes on the same ranks, one after the other, and prints a table:
#   op, size, cupcake us (slowest rank's median of per-call times, each call after a barrier),
#   per-call us (osu_style --method per-call: the same quantity, measured by the reference's own
#   code, with the same kind of call: non-blocking and completed by MPI_Test, as cupcake's MPI
#   communicator does; CALL=blocking for MPI_Allreduce/MPI_Allgather) and its ratio, which the
#   15% check applies to, with the range of that ratio over the rounds, then osu us (osu_style
#   --method osu, blocking calls: max over ranks of the mean of back-to-back calls) and its ratio.
# The three run in turn ROUNDS times (default 3) and each point is the median over the rounds,
# so that a slow minute of a shared machine does not land on one of them alone.
# Usage: bench/profile/compare.sh [NP]   (default 2; CUPCAKE_BUILD_DIR picks the build, default build/)
# Environment: MIN_BYTES (1024), MAX_BYTES (16777216), WARMUP (5), ITERS (20), REF_ITERS (100),
# ROUNDS (3), CALL (nonblocking), ALLREDUCE (the per-call reference's allreduce: exchange, the
# algorithm cupcake runs for 2 ranks and from 64 KiB, default; or mpi, MPI's own). The osu
# column is always MPI's own allreduce.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"
np="${1:-2}"
min="${MIN_BYTES:-1024}" max="${MAX_BYTES:-16777216}"
warmup="${WARMUP:-5}" iters="${ITERS:-20}" ref_iters="${REF_ITERS:-100}" rounds="${ROUNDS:-3}"
call="${CALL:-nonblocking}" allreduce="${ALLREDUCE:-exchange}"
mpirun=(mpirun -np "$np")
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
[ "$np" -gt "$(nproc)" ] && mpirun+=(--oversubscribe)
for bin in "$build/tools/cupcake-profile" "$build/bench/profile/osu_style"; do
  [ -x "$bin" ] || { echo "compare.sh: $bin: not built; run scripts/build.sh (CUPCAKE_BUILD_DIR=$build)" >&2; exit 2; }
done
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) $(hostname), $(nproc) cores, ${mpirun[*]}" >&2
for round in $(seq "$rounds"); do
  "${mpirun[@]}" "$build/tools/cupcake-profile" comm --db "$work/p$round.db" --ops allreduce,allgather \
    --min-bytes "$min" --max-bytes "$max" --warmup "$warmup" --iters "$iters" >"$work/cupcake.txt"
  "$build/tools/cupcake-profile" export --db "$work/p$round.db" -o "$work/p$round.json"
  for method in per-call osu; do
    kind=blocking algorithm=mpi
    [ "$method" = per-call ] && kind=$call algorithm=$allreduce
    "${mpirun[@]}" "$build/bench/profile/osu_style" --ops allreduce,allgather --min-bytes "$min" \
      --max-bytes "$max" --warmup "$warmup" --iters "$ref_iters" --method "$method" --call "$kind" \
      --allreduce "$algorithm" >"$work/$method$round.txt"
  done
done
head -1 "$work/cupcake.txt"
head -qn1 "$work/per-call1.txt" "$work/osu1.txt"
echo "# each point: the median over $rounds rounds (cupcake, per-call, osu in turn)"

python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])

def read_cupcake(path):
    cup = {}
    for c in json.load(open(path))["curves"]:
        # float32 curves only: the float16 allreduce curve has the same op and sizes
        if c["kind"] == "comm" and c["scope"] == "global" and c.get("dtype", "") in ("", "float32"):
            for size, us in c["points"]:
                cup[(c["op"], size)] = us
    return cup

def read_ref(path):
    ref = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        op, size, us, _ = line.split("\t")
        ref[(op, int(size))] = float(us)
    return ref

def median_over_rounds(runs):
    keys = set.intersection(*(set(r) for r in runs))
    return {k: statistics.median(r[k] for r in runs) for k in keys}

cup_rounds = [read_cupcake(f"{work}/p{r}.json") for r in range(1, rounds + 1)]
per_call_rounds = [read_ref(f"{work}/per-call{r}.txt") for r in range(1, rounds + 1)]
cup = median_over_rounds(cup_rounds)
per_call = median_over_rounds(per_call_rounds)
osu = median_over_rounds([read_ref(f"{work}/osu{r}.txt") for r in range(1, rounds + 1)])

def human(b):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024:
            return f"{b} {unit}"
        b //= 1024
    return f"{b} TiB"

def round_ratios(key):
    return [c[key] / p[key] for c, p in zip(cup_rounds, per_call_rounds) if key in c and p.get(key, 0) > 0]

print(f"{'op':<10} {'size':>9} {'cupcake us':>11} {'per-call us':>12} {'ratio':>6} {'rounds':>11} {'osu us':>9} {'ratio':>6}")
worst = {"per-call": 0.0, "osu": 0.0}
checked = outside = 0
for (op, size) in sorted(per_call, key=lambda k: (k[0] != "allreduce", k[1])):
    if (op, size) not in cup or (op, size) not in osu:
        continue
    c, p, o = cup[(op, size)], per_call[(op, size)], osu[(op, size)]
    rp, ro = c / p if p > 0 else float("inf"), c / o if o > 0 else float("inf")
    rr = round_ratios((op, size))
    spread = f"{min(rr):.2f}-{max(rr):.2f}" if rr else "-"
    mark = ""
    if size >= 65536:
        worst["per-call"] = max(worst["per-call"], abs(rp - 1))
        worst["osu"] = max(worst["osu"], abs(ro - 1))
        checked += 1
        outside += abs(rp - 1) > 0.15
        mark = "" if abs(rp - 1) <= 0.15 else "  > 15%"
    print(f"{op:<10} {human(size):>9} {c:11.1f} {p:12.1f} {rp:6.2f} {spread:>11} {o:9.1f} {ro:6.2f}{mark}")
print(f"points >= 64 KiB outside 15% of per-call: {outside} of {checked}")
for method, w in worst.items():
    print(f"largest |ratio - 1| against {method} at sizes >= 64 KiB: {w:.2f} ({'within' if w <= 0.15 else 'outside'} 15%)")
PY

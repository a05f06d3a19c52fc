#!/usr/bin/env bash
# Kills one rank of a running `cupcake-profile comm` job with SIGKILL in the middle of its
# collectives and measures how long the job takes to end, and how. Prints one line per trial
# and the spread. Usage: bench/faults/rank_kill.sh [TRIALS] [RANKS]   (a built build/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"
trials="${1:-5}" ranks="${2:-4}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
as_root=()
[ "$(id -u)" -eq 0 ] && as_root=(--allow-run-as-root)
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "job: mpirun -np $ranks cupcake-profile comm --min-bytes 1048576 --max-bytes 67108864 --iters 50; rank $((ranks - 1)) killed 2 s in"
times=()
for t in $(seq 1 "$trials"); do
  rm -f "$work"/p.db*
  mpirun "${as_root[@]}" --oversubscribe -np "$ranks" "$build/tools/cupcake-profile" comm --db "$work/p.db" \
    --min-bytes 1048576 --max-bytes 67108864 --iters 50 >"$work/out" 2>"$work/err" &
  launcher=$!
  sleep 2
  victim=$(pgrep -f "^$build/tools/cupcake-profile comm --db $work/p.db" | tail -1)  # a rank, not mpirun
  [ -n "$victim" ] || { echo "trial $t: no rank to kill (job ended early)"; wait "$launcher" || true; continue; }
  killed=$(date +%s.%N)
  kill -9 "$victim"
  rc=0
  wait "$launcher" || rc=$?
  ended=$(date +%s.%N)
  left=$(pgrep -fc "^$build/tools/cupcake-profile comm --db $work/p.db" || true)
  s=$(awk -v a="$killed" -v b="$ended" 'BEGIN {printf "%.3f", b - a}')
  times+=("$s")
  printf 'trial %d: job ended %.3f s after the kill, mpirun exit %d, ranks left running %s, DB readable: %s\n' \
    "$t" "$s" "$rc" "$left" "$("$build/tools/cupcake-profile" inspect --db "$work/p.db" >/dev/null 2>&1 && echo yes || echo no)"
done
printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {if (NR) printf "end after kill: min %.3f s, median %.3f s, max %.3f s over %d trials\n", a[1], a[int((NR+1)/2)], a[NR], NR}'

#!/bin/bash
# Measures the testbed (scripts/testbed.sh, docs/TESTBED.md): 2 hosts x 1 rank, for each rate
# (default: none 1gbit 200mbit), RUNS runs (default 3) of cupcake-profile comm over
#   small: allreduce 8 B .. 64 KiB        (latency)
#   large: allreduce, allgather of 16 MiB per rank (bandwidth)
# and prints min/median/max of the global-scope times over the runs. With 2 ranks each rank
# sends and receives S bytes per allreduce (2(n-1)/n S) and per allgather ((n-1) S), so the
# wire rate is S*8/t, set beside the shaped rate. Variants for the first try's faults:
#   BIND=core   mpirun --bind-to core instead of none (every host's rank on core 0)
#   QDISC=tbf   tbf with a small burst (TBF_BURST, default 5kb) instead of htb
#   CUPCAKE_TESTBED_TCP_CC=bbr   the hosts' TCP congestion control (default cubic)
# Usage: bench/testbed/measure.sh [RATE...]   (root; build/tools/cupcake-profile built)
set -u -o pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tb="$root/scripts/testbed.sh"
prof="$root/build/tools/cupcake-profile"
runs=${RUNS:-3}
export CUPCAKE_TESTBED_DIR="${TMPDIR:-/tmp}/cupcake-testbed-measure.$$"
export CUPCAKE_TESTBED_PREFIX="cptm$$"
export CUPCAKE_TESTBED_NET=10.79.0
work=$(mktemp -d)
trap '"$tb" down >/dev/null 2>&1; rm -rf "$work"' EXIT
rates=("$@"); [ ${#rates[@]} -gt 0 ] || rates=(none 1gbit 200mbit)

echo "# $(date -u +%FT%TZ) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) ($(nproc) cores)"
echo "# load before: $(uptime)"
echo "# BIND=${BIND:-none} QDISC=${QDISC:-htb} TCP=${CUPCAKE_TESTBED_TCP_CC:-cubic} runs=$runs"
printf '%-8s %-10s %-9s %10s %10s %10s %12s\n' rate collective size min_us median_us max_us wire_Mbit/s
for rate in "${rates[@]}"; do
  "$tb" up --hosts 2 --ranks-per-host 1 --rate "$rate" >/dev/null || exit 1
  if [ "${QDISC:-htb}" = tbf ] && [ "$rate" != none ]; then
    for i in 0 1; do
      tc -n "cptm$$-h$i" qdisc replace dev eth0 root tbf rate "$rate" burst "${TBF_BURST:-5kb}" latency 50ms
      tc -n "cptm$$-sw" qdisc replace dev "p$i" root tbf rate "$rate" burst "${TBF_BURST:-5kb}" latency 50ms
    done
  fi
  for ((r = 0; r < runs; r++)); do
    for part in "allreduce 8 65536" "allreduce,allgather 16777216 16777216"; do
      set -- $part
      timeout 300 "$tb" run --mpirun-arg "--bind-to" --mpirun-arg "${BIND:-none}" -- \
        "$prof" comm --db "$work/$rate.$r.$2.db" --ops "$1" --min-bytes "$2" --max-bytes "$3" \
        --warmup 3 --iters 10 >>"$work/$rate.out" 2>&1 || { tail "$work/$rate.out"; exit 1; }
    done
  done
  # Rows "collective [float16] global SIZE UNIT us wrong": fp32 only; aggregate over runs.
  awk -v rate="$rate" '$2 == "global" { s = $3 " " $4; k = $1 " " s; n[k]++; v[k, n[k]] = $5;
        if (!(k in seen)) { seen[k] = 1; order[++m] = k } }
      function mul(u) { return u == "B" ? 1 : u == "KiB" ? 1024 : 1048576 }
      END { for (i = 1; i <= m; i++) { k = order[i]; c = n[k];
        for (a = 1; a <= c; a++) x[a] = v[k, a];
        for (a = 1; a <= c; a++) for (b = a + 1; b <= c; b++) if (x[b] < x[a]) { t = x[a]; x[a] = x[b]; x[b] = t }
        split(k, f, " "); bytes = f[2] * mul(f[3]);
        printf "%-8s %-10s %-9s %10.1f %10.1f %10.1f %12.0f\n", rate, f[1], f[2] " " f[3], x[1], x[int((c + 1) / 2)], x[c],
          bytes * 8 / x[int((c + 1) / 2)] }}' "$work/$rate.out"
done
echo "# load after: $(uptime)"

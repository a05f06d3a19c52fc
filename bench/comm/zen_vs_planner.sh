#!/bin/bash
# Zen against the allgather scheme on the testbed, with the planner's prediction beside every
# measured point (docs/ZEN.md, "The planner beside zen_time"): brings the testbed up, profiles it
# as a user would (comm allreduce, allgather, alltoall; topk's and Zen's CPU kernels at both
# densities and Zen's at the lower ratios an overlapping union reads, swept by all ranks in step
# as the job runs them), then runs zen_time --profile RUNS
# times. Everything goes to OUT (a text file), the
# profile to OUT.db.
# --local runs the H x R ranks on this machine instead, over TCP loopback (mpirun --mca btl
# tcp,self; no testbed, no shaping: --rate is ignored), for a machine with a core per rank.
#
#   bench/comm/zen_vs_planner.sh --hosts H --ranks-per-host R --rate RATE --out OUT
#       [--local] [--n ELEMENTS] [--iters N] [--runs N] [--build DIR]
#
# Exit codes: 0 success, 1 failure, 2 usage, 77 the machine refuses the testbed.
set -eu -o pipefail

hosts=2 per_host=1 rate=1gbit out="" n=16777216 iters=15 runs=3 build=build local=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --ranks-per-host) per_host=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --n) n=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --local) local=1; shift ;;
    *) sed -n '12,13p' "$0" | sed 's/^# *//' >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "zen_vs_planner: --out is required" >&2; exit 2; }
here=$(cd "$(dirname "$0")/../.." && pwd)
tb="$here/scripts/testbed.sh"
db="$out.db"
rm -f "$db"
world=$((hosts * per_host))
if [ "$local" = 1 ]; then
  launch=(mpirun --oversubscribe --bind-to none -np "$world" --mca btl tcp,self)
  if [ "$(id -u)" = 0 ]; then launch+=(--allow-run-as-root); fi
  where="local: $world ranks on this machine over TCP loopback (${launch[*]})"
else
  trap '"$tb" down >/dev/null 2>&1 || true' EXIT
  rc=0
  "$tb" up --hosts "$hosts" --ranks-per-host "$per_host" --rate "$rate" >/dev/null || rc=$?
  [ "$rc" = 0 ] || exit "$rc"
  launch=("$tb" run --)
  where="testbed: hosts=$hosts ranks_per_host=$per_host rate=$rate"
fi
profile_comm="$build/tools/cupcake-profile comm --db $db --ops allreduce,allgather,alltoall --min-bytes 1024 --max-bytes 4194304 --warmup 1 --iters 5 --rounds 3"
# topk at the two densities; Zen's curves also at the ratios where the decode is read when
# indices overlap (a smaller union reads it at a lower ratio, docs/MODEL.md "A measured union").
profile_kernels="$build/tools/cupcake-profile kernels --db $db --device cpu --world-size $world --compressors topk --ratios 0.001,0.01 --max-elements $n"
profile_zen="$build/tools/cupcake-profile kernels --db $db --device cpu --world-size $world --compressors zen --ratios 0.0001,0.0003,0.001,0.003,0.01 --max-elements $n"
{
  echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git -C "$here" describe --always --dirty), $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores), load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# $where"
  echo "# profile: ${launch[*]} $profile_comm; ${launch[*]} $profile_kernels; ${launch[*]} $profile_zen"
} >"$out"
"${launch[@]}" $profile_comm >/dev/null
"${launch[@]}" $profile_kernels >/dev/null
"${launch[@]}" $profile_zen >/dev/null
for run in $(seq 1 "$runs"); do
  echo "# command: ${launch[*]} $build/bench/comm/zen_time --n=$n --iters=$iters --profile=PROFILE (run $run; load $(cut -d' ' -f1-3 /proc/loadavg))" >>"$out"
  "${launch[@]}" "$build/bench/comm/zen_time" --n="$n" --iters="$iters" --profile="$db" | grep -v '^#' >>"$out"
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"

#!/usr/bin/env bash
# A/B: main (795d804) and session-engine runtime_bench, alternated, one profile and plan.
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
W=/tmp/rtb-session
B=/work/wt-session/build
M=/work/wt-session-basemain/build
model=/work/wt-session/examples/models/resnet50.json
mp=(mpirun -np 2 --allow-run-as-root --oversubscribe)
if [ ! -f $W/efsignsgd.pb ]; then
  { echo "# profile $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)"; 
  "${mp[@]}" $B/tools/cupcake-profile comm --db $W/profile.db --quick --ops allreduce,allgather --max-bytes $((128<<20));
  $B/tools/cupcake-profile kernels --db $W/profile.db --device cpu --quick --compressors fp32,efsignsgd --max-elements $((32<<20));
  $B/tools/cupcake-plan search --model $model --profile $W/profile.db --compressor efsignsgd --device cpu -o $W/efsignsgd.pb; } > $W/raw/profile.log 2>&1
fi
for i in 1 2 3; do
  for side in main branch; do
    bin=$B/bench/runtime/runtime_bench; [ $side = main ] && bin=$M/bench/runtime/runtime_bench
    out=$W/raw/run$i-$side.txt
    { echo "# $(date -u +%FT%TZ) $(hostname), $(nproc) cores, uptime: $(uptime)"; echo "# side $side, binary $bin";
      "${mp[@]}" $bin --model $model --profile $W/profile.db --plan $W/efsignsgd.pb --warmup 3 --iters 20; } > $out 2>&1
    echo "done $out"
  done
done

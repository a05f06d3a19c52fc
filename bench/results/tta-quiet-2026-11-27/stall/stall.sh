#!/bin/bash
# Where do Cupcake fp32's slow steps at 200 Mbit/s come from? Variants of the cupcake-fp32 arm,
# 60 steps each (target unreachable), on the running testbed.
set -u
cd /work/main
out=/tmp/stall; mkdir -p $out
db=/tmp/tta-quiet/200mbit/profile.db
build/tools/cupcake-plan search --model-name ttadigits --profile $db --compressor fp32 --algorithm one_group -o $out/one.pb > $out/one.txt
export PYTHONPATH=/work/main/build/python OMP_NUM_THREADS=1 MASTER_ADDR=10.77.0.1 MASTER_PORT=29611 GLOO_SOCKET_IFNAME=eth0
base=(scripts/testbed.sh run --mpirun-arg -x --mpirun-arg PYTHONPATH --mpirun-arg -x --mpirun-arg OMP_NUM_THREADS --mpirun-arg -x --mpirun-arg MASTER_ADDR --mpirun-arg -x --mpirun-arg MASTER_PORT --mpirun-arg -x --mpirun-arg GLOO_SOCKET_IFNAME)
tta=(/usr/bin/python3 bench/python/tta.py --model cnn --max-steps 60 --eval-every 60 --target 1 --seed 1 --data /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz)
run() { local name=$1; shift; nice -n -15 "$@" --record $out/$name.json > $out/$name.log 2>&1; echo "$name rc=$?"; }
for round in 1 2; do
run ddp-$round "${base[@]}" -- "${tta[@]}" --arm ddp-fp32 --name ddp
run plan-$round "${base[@]}" -- "${tta[@]}" --arm cupcake --plan /tmp/tta-quiet/200mbit/cupcake-fp32.pb --name plan
run yield-$round "${base[@]}" --mpirun-arg --mca --mpirun-arg mpi_yield_when_idle --mpirun-arg 1 -- "${tta[@]}" --arm cupcake --plan /tmp/tta-quiet/200mbit/cupcake-fp32.pb --name yield
run one-$round "${base[@]}" -- "${tta[@]}" --arm cupcake --plan $out/one.pb --name one
CUPCAKE_BACKEND=gloo run gloo-$round "${base[@]}" --mpirun-arg -x --mpirun-arg CUPCAKE_BACKEND -- "${tta[@]}" --arm cupcake --plan /tmp/tta-quiet/200mbit/cupcake-fp32.pb --name gloo
done
python3 - <<'PY'
import json,glob,os
for f in sorted(glob.glob('/tmp/stall/*.json')):
    r=json.load(open(f)); st=r.get('step_ms') or []
    if not st: print(os.path.basename(f), r.get('status')); continue
    med=sorted(st)[len(st)//2]
    slow=[i for i,x in enumerate(st) if x>1.4*med]
    print(f"{os.path.basename(f):14s} median {med:7.1f} ms  sum {sum(st)/1000:6.2f} s  slow {len(slow)}/{len(st)}  {slow[:12]}")
PY

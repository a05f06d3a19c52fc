#!/bin/bash
set -u
cd /work/main
out=/tmp/stall; mkdir -p $out
export PYTHONPATH=/work/main/build/python OMP_NUM_THREADS=1 MASTER_ADDR=10.77.0.1 MASTER_PORT=29611 GLOO_SOCKET_IFNAME=eth0
base=(scripts/testbed.sh run --mpirun-arg -x --mpirun-arg PYTHONPATH --mpirun-arg -x --mpirun-arg OMP_NUM_THREADS --mpirun-arg -x --mpirun-arg MASTER_ADDR --mpirun-arg -x --mpirun-arg MASTER_PORT --mpirun-arg -x --mpirun-arg GLOO_SOCKET_IFNAME)
tta=(/usr/bin/python3 bench/python/tta.py --model cnn --max-steps 60 --eval-every 60 --target 1 --seed 1 --data /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz --arm cupcake --plan /tmp/tta-quiet/200mbit/cupcake-fp32.pb)
run() { local name=$1; shift; nice -n -15 "$@" --record $out/$name.json > $out/$name.log 2>&1; echo "$name rc=$?"; }
mca() { for a in "$@"; do printf -- '--mpirun-arg\n%s\n' "$a"; done; }
mapfile -t ring < <(mca --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)
mapfile -t rd < <(mca --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 3)
mapfile -t nonbl < <(mca --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 1)
for round in 1 2; do
run ring-$round "${base[@]}" "${ring[@]}" -- "${tta[@]}" --name ring
run rd-$round "${base[@]}" "${rd[@]}" -- "${tta[@]}" --name rd
run basic-$round "${base[@]}" "${nonbl[@]}" -- "${tta[@]}" --name basic
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

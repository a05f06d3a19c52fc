#!/bin/bash
set -u
cd /work/main
out=/tmp/stall5; mkdir -p $out
export PYTHONPATH=/work/main/build/python OMP_NUM_THREADS=1 MASTER_ADDR=10.77.0.1 MASTER_PORT=29611 GLOO_SOCKET_IFNAME=eth0
base=(scripts/testbed.sh run --mpirun-arg -x --mpirun-arg PYTHONPATH --mpirun-arg -x --mpirun-arg OMP_NUM_THREADS --mpirun-arg -x --mpirun-arg MASTER_ADDR --mpirun-arg -x --mpirun-arg MASTER_PORT --mpirun-arg -x --mpirun-arg GLOO_SOCKET_IFNAME)
tta=(/usr/bin/python3 bench/python/tta.py --model cnn --max-steps 60 --eval-every 60 --target 1 --seed 1 --data /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz --arm cupcake --plan /tmp/tta-quiet/200mbit/cupcake-fp32.pb)
for round in 1 2; do
  nice -n -15 "${base[@]}" -- "${tta[@]}" --name base --record $out/base-$round.json > $out/base-$round.log 2>&1
  nice -n -15 "${base[@]}" --mpirun-arg --mca --mpirun-arg btl_tcp_links --mpirun-arg 2 -- "${tta[@]}" --name links2 --record $out/links2-$round.json > $out/links2-$round.log 2>&1
done
python3 - <<'PY'
import json,glob,os
for f in sorted(glob.glob('/tmp/stall5/*.json')):
    r=json.load(open(f)); st=r.get('step_ms') or []
    med=sorted(st)[len(st)//2]
    slow=[i for i,x in enumerate(st) if x>1.4*med]
    print(f"{os.path.basename(f):14s} median {med:7.1f} ms  sum {sum(st)/1000:6.2f} s  slow {len(slow)}/{len(st)}")
PY

#!/bin/bash
# Re-prices an evaluation's plans with its kernel curves measured again, alone and with the
# testbed's ranks in step (cupcake-profile kernels under mpirun), on the same comm curves and
# model times (a copy of DIR/profile.db each), and prints how many runs each profile predicts
# within 10% of their committed measured time (docs/EVALUATION.md, "Kernels timed in step").
# The kernels are swept as evaluate.sh sweeps them for --compressors efsignsgd,topk,fp16 --ratio
# 0.01 (its default). Writes OUT_DIR/{alone,step}.db, log.txt, reprice.json and summary.txt.
#   bench/testbed/reprice_kernels.sh EVAL_DIR HOSTS RANKS_PER_HOST OUT_DIR
set -eu
cd "$(dirname "$0")/../.."
E=$1; H=$2; R=$3; W=$((H*R)); out=$4
mkdir -p "$out"
cp $E/profile.db $out/alone.db; cp $E/profile.db $out/step.db
k="kernels --device cpu --world-size $W --compressors fp32,efsignsgd,topk,fp16,zen --ratios 0.01 --max-elements 8388608 --force"
echo "# $(date -u +%FT%TZ) commit $(git describe --always --dirty), load $(cut -d' ' -f1-3 /proc/loadavg)" > $out/log.txt
build/tools/cupcake-profile $k --db $out/alone.db >> $out/log.txt
scripts/testbed.sh up --hosts $H --ranks-per-host $R --rate 1gbit > /dev/null
scripts/testbed.sh run -- build/tools/cupcake-profile $k --db $out/step.db >> $out/log.txt
scripts/testbed.sh down > /dev/null
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $out/log.txt
python3 - "$E" "$out" <<'PY' | tee "$out/summary.txt"
import json, subprocess, sys, re
E, out = sys.argv[1], sys.argv[2]
rows = json.load(open(E + '/results.json'))
def sim(plan, model, db):
    t = subprocess.run(['build/tools/cupcake-plan', 'simulate', '--plan', plan, '--model-name', model, '--profile', db],
                       capture_output=True, text=True, check=True).stdout
    return float(re.search(r'^iteration\s+([0-9.]+) ms', t, re.M).group(1))
res = []
for r in rows:
    plan = f"{E}/plans/{r['model']}-{r['strategy']}-{r['compressor']}.pb"
    a, s = sim(plan, r['model'], out + '/alone.db'), sim(plan, r['model'], out + '/step.db')
    res.append(dict(model=r['model'], strategy=r['strategy'], compressor=r['compressor'], measured_ms=r['measured_ms'],
                    predicted_ms=r['predicted_ms'], alone_ms=a, in_step_ms=s))
json.dump(res, open(out + '/reprice.json', 'w'), indent=1)
within = lambda k: sum(abs(x['measured_ms'] / x[k] - 1) <= 0.10 for x in res)
print(f"{len(res)} runs within 10%: committed {within('predicted_ms')}, alone now {within('alone_ms')}, in step now {within('in_step_ms')}")
for x in res:
    print(f"{x['model']:7s} {x['strategy']:12s} {x['compressor']:10s} meas {x['measured_ms']:8.1f}  pred {x['predicted_ms']:8.1f} ({x['measured_ms']/x['predicted_ms']:.2f})  alone {x['alone_ms']:8.1f} ({x['measured_ms']/x['alone_ms']:.2f})  in step {x['in_step_ms']:8.1f} ({x['measured_ms']/x['in_step_ms']:.2f})")
PY

#!/bin/bash
# Re-prices the replay evaluations' plans (r1: no start-up, r3: 1000 us) with kernel curves swept
# again warm and cold (cupcake-profile kernels --cache), in step on a 2-host testbed, on each
# evaluation's own comm curves and recorded model, and compares with the measured times.
set -u
cd /work/main
out=/work/eval/replay/reprice
rm -rf "$out"; mkdir -p "$out"
export CUPCAKE_TESTBED_DIR=/run/cupcake-testbed-replay CUPCAKE_TESTBED_PREFIX=cprep CUPCAKE_TESTBED_NET=10.79.0
scripts/testbed.sh up --hosts 2 --ranks-per-host 1 --rate 1gbit > "$out/testbed.log" 2>&1
echo "# $(date -u +%FT%TZ) commit $(git describe --always --dirty), load $(cut -d' ' -f1-3 /proc/loadavg)" > "$out/log.txt"
for E in r1 r3; do
  for cache in warm cold; do
    cp /work/eval/replay/$E/profile.db "$out/$E-$cache.db"
    nice -n -15 scripts/testbed.sh run -- build/tools/cupcake-profile kernels --db "$out/$E-$cache.db" --device cpu \
      --world-size 2 --compressors fp32,efsignsgd,topk,dgc,fp16,zen --ratios 0.01 --max-elements 16777216 \
      --force --cache "$cache" >> "$out/log.txt" 2>&1
  done
done
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/log.txt"
scripts/testbed.sh down > /dev/null 2>&1
python3 - "$out" <<'PY' > "$out/summary.txt" 2>&1
import json, re, subprocess, sys
out = sys.argv[1]
res = []
for E in ("r1", "r3"):
    d = "/work/eval/replay/" + E
    for r in json.load(open(d + "/results.json")):
        plan = f"{d}/plans/{r['model']}-{r['strategy']}-{r['compressor']}.pb"
        row = dict(eval=E, model=r["model"], strategy=r["strategy"], compressor=r["compressor"],
                   measured_ms=r["measured_ms"], predicted_ms=r["predicted_ms"])
        for cache in ("warm", "cold"):
            t = subprocess.run(["build/tools/cupcake-plan", "simulate", "--plan", plan, "--model-name", r["model"],
                                "--profile", f"{out}/{E}-{cache}.db"], capture_output=True, text=True, check=True).stdout
            row[cache + "_ms"] = float(re.search(r"^iteration\s+([0-9.]+) ms", t, re.M).group(1))
        res.append(row)
json.dump(res, open(out + "/reprice.json", "w"), indent=1)
for E in ("r1", "r3"):
    rows = [x for x in res if x["eval"] == E]
    within = lambda k: sum(abs(x["measured_ms"] / x[k] - 1) <= 0.10 for x in rows)
    print(f"{E}: {len(rows)} runs within 10%: as planned {within('predicted_ms')}, warm again {within('warm_ms')}, cold {within('cold_ms')}")
for x in res:
    print(f"{x['eval']} {x['model']:9s} {x['strategy']:12s} {x['compressor']:9s} meas {x['measured_ms']:8.1f}  "
          f"planned {x['predicted_ms']:8.1f} ({x['measured_ms']/x['predicted_ms']:.2f})  warm {x['warm_ms']:8.1f} "
          f"({x['measured_ms']/x['warm_ms']:.2f})  cold {x['cold_ms']:8.1f} ({x['measured_ms']/x['cold_ms']:.2f})")
PY

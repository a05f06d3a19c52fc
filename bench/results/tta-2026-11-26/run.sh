#!/bin/bash
# The time-to-accuracy evaluation on the testbed: one rate per call.
set -u
rate=$1
export CUPCAKE_TESTBED_DIR=/run/ttaeval-$rate CUPCAKE_TESTBED_PREFIX=tte CUPCAKE_TESTBED_NET=10.83.0
cd /work/main
scripts/testbed.sh up --hosts 2 --ranks-per-host 1 --rate $rate
echo "load before: $(uptime)"
bench/python/tta.sh --seeds 1,2,3 --max-steps 600 --testbed --out /work/eval/tta-$rate
echo "rc=$?"
echo "load after: $(uptime)"
scripts/testbed.sh down

#!/bin/bash
# The PowerSGD time-to-accuracy comparison on the testbed, one rate per argument, as run for this
# experiment (the harness's ranks at nice -15: other engineers' builds ran beside it at nice 19).
set -u
cd "$(dirname "$0")/../../.."
for rate in "$@"; do
  scripts/testbed.sh down >/dev/null 2>&1
  scripts/testbed.sh up --hosts 2 --ranks-per-host 1 --rate "$rate" || exit 1
  mkdir -p /tmp/tta-powersgd
  nice -n -15 bench/python/tta.sh --seeds 1,2,3 --max-steps 600 --testbed --ranks 1,2,4 \
    --arms ddp-fp32,ddp-powersgd-1,ddp-powersgd-2,ddp-powersgd-4,powersgd-1,powersgd-2,powersgd-4 \
    --out "/tmp/tta-powersgd/$rate" > "/tmp/tta-powersgd/$rate.console" 2>&1
  echo "$rate rc=$?"
  scripts/testbed.sh down
done

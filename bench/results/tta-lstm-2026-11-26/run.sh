#!/bin/bash
# The LSTM time-to-accuracy comparison on the testbed at one rate.
set -u
cd "$(dirname "$0")/../../.."
rate=$1
scripts/testbed.sh down >/dev/null 2>&1
scripts/testbed.sh up --hosts 2 --ranks-per-host 1 --rate "$rate" || exit 1
mkdir -p /tmp/tta-lstm
nice -n -15 bench/python/tta.sh --model lstm --seeds 1,2,3 --max-steps 400 --testbed --ranks 4 \
  --arms ddp-fp32,ddp-powersgd-4,powersgd-4,topk-0.1,topk-0.01,gravac \
  --out "/tmp/tta-lstm/$rate" > "/tmp/tta-lstm/$rate.console" 2>&1
echo "$rate rc=$?"
scripts/testbed.sh down

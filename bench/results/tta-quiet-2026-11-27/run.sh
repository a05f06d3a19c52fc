#!/bin/bash
# Time to accuracy on an otherwise idle machine: every arm of docs/TTA.md on the digits CNN, one
# rate per argument (testbed 2 hosts x 1 rank); load average logged every 20 s to OUT/load.txt.
# Usage: run.sh OUT RATE [RATE...]
set -u
out="$1"; shift
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
(while :; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 20; done) >> "$out/load.txt" &
logger=$!
trap 'kill $logger' EXIT
for rate in "$@"; do
  scripts/testbed.sh down >/dev/null 2>&1
  scripts/testbed.sh up --hosts 2 --ranks-per-host 1 --rate "$rate" || exit 1
  nice -n -15 bench/python/tta.sh --seeds 1,2,3 --max-steps 600 --testbed --ranks 2,4 \
    --arms ddp-fp32,ddp-fp16,ddp-powersgd-2,ddp-powersgd-4,cupcake-fp32,topk-0.1,topk-0.01,topk-0.001,powersgd-2,powersgd-4,gravac \
    --out "$out/$rate" > "$out/$rate.console" 2>&1
  echo "$rate rc=$?"
  scripts/testbed.sh down
done

#!/bin/bash
# Time to accuracy on an otherwise idle machine for the larger model of docs/TTA.md, the
# character LSTM: DDP fp32, DDP + powerSGD_hook and Cupcake's PowerSGD plans at ranks 2 and 4,
# one rate per argument (testbed 2 hosts x 1 rank); load average logged every 20 s to OUT/load.txt.
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
  nice -n -15 bench/python/tta.sh --model lstm --seeds 1,2,3 --max-steps 400 --testbed --ranks 2,4 \
    --arms ddp-fp32,ddp-powersgd-2,ddp-powersgd-4,powersgd-2,powersgd-4 \
    --out "$out/$rate" > "$out/$rate.console" 2>&1
  echo "$rate rc=$?"
  scripts/testbed.sh down
done

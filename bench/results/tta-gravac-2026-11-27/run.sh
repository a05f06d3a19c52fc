#!/bin/bash
# The quiet window of 2026-11-27 (second session): issue 31's third testbed shape (the digits CNN
# on 4 hosts x 1 rank at 200 Mbit/s), the LSTM at 1 Gbit/s with GraVAC over topk and over PowerSGD
# ranks, then issue 32's checkpoint overhead on an idle machine (train_wide and train_resnet).
# Everything at nice -15, nothing else running; load average logged every 20 s to OUT/load.txt.
# Usage: run.sh OUT
set -u
out="$1"
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
(while :; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 20; done) >> "$out/load.txt" &
logger=$!
trap 'kill $logger' EXIT
echo "start $(date -u +%T)" >> "$out/stages.txt"
scripts/testbed.sh down >/dev/null 2>&1
scripts/testbed.sh up --hosts 4 --ranks-per-host 1 --rate 200mbit || exit 1
nice -n -15 bench/python/tta.sh --np 4 --seeds 1,2,3 --max-steps 600 --testbed --ranks 2 \
  --arms ddp-fp32,ddp-powersgd-2,topk-0.1,topk-0.01,powersgd-2,gravac,gravac-powersgd \
  --out "$out/cnn-4hosts-200mbit" > "$out/cnn-4hosts-200mbit.console" 2>&1
echo "cnn-4hosts-200mbit rc=$? $(date -u +%T)" >> "$out/stages.txt"
scripts/testbed.sh down
scripts/testbed.sh up --hosts 2 --ranks-per-host 1 --rate 1gbit || exit 1
nice -n -15 bench/python/tta.sh --model lstm --seeds 1,2,3 --max-steps 400 --testbed --ranks 2,4 \
  --arms ddp-fp32,topk-0.1,powersgd-4,gravac,gravac-powersgd \
  --out "$out/lstm-2hosts-1gbit" > "$out/lstm-2hosts-1gbit.console" 2>&1
echo "lstm-2hosts-1gbit rc=$? $(date -u +%T)" >> "$out/stages.txt"
scripts/testbed.sh down
for model in wide resnet; do
  nice -n -15 bench/testbed/checkpoint.sh --out "$out/ckpt-$model" --model "$model" > "$out/ckpt-$model.console" 2>&1
  echo "ckpt-$model rc=$? $(date -u +%T)" >> "$out/stages.txt"
done
scripts/testbed.sh down >/dev/null 2>&1

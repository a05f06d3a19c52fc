#!/bin/bash
# Checkpoint overhead at 4 hosts x 1 rank, 1 Gbit/s, train_wide and train_resnet, nothing else
# running; load average every 20 s to OUT/load.txt. Usage: run.sh OUT
set -u
out="$1"
cd "$(dirname "$0")/../../.."
mkdir -p "$out"
(while :; do echo "$(date -u +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 20; done) >> "$out/load.txt" &
logger=$!
trap 'kill $logger' EXIT
for model in wide resnet; do
  nice -n -15 bench/testbed/checkpoint.sh --hosts 4 --out "$out/ckpt-$model" --model "$model" > "$out/ckpt-$model.console" 2>&1
  echo "ckpt-$model rc=$? $(date -u +%T)" >> "$out/stages.txt"
done

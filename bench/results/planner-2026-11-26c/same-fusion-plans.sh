#!/bin/bash
# The fusion search's plans of two cupcake-plan binaries compared byte for byte (cmp): the
# shipped models and resnet50x400 x every compressor x the sample and the 2 x 2 testbed profile,
# --search-space fusion at the default budget (10^8 nodes) and at 10^5 nodes (stopped by the
# budget). The options corpus is ../planner-2026-11-26b/same-plans.sh. Run from the repository root:
#   bench/results/planner-2026-11-26c/same-fusion-plans.sh OLD/cupcake-plan NEW/cupcake-plan
set -u
old=$1 new=$2 tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - examples/models/resnet50.json "$tmp/resnet50x400.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
t = m["tensors"]
m["name"] = "resnet50x400"
m["tensors"] = [dict(t[i % len(t)], name=f"{t[i % len(t)]['name']}#{i // len(t)}") for i in range(400)]
json.dump(m, open(sys.argv[2], "w"))
PY
n=0 bad=0
for prof in examples/profiles/v100-8x8-pcie-25g.json bench/results/evaluation-2026-11-25/2x2-1gbit/profile.db; do
  for m in resnet50 vgg16 bert_base gpt2 ncf resnet50x400; do
    file=examples/models/$m.json
    [ -f "$file" ] || file=$tmp/$m.json
    for c in fp32 fp16 efsignsgd signsgd qsgd topk randk dgc; do
      for a in "" "--budget 100000"; do
        # shellcheck disable=SC2086
        "$old" search --model "$file" --profile "$prof" --compressor $c --search-space fusion $a -o "$tmp/old.pb" >"$tmp/old.txt" 2>&1 || continue
        # shellcheck disable=SC2086
        "$new" search --model "$file" --profile "$prof" --compressor $c --search-space fusion $a -o "$tmp/new.pb" >"$tmp/new.txt" 2>&1
        n=$((n + 1))
        if ! cmp -s "$tmp/old.pb" "$tmp/new.pb"; then bad=$((bad + 1)); echo "DIFF $prof $m $c $a"; fi
      done
    done
  done
done
echo "compared $n, differing $bad"

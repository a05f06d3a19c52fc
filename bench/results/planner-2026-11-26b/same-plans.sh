#!/bin/bash
# Plans of two cupcake-plan binaries compared byte for byte (cmp) on the shipped models and
# resnet50x400, efsignsgd/dgc/topk/fp16, the sample profile and the 2 x 2 testbed profile, with
# --algorithm espresso (10^8 nodes for its fusion groups) and the options search at 2x10^6 and 2x10^7 nodes; prints each case's
# search time ("took") for both.  Run from the repository root:
#   bench/results/planner-2026-11-26b/same-plans.sh OLD/cupcake-plan NEW/cupcake-plan
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
    for c in efsignsgd dgc topk fp16; do
      for a in "--algorithm espresso --budget 100000000" "--budget 2000000" "--budget 20000000"; do
        # shellcheck disable=SC2086
        "$old" search --model "$file" --profile "$prof" --compressor $c --search-space options $a -o "$tmp/old.pb" >"$tmp/old.txt" 2>&1 || continue
        # shellcheck disable=SC2086
        "$new" search --model "$file" --profile "$prof" --compressor $c --search-space options $a -o "$tmp/new.pb" >"$tmp/new.txt" 2>&1
        n=$((n + 1))
        if ! cmp -s "$tmp/old.pb" "$tmp/new.pb"; then bad=$((bad + 1)); echo "DIFF $prof $m $c $a"; fi
        echo "$(basename "$prof") $m $c $a old $(awk '/^took/ {print $2}' "$tmp/old.txt") new $(awk '/^took/ {print $2}' "$tmp/new.txt")"
      done
    done
  done
done
echo "compared $n, differing $bad"

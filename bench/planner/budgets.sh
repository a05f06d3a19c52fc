#!/bin/bash
# The options search (cupcake-plan search --search-space options) at several node budgets on the
# shipped models and resnet50x400 (resnet50's tensor list repeated to 400 tensors, as
# planner_bench builds it) with the sample profile: per case and budget, the plan's predicted
# iteration (ms), proven or the gap to the lower bound, and the search's wall time as the plan's
# summary reports it (docs/PLANNER_BENCH.md, "Budget against time"). One thread, one process at
# a time; run it on an otherwise idle machine. --profile: another profile (a DB or JSON);
# --compressors: a subset (a compressor whose curves the profile lacks: "no plan" and why).
#
#   bench/planner/budgets.sh [--build DIR] [--budgets B1,B2,...] [--profile FILE] [--compressors C1,C2,...]
set -eu -o pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
build=build budgets=1000000,2000000,5000000,100000000 compressors=efsignsgd,dgc,topk,fp16
profile="$here/examples/profiles/v100-8x8-pcie-25g.json"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --budgets) budgets=$2; shift 2 ;;
    --profile) profile=$(realpath "$2"); shift 2 ;;
    --compressors) compressors=$2; shift 2 ;;
    *) sed -n '10p' "$0" | sed 's/^# *//' >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$here/examples/models/resnet50.json" "$tmp/resnet50x400.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
tensors = m["tensors"]
m["name"] = "resnet50x400"
m["tensors"] = [dict(tensors[i % len(tensors)], name=f"{tensors[i % len(tensors)]['name']}#{i // len(tensors)}")
                for i in range(400)]
json.dump(m, open(sys.argv[2], "w"))
EOF
echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ) commit $(git -C "$here" describe --always --dirty), $(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $build/tools/cupcake-plan search --model M --profile $profile --compressor C --search-space options --budget B --format json"
for model in resnet50 vgg16 bert_base gpt2 ncf resnet50x400; do
  file="$here/examples/models/$model.json"
  [ -f "$file" ] || file="$tmp/$model.json"
  for compressor in ${compressors//,/ }; do
    line="$model $compressor"
    for budget in ${budgets//,/ }; do
      summary=$("$build/tools/cupcake-plan" search --model "$file" --profile "$profile" --compressor "$compressor" \
        --search-space options --budget "$budget" -o "$tmp/plan.pb" --format json 2>"$tmp/err") || {
        line="$line | budget $budget: no plan ($(head -1 "$tmp/err"))"
        continue
      }
      line="$line | $(python3 -c '
import json, sys
j = json.load(sys.stdin)
s = j["search"]
proof = "proven" if s["optimal"] else "gap %.2f%%" % (100 * s["gap"])
print("budget %g: %.3f ms, %s, %.0f ms" % (s["budget"], j["iteration_us"] / 1000, proof, 1000 * s["wall_s"]))' <<<"$summary")"
    done
    echo "$line"
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"

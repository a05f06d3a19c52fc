#!/bin/bash
# What the codecs' fixed cost per kernel call is worth to a plan over layer-wise compression: the
# search's predicted iteration and speed-ups on the sample V100 cluster
# (examples/profiles/v100-8x8-pcie-25g.json, an alpha-beta model with the Espresso paper's
# constants, not a measurement), once as shipped and once with every GPU encode and decode curve
# less its fixed cost (its time at the curve's first point; 1 us is kept so that a curve stays
# positive), the only difference between the two profiles. The testbed's CPU codecs have fixed
# costs of microseconds, so the second profile is the paper's cluster with the testbed's kind of
# codec (docs/EVALUATION.md, "The goal over layer-wise").
# Writes OUT/results.json (per profile, model and compressor: the plan's predicted ms and its
# speed-up over each baseline) and OUT/search/*.json (cupcake-plan search --format json).
#
#   bench/planner/fixed_cost.sh OUT [--build DIR] [--models M1,M2,...] [--compressors C1,C2,...]
set -eu -o pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
usage() { sed -n '13p' "$0" | sed 's/^# *//' >&2; exit 2; }
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
out=$1
shift
build=$here/build models=resnet50,bert_base,gpt2,vgg16 compressors=efsignsgd,topk,dgc,fp16
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$(realpath "${2:?}"); shift 2 ;;
    --models) models=${2:?}; shift 2 ;;
    --compressors) compressors=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
plan=$build/tools/cupcake-plan
[ -x "$plan" ] || { echo "fixed_cost: $plan missing; build first (scripts/build.sh)" >&2; exit 1; }
shipped=$here/examples/profiles/v100-8x8-pcie-25g.json
mkdir -p "$out/search"
python3 - "$shipped" "$out/no-fixed-cost.json" <<'EOF'
import json, sys
profile = json.load(open(sys.argv[1]))
for c in profile["curves"]:
    if c["kind"] in ("encode", "decode") and c.get("device") == "gpu":
        fixed = c["points"][0][1]
        c["points"] = [[n, max(us - fixed, 1.0)] for n, us in c["points"]]
profile["cluster"]["source"] += "; GPU encode and decode curves less their fixed cost (bench/planner/fixed_cost.sh)"
json.dump(profile, open(sys.argv[2], "w"), indent=1)
EOF
for variant in shipped no-fixed-cost; do
  profile=$shipped
  [ "$variant" = shipped ] || profile=$out/$variant.json
  for m in ${models//,/ }; do
    for c in ${compressors//,/ }; do
      ratio=()
      case "$c" in topk|randk|dgc) ratio=(--ratio 0.01) ;; esac
      "$plan" search --model "$here/examples/models/$m.json" --profile "$profile" --compressor "$c" "${ratio[@]}" \
        --device gpu --format json -o "$out/search/$variant-$m-$c.pb" >"$out/search/$variant-$m-$c.json"
      rm "$out/search/$variant-$m-$c.pb"
    done
  done
done
python3 - "$out" <<'EOF'
import glob, json, os, sys
out = sys.argv[1]
rows = []
for path in sorted(glob.glob(os.path.join(out, "search", "*.json"))):
    variant, model, compressor = os.path.basename(path)[:-5].rsplit("-", 2)
    j = json.load(open(path))
    rows.append({"profile": variant, "model": model, "compressor": compressor, "groups": j["groups"],
                 "predicted_ms": j["iteration_us"] / 1000, "optimal": j["search"]["optimal"],
                 "speedup": {b["name"]: b["speedup"] for b in j["baselines"]}})
json.dump(rows, open(os.path.join(out, "results.json"), "w"), indent=1)
for r in rows:
    print("%-13s %-9s %-9s %3d groups %9.2f ms%s  %s" % (r["profile"], r["model"], r["compressor"], r["groups"],
          r["predicted_ms"], "" if r["optimal"] else " (not proven optimal)",
          ", ".join("%s %.2fx" % kv for kv in r["speedup"].items())))
EOF

#!/usr/bin/env bash
# A PowerSGD plan (rank 2) for test/python/cnn.py's model, from the profile DB (which holds the
# powersgd kernels: `cupcake-profile kernels --compressors ...,powersgd --rank 2`) with its
# network made 1000x slower, so that PowerSGD pays on a small model and one host; fails unless
# the plan has a PowerSGD group. Shared by device_test.sh and python_test.sh.
# Usage: powersgd_plan.sh DB DEVICE(cpu|gpu) OUT PYTHON CUPCAKE_PROFILE CUPCAKE_PLAN
set -euo pipefail
db="$1" device="$2" out="$3" python="$4" profile_tool="$5" plan_tool="$6"
slow="${out%.pb}-slow-network.json"
"$profile_tool" export --db "$db" | "$python" -c '
import json, sys
profile = json.load(sys.stdin)
for curve in profile["curves"]:
    if curve["kind"] == "comm":
        curve["points"] = [[size, 1000 * us] for size, us in curve["points"]]
json.dump(profile, sys.stdout)' >"$slow"
"$plan_tool" search --model-name pycnn --profile "$slow" --device "$device" --compressor fp32 \
  --search-space options --rank 2 --schemes powersgd -o "$out" >/dev/null
"$plan_tool" show "$out" >"${out%.pb}-plan.txt"
grep -Eq " powersgd (cpu|gpu) " "${out%.pb}-plan.txt" || {
  echo "FAIL: the PowerSGD plan has no PowerSGD group:" >&2; cat "${out%.pb}-plan.txt" >&2; exit 1; }

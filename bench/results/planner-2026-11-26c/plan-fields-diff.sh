#!/bin/bash
# For every case where same-plans.sh reports DIFF (its output on stdin): both plans again, and
# every field that differs between them (protoc --decode_raw against proto/cupcake.proto, so
# doubles are compared bit for bit), with the relative change of numbers. Run from the repository root:
#   bench/results/planner-2026-11-26c/plan-fields-diff.sh OLD/cupcake-plan NEW/cupcake-plan < same-plans-output.txt
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
grep '^DIFF' | while read -r _ prof m c a; do
  file=examples/models/$m.json
  [ -f "$file" ] || file=$tmp/$m.json
  for v in old new; do
    bin=$old; [ $v = new ] && bin=$new
    # shellcheck disable=SC2086
    "$bin" search --model "$file" --profile "$prof" --compressor $c --search-space options $a -o "$tmp/$v.pb" >/dev/null 2>&1
    protoc --proto_path=proto --decode=cupcake.pb.Plan proto/cupcake.proto <"$tmp/$v.pb" >"$tmp/$v.txt"
  done
  python3 - "$tmp/old.txt" "$tmp/new.txt" "$(basename "$prof") $m $c $a" <<'PY'
import sys
a, b = open(sys.argv[1]).read().splitlines(), open(sys.argv[2]).read().splitlines()
out = []
if len(a) != len(b):
    out.append(f"{len(a)} -> {len(b)} lines")
else:
    path = []
    for x, y in zip(a, b):
        key = x.strip().split(":")[0].split(" {")[0]
        if x.strip().endswith("{"): path.append(key)
        elif x.strip() == "}": path.pop()
        elif x != y:
            u, v = x.split(": ", 1)[1], y.split(": ", 1)[1]
            try:
                fu, fv = float(u), float(v)
                out.append(f"{'.'.join(path + [key])}: {u} -> {v} (rel {abs(fv - fu) / abs(fu):.1e})")
            except ValueError:
                out.append(f"{'.'.join(path + [key])}: {u} -> {v}")
print(sys.argv[3] + ": " + ("; ".join(out) if out else "identical fields"))
PY
done

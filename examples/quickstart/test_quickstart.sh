#!/usr/bin/env bash
# docs/GETTING_STARTED.md's CLI commands, then its C++ and C programs on the plan they make, under
# mpirun with 2 ranks: every rank prints the exact mean (an fp32 plan), and an efsignsgd plan runs;
# under 3 ranks the plan for 2 is refused by every rank and the job prints that once
# (test/expect_once.sh; the C program through cupcake_last_error_printed_by).
# Usage: test_quickstart.sh SOURCE_DIR CUPCAKE_PROFILE CUPCAKE_PLAN MPIEXEC QUICKSTART_CPP QUICKSTART_C WORKDIR
set -euo pipefail
src="$1" profile_tool="$2" plan_tool="$3" mpiexec="$4" cpp="$5" c="$6" work="$7"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
launcher=("$mpiexec" --oversubscribe)
if [ "$(id -u)" = 0 ]; then launcher+=(--allow-run-as-root); fi
mpirun=("${launcher[@]}" -np 2)

# The CLI page, as written there.
"${mpirun[@]}" "$profile_tool" comm --db profile.db --quick
"$profile_tool" kernels --db profile.db --device cpu --quick --compressors fp32,efsignsgd
"$profile_tool" import --db profile.db "$src/examples/quickstart/model.json"
"$plan_tool" search --model-name quickstart --profile profile.db --compressor fp32 -o fp32.pb
"$plan_tool" search --model-name quickstart --profile profile.db --compressor efsignsgd -o efsignsgd.pb
"$plan_tool" show efsignsgd.pb >/dev/null

status=0
for prog in "$cpp" "$c"; do
  out="$("${mpirun[@]}" "$prog" fp32.pb)"
  printf '%s\n' "$out"
  lines="$(printf '%s\n' "$out" | grep -c '^rank [01] step [012]: fc1.weight\[0\] = ' || true)"
  # "rank R step S: fc1.weight[0] = V (expected E)": fields 7 and 9.
  wrong="$(printf '%s\n' "$out" | awk '/^rank/ { e = $9; sub(/\)/, "", e); if ($7 != e) print }')"
  if [ "$lines" != 6 ] || [ -n "$wrong" ]; then
    echo "FAIL: $(basename "$prog") with the fp32 plan: expected 6 exact means; got $lines lines, wrong: $wrong"
    status=1
  fi
  "${mpirun[@]}" "$prog" efsignsgd.pb >/dev/null || { echo "FAIL: $(basename "$prog") with the efsignsgd plan"; status=1; }
  sh "$src/test/expect_once.sh" "fp32.pb: world_size: does not match the job; got 2, expected 3" \
    "${launcher[@]}" -np 3 "$prog" fp32.pb || { echo "FAIL: $(basename "$prog"): a plan for 2 ranks under 3"; status=1; }
done
[ "$status" = 0 ] && echo "ok: quickstart: CLI, C++ and C"
exit $status

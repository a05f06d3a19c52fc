#!/usr/bin/env bash
# The main job end to end, as far as it goes today: install what is missing, build, import the
# sample profile and a model into an SQLite profile, inspect it and export it again, then plan
# resnet50 with efsignsgd against the DB (the model taken from the DB by name), which prints the
# plan's summary, and write the plan's predicted timeline as a Chrome trace beside it. Then profile
# this machine into a second DB (4 MPI ranks: `cupcake-profile comm --quick` under mpirun, and the
# CPU compressors: `kernels --device cpu --quick`, seconds both), import resnet50 into it, and
# plan resnet50 with efsignsgd against this machine's profile. (A later issue adds training.)
# Usage: scripts/demo.sh [DB]   (default: build/demo/profile.db)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"  # override to keep several build trees
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh"

profile_tool="$build/tools/cupcake-profile"
plan_tool="$build/tools/cupcake-plan"
db="${1:-$build/demo/profile.db}"
mkdir -p "$(dirname "$db")"
rm -f "$db" "$db-wal" "$db-shm"

set -x
"$profile_tool" import --db "$db" "$root/examples/profiles/v100-8x8-pcie-25g.json"
"$profile_tool" import --db "$db" "$root/examples/models/resnet50.json"
"$profile_tool" inspect --db "$db"
"$profile_tool" export --db "$db" -o "$(dirname "$db")/profile.json"
plan="$(dirname "$db")/resnet50-efsignsgd.pb"
"$plan_tool" search --model-name resnet50 --profile "$db" --compressor efsignsgd --require-optimal -o "$plan"
"$plan_tool" trace "$plan" -o "${plan%.pb}.trace.json"

# This machine's profile: 4 ranks on one host (--oversubscribe: more ranks than cores).
local_db="$(dirname "$db")/local.db"
rm -f "$local_db" "$local_db-wal" "$local_db-shm"
mpirun_flags=(--oversubscribe -np 4)
if [ "$(id -u)" = 0 ]; then mpirun_flags+=(--allow-run-as-root); fi
mpirun "${mpirun_flags[@]}" "$profile_tool" comm --db "$local_db" --quick
"$profile_tool" kernels --db "$local_db" --device cpu --quick
"$profile_tool" import --db "$local_db" "$root/examples/models/resnet50.json"
"$profile_tool" inspect --db "$local_db"
local_plan="$(dirname "$db")/resnet50-efsignsgd-local.pb"
"$plan_tool" search --model-name resnet50 --profile "$local_db" --compressor efsignsgd --require-optimal -o "$local_plan"
set +x
echo "demo: this machine's profile at $local_db, the plan against it at $local_plan"
echo "demo: profile DB at $db (try: sqlite3 $db 'SELECT * FROM curve_points LIMIT 5')"
echo "demo: plan at $plan (try: $plan_tool show $plan); its timeline in ${plan%.pb}.trace.json (open in ui.perfetto.dev)"

#!/usr/bin/env bash
# The main job end to end. Installs what is missing and builds what the demo runs (the two tools
# and the LibTorch examples train_mlp and train_wide; scripts/test.sh builds the rest), then:
#  1. The V100 story: the sample profile of 64 V100 GPUs (an alpha-beta model, not a
#     measurement: the plan's summary says so) and resnet50's backward times recorded on V100s
#     (examples/), imported into an SQLite profile, planned with efsignsgd; the plan's predicted
#     timeline as a Chrome trace beside it.
#  2. This machine: its collectives (4 MPI ranks, `cupcake-profile comm --quick`) and CPU
#     compressors (`kernels --device cpu --quick`) into build/demo/local.db, the backward times of
#     the LibTorch example examples/train_mlp recorded here (`cupcake-profile compute`), and a
#     plan of that model against this machine's profile: every number measured on this machine.
#     (Without LibTorch, train_mlp is not built and this step says so and stops.)
#  3. The gain, measured: where network namespaces are allowed (root), two hosts on a link shaped
#     to 200 Mbit/s (scripts/testbed.sh), profiled and recorded there (train_wide: 24 MiB of
#     gradients), then fp32 in 25 MiB buckets (what DDP does) against the efsignsgd plan, each
#     trained for 10 iterations: measured and predicted iteration times side by side. Elsewhere
#     it says why it was skipped.
# Prints one line per stage and the plans' summaries; everything else (apt, CMake, the tools' own
# output) goes to build/demo/demo.log.
# Usage: scripts/demo.sh [DB]   (the V100 profile DB; default: build/demo/profile.db)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${CUPCAKE_BUILD_DIR:-$root/build}"  # override to keep several build trees
db="${1:-$build/demo/profile.db}"
demo="$(dirname "$db")"
mkdir -p "$demo"
log="$demo/demo.log"
: >"$log"
start=$SECONDS

stage() { echo "demo: [$(( SECONDS - start )) s] $*"; }
# Runs a command with its output in the log; on failure shows the log's tail and stops.
quiet() {
  echo "+ $*" >>"$log"
  "$@" >>"$log" 2>&1 && return 0
  echo "demo: failed: $*; the last lines of $log:" >&2
  tail -n 25 "$log" >&2
  exit 1
}
# Like quiet, but also shows the command's stdout (a plan's summary) and stderr on the terminal.
shown() {
  echo "+ $*" >>"$log"
  local out errors="$demo/.stderr"
  if ! out="$("$@" 2>"$errors")"; then
    cat "$errors" >>"$log"
    echo "demo: failed: $*; the last lines of $log:" >&2
    tail -n 25 "$log" >&2
    exit 1
  fi
  printf '%s\n' "$out" >>"$log"
  printf '%s\n' "$out" | sed 's/^/  /'
  # Warnings (an extrapolated curve, say) are shown too.
  cat "$errors" >>"$log"
  sed 's/^/  /' "$errors" >&2
  rm -f "$errors"
}

stage "installing missing packages and building the demo's targets into $build (log: $log)"
quiet "$root/scripts/install-deps.sh"
quiet "$root/scripts/build.sh" --targets cupcake-profile,cupcake-plan
# The LibTorch examples exist only where CMake found LibTorch.
if ninja -C "$build" -t query train_mlp >/dev/null 2>&1; then
  quiet cmake --build "$build" -j"$(nproc)" --target train_mlp train_wide
fi
profile_tool="$build/tools/cupcake-profile"
plan_tool="$build/tools/cupcake-plan"

stage "1. the V100 story: sample profile (64 V100 GPUs) and resnet50 recorded on V100s -> $db"
rm -f "$db" "$db-wal" "$db-shm"
quiet "$profile_tool" import --db "$db" "$root/examples/profiles/v100-8x8-pcie-25g.json"
quiet "$profile_tool" import --db "$db" "$root/examples/models/resnet50.json"
quiet "$profile_tool" inspect --db "$db"
quiet "$profile_tool" export --db "$db" -o "$demo/profile.json"
plan="$demo/resnet50-efsignsgd.pb"
stage "   plan resnet50 with efsignsgd for the V100 cluster -> $plan"
shown "$plan_tool" search --model-name resnet50 --profile "$db" --compressor efsignsgd --require-optimal -o "$plan"
quiet "$plan_tool" trace "$plan" -o "${plan%.pb}.trace.json"

# This machine: 4 ranks on one host (--oversubscribe: more ranks than cores).
local_db="$demo/local.db"
rm -f "$local_db" "$local_db-wal" "$local_db-shm"
mpirun=(mpirun --oversubscribe -np 4)
if [ "$(id -u)" = 0 ]; then mpirun+=(--allow-run-as-root); fi
stage "2. this machine: collectives over 4 MPI ranks and the CPU compressors (--quick, seconds) -> $local_db"
quiet "${mpirun[@]}" "$profile_tool" comm --db "$local_db" --quick
quiet "$profile_tool" kernels --db "$local_db" --device cpu --quick
train="$build/examples/train_mlp/train_mlp"
if [ ! -x "$train" ]; then
  stage "   no $train (LibTorch not found at configure time): no model recorded on this machine to plan"
  exit 1
fi
stage "   record the backward times of examples/train_mlp (LibTorch, 4 ranks, 20 iterations) into $local_db"
quiet "$profile_tool" compute --db "$local_db" --iterations 20 -- "${mpirun[@]}" "$train"
quiet "$profile_tool" inspect --db "$local_db"
local_plan="$demo/mlp-efsignsgd-local.pb"
stage "   plan mlp with efsignsgd on this machine (its compute, collectives and kernels all measured here) -> $local_plan"
shown "$plan_tool" search --model-name mlp --profile "$local_db" --compressor efsignsgd --require-optimal -o "$local_plan"

# 3. Two hosts at 200 Mbit/s: fp32 buckets against the plan, measured. Its own namespaces, taken
# down at exit.
export CUPCAKE_TESTBED_DIR="$demo/testbed-state" CUPCAKE_TESTBED_PREFIX=cpdemo CUPCAKE_TESTBED_NET=10.76.0
testbed() { "$root/scripts/testbed.sh" "$@"; }
wide="$build/examples/train_wide/train_wide"
if ! why="$(testbed probe 2>&1)"; then
  stage "3. the measured gain: skipped; ${why#testbed: } (the two-host testbed needs root and network namespaces)"
else
  trap 'testbed down >/dev/null 2>&1 || true' EXIT
  tb_db="$demo/testbed.db"
  rm -f "$tb_db" "$tb_db-wal" "$tb_db-shm"
  stage "3. the measured gain: two hosts x 1 rank on a 200 Mbit/s link (scripts/testbed.sh) -> $tb_db"
  quiet testbed up --hosts 2 --ranks-per-host 1 --rate 200mbit
  stage "   profile the link (allreduce, allgather up to 32 MiB) and the CPU kernels; record train_wide there"
  quiet testbed run -- "$profile_tool" comm --db "$tb_db" --ops allreduce,allgather --quick --max-bytes 33554432
  quiet "$profile_tool" kernels --db "$tb_db" --device cpu --quick --compressors fp32,efsignsgd --max-elements 8388608
  quiet "$profile_tool" compute --db "$tb_db" --iterations 5 -- "$root/scripts/testbed.sh" run -- "$wide"
  for arm in "fp32-buckets fp32 --algorithm bucket --bucket-mib 25" "efsignsgd efsignsgd"; do
    read -r name compressor flags <<<"$arm"
    # shellcheck disable=SC2086  # flags: words
    quiet "$plan_tool" search --model-name wide --profile "$tb_db" --compressor "$compressor" --device cpu $flags \
      -o "$demo/wide-$name.pb"
    predicted="$("$plan_tool" show "$demo/wide-$name.pb" | awk '/^predicted/ {print $2}')"
    stage "   train wide with the $name plan (3 warm-up + 7 timed iterations; predicted $predicted ms each)"
    quiet testbed run -- "$wide" --plan "$demo/wide-$name.pb" --epochs 1 --steps 10 --warmup 3 --lr 0.01
    measured="$(sed -n 's/.*timed iterations, median \([0-9.]*\) ms.*/\1/p' "$log" | tail -1)"
    eval "measured_${name//-/_}=$measured predicted_${name//-/_}=$predicted"
  done
  # shellcheck disable=SC2154  # set by the eval above
  stage "   fp32 in 25 MiB buckets: measured $measured_fp32_buckets ms per iteration (predicted $predicted_fp32_buckets ms);" \
    "the efsignsgd plan: measured $measured_efsignsgd ms (predicted $predicted_efsignsgd ms):" \
    "$(awk -v a="$measured_fp32_buckets" -v b="$measured_efsignsgd" 'BEGIN {printf "%.2fx", a / b}') faster, measured" \
    "(median of 7 iterations, slowest rank)"
fi

stage "done. Try:"
echo "  $plan_tool show $local_plan          # summary, legend and one row per group"
echo "  $profile_tool inspect --db $local_db --plot $demo/local.svg   # this machine's curves"
echo "  sqlite3 $db 'SELECT * FROM curve_points LIMIT 5'"
echo "  ${plan%.pb}.trace.json: the V100 plan's predicted timeline (open in ui.perfetto.dev)"
echo "  full log: $log"

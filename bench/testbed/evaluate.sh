#!/usr/bin/env bash
# evaluate.sh: the end-to-end evaluation (docs/EVALUATION.md). On a testbed of H hosts x R ranks
# at RATE (scripts/testbed.sh), as a user would: profile it (`cupcake-profile comm` under the
# testbed's mpirun, `kernels --device cpu` with the ranks in step), record the LibTorch examples' times on it
# (`cupcake-profile compute`), plan every strategy, train with each plan, and compare the
# measured iteration time with the plan's prediction.
#
#   bench/testbed/evaluate.sh --hosts 2 --ranks-per-host 1 --rate 1gbit [--startup-us US] --out DIR
#       [--models resnet,wide,embed | --replay MODEL.json[,MODEL.json] [--compute-scale S]]
#       [--compressors efsignsgd,topk,fp16] [--ratio 0.01] [--iterations 30]
#       [--warmup 5] [--record-iterations 20] [--rounds 3] [--quick] [--max-bytes B] [--max-elements E]
#
# --replay: instead of the LibTorch jobs, the replay job (examples/train_replay: a recorded
# model's forward, backward and update played on an emulated accelerator, scaled by
# --compute-scale, with real buffers and the real runtime) for each model file; the model's
# name is the file's "name". Record mode records the replayed times as the profile sees them
# (the emulation's wake-up costs included), and the sweeps reach the largest model's size
# (comm bytes, kernel elements; 32 MiB and 8 Mi at least) so that the plans interpolate.
#
# Strategies per model: fp32 in 25 MiB buckets (what DDP does), and per compressor layer-wise
# (one group per tensor), one group, 25 MiB buckets, the plan (the optimal fusion search) and
# the options plan (`--search-space options`: per group compress or not, flat, hierarchical or, for
# topk and dgc, Zen; for naturally sparse gradients, Zen on their non-zeros), and the options
# plan of fp32 (the lossless schemes and fp16, per group). --ratio: the ratio of topk, randk and
# dgc (their kernels are profiled at it).
# The runs go round-robin: every strategy trains once per round (its own warm-up, then
# iterations/rounds timed iterations), so a burst of load on the machine falls on several
# strategies rather than on one. Writes DIR/profile.db, DIR/plans/*.pb, DIR/runs/NAME.rK.json
# (round K's iteration times, losses, whether the ranks agree; in the last round, the runtime's
# timeline of the last iteration in DIR/runs/NAME.timeline.json, every strategy's: a miss of
# any of them can be read against its plan),
# DIR/logs/, then DIR/results.json, DIR/README.md and the plots (bench/testbed/report.py).
# --quick: small sweeps and few iterations, to check the pipeline (the ctest testbed_evaluate).
# Exit: 0; 1 a stage failed (its log is named); 2 usage; 77 the machine refuses the testbed.
# The testbed is its own (CUPCAKE_TESTBED_DIR/PREFIX/NET below) and is taken down at exit.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd) me=evaluate
. "$repo/bench/testbed/common.sh"
build=${CUPCAKE_BUILD_DIR:-$repo/build}
hosts=2 rph=1 rate="" startup=0 out="" models=resnet,wide compressors=efsignsgd,topk,fp16 ratio=0.01
iterations=30 warmup=5 record_iterations=20 rounds=3 quick=0 replay="" compute_scale="" models_given=0
max_bytes_flag="" max_elements_flag=""

usage() { sed -n '8,11p' "$0" | sed 's/^# *//' >&2; exit 2; }
# --max-bytes, --max-elements: the comm sweep's largest size and the kernel sweep's largest
# element count, in place of the defaults below (--quick's too); plans read larger groups off
# extrapolated curves (each plan lists them in `extrapolations`).
# The --ratio flag of a search for compressor $1: only for those that select a ratio of the elements.
ratio_flag() { case "$1" in topk|randk|dgc) echo "--ratio $ratio" ;; esac; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=${2:-}; shift 2 ;;
    --ranks-per-host) rph=${2:-}; shift 2 ;;
    --rate) rate=${2:-}; shift 2 ;;
    --startup-us) startup=${2:-}; shift 2 ;;
    --out) out=${2:-}; shift 2 ;;
    --models) models=${2:-}; models_given=1; shift 2 ;;
    --replay) replay=${2:-}; shift 2 ;;
    --compute-scale) compute_scale=${2:-}; shift 2 ;;
    --compressors) compressors=${2:-}; shift 2 ;;
    --ratio) ratio=${2:-}; shift 2 ;;
    --iterations) iterations=${2:-}; shift 2 ;;
    --warmup) warmup=${2:-}; shift 2 ;;
    --record-iterations) record_iterations=${2:-}; shift 2 ;;
    --rounds) rounds=${2:-}; shift 2 ;;
    --quick) quick=1; shift ;;
    --max-bytes) max_bytes_flag=${2:-}; shift 2 ;;
    --max-elements) max_elements_flag=${2:-}; shift 2 ;;
    -h|--help) usage ;;
    *) echo "evaluate: unknown flag $1" >&2; usage ;;
  esac
done
[ -n "$out" ] || { echo "evaluate: --out DIR is required" >&2; usage; }
[ -n "$rate" ] || { echo "evaluate: --rate is required (none, or a tc rate such as 1gbit)" >&2; usage; }
for n in iterations warmup record_iterations rounds max_bytes_flag max_elements_flag; do
  [ -n "${!n}" ] || [[ "$n" != *_flag ]] || continue
  f=${n%_flag}
  [[ "${!n}" =~ ^[0-9]+$ ]] || { echo "evaluate: --${f//_/-}: got '${!n}', expected an integer" >&2; exit 2; }
done
[ "$rounds" -ge 1 ] && [ "$iterations" -ge "$rounds" ] ||
  { echo "evaluate: --iterations $iterations, --rounds $rounds: expected 1 <= rounds <= iterations" >&2; exit 2; }
declare -A model_file=()  # --replay: model name -> its file
if [ -n "$replay" ]; then
  [ "$models_given" = 0 ] || { echo "evaluate: --models and --replay: expected one of them" >&2; exit 2; }
  compute_scale=${compute_scale:-1}
  [[ "$compute_scale" =~ ^[0-9]*\.?[0-9]+$ ]] && awk -v s="$compute_scale" 'BEGIN {exit !(s > 0 && s <= 1000)}' ||
    { echo "evaluate: --compute-scale: got '$compute_scale', expected a number in (0, 1000]" >&2; exit 2; }
  [ -x "$build/examples/train_replay/train_replay" ] ||
    { echo "evaluate: --replay: no job $build/examples/train_replay/train_replay (built with MPI?)" >&2; exit 2; }
  models=""
  for f in ${replay//,/ }; do
    # The model's name: the plans and runs are named MODEL-STRATEGY-COMPRESSOR (report.py splits at '-').
    m=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["name"])' "$f" 2>/dev/null) ||
      { echo "evaluate: --replay: $f: not a readable model file with a \"name\"" >&2; exit 2; }
    [[ "$m" =~ ^[A-Za-z0-9_.]+$ ]] ||
      { echo "evaluate: --replay: $f: name: got '$m', expected letters, digits, '_' or '.'" >&2; exit 2; }
    [ -z "${model_file[$m]:-}" ] || { echo "evaluate: --replay: two files name the model '$m'" >&2; exit 2; }
    model_file[$m]=$(cd "$(dirname "$f")" && pwd)/$(basename "$f")
    models+=${models:+,}$m
  done
else
  [ -z "$compute_scale" ] || { echo "evaluate: --compute-scale: needs --replay" >&2; exit 2; }
  for m in ${models//,/ }; do
    [ -x "$build/examples/train_$m/train_$m" ] ||
      { echo "evaluate: --models: no job $build/examples/train_$m/train_$m (LibTorch examples built?)" >&2; exit 2; }
  done
fi
# The training command of model $1, in the array `job`; the flags its training runs add, in `train_flags`.
job_of() {
  if [ -n "$replay" ]; then
    job=("$build/examples/train_replay/train_replay" --model "${model_file[$1]}" --compute-scale "$compute_scale")
    train_flags=()  # no parameters: no learning rate
  else
    job=("$build/examples/train_$1/train_$1")
    train_flags=(--lr 0.01)
  fi
}
for tool in tools/cupcake-profile tools/cupcake-plan; do
  [ -x "$build/$tool" ] || { echo "evaluate: $build/$tool missing; build first (scripts/build.sh)" >&2; exit 1; }
done
profile_tool=$build/tools/cupcake-profile
plan_tool=$build/tools/cupcake-plan

export CUPCAKE_TESTBED_DIR=${CUPCAKE_TESTBED_DIR:-/run/cupcake-evaluate}
export CUPCAKE_TESTBED_PREFIX=${CUPCAKE_TESTBED_PREFIX:-cceval}
export CUPCAKE_TESTBED_NET=${CUPCAKE_TESTBED_NET:-10.78.0}
testbed probe || exit $?

mkdir -p "$out/plans" "$out/runs" "$out/logs"
out=$(cd "$out" && pwd)
db=$out/profile.db
world=$((hosts * rph))

trap 'testbed down >/dev/null 2>&1 || true' EXIT
log "testbed: $hosts hosts x $rph ranks, rate $rate, start-up $startup us"
stage testbed-up testbed up --hosts "$hosts" --ranks-per-host "$rph" --rate "$rate" --startup-us "$startup"
{
  machine_header "$hosts" "$rph" "$rate"
  if [ -n "$replay" ]; then
    echo "replay=$replay"
    echo "compute_scale=$compute_scale"
    what="--replay $replay --compute-scale $compute_scale"
  else
    what="--models $models"
  fi
  echo "command=bench/testbed/evaluate.sh --hosts $hosts --ranks-per-host $rph --rate $rate$([ "$startup" != 0 ] && echo " --startup-us $startup") --out DIR $what --compressors $compressors --ratio $ratio --iterations $iterations --warmup $warmup --record-iterations $record_iterations --rounds $rounds$([ $quick = 1 ] && echo ' --quick')${max_bytes_flag:+ --max-bytes $max_bytes_flag}${max_elements_flag:+ --max-elements $max_elements_flag}"
} >"$out/machine.txt"

# 1. The cluster: collectives across the testbed, compression kernels on this CPU. Sizes up to
# the largest model's gradients (wide: 25 MiB), so that the plans interpolate.
max_bytes=33554432 max_elements=8388608
if [ -n "$replay" ]; then
  # The largest replayed model's gradients, as a power of two at least the defaults.
  read -r max_bytes max_elements < <(python3 - "$max_bytes" "$max_elements" "${model_file[@]}" <<'PY'
import json, sys
b, e = int(sys.argv[1]), int(sys.argv[2])
n = max(sum(t["numel"] for t in json.load(open(f))["tensors"]) for f in sys.argv[3:])
while e < n: e *= 2
while b < 4 * n: b *= 2
print(b, e)
PY
)
fi
# `spaced`: the iterations of the spaced and busy sweeps (a chained sweep sets its own).
if [ "$quick" = 1 ]; then sweep=(--quick --max-bytes "${max_bytes_flag:-4194304}"); spaced=(); ksweep=(--quick --max-elements "${max_elements_flag:-1048576}")
else sweep=(--rounds 3 --max-bytes "${max_bytes_flag:-$max_bytes}"); spaced=(--warmup 1 --iters 3); ksweep=(--max-elements "${max_elements_flag:-$max_elements}"); fi
# Hierarchical schemes reduce-scatter inside a host; Zen exchanges by alltoall.
ops=allreduce,allgather,alltoall; [ "$rph" -gt 1 ] && ops+=,reduce_scatter
log "profile: comm ($ops) across the testbed"
stage profile-comm testbed run -- "$profile_tool" comm --db "$db" --ops "$ops" "${sweep[@]}" "${spaced[@]}"
# The same on calls back to back: the collectives of groups that queue on the network follow one
# another (docs/MODEL.md, "Chained collectives"). A chain of 3 calls times 2 that follow another,
# so 2 chains per point and round cost about the calls of the spaced sweep's point.
log "profile: comm ($ops) chained"
stage profile-comm-chained testbed run -- "$profile_tool" comm --db "$db" --ops "$ops" --chained "${sweep[@]}" \
  --warmup 0 --iters 2
# The same beside a busy core per rank: the LibTorch jobs' backward shares the cores with the
# collectives that overlap it (docs/MODEL.md, "Busy cores"). Not for --replay: its emulated
# accelerator sleeps through backward and leaves the cores free, as a GPU job's does.
if [ -z "$replay" ]; then
  log "profile: comm ($ops) beside busy cores"
  stage profile-comm-busy testbed run -- "$profile_tool" comm --db "$db" --ops "$ops" --busy "${sweep[@]}" "${spaced[@]}"
fi
# 2. The models' forward, backward and update times and their gradients' densities, recorded on
# the testbed.
for m in ${models//,/ }; do
  job_of "$m"
  log "record: $m ($record_iterations iterations on $world ranks)"
  stage "record-$m" "$profile_tool" compute --db "$db" --iterations "$record_iterations" -- \
    "$repo/scripts/testbed.sh" run -- "${job[@]}"
done

# 3. Compression kernels on this CPU, every rank sweeping at once, in step, as the jobs run them
# (docs/PROFILER.md).
kcompressors=fp32,$compressors  # fp16 too: the options search offers fp16 for any compressor's groups
[[ ",$compressors," == *,fp16,* ]] || kcompressors+=,fp16
# Zen's host work, for the options search's zen scheme (topk and dgc payloads).
[[ ",$compressors," =~ ,(topk|dgc), ]] && [ "$world" -ge 2 ] && kcompressors+=,zen
# Naturally sparse gradients (a recorded density <= 1/2): the zen_sparse scheme's scan, and
# Zen's curves, at each model's sparse share too (docs/MODEL.md, "Naturally sparse gradients").
kratios=$ratio
stage export-models "$profile_tool" export --db "$db" -o "$out/logs/recorded.json"
sparse=$(python3 - "$out/logs/recorded.json" <<'PY'
import json, sys
shares = set()
for m in json.load(open(sys.argv[1])).get("models", []):
    ts = [t for t in m["tensors"] if t.get("density", 1) <= 0.5]  # kSparseDensityLimit (catalogue.h)
    if ts:
        # ExpectedNonzeros (catalogue.h): density x numel rounded half away from zero, in [1, numel]
        nz = sum(max(1, min(t["numel"], int(t["density"] * t["numel"] + 0.5))) for t in ts)
        shares.add(nz / sum(t["numel"] for t in ts))  # the planner's sparse_density, bit for bit
print(",".join(repr(x) for x in sorted(shares)))
PY
)
if [ -n "$sparse" ] && [ "$world" -ge 2 ]; then
  kcompressors+=,nonzero
  [[ ",$kcompressors," == *,zen,* ]] || kcompressors+=,zen
  kratios=$(echo "$ratio,$sparse" | tr , '\n' | sort -g -u | paste -sd,)
fi
log "profile: kernels on the CPU ($kcompressors; ratios $kratios), the testbed's ranks in step"
stage profile-kernels testbed run -- "$profile_tool" kernels --db "$db" --device cpu --world-size "$world" \
  --compressors "$kcompressors" --ratios "$kratios" "${ksweep[@]}"

# 4. Plans. A strategy is "STRATEGY COMPRESSOR". The options plan of fp32 chooses among the
# lossless schemes (and fp16) per group.
strategies=("fp32_bucket fp32" "options fp32")
for c in ${compressors//,/ }; do
  for s in layerwise one_group bucket plan options; do strategies+=("$s $c"); done
done
for m in ${models//,/ }; do
  for sc in "${strategies[@]}"; do
    read -r s c <<<"$sc"
    name="$m-$s-$c"
    case "$s" in
      plan) algorithm=(--algorithm branch_and_bound) ;;
      options) algorithm=(--algorithm branch_and_bound --search-space options) ;;
      fp32_bucket|bucket) algorithm=(--algorithm bucket --bucket-mib 25) ;;
      *) algorithm=(--algorithm "$s") ;;
    esac
    # shellcheck disable=SC2046  # ratio_flag prints two words or none
    stage "plan-$name" "$plan_tool" search --model-name "$m" --profile "$db" --compressor "$c" --device cpu \
      $(ratio_flag "$c") "${algorithm[@]}" -o "$out/plans/$name.pb"
    "$plan_tool" show "$out/plans/$name.pb" --format json >"$out/plans/$name.json"
  done
done

# 5. Runs, round-robin over the strategies; the last round records their timelines.
for ((round = 1; round <= rounds; round++)); do
  timed=$(((iterations * round) / rounds - (iterations * (round - 1)) / rounds))
  for m in ${models//,/ }; do
    for sc in "${strategies[@]}"; do
      read -r s c <<<"$sc"
      name="$m-$s-$c"
      timeline=()
      [ "$round" = "$rounds" ] && timeline=(--timeline "$out/runs/$name.timeline.json")
      job_of "$m"
      log "train: $name, round $round of $rounds ($warmup + $timed iterations)"
      stage "train-$name.r$round" testbed run -- "${job[@]}" --plan "$out/plans/$name.pb" \
        --epochs 1 --steps $((warmup + timed)) --warmup "$warmup" "${train_flags[@]}" \
        --timing "$out/runs/$name.r$round.json" "${timeline[@]}"
    done
  done
done
machine_footer

# 6. The report.
log "report: $out/results.json, $out/README.md, plots"
stage report python3 "$repo/bench/testbed/report.py" "$out"
cat "$out/summary.txt"

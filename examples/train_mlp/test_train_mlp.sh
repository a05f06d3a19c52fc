#!/usr/bin/env bash
# The training path end to end with 2 ranks: profile this machine (comm --quick under mpirun,
# kernels --quick), record train_mlp's model with `cupcake-profile compute`, plan it with fp32,
# efsignsgd and topk, train 3 epochs x 10 steps with each plan and check the loss fell; then a
# topk ladder with --adapt 5 (GraVAC): the loss falls and every window printed its decision.
# Usage: test_train_mlp.sh TRAIN_MLP CUPCAKE_PROFILE CUPCAKE_PLAN MPIEXEC WORKDIR
set -euo pipefail
train="$1" profile_tool="$2" plan_tool="$3" mpiexec="$4" work="$5"
rm -rf "$work" && mkdir -p "$work"
db="$work/profile.db"
mpirun=("$mpiexec" --oversubscribe -np 2)
if [ "$(id -u)" = 0 ]; then mpirun+=(--allow-run-as-root); fi

"${mpirun[@]}" "$profile_tool" comm --db "$db" --quick --ops allreduce,allgather
"$profile_tool" kernels --db "$db" --device cpu --quick --compressors fp32,efsignsgd,topk
"$profile_tool" compute --db "$db" --iterations 5 -- "${mpirun[@]}" "$train"

status=0
for c in fp32 efsignsgd topk; do
  "$plan_tool" search --model-name mlp --profile "$db" --compressor "$c" -o "$work/mlp-$c.pb"
  "${mpirun[@]}" "$train" --plan "$work/mlp-$c.pb" --epochs 3 --steps 10 | tee "$work/$c.log"
  first="$(awk '/^epoch 0 loss/ {print $4}' "$work/$c.log")"
  last="$(awk '/^epoch 3 loss/ {print $4}' "$work/$c.log")"
  if [ -z "$first" ] || [ -z "$last" ] || ! awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.9 * a)}'; then
    echo "FAIL: $c: the loss did not fall by 10%; got epoch 0 '$first', epoch 3 '$last'"
    status=1
  else
    echo "ok: $c: loss $first -> $last"
  fi
done

"$plan_tool" search --model-name mlp --profile "$db" --compressor topk --ratios 0.1,0.01 -o "$work/mlp-ladder.pb"
"${mpirun[@]}" "$train" --plan "$work/mlp-ladder.pb" --epochs 3 --steps 10 --adapt 5 | tee "$work/adapt.log"
first="$(awk '/^epoch 0 loss/ {print $4}' "$work/adapt.log")"
last="$(awk '/^epoch 3 loss/ {print $4}' "$work/adapt.log")"
windows="$(grep -c '^gravac: steps ' "$work/adapt.log" || true)"
if [ -z "$first" ] || [ -z "$last" ] || ! awk -v a="$first" -v b="$last" 'BEGIN {exit !(b < 0.9 * a)}' ||
   [ "$windows" != 6 ]; then
  echo "FAIL: --adapt 5: expected the loss to fall by 10% and 6 decisions; got epoch 0 '$first', epoch 3 '$last', $windows decisions"
  status=1
else
  echo "ok: --adapt 5: loss $first -> $last, $windows decisions"
fi
exit $status

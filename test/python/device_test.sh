#!/usr/bin/env bash
# The Python package in one worker under a torchrun-style launcher, on DEVICE (cpu or cuda): the
# whole user path at world size 1, a fresh profile each time.
#   1. profile: comm over gloo (the launcher's store), the codecs' kernels on DEVICE (--quick);
#   2. record test/python/cnn.py's model on DEVICE (`cupcake-profile compute -- LAUNCHER ...
#      record_job.py`; on cuda the recorder times the device's kernels through CUPTI) and check it;
#   3. plan fp32 (one group, layer-wise), efsignsgd, topk and PowerSGD (rank 2) for DEVICE (PowerSGD
#      from the profile with its network made 1000x slower: at world size 1 it would not pay),
#      and a topk ladder (ratios 0.1, 0.01);
#   4. device_job.py with those plans (cuda: NCCL sessions on GPU memory), GraVAC over the ladder.
# Runs in ctest on cpu (python_device_np1, under torchrun_like.py) and on a GPU machine on cuda
# (bench/gpu/python.sh, under that machine's torchrun).
# Usage: device_test.sh DEVICE WORK PYTHON CUPCAKE_PROFILE CUPCAKE_PLAN LAUNCHER...
#   LAUNCHER: a command that starts one worker as torchrun does (e.g. torchrun --nproc_per_node 1)
# Exit 77 (ctest: skipped) only when PYTHON cannot import torch.
set -euo pipefail
device="$1" work="$2" python="$3" profile_tool="$4" plan_tool="$5"
shift 5
launcher=("$@")
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "SKIP: $python cannot import torch; install python3-torch (scripts/install-deps.sh) to run the Python tests"
  exit 77
fi
case "$device" in
  cpu) plan_device=cpu ;;
  cuda) plan_device=gpu ;;
  *) echo "device_test.sh: DEVICE: expected cpu or cuda; got '$device'" >&2; exit 2 ;;
esac
export CUPCAKE_TEST_DEVICE="$device" OMP_NUM_THREADS=1
rm -rf "$work" && mkdir -p "$work/store"
db="$work/profile.db"

"${launcher[@]}" "$profile_tool" comm --db "$db" --quick --ops allreduce,allgather --backend gloo \
  --store "$work/store" >"$work/comm.log"
"$profile_tool" kernels --db "$db" --device "$plan_device" --quick --compressors fp32,efsignsgd,topk,powersgd \
  --rank 2 >"$work/kernels.log"
"$profile_tool" compute --db "$db" --iterations 5 -- "${launcher[@]}" "$python" "$here/record_job.py" \
  "$work/order.json"
"$profile_tool" export --db "$db" --model pycnn | "$python" "$here/check_model.py" "$work/order.json"

plan() { "$plan_tool" search --model-name pycnn --profile "$db" --device "$plan_device" "$@" >/dev/null; }
for c in fp32 efsignsgd topk; do
  plan --compressor "$c" -o "$work/pycnn-$c.pb"
done
plan --compressor fp32 --algorithm layerwise -o "$work/pycnn-fp32-layerwise.pb"
plan --compressor topk --ratios 0.1,0.01 -o "$work/pycnn-topk-ladder.pb"
"$here/powersgd_plan.sh" "$db" "$plan_device" "$work/pycnn-powersgd.pb" "$python" "$profile_tool" "$plan_tool"

"${launcher[@]}" "$python" "$here/device_job.py" "$work"

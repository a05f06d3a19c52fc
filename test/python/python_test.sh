#!/usr/bin/env bash
# The Python package's tests under mpirun with 2 ranks (docs/PYTHON.md), one stage per ctest:
#   record      profile this machine (--quick), record test/python/cnn.py's model with
#               `cupcake-profile compute -- mpirun ... record_job.py`, check the imported model,
#               plan it: fp32 (one group and layer-wise), efsignsgd, topk, a topk ladder, PowerSGD (rank 2, on
#               the profile with its network 1000x slower: powersgd_plan.sh) (the other stages' fixture)
#   fp32        fp32_job.py with both fp32 plans, and with MPI initialized by the job
#   compressed  compressed_job.py with the efsignsgd and topk plans
#   replicas    replicas_job.py: differently seeded ranks start equal (the initial broadcast)
#   ladder      ladder_job.py: a topk ladder, the fp32 rung then use_ratio(0.01)
#   gravac      gravac_job.py: the topk ladder with adapt=GraVAC(...), its decisions and log
#   checkpoint  checkpoint_job.py (docs/CHECKPOINT.md): per plan (fp32, topk with error feedback, PowerSGD
#               with its error feedback and Q, no DistributedOptimizer with Adam, and that with fc1.weight
#               laid out transposed, which goes through a host copy as a CUDA tensor does) an uninterrupted run,
#               a run killed right after commit(7) (topk, PowerSGD: once that copy is done) and its restart,
#               whose final weights must equal the uninterrupted run's bit for bit;
#               then topk with replicas, killed at 7, rank 1's segments deleted: restored from rank 0's
#               replica and rank 0's shared state; with 1-byte chunks the same loss leaves no common step;
#               out-of-range replica options are refused; the replicas' exchanges and the session's
#               collectives share the session's gate; rank 1's parameters changed by one bit fail the
#               next commit on every rank naming the entry; then topk persisted every 4 steps, killed at
#               10, its segments deleted: restored from step 8, then step 12 persisted in pieces
#               between the session's collectives
#   launch      launch_job.py under mpirun and under torchrun_like.py (torchrun's variables, no MPI; Debian's
#               torchrun itself fails at start): the same plans (fp32, fp32 layer-wise, topk) train to the
#               same parameters on every rank, bit for bit; also with torch.distributed initialized by
#               the job; and launch_check.py: the launch errors and choices in one process
#   errors      errors_job.py (another model's plan, a withheld gradient, no plan, world size), and
#               another model's plan and no plan (a UsageError) uncaught under mpirun and
#               torchrun_like.py: printed once per job
#   example     the README's record, plan, train with examples/python/train.py (a few steps)
# Usage: python_test.sh STAGE WORK PYTHON MPIEXEC CUPCAKE_PROFILE CUPCAKE_PLAN
# Exit 77 (ctest: skipped) only when PYTHON cannot import torch (python3-torch absent).
set -euo pipefail
stage="$1" work="$2" python="$3" mpiexec="$4" profile_tool="$5" plan_tool="$6"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if ! "$python" -c "import torch" 2>/dev/null; then
  echo "SKIP: $python cannot import torch; install python3-torch (scripts/install-deps.sh) to run the Python tests"
  exit 77
fi
mpirun=("$mpiexec" --oversubscribe -np 2)
if [ "$(id -u)" = 0 ]; then mpirun+=(--allow-run-as-root); fi
export OMP_NUM_THREADS=1

case "$stage" in
  record)
    rm -rf "$work" && mkdir -p "$work"
    db="$work/profile.db"
    "${mpirun[@]}" "$profile_tool" comm --db "$db" --quick --ops allreduce,allgather >"$work/comm.log"
    "$profile_tool" kernels --db "$db" --device cpu --quick --compressors fp32,efsignsgd,topk,powersgd --rank 2 \
      >"$work/kernels.log"
    "$profile_tool" compute --db "$db" --iterations 5 -- "${mpirun[@]}" "$python" "$here/record_job.py" "$work/order.json"
    "$profile_tool" export --db "$db" --model pycnn | "$python" "$here/check_model.py" "$work/order.json"
    for c in fp32 efsignsgd topk; do
      "$plan_tool" search --model-name pycnn --profile "$db" --compressor "$c" -o "$work/pycnn-$c.pb" >/dev/null
    done
    "$plan_tool" search --model-name pycnn --profile "$db" --compressor fp32 --algorithm layerwise \
      -o "$work/pycnn-fp32-layerwise.pb" >/dev/null
    "$plan_tool" search --model-name pycnn --profile "$db" --compressor topk --ratios 0.1,0.01 \
      -o "$work/pycnn-topk-ladder.pb" >/dev/null
    "$here/powersgd_plan.sh" "$db" cpu "$work/pycnn-powersgd.pb" "$python" "$profile_tool" "$plan_tool"
    echo "ok: plans in $work"
    ;;
  fp32)
    for plan in pycnn-fp32 pycnn-fp32-layerwise; do
      rm -f "$work/$plan.store"
      "${mpirun[@]}" "$python" "$here/fp32_job.py" "$work/$plan.pb" "$work/$plan.store"
    done
    rm -f "$work/job-mpi.store"
    "${mpirun[@]}" "$python" "$here/fp32_job.py" "$work/pycnn-fp32.pb" "$work/job-mpi.store" --job-mpi
    ;;
  compressed)
    for c in efsignsgd topk; do
      rm -f "$work/$c.store"
      "${mpirun[@]}" "$python" "$here/compressed_job.py" "$work/pycnn-$c.pb" "$work/$c.store"
    done
    ;;
  ladder)
    rm -f "$work/ladder.store"
    "${mpirun[@]}" "$python" "$here/ladder_job.py" "$work/pycnn-topk-ladder.pb" "$work/ladder.store"
    ;;
  gravac)
    rm -f "$work/gravac.store" "$work/gravac-decisions.jsonl"
    "${mpirun[@]}" "$python" "$here/gravac_job.py" "$work/pycnn-topk-ladder.pb" "$work/gravac.store" \
      "$work/gravac-decisions.jsonl"
    ;;
  replicas)
    rm -f "$work/replicas.store"
    "${mpirun[@]}" "$python" "$here/replicas_job.py" "$work/pycnn-fp32.pb" "$work/replicas.store"
    ;;
  checkpoint)
    # Unique segment names per run; whatever a failing run leaves in /dev/shm is removed on exit.
    tag="ckpt-test-$$"
    trap 'rm -f /dev/shm/cupcake-$tag-* ; rm -rf "$work/ckpt-persist"' EXIT
    job=("$python" "$here/checkpoint_job.py")
    for variant in fp32 topk powersgd local strided; do
      plan="$work/pycnn-$variant.pb" extra=()
      if [ "$variant" = local ] || [ "$variant" = strided ]; then plan=-; fi
      if [ "$variant" = strided ]; then extra=(--strided); fi
      name="$tag-$variant"
      # topk, powersgd: killed once the copy of step 7 is done, so the restart must resume from exactly 7.
      wait_flag=() starts=6,7
      if [ "$variant" = topk ] || [ "$variant" = powersgd ]; then wait_flag=(--wait-before-kill) starts=7; fi
      "${mpirun[@]}" "${job[@]}" "$plan" "$work/ckpt-$variant-ref" --steps 12 --no-ckpt "${extra[@]}"
      if "${mpirun[@]}" "${job[@]}" "$plan" "$work/ckpt-$variant" --steps 12 --name "$name" --kill-at 7 \
          "${wait_flag[@]}" "${extra[@]}" >"$work/ckpt-$variant-killed.log" 2>&1; then
        echo "FAIL: $variant: the run killed at step 7 exited 0"; exit 1
      fi
      ls /dev/shm/cupcake-"$name"-0 /dev/shm/cupcake-"$name"-1 >/dev/null  # the snapshots outlived the processes
      if [ "$variant" = fp32 ]; then  # another model: refused naming the entry, nothing written
        "${mpirun[@]}" "${job[@]}" "$plan" "$work/ckpt-wrong" --steps 12 --name "$name" --wrong-model
      fi
      # Step 7 when both copies finished before the kill, else 6 (a torn slot is never restored).
      "${mpirun[@]}" "${job[@]}" "$plan" "$work/ckpt-$variant" --steps 12 --name "$name" \
        --compare "$work/ckpt-$variant-ref" --expect-start "$starts" --remove "${extra[@]}"
    done
    # Replicas: rank 1's host loses its memory after the kill (its own, outgoing and replica
    # segments). Commit(7) sent step 6, the newest complete copy (step 7's goes at Commit(8)), so
    # rank 1's snapshot of step 6 comes back from rank 0's replica.
    name="$tag-replica"
    if "${mpirun[@]}" "${job[@]}" "$work/pycnn-topk.pb" "$work/ckpt-replica" --steps 12 --name "$name" --replicate \
        --kill-at 7 --wait-before-kill >"$work/ckpt-replica-killed.log" 2>&1; then
      echo "FAIL: replica: the run killed at step 7 exited 0"; exit 1
    fi
    rm -f /dev/shm/cupcake-"$name"-1 /dev/shm/cupcake-"$name"-1-replica-0 /dev/shm/cupcake-"$name"-1-outgoing
    # Its exchanges and the session's collectives share the session's gate (--check-gate).
    "${mpirun[@]}" "${job[@]}" "$work/pycnn-topk.pb" "$work/ckpt-replica" --steps 12 --name "$name" --replicate \
      --compare "$work/ckpt-topk-ref" --expect-start 6 --check-gate --remove | tee "$work/ckpt-replica.log"
    grep -q "from rank 0's /dev/shm/cupcake-$name-0-replica-1, its shared entries from rank 0" "$work/ckpt-replica.log" ||
      { echo "FAIL: replica: rank 1 did not restore from rank 0's replica and its shared state"; exit 1; }
    # Chunks of 1 byte (replica_chunk_bytes reaches the C++ options; m = 3 on one host: the next
    # rank): after 7 commits no replica is complete, so rank 1's lost memory leaves no common step.
    name="$tag-chunks"
    if "${mpirun[@]}" "${job[@]}" "$work/pycnn-topk.pb" "$work/ckpt-chunks" --steps 12 --name "$name" --replicate \
        --replica-chunk-bytes 1 --replica-group-hosts 3 --kill-at 7 --wait-before-kill \
        >"$work/ckpt-chunks-killed.log" 2>&1; then
      echo "FAIL: chunks: the run killed at step 7 exited 0"; exit 1
    fi
    rm -f /dev/shm/cupcake-"$name"-1 /dev/shm/cupcake-"$name"-1-replica-0 /dev/shm/cupcake-"$name"-1-outgoing
    if "${mpirun[@]}" "${job[@]}" "$work/pycnn-topk.pb" "$work/ckpt-chunks" --steps 12 --name "$name" --replicate \
        --replica-chunk-bytes 1 --replica-group-hosts 3 >"$work/ckpt-chunks.log" 2>&1; then
      echo "FAIL: chunks: a restart with no complete replica of rank 1 succeeded"; exit 1
    fi
    grep -q "no step is held by every rank" "$work/ckpt-chunks.log" ||
      { echo "FAIL: chunks: the restart failed, but not for want of a common step:"; cat "$work/ckpt-chunks.log"; exit 1; }
    "${mpirun[@]}" "${job[@]}" "$work/pycnn-topk.pb" "$work/ckpt-bad" --steps 1 --name "$tag-bad" --bad-options
    # Shared state that differs between the ranks (rank 1's conv1.weight, one bit after step 4):
    # commit(5) raises on every rank naming the entry and step 4.
    "${mpirun[@]}" "${job[@]}" "$work/pycnn-topk.pb" "$work/ckpt-diverge" --steps 6 --name "$tag-diverge" \
      --diverge-at 4 --remove
    # Persisted: every 4 steps; the hosts' memory is lost after the kill (segments deleted). The
    # kill comes once step 8's file is written (--wait-before-kill: ckpt.flush()), which a loaded
    # machine may not have done two steps later on its own.
    rm -rf "$work/ckpt-persist" && mkdir -p "$work/ckpt-persist"
    name="$tag-persist"
    if "${mpirun[@]}" "${job[@]}" "$work/pycnn-topk.pb" "$work/ckpt-persist" --steps 12 --name "$name" \
        --persist "$work/ckpt-persist" --persist-every 4 --kill-at 10 --wait-before-kill \
        >"$work/ckpt-persist-killed.log" 2>&1; then
      echo "FAIL: persist: the run killed at step 10 exited 0"; exit 1
    fi
    rm -f /dev/shm/cupcake-"$name"-*
    # The restart persists step 12 in pieces of 4096 bytes between the session's collectives.
    "${mpirun[@]}" "${job[@]}" "$work/pycnn-topk.pb" "$work/ckpt-persist" --steps 12 --name "$name" \
      --persist "$work/ckpt-persist" --persist-every 4 --persist-chunk-bytes 4096 --compare "$work/ckpt-topk-ref" \
      --expect-start 8 --remove
    ;;
  launch)
    torchrun=("$python" "$here/torchrun_like.py" --nproc_per_node 2 --timeout 100 --)
    for plan in pycnn-fp32 pycnn-fp32-layerwise pycnn-topk; do
      out="$work/launch-$plan"
      rm -f "$out"-*.rank*
      "${mpirun[@]}" "$python" "$here/launch_job.py" "$work/$plan.pb" "$out-mpi" mpi
      "${torchrun[@]}" "$python" "$here/launch_job.py" "$work/$plan.pb" "$out-torchrun" gloo
      runs=("$out-mpi.rank1" "$out-torchrun.rank0" "$out-torchrun.rank1")
      if [ "$plan" = pycnn-fp32 ]; then
        "${torchrun[@]}" "$python" "$here/launch_job.py" "$work/$plan.pb" "$out-dist" gloo --init-dist
        runs+=("$out-dist.rank0" "$out-dist.rank1")
      fi
      for f in "${runs[@]}"; do
        cmp "$out-mpi.rank0" "$f" || { echo "FAIL: $plan: $f differs from $out-mpi.rank0 (mpirun, rank 0)"; exit 1; }
      done
      echo "ok: $plan: the same parameters under mpirun and torchrun, every rank"
    done
    # The launch choices and errors, one process each (launch_check.py).
    "$python" "$here/launch_check.py"
    ;;
  errors)
    "${mpirun[@]}" "$python" "$here/errors_job.py" "$work"
    # One rank against a plan for 2: refused when the optimizer is made.
    "$python" "$here/errors_job.py" --world-size "$work"
    # Uncaught, an error every rank raises alike: a plan for another model (cupcake.Error, the
    # ranks agree on it) and no plan (a UsageError, the same misuse on every rank). The job's
    # output (every rank's, and the launcher's) holds the error once, with one traceback; the job
    # exits non-zero. Under mpirun, and under torchrun_like.py (gloo) where the package has gloo.
    launchers=(mpirun)
    if "$python" -c "import sys, cupcake; sys.exit(0 if cupcake.built_with_gloo() else 1)"; then
      launchers+=(torchrun)
    fi
    for launcher in "${launchers[@]}"; do
      run=("${mpirun[@]}")
      if [ "$launcher" = torchrun ]; then run=("$python" "$here/torchrun_like.py" --nproc_per_node 2 --timeout 100 --); fi
      for case in "uncaught:the job's gradient is not the plan's" "uncaught-misuse:DistributedOptimizer: no plan;"; do
        flag="${case%%:*}" text="${case#*:}"
        log="$work/$flag-$launcher.log"
        if "${run[@]}" "$python" "$here/errors_job.py" "--$flag" "$work" >"$log" 2>&1; then
          echo "FAIL: $flag ($launcher): the job exited 0"; cat "$log"; exit 1
        fi
        errors=$(grep -cF "$text" "$log" || true)
        tracebacks=$(grep -c "^Traceback" "$log" || true)
        if [ "$errors" != 1 ] || [ "$tracebacks" != 1 ]; then
          echo "FAIL: $flag ($launcher): expected '$text' once with one traceback; got it $errors times with" \
            "$tracebacks tracebacks in:"
          cat "$log"; exit 1
        fi
        echo "ok: $flag ($launcher): '$text' printed once, the job exited non-zero"
      done
    done
    ;;
  example)
    # The README's Python commands on examples/python/train.py: record (into the fixture's
    # profile), plan, train a few steps; the loss is printed for every epoch.
    db="$work/profile.db"
    example="$here/../../examples/python/train.py"
    "$profile_tool" compute --db "$db" --replace --iterations 3 -- "${mpirun[@]}" "$python" "$example" --width 8
    "$plan_tool" search --model-name cnn --profile "$db" --compressor efsignsgd -o "$work/cnn.pb" >/dev/null
    "${mpirun[@]}" "$python" "$example" --plan "$work/cnn.pb" --width 8 --epochs 2 --steps 3 | tee "$work/example.log"
    grep -q '^epoch 2 loss [0-9.]* ' "$work/example.log" || { echo "FAIL: no 'epoch 2 loss' line"; exit 1; }
    ;;
  *)
    echo "python_test.sh: unknown stage '$stage'; expected record, fp32, compressed, replicas, ladder, gravac, checkpoint, launch, errors or example" >&2
    exit 2
    ;;
esac

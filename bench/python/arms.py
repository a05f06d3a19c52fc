"""The arms the Python benchmarks compare (ddp_compare.py, tta.py), built one way for both so that
"DDP with the PowerSGD hook" means the same job in every table (docs/PYTHON.md).

  wrap(arm, model, make_sgd, ...) -> (model_to_call, optimizer)
  finish(arm, opt)      the job's last call, once its results are written

arm: one of DDP_ARMS (torch DDP over gloo; torch.distributed must be initialized first) or
"cupcake" (cupcake.torch.DistributedOptimizer over `plan`; record mode when plan is None and
CUPCAKE_RECORD is set). make_sgd(module) -> a torch.optim.Optimizer over module's parameters:
called once, on the DDP wrapper for DDP arms and on the model itself for Cupcake.
"""

import os
import sys

import torch
import torch.distributed as dist

DDP_ARMS = ("ddp-fp32", "ddp-fp16", "ddp-powersgd")


def percentile(values, q):
    """The nearest-rank q-quantile (0 <= q <= 1) of a non-empty sequence."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def wrap(arm, model, make_sgd, *, bucket_mib=25, powersgd_rank=4, plan=None, model_name=None, adapt=None):
    """The arm's (model, optimizer). adapt (Cupcake only): passed to DistributedOptimizer as
    adapt= when not None (an adaptive controller over a ladder plan, e.g. cupcake.torch.GraVAC)."""
    if arm == "cupcake":
        import cupcake.torch
        extra = {} if adapt is None else {"adapt": adapt}
        return model, cupcake.torch.DistributedOptimizer(make_sgd(model), model.named_parameters(), plan=plan,
                                                         model_name=model_name, **extra)
    if arm not in DDP_ARMS:
        raise ValueError("arm: unknown; got %r, expected cupcake or one of %s" % (arm, ", ".join(DDP_ARMS)))
    if arm == "ddp-powersgd":
        # One bucket size throughout: torch 1.13's powerSGD_hook issues its later allreduces from
        # gloo's callback threads, so two buckets in flight (DDP's 1 MiB first bucket and the rest)
        # reach gloo in different orders on different ranks and the job aborts ("op.preamble.length
        # <= op.nbytes"). With the first bucket as large as the others, a model under 25 MiB is one.
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(bucket_mib * 2**20)
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mib)
    if arm == "ddp-fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif arm == "ddp-powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        # PowerSGD from the second step on (vanilla allreduce before: its warm-up), so every timed
        # iteration compresses; error feedback and warm start as the hook's defaults.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=powersgd_rank,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp, make_sgd(ddp)


def finish(arm, opt):
    """Ends the process once its results are written: the optimizer closed, torch.distributed
    left. DDP arms skip the interpreter's finalization (os._exit after flushing): with torch 1.13
    over gloo, rank 0 of a finished `tta.py --arm ddp-fp32` job hung for 10 minutes at exit, its
    main thread in ~Reducer -> ~ProcessGroupGloo joining a gloo worker that waited for the GIL to
    free a tensor (gdb, 2026-11-26; once in about 15 DDP runs, under load). Nothing is left to do then, and no MPI
    to finalize (a DDP arm never starts Cupcake's). Cupcake arms exit normally: the package
    finalizes MPI at exit, as mpirun expects."""
    if hasattr(opt, "close"):
        opt.close()
    sys.stdout.flush()
    sys.stderr.flush()
    if arm in DDP_ARMS:
        os._exit(0)
    dist.destroy_process_group()

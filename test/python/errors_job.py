"""The errors a job sees, as Python exceptions carrying the runtime's message (texts pinned here).
Under mpirun with 2 ranks: a plan for another model (the first tensor that differs is named), a
gradient withheld on every rank (synchronize() names the missing tensors after the timeout), a
gradient computed twice before step(), no plan and no CUPCAKE_RECORD, record mode's kernel time
where there is no GPU (this suite runs on Debian's CPU-only torch). With --world-size, one
process against a plan for 2 ranks. With --uncaught, a plan for another model left uncaught, and
with --uncaught-misuse, no plan and no CUPCAKE_RECORD (a cupcake.torch.UsageError) left uncaught:
the job dies, and python_test.sh checks that its output holds the error once. The expected
indices come from the gradient-ready order the record stage found with tensor hooks
(WORK/order.json), not from the package.
Usage: errors_job.py WORK | errors_job.py --world-size WORK | errors_job.py --uncaught WORK |
       errors_job.py --uncaught-misuse WORK"""

import json
import os
import re
import sys
import traceback

import torch

import cnn
import cupcake
import cupcake.torch
from expect import expect_raises


def train_step(model, opt, step, use_head2=True):
    x, y = cnn.batch(0, step)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x, use_head2=use_head2), y).backward()
    opt.step()


def other_model(work, order):
    """conv1 with 6 channels instead of 8: conv2.weight is the first tensor in ready order to differ."""
    plan = os.path.join(work, "pycnn-fp32.pb")
    model = cnn.make_model(channels=6)
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                             plan=plan)
    i = order.index("conv2.weight")
    pattern = (re.escape("%s: tensor %d: the job's gradient is not the plan's; got 'conv2.weight' with 864 elements "
                         "(the job's gradient %d), expected 'conv2.weight' with 1152 elements (the plan's model pycnn)"
                         % (plan, i, i)))
    e = expect_raises("another model's plan", lambda: train_step(model, opt, 0), cupcake.Error, pattern=pattern)
    inside = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.endswith(os.path.join("cupcake", "torch.py"))]
    if len(inside) != 1:
        sys.exit("FAIL: another model's plan: the traceback shows %d frames of cupcake/torch.py, expected 1 (the "
                 "public call):\n%s" % (len(inside), "".join(traceback.format_list(inside))))
    if not isinstance(e, RuntimeError) or e.code != "INVALID_ARGUMENT":
        sys.exit("FAIL: another model's plan: got %s with code %r, expected a RuntimeError with code "
                 "'INVALID_ARGUMENT'" % (type(e).__name__, getattr(e, "code", None)))
    # Every rank found it alike (the ranks agreed on it): raised on every rank, printed by rank 0.
    if e.reporter != 0:
        sys.exit("FAIL: another model's plan: reporter %r, expected 0 (every rank raises it alike)" % (e.reporter,))
    opt.close()


def uncaught_other_model(work):
    """A plan for another model, not caught: the job dies, printing the error once (rank 0)."""
    model = cnn.make_model(channels=6)
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                             plan=os.path.join(work, "pycnn-fp32.pb"))
    train_step(model, opt, 0)


def withheld_gradient(work, order, rank):
    """Step 1 leaves head2 out of the forward on every rank: its two gradients never arrive."""
    model = cnn.make_model()
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                             plan=os.path.join(work, "pycnn-fp32.pb"), timeout_s=1.5)
    train_step(model, opt, 0)
    missing = ", ".join("%d ('%s')" % (order.index(n), n) for n in ("head2.bias", "head2.weight"))
    pattern = (re.escape("Synchronize: gradients never became ready; got no GradientReady within 1.5 s for 2 of 10 "
                         "tensors: %s (iteration 1, rank %d on " % (missing, rank)))
    e = expect_raises("withheld gradient", lambda: train_step(model, opt, 1, use_head2=False), cupcake.Error,
                      pattern=pattern)
    if e.code != "DEADLINE_EXCEEDED":
        sys.exit("FAIL: withheld gradient: code %r, expected 'DEADLINE_EXCEEDED'" % e.code)
    if e.reporter is not None:  # this rank's own finding (it names the rank): printed by each rank
        sys.exit("FAIL: withheld gradient: reporter %r, expected None" % (e.reporter,))
    opt.close()


def gradient_twice(work):
    model = cnn.make_model()
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                                             plan=os.path.join(work, "pycnn-fp32.pb"))
    train_step(model, opt, 0)
    x, y = cnn.batch(0, 1)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    pattern = re.escape("DistributedOptimizer: parameter 'head2.bias': gradient computed 2 times since the last "
                        "step(); expected 1 (backward_passes_per_step)")
    expect_raises("two backward passes", lambda: torch.nn.functional.cross_entropy(model(x), y).backward(),
                  cupcake.Error, pattern=pattern)
    opt.synchronize()  # the first pass's collective is under way; closing mid-step would abort the job
    opt.close()


def no_plan():
    os.environ.pop("CUPCAKE_RECORD", None)
    model = cnn.make_model()
    pattern = re.escape("DistributedOptimizer: no plan; expected plan='PLAN.pb' (cupcake-plan search), or "
                        "CUPCAKE_RECORD set for record mode (cupcake-profile compute --db DB -- CMD)")
    e = expect_raises("no plan", lambda: cupcake.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters()), ValueError, pattern=pattern)
    # Every rank makes the same mistake: a UsageError (still a ValueError), printed by rank 0.
    if not isinstance(e, cupcake.torch.UsageError) or e.reporter != 0:
        sys.exit("FAIL: no plan: got %s with reporter %r, expected cupcake.torch.UsageError with reporter 0"
                 % (type(e).__name__, getattr(e, "reporter", None)))


def uncaught_no_plan():
    """No plan and no CUPCAKE_RECORD, not caught: the job dies, printing the error once (rank 0)."""
    os.environ.pop("CUPCAKE_RECORD", None)
    model = cnn.make_model()
    cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())


def world_size(work):
    plan = os.path.join(work, "pycnn-fp32.pb")
    model = cnn.make_model()
    pattern = re.escape("%s: world_size: does not match the job; got 2, expected 1 (ranks in the communicator)" % plan)
    expect_raises("world size", lambda: cupcake.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), plan=plan), cupcake.Error,
        pattern=pattern)
    print("ok: errors: a plan for 2 ranks refused by 1")


def kernel_time_without_a_gpu():
    """Record mode's kernel time (cupcake.kernel_time_source(), what record mode uses for CUDA
    parameters) where there is no GPU: a CUPTI build opens the source and the first iteration
    says why it cannot time kernels (CUPTI at begin_backward, or CUDA at the flush); a build
    without CUPTI names the fix. (On a GPU, libruntime's RecorderKernelTime test records with
    the same source.)"""
    try:
        source = cupcake.kernel_time_source()
    except cupcake.Error as e:
        if str(e) == ("this build has no CUPTI; build with the CUDA toolkit's CUPTI (extras/CUPTI) and "
                      "-DCUPCAKE_WITH_CUPTI=ON") or str(e).startswith("cupti: "):
            return
        sys.exit("FAIL: kernel_time_source: unexpected error: %s" % e)
    if cupcake.kernel_time_source() is not source:
        sys.exit("FAIL: kernel_time_source: a second source was opened; expected one per process")
    recorder = cupcake.Recorder("mlp", source)
    recorder.register("fc.bias", 10)

    def one_iteration():
        recorder.begin_backward()
        recorder.gradient_ready(0)

    expect_raises("kernel time without a GPU", one_iteration, cupcake.Error,
                  pattern=r"^(recorder: BeginBackward: kernel time: cupti: |"
                          r"recorder: GradientReady\(0\): kernel time; iteration 0 abandoned: cuda: )")


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "--world-size":
        world_size(sys.argv[2])
        return
    if sys.argv[1] == "--uncaught":
        uncaught_other_model(sys.argv[2])
        sys.exit("FAIL: another model's plan: no error raised")
    if sys.argv[1] == "--uncaught-misuse":
        uncaught_no_plan()
        sys.exit("FAIL: no plan: no error raised")
    work = sys.argv[1]
    rank, _ = cnn.mpi_rank_size()
    order = [entry[0] for entry in json.load(open(os.path.join(work, "order.json")))]  # [name, numel, shape]
    other_model(work, order)
    gradient_twice(work)  # its steps (60 s timeout) also bring the ranks together for the next one
    withheld_gradient(work, order, rank)  # step 0 must finish within its 1.5 s timeout
    no_plan()
    kernel_time_without_a_gpu()
    if rank == 0:
        print("ok: errors: another model's plan, a withheld gradient, a gradient twice, no plan, kernel time "
              "without a GPU")


if __name__ == "__main__":
    main()

"""fp32 plan, under mpirun with 2 ranks: after every step each parameter's gradient equals, bit for
bit, the average over ranks that torch.distributed (gloo) computes from the same local gradients,
and both models' weights stay equal. The same with gradient accumulation (2 backward passes per
step), with zero_grad(set_to_none=True) (the hook copies a new p.grad into the runtime's buffer),
and an LR scheduler on both optimizers (the state_dicts compared at the end),
and with synchronize() before step() (clipping between them). With --job-mpi the job initializes
MPI itself first (as with mpi4py): the package then uses it and leaves finalizing to the job.
Usage: fp32_job.py PLAN STORE_FILE [--job-mpi]"""

import ctypes
import sys

import torch
import torch.distributed as dist

import cnn
import cupcake.torch
from expect import check_in_place

STEPS = 6


def reference_average(model):
    """The definition: sum over ranks with gloo, divided by the world size."""
    size = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad.div_(size)


def check_equal(what, step, ours, theirs, rank):
    for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
        x, y = (a.grad, b.grad) if what == "gradient" else (a, b)
        if not torch.equal(x, y):
            diff = (x - y).abs().max().item()
            sys.exit("FAIL: rank %d step %d: %s of '%s' differs from torch.distributed's average; max |diff| %g"
                     % (rank, step, what, name, diff))


def check_ranks_differ(model, rank):
    """The local gradients differ between ranks (else the average would prove nothing)."""
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(g) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, g)
    if torch.equal(gathered[0], gathered[1]):
        sys.exit("FAIL: rank %d: the ranks' local gradients are equal; the test needs them to differ" % rank)


def check_state_dict(ours, theirs, rank):
    """The wrapped optimizer's state (momentum buffers, the scheduled lr) is the reference's."""
    if [g["lr"] for g in ours["param_groups"]] != [g["lr"] for g in theirs["param_groups"]]:
        sys.exit("FAIL: rank %d: state_dict lr %s, expected %s" % (rank, [g["lr"] for g in ours["param_groups"]],
                                                                   [g["lr"] for g in theirs["param_groups"]]))
    if sorted(ours["state"]) != sorted(theirs["state"]) or not all(
            torch.equal(ours["state"][k]["momentum_buffer"], theirs["state"][k]["momentum_buffer"])
            for k in theirs["state"]):
        sys.exit("FAIL: rank %d: state_dict momentum buffers differ from the reference's" % rank)


def run(plan, rank, passes=1, set_to_none=False, clip=False):
    ours, theirs = cnn.make_model(), cnn.make_model()
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9),
                                             ours.named_parameters(), plan=plan, backward_passes_per_step=passes)
    ref = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    # Passed through: an LR scheduler on the wrapped optimizer, and its state_dict.
    schedulers = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in (opt, ref)]
    for step in range(STEPS):
        opt.zero_grad(set_to_none=set_to_none)
        ref.zero_grad(set_to_none=set_to_none)
        for k in range(passes):
            x, y = cnn.batch(rank, step * passes + k)
            torch.nn.functional.cross_entropy(ours(x), y).backward()
            torch.nn.functional.cross_entropy(theirs(x), y).backward()
        if step == 0:
            check_ranks_differ(theirs, rank)
        reference_average(theirs)
        if clip:
            opt.synchronize()
            torch.nn.utils.clip_grad_norm_(ours.parameters(), 0.5)
            torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
            with opt.skip_synchronize():
                opt.step()
        else:
            opt.synchronize()
            check_equal("gradient", step, ours, theirs, rank)
            opt.step()
        ref.step()
        check_equal("gradient", step, ours, theirs, rank)
        check_equal("weight", step, ours, theirs, rank)
        check_in_place(opt, rank)
        for scheduler in schedulers:
            scheduler.step()
    check_state_dict(opt.state_dict(), ref.state_dict(), rank)
    opt.close()
    return "passes=%d set_to_none=%s clip=%s" % (passes, set_to_none, clip)


def init_mpi_as_the_job():
    """MPI_Init_thread called by the job itself (as mpi4py would), before the package is used."""
    libmpi = ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
    provided = ctypes.c_int(0)
    if libmpi.MPI_Init_thread(None, None, 3, ctypes.byref(provided)) != 0:  # 3: MPI_THREAD_MULTIPLE (Open MPI)
        sys.exit("FAIL: MPI_Init_thread")
    return libmpi


def main():
    plan, store = sys.argv[1], sys.argv[2]
    job_mpi = sys.argv[3:] == ["--job-mpi"]
    libmpi = init_mpi_as_the_job() if job_mpi else None
    torch.set_num_threads(1)
    rank, size = cnn.init_gloo(store)
    if size != 2:
        sys.exit("FAIL: expected 2 ranks (mpirun -np 2); got %d" % size)
    if cupcake.mpi().owns_mpi == job_mpi:
        sys.exit("FAIL: rank %d: cupcake.mpi().owns_mpi is %s with the job's MPI %s" % (rank, not job_mpi,
                 "initialized" if job_mpi else "not initialized"))
    configs = ({},) if job_mpi else ({}, {"passes": 2}, {"set_to_none": True}, {"clip": True})
    for kwargs in configs:
        what = run(plan, rank, **kwargs)
        if rank == 0:
            print("ok: fp32 %s%s: %d steps, every gradient and weight equal to gloo's average"
                  % (what, ", MPI initialized by the job" if job_mpi else "", STEPS))
    dist.destroy_process_group()
    if libmpi is not None:
        libmpi.MPI_Finalize()  # the job's to finalize; the package leaves it alone


if __name__ == "__main__":
    main()

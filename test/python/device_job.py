"""DistributedOptimizer in one worker under torchrun, on the device CUPCAKE_TEST_DEVICE names (cnn.py):
cpu (the gloo session), or cuda (a NCCL session on GPU memory: bench/gpu/python.sh on a GPU
machine; one GPU holds one NCCL rank, so one worker is what one GPU can check).
- fp32 plans (one group, layer-wise): after every synchronize() each p.grad equals a twin model's
  local gradient bit for bit (the average over one rank), the weights stay equal under SGD with
  momentum, and every p.grad is the next slice of one flat buffer on the parameters' device.
- compressed plans (efsignsgd, topk, PowerSGD): 100 steps at lr 0.01; the synchronized gradient differs from
  the local one at some step (the codec ran), everything stays finite, and the evaluation loss
  falls by at least a quarter.
- GraVAC over a topk ladder (adapt=GraVAC, window 10): one decision per window, each naming the
  ladder's rungs, gains in (0, 1], a compressed rung sent, and the loss falling by a quarter.
- a Checkpointer over the topk plan (on cuda its tensors go through pinned host copies): 5 steps
  committed, then a new model, optimizer and Checkpointer restore step 5 and train to step 8,
  ending bit for bit with an uninterrupted run's weights (the residuals are in the snapshot).
- parameters on two devices (cuda only): the ValueError of docs/PYTHON.md.
Usage: device_job.py PLAN_DIR (the plans pycnn-<name>.pb of test/python/device_test.sh)"""

import os
import sys

import torch

import cnn
import cupcake
import cupcake.torch
from expect import check_in_place

FP32_PLANS = ("fp32", "fp32-layerwise")
COMPRESSED_PLANS = ("efsignsgd", "topk", "powersgd")


def fail(message):
    sys.exit("FAIL: device_job (%s): %s" % (cnn.DEVICE, message))


def fp32(plan_dir, plan):
    ours, theirs = cnn.make_model(), cnn.make_model()
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(ours.parameters(), lr=0.05, momentum=0.9),
                                             ours.named_parameters(), plan=os.path.join(plan_dir, "pycnn-%s.pb" % plan))
    ref = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9)
    for step in range(6):
        opt.zero_grad()
        ref.zero_grad()
        x, y = cnn.batch(0, step)
        torch.nn.functional.cross_entropy(ours(x), y).backward()
        torch.nn.functional.cross_entropy(theirs(x), y).backward()
        opt.synchronize()
        for what, pairs in (("gradient", lambda a, b: (a.grad, b.grad)), ("weight", lambda a, b: (a, b))):
            for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
                if not torch.equal(*pairs(a, b)):
                    fail("%s: step %d: the %s of '%s' differs from the local one; max |diff| %g"
                         % (plan, step, what, name, (pairs(a, b)[0] - pairs(a, b)[1]).abs().max().item()))
        with opt.skip_synchronize():
            opt.step()
        ref.step()
        check_in_place(opt)
    opt.close()
    print("ok: %s on %s: 6 steps, gradients and weights equal to the local ones bit for bit" % (plan, cnn.DEVICE))


def compressed(plan_dir, plan):
    model, shadow = cnn.make_model(), cnn.make_model()
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                             model.named_parameters(), plan=os.path.join(plan_dir, "pycnn-%s.pb" % plan))
    first, changed, steps = cnn.eval_loss(model), 0, 100
    for step in range(steps):
        x, y = cnn.batch(0, step)
        shadow.load_state_dict(model.state_dict())
        shadow.zero_grad()
        torch.nn.functional.cross_entropy(shadow(x), y).backward()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        g = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        if not torch.isfinite(g).all():
            fail("%s: step %d: a synchronized gradient is not finite" % (plan, step))
        changed += int(not torch.equal(g, torch.cat([p.grad.reshape(-1) for p in shadow.parameters()])))
        with opt.skip_synchronize():
            opt.step()
    last = cnn.eval_loss(model)
    opt.close()
    if changed == 0:
        fail("%s: the synchronized gradient equalled the local one at every step (no codec ran)" % plan)
    if not last < 0.75 * first:
        fail("%s: the loss did not fall by a quarter; got %.4f -> %.4f after %d steps" % (plan, first, last, steps))
    print("ok: %s on %s: %d steps, compressed at %d, loss %.4f -> %.4f" % (plan, cnn.DEVICE, steps, changed, first, last))


def adaptive(plan_dir):
    model = cnn.make_model()
    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                             model.named_parameters(),
                                             plan=os.path.join(plan_dir, "pycnn-topk-ladder.pb"),
                                             adapt=cupcake.torch.GraVAC(window=10, epsilon=0.01, omega=0.01))
    first, steps = cnn.eval_loss(model), 100
    for step in range(steps):
        x, y = cnn.batch(0, step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    last, ratios, decisions = cnn.eval_loss(model), opt.ratios, opt.decisions
    opt.close()
    if len(decisions) != steps // 10:
        fail("gravac: %d decisions after %d steps of windows of 10; expected %d" % (len(decisions), steps, steps // 10))
    for d in decisions:
        if d["ratio"] not in ratios or d["next_ratio"] not in ratios or not 0 < d["gain_c"] <= d["gain_min"] <= 1:
            fail("gravac: decision %r: expected rungs of %r and 0 < gain_c <= gain_min <= 1" % (d, ratios))
    sent = sorted({d["ratio"] for d in decisions})
    if sent[0] == 1:
        fail("gravac: only the fp32 rung was sent; expected a topk rung at epsilon 0.01")
    if not last < 0.75 * first:
        fail("gravac: the loss did not fall by a quarter; got %.4f -> %.4f after %d steps" % (first, last, steps))
    print("ok: gravac on %s: %d windows, ratios sent %s, loss %.4f -> %.4f" % (cnn.DEVICE, len(decisions), sent,
                                                                             first, last))


def checkpoint(plan_dir):
    name = "device-job-%d" % os.getpid()
    plan = os.path.join(plan_dir, "pycnn-topk.pb")

    def train(first, last, ckpt_name=None):
        model = cnn.make_model()
        opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                                                 model.named_parameters(), plan=plan)
        ckpt = cupcake.torch.Checkpointer(model, opt, name=ckpt_name) if ckpt_name else None
        start = ckpt.restore() if ckpt else 0
        if start != first - 1:
            fail("checkpoint: restore() returned step %d, expected %d" % (start, first - 1))
        for step in range(first, last + 1):
            x, y = cnn.batch(0, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if ckpt:
                ckpt.commit(step)
        if ckpt:
            ckpt.close()
        opt.close()
        return [p.detach().cpu() for p in model.parameters()]

    want = train(1, 8)
    train(1, 5, name)
    got = train(6, 8, name)
    cupcake.torch.Checkpointer.remove(name)
    for i, (g, w) in enumerate(zip(got, want)):
        if not torch.equal(g.view(torch.int32), w.view(torch.int32)):
            fail("checkpoint: parameter %d after a restore at step 5 differs from the uninterrupted run's" % i)
    print("ok: checkpoint on %s: restored step 5, %d parameters bitwise equal after step 8" % (cnn.DEVICE, len(got)))


def two_devices(plan_dir):
    model = cnn.make_model()
    model.fc2.to("cpu")
    try:
        cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model.named_parameters(),
                                           plan=os.path.join(plan_dir, "pycnn-fp32.pb"))
    except ValueError as e:
        expected = "DistributedOptimizer: parameter 'fc2.weight': got device cpu, expected %s" % next(model.parameters()).device
        if not str(e).startswith(expected):
            fail("parameters on two devices: got %r, expected it to start with %r" % (str(e), expected))
        print("ok: parameters on two devices refused: %s" % e)
        return
    fail("parameters on two devices: no ValueError")


def main():
    plan_dir = sys.argv[1]
    torch.set_num_threads(1)
    # The twin's gradients are the reference bit for bit: cuDNN's convolution backward may
    # otherwise pick algorithms whose sums differ from run to run.
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if cupcake.torch.size() != 1:
        fail("expected one worker; got %d" % cupcake.torch.size())
    for plan in FP32_PLANS:
        fp32(plan_dir, plan)
    for plan in COMPRESSED_PLANS:
        compressed(plan_dir, plan)
    adaptive(plan_dir)
    checkpoint(plan_dir)
    if cnn.DEVICE.type == "cuda":
        two_devices(plan_dir)


if __name__ == "__main__":
    main()

"""PyTorch front end: DistributedOptimizer in Horovod's shape over Cupcake's runtime.

    opt = cupcake.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             model.named_parameters(), plan="plan.pb")
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # hooks hand each gradient to the runtime as it is ready
        opt.step()                        # waits for the average over ranks, then steps

How it works (docs/PYTHON.md):
  1. Each parameter's gradient accumulator (its AccumulateGrad node) gets a hook that fires once
     the parameter's gradient of this backward pass is in `p.grad`.
  2. The first backward discovers the gradient-ready order (the order the hooks fire, the same
     on every rank for the same graph). At the first step() the gradients move into one flat
     buffer laid out in that order and each `p.grad` becomes a view of it, so the runtime works
     on the framework's memory in place: no copies from then on (autograd accumulates into an
     existing `p.grad` in place; a `p.grad` replaced by the job, e.g. zero_grad(set_to_none=True),
     is copied in by the hook and pointed back at the buffer after synchronization).
  3. With a plan: a runtime Session (MPI under mpirun, gloo under torchrun, on CPU memory; NCCL
     on the current CUDA device for CUDA parameters, bootstrapped through either; cupcake.init)
     registers the buffer's slices in that order, and each hook calls
     GradientReady(i), so groups are encoded and exchanged while backward goes on; step() calls
     synchronize() (every gradient averaged over ranks per the plan) and then the wrapped
     optimizer's step.
  4. With no plan and CUPCAKE_RECORD set (`cupcake-profile compute -- CMD` sets it): record
     mode. After the discovery iteration a runtime Recorder times CUPCAKE_RECORD_ITERATIONS
     iterations (forward from the first module call after step(), backward from
     torch.autograd.backward, each gradient from its hook, the update to the end of step()),
     merges the ranks (the slowest rank's ready times), rank 0 writes the model file, and the
     job exits 0 (exit_after_record=False: training goes on, unsynchronized). Gradients are not
     averaged while recording.

Errors of the runtime raise cupcake.Error (a RuntimeError) with the runtime's message: a plan for
another model names the first tensor that differs; a gradient missing at synchronize() after
`timeout_s` names the missing tensors. An error every rank raises alike (agreed between the
ranks: a plan for another model or world size, ranks with different plans) carries `reporter`,
the rank that prints it: while this module is imported, sys.excepthook prints such an uncaught
error on that rank only, so a job shows it once (every rank still raises it, and exits 1). Misuse
raises UsageError, a ValueError with `reporter` 0: every rank runs the same script with the same
arguments and makes the same mistake, after joining the job (cupcake.launch()), so rank 0 prints it.
"""

import atexit
import contextlib
import copy
import functools
import io
import json
import os
import sys
import types

import torch

import cupcake

__all__ = ["DistributedOptimizer", "Error", "UsageError", "broadcast_parameters", "broadcast_optimizer_state", "rank",
           "size", "local_rank", "local_size"]

Error = cupcake.Error


class UsageError(ValueError):
    """Misuse of this module's API (no plan and no CUPCAKE_RECORD, a parameter that is not float32,
    a name twice, an option out of range). Every rank runs the same script with the same
    arguments, so every rank raises it alike; it is raised after the rank joined the job
    (cupcake.launch()), so that no rank leaves before the others reach it. `reporter`, 0, is the
    rank that prints it when it is not caught, as for a cupcake.Error the ranks agree on."""
    reporter = 0


def _print_once(kind, value, tb):
    """sys.excepthook while cupcake.torch is imported: an uncaught cupcake.Error that every rank
    of the job raised alike (its `reporter` is set: a plan for another model, ranks that run
    different plans) or UsageError is printed by the rank `reporter` alone; the other ranks print
    nothing and exit 1 all the same. Everything else goes to the hook that was there before."""
    reporter = getattr(value, "reporter", None) if isinstance(value, (Error, UsageError)) else None
    rank = cupcake.known_rank() if reporter is not None else None
    if rank is not None and rank != reporter:
        return
    _previous_excepthook(kind, value, tb)


_previous_excepthook = sys.excepthook
sys.excepthook = _print_once


def _raised_here(fn):
    """The runtime's errors and UsageError surface at the caller's frame: their message says what
    went wrong and where (plan, tensor, rank), the package's internal frames add nothing to read."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (Error, UsageError) as e:
            raise e.with_traceback(None)
    return call


_RECORD_ENV = "CUPCAKE_RECORD"
_RECORD_ITERATIONS_ENV = "CUPCAKE_RECORD_ITERATIONS"


def rank():
    """This process's rank among the job's ranks (0 .. size() - 1)."""
    return cupcake.layout()[0]


def size():
    """The number of ranks in the job."""
    return cupcake.layout()[1]


def local_rank():
    """This process's rank among the ranks on its host (Horovod's meaning: pick the GPU with it)."""
    return cupcake.layout()[2]


def local_size():
    """The number of ranks on this process's host."""
    return cupcake.layout()[3]


def _tensors(params):
    """The tensors of a state_dict, of (name, tensor) pairs or of tensors, in the order given."""
    if isinstance(params, dict):
        return list(params.values())
    out = []
    for p in params:
        out.append(p[1] if isinstance(p, tuple) else p)
    return out


@_raised_here
def broadcast_parameters(params, root_rank=0):
    """Collective: every rank's tensors become rank `root_rank`'s (as DDP does at construction).

    params: model.state_dict() (parameters and buffers), model.named_parameters(), or tensors;
        the same names, shapes and dtypes in the same order on every rank. Any device: the
        values travel through host memory in one broadcast.
    """
    _check_root("broadcast_parameters", root_rank)
    tensors = [t for t in _tensors(params) if t is not None]
    if size() == 1 or not tensors:
        return
    with torch.no_grad(), contextlib.closing(cupcake.world()) as world:
        flat = torch.cat([t.detach().reshape(-1).contiguous().cpu().view(torch.uint8) for t in tensors])
        world.broadcast(flat.data_ptr(), flat.numel(), root_rank)
        if world.rank == root_rank:
            return
        at = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            t.copy_(flat[at:at + n].clone().view(t.dtype).view(t.shape))  # clone: aligned for t.dtype
            at += n


@_raised_here
def broadcast_optimizer_state(optimizer, root_rank=0):
    """Collective: every rank's optimizer state and hyperparameters become rank `root_rank`'s
    (optimizer.load_state_dict of root_rank's state_dict(); tensors move to each parameter's device)."""
    _check_root("broadcast_optimizer_state", root_rank)
    if size() == 1:
        return
    with contextlib.closing(cupcake.world()) as world:
        payload = b""
        if world.rank == root_rank:
            buffer = io.BytesIO()
            torch.save(optimizer.state_dict(), buffer)
            payload = buffer.getvalue()
        length = torch.tensor([len(payload)], dtype=torch.int64)
        world.broadcast(length.data_ptr(), 8, root_rank)
        if world.rank == root_rank:
            data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        else:
            data = torch.empty(int(length.item()), dtype=torch.uint8)
        world.broadcast(data.data_ptr(), data.numel(), root_rank)
        if world.rank == root_rank:
            return
    optimizer.load_state_dict(torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu"))


def _check_root(call, root_rank):
    if not 0 <= root_rank < size():
        raise UsageError("%s: root_rank: out of range; got %r, expected 0 <= root_rank < %d" % (call, root_rank, size()))


class GraVAC:
    """GraVAC's options (docs/ADAPTIVE.md) for DistributedOptimizer(adapt=...): the compression
    ratio is chosen per window of `window` steps among a ladder's rungs, from the compression gain
    of the gradients (threshold `epsilon`, saturation `omega`) and the rungs' iteration times.
    probe_every: the gain is measured on every probe_every-th step of a window (less of the
    probe's cost per step). log: a path; rank 0 appends each window's decision there as a JSON
    line (None: no log)."""

    def __init__(self, window=500, epsilon=0.7, omega=0.01, measured_tolerance=0.1, probe_every=1, log=None):
        self.window = window
        self.epsilon = epsilon
        self.omega = omega
        self.measured_tolerance = measured_tolerance
        self.probe_every = probe_every
        self.log = log

    def __repr__(self):
        return "GraVAC(window=%r, epsilon=%r, omega=%r, measured_tolerance=%r, probe_every=%r, log=%r)" % (
            self.window, self.epsilon, self.omega, self.measured_tolerance, self.probe_every, self.log)


@_raised_here
def DistributedOptimizer(optimizer, named_parameters, plan=None, *, backward_passes_per_step=1,
                         model_name=None, compressor="", timeout_s=60.0, exit_after_record=True, broadcast=True,
                         adapt=None):
    """Wraps `optimizer` so that step() uses gradients averaged over the job's ranks per `plan`
    (launched by mpirun or torchrun: cupcake.init).

    optimizer: a torch.optim.Optimizer; the result is an instance of a subclass of its class that
        shares its state (param_groups, state), so zero_grad, state_dict, load_state_dict, LR
        schedulers and the rest behave as the wrapped optimizer's.
    named_parameters: (name, parameter) pairs, e.g. model.named_parameters(); the names must be
        the ones the plan's model was recorded with. Parameters with requires_grad=False are left
        out. float32, all on one device (CPU, or one CUDA device per rank).
    plan: a plan file from `cupcake-plan search`; None: record mode when CUPCAKE_RECORD is set.
    backward_passes_per_step: backward passes whose gradients are summed locally before each
        step() averages them over ranks.
    model_name: the recorded model's name (default: the script's file name without .py).
    compressor: when set, the plan's compressor must be this one.
    timeout_s: synchronize() fails when gradients are still missing after this long.
    exit_after_record: in record mode, end the job (exit status 0) once the model is written.
    broadcast: at construction, rank 0's parameters (those in named_parameters) and optimizer
        state are broadcast to every rank (broadcast_parameters, broadcast_optimizer_state), so
        that the replicas start equal, as DDP's do. Buffers (batch-norm statistics) are not
        parameters: broadcast_parameters(model.state_dict()) covers them.
    adapt: GraVAC(...) to let the ratio adapt over a ladder's rungs (plan: a ladder file from
        `cupcake-plan search --ratios`, or of PowerSGD ranks from `--ranks`); the decisions are then
        in `decisions`.
    """
    cupcake.launch()  # join the job before the checks (UsageError says why)
    if getattr(optimizer, "_cupcake", None) is not None:
        raise UsageError("DistributedOptimizer: the optimizer is already a DistributedOptimizer")
    if adapt is not None and not isinstance(adapt, GraVAC):
        raise UsageError("DistributedOptimizer: adapt: got %r, expected None or cupcake.torch.GraVAC(...)" % (adapt,))
    if adapt is not None and plan is None:
        raise UsageError("DistributedOptimizer: adapt: needs a plan; expected plan='LADDER.pb' (cupcake-plan search "
                         "--ratios)")
    if backward_passes_per_step < 1:
        raise UsageError("DistributedOptimizer: backward_passes_per_step: out of range; got %r, expected >= 1"
                         % (backward_passes_per_step,))
    methods = {k: v for k, v in _DistributedOptimizer.__dict__.items() if k not in ("__dict__", "__weakref__")}
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    named_parameters = list(named_parameters)
    if broadcast:
        broadcast_parameters(named_parameters, root_rank=0)
        broadcast_optimizer_state(optimizer, root_rank=0)  # replaces optimizer.state: before the copy below
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)  # the same param_groups and state objects
    wrapped._cupcake = _State(wrapped, named_parameters, plan, backward_passes_per_step, model_name,
                              compressor, timeout_s, exit_after_record, adapt)
    return wrapped


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods DistributedOptimizer adds to the wrapped optimizer's class (Horovod's pattern)."""

    @_raised_here
    def synchronize(self):
        """Waits until every gradient holds its average over ranks (per the plan). For jobs that
        clip or inspect the averaged gradients before step(); step() then does not wait again."""
        self._cupcake.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's idiom after synchronize(): step() inside it does not synchronize. (step()
        never synchronizes twice for one set of gradients, so this is only for compatibility.)"""
        yield

    @_raised_here
    def step(self, closure=None):
        if closure is not None:
            raise UsageError("DistributedOptimizer.step: closures are not supported; call backward, then step()")
        state = self._cupcake
        state.before_step()
        result = super(self.__class__, self).step()
        state.after_step()
        return result

    @property
    def ratios(self):
        """The plan's rungs by their ratio, in order: a ladder's (the fp32 rung's 1 first; a PowerSGD
        rung's is the share of the dense bytes it sends), or a single plan's one."""
        return list(self._cupcake.ratios)

    @_raised_here
    def use_ratio(self, ratio):
        """Collective, between steps (every rank, the same ratio): the ladder's rung of `ratio`
        runs from the next step, with each element's error feedback carried over (a PowerSGD rung
        restarts its warm-start Q). The job chooses the schedule (e.g. dense for a warm-up, then
        compressed)."""
        self._cupcake.use_ratio(ratio)

    @property
    def decisions(self):
        """GraVAC's decisions so far (adapt=GraVAC(...)), one dict per window, the same on every rank:
        step (the window's first), steps, ratio (the rung sent), ratio_min and ratio_c (the rungs
        probed), gain_min, gain_c, groups_skipped (probed groups left out: a gradient not finite),
        predicted_ms, measured_ms, bytes_sent (this rank's), probe_ms (the controller's cost per
        step) and next_ratio. Empty without adapt."""
        session = self._cupcake.session
        return session.decisions if session is not None else list(self._cupcake.decisions)

    @property
    def warnings(self):
        """The session's warnings so far (the drift self-check, docs/ADAPTIVE.md)."""
        session = self._cupcake.session
        return session.warnings if session is not None else []

    @_raised_here
    def close(self):
        """Ends the session (or recording) and removes the hooks; the optimizer stays usable as a
        local one. Between steps only: closing while gradients of a step are being exchanged (after
        backward, before synchronize()) aborts the group (under MPI: the job), as destroying a runtime Session does."""
        self._cupcake.close()


class _State:
    """What DistributedOptimizer keeps: parameters, hooks, the flat buffer, the session or recorder."""

    def __init__(self, owner, named_parameters, plan, passes, model_name, compressor, timeout_s, exit_after_record,
                 adapt):
        self.named = [(n, p) for n, p in named_parameters if p.requires_grad]
        self._check_parameters()
        self.passes = passes
        self.order = None  # indices into self.named in gradient-ready order, from the first backward
        self.fired = []  # the discovery backward's order
        self.index = [-1] * len(self.named)  # position in the order (-1: no gradient in discovery)
        self.counts = [0] * len(self.named)  # backward passes seen since the last step
        self.views = [None] * len(self.named)
        self.flat = None
        self.synchronized = False
        self.session = None
        self.ratios = []
        self.adapt = adapt
        self.decisions = []  # kept when the session closes
        self.logged = 0  # decisions written to adapt.log
        self.recorder = None
        self.handles = []
        self.accumulators = []
        self.device = self.named[0][1].device
        record_path = os.environ.get(_RECORD_ENV, "")
        if plan is None and not record_path:
            raise UsageError("DistributedOptimizer: no plan; expected plan='PLAN.pb' (cupcake-plan search), or %s "
                             "set for record mode (cupcake-profile compute --db DB -- CMD)" % _RECORD_ENV)
        self.mpi = cupcake.launch()
        if plan is not None:
            self.mode = "train"
            self._open_session(str(plan), compressor, timeout_s)
        else:
            self.mode = "record"
            self.record = _Record(self, record_path, model_name, exit_after_record)
        self._install_hooks()

    def _check_parameters(self):
        if not self.named:
            raise UsageError("DistributedOptimizer: named_parameters: no parameter that requires a gradient")
        seen = set()
        device = self.named[0][1].device
        for name, p in self.named:
            if name in seen:
                raise UsageError("DistributedOptimizer: named_parameters: '%s' appears twice; expected distinct names"
                                 % name)
            seen.add(name)
            if p.dtype != torch.float32:
                raise UsageError("DistributedOptimizer: parameter '%s': got dtype %s, expected torch.float32"
                                 % (name, p.dtype))
            if p.device != device:
                raise UsageError("DistributedOptimizer: parameter '%s': got device %s, expected %s (every "
                                 "parameter on one device)" % (name, p.device, device))
            if p.device.type not in ("cpu", "cuda"):
                raise UsageError("DistributedOptimizer: parameter '%s': got device %s, expected cpu or cuda"
                                 % (name, p.device))

    def _open_session(self, plan, compressor, timeout_s):
        options = cupcake.SessionOptions()
        options.compressor = compressor
        options.ready_timeout_us = float(timeout_s) * 1e6
        if self.device.type == "cuda":
            # Untested here (no GPU on the machine this was written on): NCCL on the parameters'
            # device; the runtime's encodes wait for the stream backward runs on.
            with self._on_device():
                stream = torch.cuda.current_stream(self.device).cuda_stream
                self.session = cupcake.Session.create_nccl(plan, self.mpi, options, stream)
        else:
            self.session = cupcake.Session(plan, self.mpi, options)
        cupcake.track(self.session)
        self.ratios = cupcake.plan_ratios(plan)
        if self.adapt is not None:
            a = self.adapt
            with self._on_device():
                self.session.enable_gravac(a.window, a.epsilon, a.omega, a.measured_tolerance, a.probe_every)

    def use_ratio(self, ratio):
        if self.session is None:
            raise Error("DistributedOptimizer.use_ratio: no session (closed, or record mode)")
        matches = [i for i, r in enumerate(self.ratios) if abs(r - ratio) <= 1e-9 * max(r, ratio)]
        if not matches:
            raise UsageError("DistributedOptimizer.use_ratio: ratio: not a rung of the plan; got %r, expected one of %s"
                             % (ratio, ", ".join("%g" % r for r in self.ratios)))
        with self._on_device():
            self.session.switch_plan(matches[0])

    def _on_device(self):
        """CUDA calls of the session (NCCL, streams, events, pointer checks) need the parameters'
        device current on the calling thread (the job's, or autograd's device thread)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    # 1. Hooks on the gradient accumulators.
    def _install_hooks(self):
        for k, (_, p) in enumerate(self.named):
            accumulator = p.expand_as(p).grad_fn.next_functions[0][0]  # p's AccumulateGrad node
            self.handles.append(accumulator.register_hook(self._hook(k)))
            self.accumulators.append(accumulator)  # kept alive, so later graphs reuse this node

    def _hook(self, k):
        def hook(*unused):
            self.on_gradient(k)
        return hook

    def on_gradient(self, k):
        self.synchronized = False
        self.counts[k] += 1
        if self.order is None:  # the discovery backward
            if self.counts[k] == 1:
                self.fired.append(k)
            return
        if self.counts[k] > self.passes:
            raise Error("DistributedOptimizer: parameter '%s': gradient computed %d times since the last step(); "
                        "expected %d (backward_passes_per_step)" % (self.named[k][0], self.counts[k], self.passes))
        if self.counts[k] < self.passes:
            return
        i = self.index[k]
        if i < 0:
            raise Error("DistributedOptimizer: parameter '%s': got a gradient, but it had none in the first "
                        "backward pass, which fixed the tensors the runtime synchronizes" % self.named[k][0])
        if self.mode == "train":
            self._adopt_gradient(k)
            with self._on_device():
                self.session.gradient_ready(i)
        else:
            self.record.gradient_ready(i)

    # 2. The flat buffer in gradient-ready order; each p.grad a view of it.
    def _discover(self):
        if not self.fired:
            raise Error("DistributedOptimizer: step() before any backward pass; expected loss.backward() first")
        self.order = list(self.fired)
        for i, k in enumerate(self.order):
            self.index[k] = i
        total = sum(self.named[k][1].numel() for k in self.order)
        self.flat = torch.zeros(total, dtype=torch.float32, device=self.device)
        at = 0
        for k in self.order:
            p = self.named[k][1]
            self.views[k] = self.flat.narrow(0, at, p.numel())
            at += p.numel()
            self._adopt_gradient(k)
            p.grad = self.views[k].view_as(p)

    def _adopt_gradient(self, k):
        """Copies p.grad into its slice of the flat buffer unless it already is that slice."""
        p, view = self.named[k][1], self.views[k]
        if p.grad is None:
            view.zero_()
        elif p.grad.data_ptr() != view.data_ptr() or p.grad.numel() != view.numel():
            view.copy_(p.grad.detach().reshape(-1))

    def _register(self):
        with self._on_device():
            self._register_in_order()

    def _register_in_order(self):
        # Collective: a plan for another model fails on every rank alike, printed once per job.
        self.session.register_all([(self.named[k][0], self.views[k].data_ptr(), self.views[k].numel())
                                   for k in self.order])

    # 3. Synchronization.
    def synchronize(self):
        if self.mode != "train":
            if self.order is None:
                self.record.discover()
            return
        if self.session is None:
            raise Error("DistributedOptimizer: closed")
        if self.synchronized:
            return
        if self.order is None:
            if self.passes > 1 and any(self.counts[k] < self.passes for k in self.fired):
                raise Error("DistributedOptimizer: step() after %d of %d backward passes; expected "
                            "backward_passes_per_step passes per step()" % (max(self.counts), self.passes))
            self._discover()
            self._register()
            with self._on_device():
                for i, k in enumerate(self.order):
                    self.session.gradient_ready(i)
        elif 0 < max(self.counts) < self.passes:
            raise Error("DistributedOptimizer: step() after %d of %d backward passes; expected "
                        "backward_passes_per_step passes per step()" % (max(self.counts), self.passes))
        with self._on_device():
            self.session.synchronize()
        if self.adapt is not None and self.adapt.log and self.session.rank == 0:
            self._log_decisions()
        for k in self.order:
            p, view = self.named[k][1], self.views[k]
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view.view_as(p)  # the averaged gradient, wherever the job had put p.grad
        self.counts = [0] * len(self.named)
        self.synchronized = True

    def _log_decisions(self):
        decisions = self.session.decisions
        if len(decisions) == self.logged:
            return
        with open(self.adapt.log, "a") as f:
            for d in decisions[self.logged:]:
                f.write(json.dumps(d, sort_keys=True) + "\n")
        self.logged = len(decisions)

    def before_step(self):
        self.synchronize()

    def after_step(self):
        self.synchronized = False
        self.counts = [0] * len(self.named)
        if self.mode == "record":
            self.record.after_step()

    def close(self):
        for h in self.handles:
            h.remove()
        self.handles, self.accumulators = [], []
        if self.session is not None:
            self.decisions = self.session.decisions
            self.session.close()
            self.session = None
        if self.mode == "record":
            self.record.close()


class _Record:
    """Record mode (4. in the module's comment): marks for the runtime's Recorder."""

    def __init__(self, state, path, model_name, exit_after_record):
        self.state = state
        self.path = path
        text = os.environ.get(_RECORD_ITERATIONS_ENV, "") or "20"
        try:
            self.iterations = int(text)
        except ValueError:
            self.iterations = 0
        if self.iterations < 1:
            raise UsageError("DistributedOptimizer: %s: got '%s', expected an integer >= 1"
                             % (_RECORD_ITERATIONS_ENV, text))
        if model_name is None:
            model_name = os.path.splitext(os.path.basename(sys.argv[0] or ""))[0] or "model"
        self.model_name = model_name
        self.exit_after_record = exit_after_record
        self.recorder = None
        self.forward_marked = False
        self.in_backward = False
        self.passes_done = 0  # backward passes since the last step
        self.last_marked = False  # the iteration's last gradient was marked: EndIteration may follow
        self.forward_handle = None
        self.backward = None  # torch.autograd.backward as it was before record mode wrapped it
        self.done = False
        atexit.register(self._at_exit)

    def _at_exit(self):
        if not self.done:
            recorded = self.recorder.completed_iterations if self.recorder is not None else 0
            print("cupcake: record mode: the job ended after %d of %d recorded iterations (%s); no model written"
                  % (recorded, self.iterations, _RECORD_ITERATIONS_ENV), file=sys.stderr, flush=True)

    def discover(self):
        state = self.state
        state._discover()
        # On a GPU the host's gaps time launches, not kernels: the device's kernel time between
        # the gradient-ready marks (CUPTI) instead.
        on_gpu = state.device.type == "cuda"
        self.recorder = cupcake.Recorder(self.model_name, cupcake.kernel_time_source() if on_gpu else None)
        for k in state.order:
            p = state.named[k][1]
            self.recorder.register(state.named[k][0], p.numel(), list(p.shape))  # shapes: PowerSGD's matrices
        self.forward_handle = torch.nn.modules.module.register_module_forward_pre_hook(self._on_forward)
        self.backward = torch.autograd.backward
        torch.autograd.backward = self._wrapped_backward

    def _on_forward(self, module, inputs):
        if self.recorder is not None and not self.forward_marked and not self.in_backward:
            self.forward_marked = True
            self.recorder.begin_forward()

    def _wrapped_backward(self, *args, **kwargs):
        last_pass = self.passes_done == self.state.passes - 1
        if self.recorder is not None and last_pass:
            self.recorder.begin_backward()
            self.in_backward = True
        try:
            return self.backward(*args, **kwargs)
        finally:
            self.in_backward = False
            self.passes_done += 1
            self.forward_marked = False

    def gradient_ready(self, i):
        if self.recorder is None or self.done:
            return
        if i == 0 and not self.in_backward:
            self.recorder.begin_backward()  # backward not entered through torch.autograd.backward
        self.recorder.gradient_ready(i)
        self.last_marked = i == len(self.state.order) - 1

    def after_step(self):
        self.passes_done = 0
        self.forward_marked = False
        if self.recorder is None or self.done:
            return
        if self.last_marked:
            self.recorder.end_iteration()
            self.last_marked = False
            # Each gradient's share of non-zeros (naturally sparse gradients: the model's densities).
            for i, k in enumerate(self.state.order):
                grad = self.state.named[k][1].grad
                if grad is not None:
                    host = grad.detach().reshape(-1).to("cpu", torch.float32).contiguous()
                    self.recorder.sample_density(i, host.data_ptr(), host.numel())
        if self.recorder.completed_iterations >= self.iterations and not self.done:
            self.finish()

    def finish(self):
        """Merges the ranks' times (a collective), writes the model on rank 0, and ends the job."""
        self.done = True
        self.close()
        rank = self.recorder.merge_ranks(self.state.mpi)
        if rank == 0:
            self.recorder.write(self.path)
            print("cupcake: recorded %d tensors of model '%s' over %d iterations into %s"
                  % (self.recorder.registered, self.model_name, self.recorder.completed_iterations, self.path),
                  file=sys.stderr, flush=True)
        if self.exit_after_record:
            sys.exit(0)

    def close(self):
        if self.forward_handle is not None:
            self.forward_handle.remove()
            self.forward_handle = None
        if self.backward is not None:
            torch.autograd.backward = self.backward
            self.backward = None


def _replica_gaps(gaps):
    """Checkpointer's replica_gaps as (after_group, bytes) pairs: from pairs, or from dicts of
    `cupcake-plan show --format json`'s replica_schedule.gaps (after_group, chunk_bytes)."""
    if gaps is None:
        return []
    out = []
    items = gaps if isinstance(gaps, (list, tuple)) else None
    for i, g in enumerate(items if items is not None else [gaps]):
        pair = (g.get("after_group"), g.get("chunk_bytes")) if isinstance(g, dict) else g
        if (items is None or not isinstance(pair, (list, tuple)) or len(pair) != 2 or
                any(isinstance(v, bool) or not isinstance(v, int) for v in pair)):
            raise UsageError("Checkpointer: replica_gaps[%d]: not a gap; got %r, expected (after_group, bytes) ints "
                             "or a dict of replica_schedule.gaps (after_group, chunk_bytes)" % (i, g))
        out.append((pair[0], pair[1]))
    return out


class Checkpointer:
    """Every-iteration snapshots in host memory that outlive the process (docs/CHECKPOINT.md):

        ckpt = cupcake.torch.Checkpointer(model, opt, name="job", persist_dir=None, persist_every=0)
        start = ckpt.restore()            # collective; 0 for a fresh job, else the step restored
        for step in range(start + 1, steps + 1):
            ...; opt.step()
            ckpt.commit(step)             # collective; the copy runs in the background

    A snapshot holds the model's state_dict (parameters, copied in the background; buffers such as
    batch-norm statistics, copied inside commit() because forward writes them), the optimizer's
    state tensors and, as JSON metadata, its hyperparameters and other state values, and with a
    DistributedOptimizer its session's state: error-feedback memory and momentum (this rank's own),
    PowerSGD's, the active rung and, with adapt=GraVAC(...), the controller's and window's state.
    It goes to /dev/shm/cupcake-<name>-<rank> (two slots: a torn copy is never restored) and, every
    `persist_every` steps, to `persist_dir` (each rank its own state and 1/W of the shared state,
    written durably; restore falls back to it when no segment survives, with the same world size).
    replicate=True: each rank's own state is also kept by a rank on another host (Gemini's
    replicas: hosts in groups of `replica_group_hosts` (>= 2) that back each other up; one host
    alone: the next rank), sent in chunks of `replica_chunk_bytes` (>= 0; 0: whole), one
    per commit (cupcake-plan show --profile prints the chunk that fits the plan's idle gap), or with
    `replica_gaps` in every idle gap of the session's plan: a list of (after_group, bytes) pairs or
    of `cupcake-plan show --format json`'s replica_schedule.gaps (after_group, chunk_bytes), -1 the
    gap before the first collective, k the gap after group k's (a DistributedOptimizer's session,
    its plan active now; docs/CHECKPOINT.md). replica_max_commits (>= 0; 0: no bound): a replica
    takes at most that many commits, the last sending all it has left, even when the job runs
    behind its plan and the gaps carry nothing. So a rank whose host lost its memory restores
    from that copy and another rank's shared state (docs/CHECKPOINT.md). persist_chunk_bytes (>= 0;
    0: one write): each persist written in pieces of that many bytes, each synced to storage in the
    network's idle time between the session's collectives (a DistributedOptimizer's host session;
    docs/CHECKPOINT.md). shared_state: whether
    the parameters and the optimizer's state are the same on every rank at every commit (data
    parallelism), so that replicas leave them out; None: True with a DistributedOptimizer (it
    averages the gradients), else False (each rank's own, as for a job whose ranks train apart).
    Buffers (batch-norm statistics, computed from each rank's batches) and the session's state
    are always this rank's own. A restore from a replica checks the rebuilt snapshot against the
    lost rank's checksum, so shared state that differed fails it.
    Earlier than that, each commit() compares the shared state of the previous snapshot across the
    ranks (fingerprints the background copy computes) and raises cupcake.Error on every rank
    naming the first entry that differs and its step; that snapshot is dropped. With replicate and
    a DistributedOptimizer, the replica exchanges and the session's collectives share its session's
    gate (`gate`, a cupcake.NetworkGate): a collective waits while an exchange is on the network.
    restore() puts back the newest step every rank holds, bit for bit.

    Contract: the job writes parameters and optimizer state only in optimizer.step(), which this
    object wraps to wait for the background copy first. A CUDA tensor or a strided one goes through
    a contiguous host copy of its own (pinned for CUDA) that commit() fills on the calling thread (a
    device-to-host copy, which waits for the GPU's work on it) and restore() copies back; the
    background copy then reads the host copy.
    Same world, same name, same model and optimizer (adapt included) on restart. The session's
    iteration counter (randk's, qsgd's and terngrad's random choices) is in the snapshot, and
    GraVAC goes on from the restored window (the step across the restart is not timed); the
    optimizer's `decisions` list starts over.
    """

    def __init__(self, model, optimizer, name="job", persist_dir=None, persist_every=0, replicate=False,
                 replica_chunk_bytes=0, replica_group_hosts=2, shared_state=None, replica_gaps=None,
                 replica_max_commits=0, persist_chunk_bytes=0):
        self.model = model
        self.optimizer = optimizer
        self.name = name
        launched = cupcake.launch()  # join the job before the checks (UsageError says why)
        state = getattr(optimizer, "_cupcake", None)
        if isinstance(replica_chunk_bytes, bool) or not isinstance(replica_chunk_bytes, int) or replica_chunk_bytes < 0:
            raise UsageError("Checkpointer: replica_chunk_bytes: out of range; got %r, expected an int >= 0 (0: "
                             "whole replicas)" % (replica_chunk_bytes,))
        if isinstance(replica_group_hosts, bool) or not isinstance(replica_group_hosts, int) or replica_group_hosts < 2:
            raise UsageError("Checkpointer: replica_group_hosts: out of range; got %r, expected an int >= 2 (a host "
                             "and at least one that keeps its replicas)" % (replica_group_hosts,))
        if isinstance(replica_max_commits, bool) or not isinstance(replica_max_commits, int) or replica_max_commits < 0:
            raise UsageError("Checkpointer: replica_max_commits: out of range; got %r, expected an int >= 0 (0: no "
                             "bound)" % (replica_max_commits,))
        if isinstance(persist_chunk_bytes, bool) or not isinstance(persist_chunk_bytes, int) or persist_chunk_bytes < 0:
            raise UsageError("Checkpointer: persist_chunk_bytes: out of range; got %r, expected an int >= 0 (0: the "
                             "whole file in one write)" % (persist_chunk_bytes,))
        gaps = _replica_gaps(replica_gaps)
        if shared_state not in (None, True, False):
            raise UsageError("Checkpointer: shared_state: got %r, expected None, True or False" % (shared_state,))
        self._shared = state is not None if shared_state is None else shared_state
        self._session = state.session if state is not None else None
        # The replica exchanges and persist pieces behind the session's gate, as GateCommunicator
        # does in C++; None without either or without a host session (record mode, NCCL).
        gated = (replicate or persist_chunk_bytes > 0) and self._session is not None
        self.gate = self._session.gate if gated else None
        if persist_chunk_bytes > 0 and self.gate is None:
            raise UsageError("Checkpointer: persist_chunk_bytes: got %d without a gate; expected a DistributedOptimizer "
                             "whose host session's collectives the pieces wait for" % persist_chunk_bytes)
        self._cpp = cupcake.track(cupcake.Checkpointer(launched, name, persist_dir or "", int(persist_every),
                                                       bool(replicate), replica_chunk_bytes, replica_group_hosts,
                                                       self.gate, gaps, replica_max_commits, persist_chunk_bytes))
        if self._session is not None:
            self._cpp.attach_session(self._session)
        self.source = None  # where the last restore() read this rank's snapshot (a segment slot or a file)
        self.refused = []  # the snapshots the last restore() refused on this rank, one line each (torn, corrupt)
        self._states = {}  # add_state's objects (LR schedulers): their state_dict() in the metadata
        self._registered = None  # (name, address, bytes, device, strides, at_commit, shared) per entry
        self._tensors = []  # the registered tensors and host copies, kept alive while the copy may read them
        self._staged = []  # (tensor, its host copy) per entry registered through a host copy (_register)
        original = optimizer.step
        cpp = self._cpp

        def step(unused_self, *args, **kwargs):
            cpp.wait_for_copy()  # the copy reads what step() is about to write
            return original(*args, **kwargs)

        step.__doc__ = getattr(original, "__doc__", None)
        if getattr(original, "_with_counter", False):
            step._with_counter = True  # an LR scheduler's counting wrapper is inside: it still counts
        # A bound method, as optimizer.step was: LR schedulers made later wrap it through __self__.
        optimizer.step = types.MethodType(step, optimizer)

    def commit(self, step):
        """Collective, after the optimizer step of `step` (>= 1, increasing, the same on every rank).
        Raises cupcake.Error on every rank when the previous snapshot's shared entries differ
        between the ranks (naming the entry and that step), or when its background copy failed;
        the snapshot of `step` is then not taken."""
        self._register()
        self._stage()
        self._cpp.commit(int(step), json.dumps(self._metadata(), sort_keys=True).encode())

    def restore(self):
        """Collective, before training: the newest step every rank holds, restored into the model,
        the optimizer and the session; returns it (0: nothing to restore, nothing changed)."""
        point = self._cpp.find()
        self.refused, self.source = list(point["refused"]), point["source"] or None
        if point["step"] == 0:
            return 0
        saved = copy.deepcopy(self.optimizer.state_dict())
        problem = None
        try:
            self._load_optimizer_skeleton(json.loads(point["metadata"].decode()), point["source"])
            self._register()
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
            problem = e
        try:
            # Collective, also after a local problem (the others then fail too instead of waiting);
            # it writes nothing unless every rank's snapshot fits its job.
            self._cpp.apply("" if problem is None else "Checkpointer.restore: %s" % problem)
        except Error:
            self.optimizer.load_state_dict(saved)  # a refused restore leaves the optimizer as it was
            self._registered = None
            raise
        with torch.no_grad():
            for t, host in self._staged:
                t.copy_(host)
        return int(point["step"])

    def add_state(self, name, obj):
        """Includes obj.state_dict() (numbers, strings, lists, tuples, dicts: e.g. an LR scheduler's) in
        every snapshot under `name`; restore() calls obj.load_state_dict with it. Before restore()."""
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise UsageError("Checkpointer.add_state: '%s': got %s, expected an object with state_dict() and "
                             "load_state_dict()" % (name, type(obj).__name__))
        self._states[str(name)] = obj

    @property
    def agreed_step(self):
        """The newest step every rank had completed at the last commit or restore."""
        return self._cpp.agreed_step

    @property
    def persisted_step(self):
        """The newest step whose persisted share this process has written (0: none yet); a persist
        may end during a later step."""
        return self._cpp.persisted_step

    @property
    def replicated_step(self):
        """With replicas: the newest step whose replica of this rank's own state this process has
        sent in full to its peers (0: none yet)."""
        return self._cpp.replicated_step

    @property
    def replica_gaps_skipped(self):
        """With replica_gaps: the gaps that carried no chunk because some rank's next collective
        was already waiting there (its step behind the plan) or the gap rested after that, so
        far."""
        return self._cpp.replica_gaps_skipped

    def wait(self):
        """Waits for the background copy of the last commit (raises its error, if any); not for a
        persist still writing its file nor for the replica exchanges in flight (see flush)."""
        self._cpp.wait_for_copy()

    def flush(self):
        """Waits for everything in flight: the copy, the persist and the replica exchanges (raises
        the first error, if any)."""
        self._cpp.wait_for_persist()

    def close(self):
        """Waits for the copy and the persist in progress and frees the checkpointer; the segment
        stays."""
        self._cpp.close()

    @staticmethod
    def remove(name, ranks=None):
        """Deletes job `name`'s shared-memory segments of `ranks` (default: this rank's)."""
        for r in ([rank()] if ranks is None else ranks):
            cupcake.Checkpointer.remove_segment(name, r)

    def _entries(self):
        """(name, tensor, at_commit, shared) per entry: parameters and optimizer state are shared
        with shared_state; buffers, written in forward from each rank's batch, are copied at commit
        and always this rank's own."""
        out = []
        for key, t in self.model.state_dict(keep_vars=True).items():
            if t is not None:
                parameter = isinstance(t, torch.nn.Parameter)
                out.append(("model." + key, t, not parameter, parameter and self._shared))
        for i, p in enumerate(self._parameters()):
            state = self.optimizer.state.get(p, {})
            for key in sorted(state, key=str):
                if torch.is_tensor(state[key]):
                    out.append(("optimizer.%d.%s" % (i, key), state[key], False, self._shared))
        return out

    def _register(self):
        """Registers the entries anew when one moved or changed. A tensor that is not a contiguous
        CPU tensor (a CUDA tensor, a strided one) is registered through a host copy of its own,
        contiguous and, for CUDA, pinned, which commit() fills (_stage) and restore() copies back."""
        entries = self._entries()
        signature = [(n, t.data_ptr(), t.numel() * t.element_size(), str(t.device), t.stride(), c, s)
                     for n, t, c, s in entries]
        if signature == self._registered:
            return
        self._cpp.wait_for_copy()  # a copy in flight reads the entries (and host copies) replaced here
        self._cpp.clear()
        self._tensors, self._staged = [], []
        for n, t, at_commit, shared in entries:
            host = t
            if t.device.type != "cpu" or not t.is_contiguous():
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
                self._staged.append((t, host))
            self._cpp.add(n, host.data_ptr(), host.numel() * host.element_size(), at_commit, shared)
            self._tensors.append(host)  # a staged tensor itself is kept by _staged
        self._registered = signature

    def _stage(self):
        """The host copies of the staged entries, from their tensors (a device-to-host copy for CUDA,
        which waits for the work that writes them). After the previous commit's background copy,
        which reads them."""
        if not self._staged:
            return
        self._cpp.wait_for_copy()
        with torch.no_grad():
            for t, host in self._staged:
                host.copy_(t)

    def _parameters(self):
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _metadata(self):
        """The optimizer's hyperparameters and non-tensor state, and the shapes of its state
        tensors (whose bytes are entries), so restore() can rebuild the state before copying."""
        groups = [{k: _encode(v) for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        state = {}
        for i, p in enumerate(self._parameters()):
            s = self.optimizer.state.get(p, {})
            if s:
                state[str(i)] = {str(k): ({"__tensor__": [str(v.dtype).replace("torch.", ""), list(v.shape)]}
                                          if torch.is_tensor(v) else _encode(v)) for k, v in s.items()}
        states = {name: _encode(obj.state_dict()) for name, obj in self._states.items()}
        return {"param_groups": groups, "state": state, "states": states}

    def _load_optimizer_skeleton(self, meta, source):
        saved = self.optimizer.state_dict()
        if len(meta["param_groups"]) != len(saved["param_groups"]):
            raise Error("%s: metadata: param_groups: does not match the job; got %d groups, expected %d"
                        % (source, len(meta["param_groups"]), len(saved["param_groups"])))
        for group, stored in zip(saved["param_groups"], meta["param_groups"]):
            for k, v in stored.items():
                group[k] = _decode(v)
        state = {}
        for i, entries in meta["state"].items():
            state[int(i)] = {k: (torch.zeros(v["__tensor__"][1], dtype=getattr(torch, v["__tensor__"][0]))
                                 if isinstance(v, dict) and "__tensor__" in v else _decode(v))
                             for k, v in entries.items()}
        saved["state"] = state
        self.optimizer.load_state_dict(saved)
        stored = meta.get("states", {})
        for name, obj in self._states.items():
            if name not in stored:
                raise Error("%s: metadata: states: '%s' missing; got %s, expected the states added with add_state"
                            % (source, name, sorted(stored)))
            obj.load_state_dict(_decode(stored[name]))


def _encode(v):
    """A hyperparameter or state value as JSON (tuples kept apart from lists; floats exact)."""
    if isinstance(v, tuple):
        return {"__tuple__": [_encode(x) for x in v]}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if isinstance(v, dict):
        return {"__dict__": [[_encode(k), _encode(x)] for k, x in v.items()]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise UsageError("Checkpointer: value %r of type %s: not serializable; expected numbers, strings, None, "
                     "tuples, lists, dicts (or, in the optimizer's state, tensors)" % (v, type(v).__name__))


def _decode(v):
    if isinstance(v, dict) and "__tuple__" in v:
        return tuple(_decode(x) for x in v["__tuple__"])
    if isinstance(v, dict) and "__dict__" in v:
        return {_decode(k): _decode(x) for k, x in v["__dict__"]}
    if isinstance(v, list):
        return [_decode(x) for x in v]
    return v


__all__ += ["Checkpointer"]

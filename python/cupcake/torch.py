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
  3. With a plan: a runtime Session (MPI on CPU memory; NCCL on the current CUDA device for CUDA
     parameters) registers the buffer's slices in that order, and each hook calls
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
`timeout_s` names the missing tensors.
"""

import atexit
import contextlib
import io
import os
import sys

import torch

import cupcake

__all__ = ["DistributedOptimizer", "Error", "broadcast_parameters", "broadcast_optimizer_state", "rank", "size",
           "local_rank", "local_size"]

Error = cupcake.Error

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
        raise ValueError("%s: root_rank: out of range; got %r, expected 0 <= root_rank < %d" % (call, root_rank, size()))


def DistributedOptimizer(optimizer, named_parameters, plan=None, *, backward_passes_per_step=1,
                         model_name=None, compressor="", timeout_s=60.0, exit_after_record=True, broadcast=True):
    """Wraps `optimizer` so that step() uses gradients averaged over the MPI ranks per `plan`.

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
    """
    if getattr(optimizer, "_cupcake", None) is not None:
        raise ValueError("DistributedOptimizer: the optimizer is already a DistributedOptimizer")
    if backward_passes_per_step < 1:
        raise ValueError("DistributedOptimizer: backward_passes_per_step: out of range; got %r, expected >= 1"
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
                              compressor, timeout_s, exit_after_record)
    return wrapped


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods DistributedOptimizer adds to the wrapped optimizer's class (Horovod's pattern)."""

    def synchronize(self):
        """Waits until every gradient holds its average over ranks (per the plan). For jobs that
        clip or inspect the averaged gradients before step(); step() then does not wait again."""
        self._cupcake.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's idiom after synchronize(): step() inside it does not synchronize. (step()
        never synchronizes twice for one set of gradients, so this is only for compatibility.)"""
        yield

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("DistributedOptimizer.step: closures are not supported; call backward, then step()")
        state = self._cupcake
        state.before_step()
        result = super(self.__class__, self).step()
        state.after_step()
        return result

    @property
    def ratios(self):
        """The plan's rungs by their ratio, in order: a ladder's (the fp32 rung's 1 first), or a
        single plan's one."""
        return list(self._cupcake.ratios)

    def use_ratio(self, ratio):
        """Collective, between steps (every rank, the same ratio): the ladder's rung of `ratio`
        runs from the next step, with each element's error feedback carried over. The job chooses
        the schedule (e.g. dense for a warm-up, then compressed)."""
        self._cupcake.use_ratio(ratio)

    def close(self):
        """Ends the session (or recording) and removes the hooks; the optimizer stays usable as a
        local one. Between steps only: closing while gradients of a step are being exchanged (after
        backward, before synchronize()) aborts the MPI job, as destroying a runtime Session does."""
        self._cupcake.close()


class _State:
    """What DistributedOptimizer keeps: parameters, hooks, the flat buffer, the session or recorder."""

    def __init__(self, owner, named_parameters, plan, passes, model_name, compressor, timeout_s, exit_after_record):
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
        self.recorder = None
        self.handles = []
        self.accumulators = []
        self.device = self.named[0][1].device
        record_path = os.environ.get(_RECORD_ENV, "")
        if plan is None and not record_path:
            raise ValueError("DistributedOptimizer: no plan; expected plan='PLAN.pb' (cupcake-plan search), or %s "
                             "set for record mode (cupcake-profile compute --db DB -- CMD)" % _RECORD_ENV)
        self.mpi = cupcake.mpi()
        if plan is not None:
            self.mode = "train"
            self._open_session(str(plan), compressor, timeout_s)
        else:
            self.mode = "record"
            self.record = _Record(self, record_path, model_name, exit_after_record)
        self._install_hooks()

    def _check_parameters(self):
        if not self.named:
            raise ValueError("DistributedOptimizer: named_parameters: no parameter that requires a gradient")
        seen = set()
        device = self.named[0][1].device
        for name, p in self.named:
            if name in seen:
                raise ValueError("DistributedOptimizer: named_parameters: '%s' appears twice; expected distinct names"
                                 % name)
            seen.add(name)
            if p.dtype != torch.float32:
                raise ValueError("DistributedOptimizer: parameter '%s': got dtype %s, expected torch.float32"
                                 % (name, p.dtype))
            if p.device != device:
                raise ValueError("DistributedOptimizer: parameter '%s': got device %s, expected %s (every "
                                 "parameter on one device)" % (name, p.device, device))
            if p.device.type not in ("cpu", "cuda"):
                raise ValueError("DistributedOptimizer: parameter '%s': got device %s, expected cpu or cuda"
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

    def use_ratio(self, ratio):
        if self.session is None:
            raise Error("DistributedOptimizer.use_ratio: no session (closed, or record mode)")
        matches = [i for i, r in enumerate(self.ratios) if abs(r - ratio) <= 1e-9 * max(r, ratio)]
        if not matches:
            raise ValueError("DistributedOptimizer.use_ratio: ratio: not a rung of the plan; got %r, expected one of %s"
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
        for k in self.order:
            name, view = self.named[k][0], self.views[k]
            if self.device.type == "cuda":
                self.session.register_device(name, view.data_ptr(), view.numel())
            else:
                self.session.register(name, view.data_ptr(), view.numel())
        if self.session.registered != self.session.tensor_count:
            raise Error("DistributedOptimizer: the job has %d gradients, the plan %d; expected the model the plan "
                        "was made for (missing from the job: the plan's tensors from index %d on)"
                        % (self.session.registered, self.session.tensor_count, self.session.registered))

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
        for k in self.order:
            p, view = self.named[k][1], self.views[k]
            if p.grad is None or p.grad.data_ptr() != view.data_ptr():
                p.grad = view.view_as(p)  # the averaged gradient, wherever the job had put p.grad
        self.counts = [0] * len(self.named)
        self.synchronized = True

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
            raise ValueError("DistributedOptimizer: %s: got '%s', expected an integer >= 1"
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

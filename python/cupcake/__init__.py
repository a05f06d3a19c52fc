"""Cupcake's Python package: the runtime (libruntime) for training jobs (docs/PYTHON.md).

`cupcake.torch.DistributedOptimizer` is what a PyTorch job uses. This module holds the process
state the package shares: how the ranks were launched (launch(): MPI under mpirun, gloo over
torch.distributed's store under torchrun), chosen once. MPI is initialized on first use unless
the job initialized it already (mpi4py, another library), and finalized at exit after every
session and recorder made from it is closed.
"""

import atexit
import contextlib
import ctypes
import os
import sys
import weakref

# Open MPI loads its components with dlopen and expects libmpi's symbols to be global; a Python
# extension is loaded RTLD_LOCAL, so load libmpi globally first (what mpi4py does).
for _name in ("libmpi.so.40", "libmpi.so"):
    try:
        ctypes.CDLL(_name, mode=ctypes.RTLD_GLOBAL)
        break
    except OSError:
        pass

from ._runtime import Communicator, Error, Recorder, Session, SessionOptions, Launch, Mpi, Gloo  # noqa: E402
from ._runtime import built_with_gloo, built_with_nccl, plan_ratios  # noqa: E402
from ._runtime import open_kernel_time_source as _open_kernel_time_source  # noqa: E402
from ._runtime import Checkpointer, NetworkGate  # noqa: E402,F401  (docs/CHECKPOINT.md)

__all__ = ["Communicator", "Error", "Recorder", "Session", "SessionOptions", "Launch", "Mpi", "Gloo", "mpi", "init",
           "launch", "world", "layout", "known_rank", "track", "built_with_gloo", "built_with_nccl", "plan_ratios",
           "kernel_time_source"]

BACKEND_ENV = "CUPCAKE_BACKEND"
# Set by mpirun (Open MPI; PMI and PMIx for MPICH and others), and by torchrun.
_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

_mpi = None
_launch = None
_layout = None
_kernel_time = None
_tracked = weakref.WeakSet()


def mpi():
    """The process's Mpi object: MPI initialized (MPI_THREAD_MULTIPLE) on the first call."""
    global _mpi
    if _mpi is None:
        _mpi = Mpi()
        atexit.register(_finalize)
    return _mpi


def init(backend=None, timeout_s=60.0):
    """Chooses how the ranks communicate, once per process; the first call of launch() (any
    collective of the package) makes it with backend=None. Returns the Launch (Mpi or Gloo).

    backend: "mpi": MPI (a job under mpirun, or one process alone);
        "gloo": gloo over torch.distributed's default store (a job under torchrun); when the job
        has not called torch.distributed.init_process_group, it is called with "gloo" and
        torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
        None or "auto": $CUPCAKE_BACKEND when set, else "mpi" under mpirun (OMPI_COMM_WORLD_SIZE,
        PMI_SIZE or PMIX_RANK set), else "gloo" when torch.distributed is initialized or all of
        torchrun's variables are set, else "mpi" (one process). Some but not all of torchrun's
        variables is an error naming the missing ones.
    timeout_s: gloo only: the longest a rank waits for its peers at set-up or in a collective.
    GLOO_SOCKET_IFNAME (torch's variable): gloo listens on that interface instead of this host's name.
    """
    global _launch
    chosen = _choose(backend)
    if _launch is not None:
        current = "mpi" if isinstance(_launch, Mpi) else "gloo"
        if current != chosen:
            raise ValueError("cupcake.init: backend: already chosen; got %r, expected %r (the first choice holds for "
                             "the process)" % (chosen, current))
        return _launch
    _launch = mpi() if chosen == "mpi" else _gloo(timeout_s)
    return _launch


def launch():
    """The process's Launch: init() with its defaults on the first call."""
    return _launch if _launch is not None else init()


def _choose(backend):
    where = "cupcake.init: backend"
    if backend is None or backend == "auto":
        backend = os.environ.get(BACKEND_ENV) or "auto"
        where = BACKEND_ENV
    if backend not in ("auto", "mpi", "gloo"):
        raise ValueError("%s: unknown backend; got %r, expected auto, mpi or gloo" % (where, backend))
    if backend != "auto":
        return backend
    if any(v in os.environ for v in _MPI_ENV):
        return "mpi"
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return "gloo"
    present = [v for v in _TORCHRUN_ENV if v in os.environ]
    if len(present) == len(_TORCHRUN_ENV):
        return "gloo"
    if present:
        raise ValueError("cupcake: launch: torchrun's variables are incomplete; got %s, missing %s; expected all of "
                         "%s (torchrun), or a job under mpirun, or %s=mpi|gloo"
                         % (", ".join(present), ", ".join(v for v in _TORCHRUN_ENV if v not in present),
                            ", ".join(_TORCHRUN_ENV), BACKEND_ENV))
    return "mpi"


def _gloo(timeout_s):
    import torch.distributed as dist
    if not dist.is_initialized():
        missing = [v for v in _TORCHRUN_ENV if v not in os.environ]
        if missing:
            raise ValueError("cupcake: backend gloo: torch.distributed is not initialized and %s not set; expected a "
                             "job under torchrun, or torch.distributed.init_process_group first" % ", ".join(missing))
        dist.init_process_group("gloo", init_method="env://")
    # Our keys apart from the job's and torch's own.
    store = dist.PrefixStore("cupcake/", dist.distributed_c10d._get_default_store())
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "").split(",")[0]
    launched = Gloo(store, dist.get_rank(), dist.get_world_size(), iface=iface, timeout_s=timeout_s)
    atexit.register(_finalize)
    return launched


def world():
    """Collective: a new host communicator over every rank (a duplicate of MPI_COMM_WORLD, or a
    new gloo group) with rank, size, local_rank, local_size and broadcast. Close it when done
    (contextlib.closing): a job that initialized MPI itself finalizes it, and must find no
    communicator of ours left."""
    return launch().world()


def layout():
    """(rank, size, local_rank, local_size) of this process; collective on the first call."""
    global _layout
    if _layout is None:
        with contextlib.closing(world()) as w:
            _layout = (w.rank, w.size, w.local_rank, w.local_size)
    return _layout


def known_rank():
    """This process's rank when known without a collective (for printing an error once per
    job): layout()'s once made, the gloo launch's, else the launcher's variables (mpirun's
    OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK; torchrun's RANK); None when none says."""
    if _layout is not None:
        return _layout[0]
    if _launch is not None and not isinstance(_launch, Mpi):
        return _launch.rank
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def kernel_time_source():
    """The process's CUPTI kernel-time source (one per process), opened on the first call, for a
    Recorder on a GPU: `Recorder(name, kernel_time_source())`. Raises cupcake.Error when the
    build has no CUPTI."""
    global _kernel_time
    if _kernel_time is None:
        _kernel_time = _open_kernel_time_source()
    return _kernel_time


def track(closeable):
    """Closes `closeable` (a session) at exit, before MPI is finalized. Returns it."""
    _tracked.add(closeable)
    return closeable


def _finalize():
    for c in list(_tracked):
        c.close()
    if _launch is not None and not isinstance(_launch, Mpi):
        _launch.close()
    if _mpi is not None:
        _mpi.close()

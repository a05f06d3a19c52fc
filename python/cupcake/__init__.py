"""Cupcake's Python package: the runtime (libruntime) for training jobs (docs/PYTHON.md).

`cupcake.torch.DistributedOptimizer` is what a PyTorch job uses. This module holds the process
state the package shares: MPI, initialized on first use unless the job initialized it already
(mpi4py, another library), and finalized at exit after every session and recorder made from it
is closed.
"""

import atexit
import contextlib
import ctypes
import weakref

# Open MPI loads its components with dlopen and expects libmpi's symbols to be global; a Python
# extension is loaded RTLD_LOCAL, so load libmpi globally first (what mpi4py does).
for _name in ("libmpi.so.40", "libmpi.so"):
    try:
        ctypes.CDLL(_name, mode=ctypes.RTLD_GLOBAL)
        break
    except OSError:
        pass

from ._runtime import Communicator, Error, Recorder, Session, SessionOptions, Mpi, built_with_nccl, plan_ratios  # noqa: E402,E501
from ._runtime import open_kernel_time_source as _open_kernel_time_source  # noqa: E402
from ._runtime import Checkpointer  # noqa: E402,F401  (docs/CHECKPOINT.md)

__all__ = ["Communicator", "Error", "Recorder", "Session", "SessionOptions", "Mpi", "mpi", "world", "layout", "track",
           "built_with_nccl", "plan_ratios", "kernel_time_source"]

_mpi = None
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


def world():
    """Collective: a new host communicator over every rank (a duplicate of MPI_COMM_WORLD) with
    rank, size, local_rank, local_size and broadcast. Close it when done (contextlib.closing):
    a job that initialized MPI itself finalizes it, and must find no communicator of ours left."""
    return mpi().world()


def layout():
    """(rank, size, local_rank, local_size) of this process; collective on the first call."""
    global _layout
    if _layout is None:
        with contextlib.closing(world()) as w:
            _layout = (w.rank, w.size, w.local_rank, w.local_size)
    return _layout


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
    if _mpi is not None:
        _mpi.close()

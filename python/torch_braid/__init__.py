"""braid: a faster, safer c10d communication backend for PyTorch.

    import torch_braid
    torch.distributed.init_process_group("braid")

Importing this package registers the backend under the name "braid".
"""
import inspect

import torch
import torch.distributed as dist

from . import _C
from . import _destroy
from . import _monitored_barrier

__version__ = _C.__version__
__all__ = ["__version__", "build_info", "settings"]


def _create_backend(store, rank, size, timeout):
    return _C.ProcessGroupBraid(store, rank, size, timeout)


def _create_backend_extended(opts, backend_options=None):
    # torch 2.x's extended creator also tells the group's name and its
    # members' global ranks, which the flight recorder's dumps show.
    pg = _C.ProcessGroupBraid(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    ranks = list(getattr(opts, "global_ranks_in_group", None) or range(opts.group_size))
    pg._fr_describe(str(getattr(opts, "group_id", "") or ""), [int(r) for r in ranks])
    return pg


def _register():
    if getattr(dist.Backend, "BRAID", None) is not None:
        return  # already registered (module re-executed)
    kwargs = {}
    params = inspect.signature(dist.Backend.register_backend).parameters
    creator = _create_backend
    if "devices" in params:
        # torch 2.x: one Backend object serves both devices (a group holds one
        # backend per type, and two custom ones would alias); CUDA tensors go
        # through braid's CUDA executors (Note [The staged CUDA executor]).
        kwargs["devices"] = ["cpu", "cuda"]
    if "extended_api" in params:
        kwargs["extended_api"] = True
        creator = _create_backend_extended
    dist.Backend.register_backend("braid", creator, **kwargs)


def build_info():
    """How this build was configured: versions, SIMD level, CUDA."""
    return _C.build_info()


def settings():
    """Every BRAID_ environment setting with its default, value and doc."""
    return _C.settings()


_register()
_monitored_barrier.install()  # dist.monitored_barrier accepts braid groups
_destroy.install()  # dist.destroy_process_group ends braid's threads on every torch

import atexit as _atexit  # noqa: E402

# Note [Dropping Python objects at exit] (csrc/common/exit_guard.h): before the interpreter
# finalizes, braid's threads stop dropping tensors (which would take the GIL and be ended).
_atexit.register(_C._begin_exit)

def __getattr__(name):
    # torch_braid.fr loads on first use, so that `python -m torch_braid.fr`
    # does not find it imported already.
    if name == "fr":
        import importlib

        return importlib.import_module(".fr", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if _C.fr_dump_on_exit():
    import atexit
    import importlib

    atexit.register(lambda: importlib.import_module(".fr", __name__)._dump_at_exit())

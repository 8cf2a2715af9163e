"""braid: a faster, safer c10d communication backend for PyTorch.

    import torch_braid
    torch.distributed.init_process_group("braid")

Importing this package registers the backend under the name "braid".
"""
import inspect

import torch
import torch.distributed as dist

from . import _C
from . import _monitored_barrier

__version__ = _C.__version__
__all__ = ["__version__", "build_info", "settings"]


def _create_backend(store, rank, size, timeout):
    return _C.ProcessGroupBraid(store, rank, size, timeout)


def _register():
    if getattr(dist.Backend, "BRAID", None) is not None:
        return  # already registered (module re-executed)
    kwargs = {}
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        # torch 2.x: the CPU path only, for now; CUDA tensors go to NCCL in
        # mixed configs such as "cpu:braid,cuda:nccl".
        kwargs["devices"] = ["cpu"]
    dist.Backend.register_backend("braid", _create_backend, **kwargs)


def build_info():
    """How this build was configured: versions, SIMD level, CUDA."""
    return _C.build_info()


def settings():
    """Every BRAID_ environment setting with its default, value and doc."""
    return _C.settings()


_register()
_monitored_barrier.install()  # dist.monitored_barrier accepts braid groups

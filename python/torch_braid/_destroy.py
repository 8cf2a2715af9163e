"""Makes ``torch.distributed.destroy_process_group`` end braid's threads on every torch.

torch 2.8 and later call ``shutdown()`` on each backend of a group they
destroy; torch 1.13 and 2.6 only drop their references to the group. A
group that something else still holds (DDP's C++ reducer after a failed
backward holds it in a cycle no garbage collection breaks: seen on torch 2.6
by tests/python/test_fault_injection.py) then keeps braid's worker and
point-to-point threads running after the script destroyed it. Importing
torch_braid wraps the function: after torch's own destroy, every braid
backend of the destroyed groups is shut down (issued ops finish within their
timeouts, then the threads are joined). ``shutdown()`` is idempotent, so on
torch 2.8+ the second call costs nothing.

As with the monitored_barrier wrapper, code that bound the function before
importing torch_braid (`from torch.distributed import destroy_process_group`)
keeps torch's original.
"""
import functools

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from . import _C


def _braid_backends(group):
    """The braid backends of `group`, or of every group when it is None."""
    if group is None or group is _c10d.GroupMember.WORLD:
        world = getattr(_c10d, "_world", None)  # torch 1.13 keeps a module-level _pg_map
        groups = list((world.pg_map if world is not None else _c10d._pg_map).keys())
    else:
        groups = [group]
    found = []
    for pg in groups:
        backend = pg
        if hasattr(pg, "_get_backend"):  # torch 2.x: a ProcessGroup over backends
            try:
                backend = pg._get_backend(torch.device("cpu"))
            except RuntimeError:
                continue  # no CPU backend
        if isinstance(backend, _C.ProcessGroupBraid):
            found.append(backend)
    return found


def install():
    original = _c10d.destroy_process_group
    if getattr(original, "_braid_wrapped", None) is not None:
        return  # already installed (the package was imported again)

    @functools.wraps(original)
    def destroy_process_group(*args, **kwargs):
        group = kwargs.get("group", args[0] if args else None)
        backends = _braid_backends(group)
        original(*args, **kwargs)
        for backend in backends:
            backend.shutdown()

    destroy_process_group._braid_wrapped = original
    _c10d.destroy_process_group = destroy_process_group
    if getattr(dist, "destroy_process_group", None) is original:
        dist.destroy_process_group = destroy_process_group

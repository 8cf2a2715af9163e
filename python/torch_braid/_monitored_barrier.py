"""Lets ``torch.distributed.monitored_barrier`` run on braid groups.

torch's Python function refuses every backend but gloo by name, before it
reaches the C++ ``monitoredBarrier`` that braid implements
(csrc/c10d/process_group_monitored.cc, Note [Monitored barrier]). Importing
torch_braid wraps it: a group whose CPU backend is braid goes straight to that
method; any other call goes to torch's own function, unchanged.

The wrapper keeps torch's signature and its two other steps (ranks outside
the group return at once, a float timeout means seconds). Without a timeout
it passes none, so braid uses the group's own timeout, as gloo's
documentation promises ("the default process group timeout").

The wrapper replaces the name in torch.distributed and its distributed_c10d
module: code that bound the function itself before importing torch_braid
(`from torch.distributed import monitored_barrier`) keeps torch's original.
"""
import datetime
import functools

import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d


def _is_braid(group):
    """Whether the group's CPU collectives run on braid ("braid", "cpu:braid,...")."""
    try:
        name = str(dist.get_backend(group))
    except (RuntimeError, ValueError):
        return False
    parts = [p.strip() for p in name.split(",")]
    return "braid" in parts or "cpu:braid" in parts


def install():
    original = _c10d.monitored_barrier
    if getattr(original, "_braid_wrapped", None) is not None:
        return  # already installed (the package was imported again)

    @functools.wraps(original)
    def monitored_barrier(group=_c10d.GroupMember.WORLD, timeout=None, wait_all_ranks=False):
        if _c10d._rank_not_in_group(group) or not _is_braid(group):
            return original(group, timeout, wait_all_ranks)
        pg = _c10d._get_default_group() if group is None else group
        if timeout is None:
            return pg.monitored_barrier(wait_all_ranks=wait_all_ranks)
        if isinstance(timeout, (int, float)):
            timeout = datetime.timedelta(seconds=timeout)
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._braid_wrapped = original
    _c10d.monitored_barrier = monitored_barrier
    if getattr(dist, "monitored_barrier", None) is original:  # `from .distributed_c10d import *`
        dist.monitored_barrier = monitored_barrier

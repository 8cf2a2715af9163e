"""Coalescing windows (torch 2.x): Note [Coalescing] in csrc/backend/coalesced_work.h.

torch's _coalescing_manager with a device, batch_isend_irecv (which coalesces
when the backend says it supports it) and the backend's own start/end pair:
every op in the window completes, with closed-form results, through the one
Work that endCoalescing returns.
"""
import inspect

import pytest

import harness as H


def _has_device_coalescing(ctx):
    from torch.distributed import distributed_c10d as c10d

    cm = getattr(c10d, "_coalescing_manager", None)
    return (cm is not None and "device" in inspect.signature(cm).parameters
            and getattr(ctx.backend_object(), "supports_coalescing", False))


def _manager_allreduce(ctx, count, async_ops):
    """Several all_reduce calls in one _coalescing_manager window (the fast path)."""
    torch, dist = ctx.torch, ctx.dist
    if not _has_device_coalescing(ctx):
        return "unsupported"
    from torch.distributed import distributed_c10d as c10d

    ch = H.Checker(ctx)
    n, me = ctx.size, ctx.rank
    tensors = [torch.full((count + i,), float(me + 1 + i)) for i in range(3)]
    with c10d._coalescing_manager(device=torch.device("cpu"), async_ops=async_ops) as cm:
        for t in tensors:
            dist.all_reduce(t)
    if async_ops:
        cm.wait()
    for i, t in enumerate(tensors):
        expected = sum(float(r + 1 + i) for r in range(n))
        ch.equal(f"tensor {i} (count {count + i})", t, torch.full((count + i,), expected))
    return ch.report()


def _backend_window(ctx):
    """Mixed ops between the backend's startCoalescing and endCoalescing."""
    torch = ctx.torch
    from torch.distributed import distributed_c10d as c10d

    be = ctx.backend_object()
    pg = c10d._get_default_group()
    cpu = torch.device("cpu")
    if not _has_device_coalescing(ctx):
        return "unsupported"
    ch = H.Checker(ctx)
    n, me = ctx.size, ctx.rank
    a = torch.full((7,), float(me))
    b = torch.full((5,), float(me * 10)) if me == 0 else torch.zeros(5)
    pg._start_coalescing(cpu)  # the ProcessGroup forwards to the backend for the device
    be.allreduce([a])
    be.broadcast([b])
    work = pg._end_coalescing(cpu)
    work.wait()
    ch.equal("allreduce", a, torch.full((7,), float(n * (n - 1) / 2)))
    ch.equal("broadcast", b, torch.zeros(5))
    outputs = work.get_future().wait()
    ch.equal("future outputs in issue order", torch.tensor(len(outputs)), torch.tensor(2))
    return ch.report()


def _skip_if_unsupported(results):
    if any(r == "unsupported" for r in results):
        pytest.skip("this torch has no device coalescing for custom backends")


@pytest.mark.braid_only
@pytest.mark.parametrize("async_ops", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("count", [0, 1, 1023])
@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3), slow=(4, 5)), indirect=True)
def test_coalescing_manager_allreduce(world, count, async_ops):
    results = world.run(_manager_allreduce, count, async_ops)
    _skip_if_unsupported(results)
    H.check_reports(results)


@pytest.mark.braid_only
@pytest.mark.parametrize("world", H.sizes(fast=(2, 3), slow=(4,)), indirect=True)
def test_backend_coalescing_window(world):
    results = world.run(_backend_window)
    _skip_if_unsupported(results)
    H.check_reports(results)

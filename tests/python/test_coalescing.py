"""Coalescing windows (torch 2.x): Note [Coalescing] in csrc/c10d/coalesced_work.h.

torch's _coalescing_manager with a device, batch_isend_irecv (which coalesces
when the backend says it supports it) and the backend's own start/end pair:
every op in the window completes, with closed-form results, through the one
Work that endCoalescing returns. reduce_scatter_tensor_coalesced and
allgather_into_tensor_coalesced return one such Work too (Note [Coalesced
calls]): every output, complete when all ops are, and the first op's error when
it fails on the worker (its shape differs between the ranks) while the others
succeed.
"""
import inspect

import pytest

import harness as H


def _has_device_coalescing(ctx):
    """Whether this torch coalesces for custom backends (_coalescing_manager takes a device).
    Where torch asks the backend (Backend.supports_coalescing, after 2.6), braid's must say
    True: its own flag turning false is a regression, which fails here rather than skipping
    the tests (on torch 2.6, which has no such flag, that skip hid every case)."""
    from torch.distributed import distributed_c10d as c10d

    cm = getattr(c10d, "_coalescing_manager", None)
    if cm is None or "device" not in inspect.signature(cm).parameters:
        return False
    be = ctx.backend_object()
    if not hasattr(type(be), "supports_coalescing"):
        return True  # torch 2.6: no backend is asked; the manager calls _start_coalescing
    assert be.supports_coalescing is True, (
        f"rank {ctx.rank}: braid's backend has supports_coalescing = {be.supports_coalescing!r} "
        f"on torch {ctx.torch.__version__}, whose _coalescing_manager coalesces for backends "
        f"that say True")
    return True


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


# -- one Work for a whole call, and its first op failing -------------------------------


def _work_outcome(work):
    """(wait's error, the future's error, the future's tensors, result(), completed, success)."""
    try:
        work.wait()
        err = None
    except RuntimeError as e:
        err = str(e)
    try:
        values, ferr = work.get_future().wait(), None
    except RuntimeError as e:
        values, ferr = None, str(e)
    return err, ferr, values, work.result(), work.is_completed(), work.is_success()


def _tensor_coalesced(ctx, which, mode):
    """pg.<which>_tensor_coalesced with 3 pairs of tensors ("ok"), op 0 mismatched
    ("first_fails"), or none ("empty"); also through _coalescing_manager's fast path."""
    torch, dist = ctx.torch, ctx.dist
    from torch.distributed import distributed_c10d as c10d

    pg = c10d._get_default_group()
    if not hasattr(pg, "allgather_into_tensor_coalesced"):
        return "unsupported"
    ch = H.Checker(ctx)
    n, me = ctx.size, ctx.rank
    counts = {"ok": [3, 5, 2], "first_fails": [3, 5, 2], "empty": []}[mode]
    if mode == "first_fails" and me == n - 1:
        counts = [4] + counts[1:]  # op 0's shape differs: its header check fails on every rank

    def tensors():
        if which == "allgather":
            ins = [torch.full((c,), float(me * 10 + i)) for i, c in enumerate(counts)]
            outs = [torch.full((c * n,), -1.0) for c in counts]
            want = [torch.cat([torch.full((c,), float(r * 10 + i)) for r in range(n)])
                    for i, c in enumerate(counts)]
        else:
            ins = [torch.arange(c * n, dtype=torch.float32) + me + i for i, c in enumerate(counts)]
            outs = [torch.full((c,), -1.0) for c in counts]
            want = [n * torch.arange(me * c, (me + 1) * c, dtype=torch.float32)
                    + sum(r + i for r in range(n)) for i, c in enumerate(counts)]
        return ins, outs, want

    # torch 2.14 adds torchcomms' names, which reach the same backend calls.
    base = "allgather_into_tensor" if which == "allgather" else "reduce_scatter_tensor"
    newer = "all_gather_single" if which == "allgather" else "reduce_scatter_single"
    names = [f"{base}_coalesced"] + [f"{newer}_coalesced"] * hasattr(pg, f"{newer}_coalesced")

    def issue(ins, outs, name=names[0]):
        if which == "allgather":
            return getattr(pg, name)(outs, ins)
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        return getattr(pg, name)(outs, ins, opts)

    def check(label, err, outs, want):
        if mode == "first_fails":
            ch.true(f"{label}: op 0's error", err is not None and "passed shape" in err, err)
            first = 1
        else:
            ch.true(f"{label}: no error", err is None, err)
            first = 0
        for i in range(first, len(counts)):  # the ops after a failed one still ran
            ch.equal(f"{label}: output {i}", outs[i], want[i])

    if mode == "empty":
        # torch 2.x's dispatcher finds no tensor to dispatch on and refuses before
        # any backend sees the call; braid's own answer (a completed Work with no
        # outputs) is checked from C++ (tests/cpp/test_torch_coalesced.cc).
        try:
            issue([], [])
            ch.true("torch refuses an empty list", False, "it was accepted")
        except (RuntimeError, NotImplementedError) as e:
            ch.true("torch refuses an empty list", "no tensor arguments" in str(e), str(e))
        t = torch.ones(3)
        dist.all_reduce(t)
        ch.equal("allreduce after", t, torch.full((3,), float(n)))
        return ch.report()

    for name in names:
        ins, outs, want = tensors()
        err, ferr, values, result, completed, success = _work_outcome(issue(ins, outs, name))
        check(name, err, outs, want)
        ch.true(f"{name}: completed", completed)
        ch.true(f"{name}: success", success == (mode != "first_fails"), success)
        ch.true(f"{name}: future's error is wait's", ferr == err, (ferr, err))
        ch.equal(f"{name}: result() holds every output", torch.tensor(len(result)),
                 torch.tensor(len(counts)))
        for i in range(len(result)):
            ch.true(f"{name}: result {i} is output {i}",
                    result[i].data_ptr() == outs[i].data_ptr())
        if err is None:
            ch.equal(f"{name}: future holds every output", torch.tensor(len(values)),
                     torch.tensor(len(counts)))
            for i, v in enumerate(values):
                ch.equal(f"{name}: future value {i}", v, want[i])

    # The same through torch's fast path: ops queued in the manager, then one call.
    ins, outs, want = tensors()
    try:
        with c10d._coalescing_manager(async_ops=True) as cm:
            for a, b in zip(ins, outs):
                if which == "allgather":
                    dist.all_gather_into_tensor(b, a, async_op=True)
                else:
                    dist.reduce_scatter_tensor(b, a, async_op=True)
        cm.wait()
        err = None
    except RuntimeError as e:
        err = str(e)
    check("_coalescing_manager", err, outs, want)

    t = torch.ones(3)
    dist.all_reduce(t)  # the group is still in step and usable
    ch.equal("allreduce after", t, torch.full((3,), float(n)))
    return ch.report()


def _window_first_fails(ctx):
    """The backend's start/end window: op 0 fails on the worker, ops 1 and 2 complete."""
    torch = ctx.torch
    from torch.distributed import distributed_c10d as c10d

    if not _has_device_coalescing(ctx):
        return "unsupported"
    be = ctx.backend_object()
    pg = c10d._get_default_group()
    cpu = torch.device("cpu")
    ch = H.Checker(ctx)
    n, me = ctx.size, ctx.rank
    bad = torch.ones(3 if me == 0 else 4)
    a = torch.full((7,), float(me))
    b = torch.full((5,), 10.0) if me == 0 else torch.zeros(5)
    pg._start_coalescing(cpu)
    be.allreduce([bad])
    be.allreduce([a])
    be.broadcast([b])
    work = pg._end_coalescing(cpu)
    err, ferr, values, result, completed, success = _work_outcome(work)
    ch.true("op 0's error", err is not None and "shape" in err, err)
    ch.true("future's error is wait's", ferr == err, (ferr, err))
    ch.true("completed, not successful", completed and not success, (completed, success))
    ch.equal("op 1 ran", a, torch.full((7,), float(n * (n - 1) / 2)))
    ch.equal("op 2 ran", b, torch.full((5,), 10.0))
    ch.equal("result() holds every output", torch.tensor(len(result)), torch.tensor(3))
    empty = (pg._start_coalescing(cpu), pg._end_coalescing(cpu))[1]
    err, ferr, values, result, completed, success = _work_outcome(empty)
    ch.true("an empty window completes", completed and success and err is None and ferr is None,
            (completed, success, err, ferr))
    ch.equal("with no outputs", torch.tensor(len(values) + len(result)), torch.tensor(0))
    return ch.report()


@pytest.mark.braid_only
@pytest.mark.parametrize("mode", ["ok", "first_fails", "empty"])
@pytest.mark.parametrize("which", ["allgather", "reduce_scatter"])
@pytest.mark.parametrize("world", H.sizes(fast=(2, 3), slow=(4,)), indirect=True)
def test_tensor_coalesced_call_is_one_work(world, which, mode):
    results = world.run(_tensor_coalesced, which, mode)
    _skip_if_unsupported(results)
    H.check_reports(results)


@pytest.mark.braid_only
@pytest.mark.parametrize("world", H.sizes(fast=(2,), slow=(3,)), indirect=True)
def test_coalescing_window_with_a_failed_first_op(world):
    results = world.run(_window_first_fails)
    _skip_if_unsupported(results)
    H.check_reports(results)

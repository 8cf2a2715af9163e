"""async_op=True: Work.wait/is_completed/get_future, overlapping ops, and barrier."""

import time

import pytest

import harness as H


def _flatten(v):
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _flatten(x)]
    return [v]


def _check_work(ch, ctx, what, work, outputs):
    """wait() is True, then is_completed(); the future's value is the list of outputs."""
    torch = ctx.torch
    ch.true(what + " returns a Work", work is not None, repr(work))
    ch.true(what + " wait() returns True", work.wait() is True)
    ch.true(what + " is_completed() after wait", work.is_completed())
    value = work.get_future().wait()
    ch.true(what + " future value is a list", isinstance(value, list), type(value).__name__)
    flat = _flatten(value)
    ch.true(what + " future value holds tensors",
            all(isinstance(t, torch.Tensor) for t in flat), repr(value)[:200])
    want = _flatten(outputs)
    ch.true(what + " future value has the outputs", len(flat) == len(want),
            f"{len(flat)} tensors, expected {len(want)}")
    for i, (got, exp) in enumerate(zip(flat, want)):
        ch.equal(f"{what} future value[{i}]", got, exp)


def _async_case(ctx, case):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    n, me, count = ctx.size, ctx.rank, 33
    if case == "allreduce":
        t = H.make_input(me, count, torch.float32)
        expected = H.closed_form([H.make_input(r, count, torch.float32) for r in range(n)],
                                 "SUM")
        _check_work(ch, ctx, case, dist.all_reduce(t, async_op=True), [expected])
        ch.equal("allreduce async result", t, expected)
    elif case == "broadcast":
        b = H.pattern(me, 0, count, torch.int64)
        _check_work(ch, ctx, case, dist.broadcast(b, n - 1, async_op=True),
                    [H.pattern(n - 1, 0, count, torch.int64)])
    elif case == "allgather":
        outs = [torch.zeros(count, dtype=torch.float16) for _ in range(n)]
        work = dist.all_gather(outs, H.pattern(me, 1, count, torch.float16), async_op=True)
        _check_work(ch, ctx, case, work,
                    [H.pattern(r, 1, count, torch.float16) for r in range(n)])
    elif case == "all_gather_into_tensor":
        out = torch.zeros(n * count)
        work = dist.all_gather_into_tensor(out, H.pattern(me, 2, count, torch.float32),
                                           async_op=True)
        _check_work(ch, ctx, case, work,
                    [torch.cat([H.pattern(r, 2, count, torch.float32) for r in range(n)])])
    elif case == "reduce_scatter_tensor":
        chunks = [H.make_input(me, count, torch.float64, salt=j) for j in range(n)]
        rs = torch.zeros(count, dtype=torch.float64)
        work = dist.reduce_scatter_tensor(rs, torch.cat(chunks), async_op=True)
        _check_work(ch, ctx, case, work, [H.closed_form(
            [H.make_input(r, count, torch.float64, salt=me) for r in range(n)], "SUM")])
    elif case == "all_to_all_single":
        a2a = torch.zeros(n * 4, dtype=torch.int32)
        inp = torch.cat([H.pattern(me, j, 4, torch.int32) for j in range(n)])
        work = dist.all_to_all_single(a2a, inp, async_op=True)
        _check_work(ch, ctx, case, work,
                    [torch.cat([H.pattern(r, me, 4, torch.int32) for r in range(n)])])
    elif case == "barrier":
        work = dist.barrier(async_op=True)
        ch.true("barrier wait() returns True", work.wait() is True)
        ch.true("barrier is_completed()", work.is_completed())
    return ch.report()


ASYNC_CASES = ["allreduce", "broadcast", "allgather", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all_single", "barrier"]


@pytest.mark.parametrize("case", ASYNC_CASES)
@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3, 5), slow=(8,)), indirect=True)
def test_async(world, case):
    H.check_reports(world.run(_async_case, case))


def _outstanding(ctx, k):
    """k async allreduces in flight, waited for in reverse order; then a future chain."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    n = ctx.size
    ts = [torch.full((100 + i,), float(ctx.rank + i)) for i in range(k)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    for i, t in enumerate(ts):
        ch.equal(f"outstanding allreduce {i}", t, torch.full((100 + i,), float(
            sum(r + i for r in range(n)))))
    t = torch.ones(8)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    ch.equal("future.then", doubled, torch.full((8,), 2.0 * n))
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(2, 3), slow=(7,)), indirect=True)
def test_outstanding_async(world):
    H.check_reports(world.run(_outstanding, 16))


def _barrier(ctx, rounds):
    """Ranks arrive staggered; nobody may leave before the last one arrived."""
    times = []
    for i in range(rounds):
        time.sleep(0.02 * ((ctx.rank + i) % ctx.size))
        arrive = time.time()
        ctx.dist.barrier()
        times.append((arrive, time.time()))
    return times


@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3, 5), slow=(8,)), indirect=True)
def test_barrier(world):
    per_rank = world.run(_barrier, 3)
    for i in range(3):
        last_arrival = max(t[i][0] for t in per_rank)
        first_departure = min(t[i][1] for t in per_rank)
        assert first_departure >= last_arrival, (
            f"round {i}: a rank left the barrier {last_arrival - first_departure:.4f} s before "
            f"the last rank arrived")

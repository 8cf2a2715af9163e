"""allreduce and allreduce_coalesced against closed forms and gloo.

Inputs are small integers (harness.make_input), so every dtype reduces
exactly and results are compared bit for bit.
"""

import pytest

import harness as H

FAST_COUNTS = (0, 1, 1023)
SLOW_COUNTS = (65537, 1 << 20)


def _allreduce(ctx, dtype_name, counts, ops):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    for op in ops:
        for count in counts:
            inputs = [H.make_input(r, count, dtype, op) for r in range(ctx.size)]
            expected = H.closed_form(inputs, op, ctx.size)
            what = f"allreduce {dtype_name} {op} count={count}"
            t = inputs[ctx.rank].clone()
            work = dist.all_reduce(t, op=H.reduce_op(op))
            ch.true(what + " returns None when sync", work is None, repr(work))
            ch.reduced(what, t, expected, op)
            ref = inputs[ctx.rank].clone()
            if H.gloo_reference_ok(dtype, op) and H.gloo(
                    lambda: dist.all_reduce(ref, op=H.reduce_op(op), group=ctx.ref)):
                ch.equal(what + " (gloo vs closed form)", ref, expected)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes())
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_allreduce(world, dtype):
    H.check_reports(world.run(_allreduce, dtype, FAST_COUNTS, H.ops_for(dtype)))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", H.dtypes())
@pytest.mark.parametrize("world", H.sizes(fast=(2, 3, 5), slow=(8,)), indirect=True)
def test_allreduce_large(world, dtype):
    H.check_reports(world.run(_allreduce, dtype, SLOW_COUNTS, H.ops_for(dtype), timeout=300))


def _allreduce_repeated(ctx, count, iters):
    """Many back-to-back calls on the same and on alternating buffers (slot reuse)."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    a = torch.full((count,), float(ctx.rank + 1))
    b = torch.ones(count, dtype=torch.int64)
    for i in range(iters):
        dist.all_reduce(a)
        dist.all_reduce(b, op=dist.ReduceOp.PRODUCT if i % 2 else dist.ReduceOp.SUM)
    # a: s0 = n(n+1)/2, then multiplied by n on each further call
    n = ctx.size
    expected_a = float(n * (n + 1) // 2) * float(n) ** (iters - 1)
    ch.equal("repeated allreduce float", a, torch.full((count,), expected_a))
    # b: SUM multiplies by n, PRODUCT raises to the n-th power; int64 wraps mod 2^64.
    v = 1
    for i in range(iters):
        v = pow(v, n, 1 << 64) if i % 2 else v * n % (1 << 64)
    v = v - (1 << 64) if v >= 1 << 63 else v
    ch.equal("repeated allreduce int64", b, torch.full((count,), v, dtype=torch.int64))
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(2, 3), slow=(7,)), indirect=True)
def test_allreduce_repeated(world):
    H.check_reports(world.run(_allreduce_repeated, 5, 6))


def _allreduce_coalesced(ctx, dtype_name, counts, ops):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    for op in ops:
        inputs = [[H.make_input(r, c, dtype, op, salt=j) for j, c in enumerate(counts)]
                  for r in range(ctx.size)]
        expected = [H.closed_form([inputs[r][j] for r in range(ctx.size)], op, ctx.size)
                    for j in range(len(counts))]
        ts = [x.clone() for x in inputs[ctx.rank]]
        dist.all_reduce_coalesced(ts, op=H.reduce_op(op))
        for j, (t, e) in enumerate(zip(ts, expected)):
            ch.reduced(f"allreduce_coalesced {dtype_name} {op} tensor {j} count={counts[j]}", t,
                       e, op)
        refs = [x.clone() for x in inputs[ctx.rank]]
        if H.gloo_reference_ok(dtype, op) and H.gloo(
                lambda: dist.all_reduce_coalesced(refs, op=H.reduce_op(op), group=ctx.ref)):
            for j, (r, e) in enumerate(zip(refs, expected)):
                ch.equal(f"allreduce_coalesced {dtype_name} {op} tensor {j} (gloo)", r, e)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "bfloat16", "int64", "bool"),
                                           slow=H.DTYPES))
@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3, 5), slow=(8,)), indirect=True)
def test_allreduce_coalesced(world, dtype):
    H.check_reports(world.run(_allreduce_coalesced, dtype, (7, 1, 300), H.ops_for(dtype)))

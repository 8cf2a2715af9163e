"""broadcast, reduce, gather and scatter, from every root."""

import pytest

import harness as H

FAST_COUNTS = (0, 1, 1023)
SLOW_COUNTS = (1 << 20,)


def _broadcast(ctx, dtype_name, counts):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    for root in range(ctx.size):
        for count in counts:
            what = f"broadcast {dtype_name} root={root} count={count}"
            t = H.pattern(ctx.rank, 0, count, dtype)
            dist.broadcast(t, src=root)
            expected = H.pattern(root, 0, count, dtype)
            ch.equal(what, t, expected)
            ref = H.pattern(ctx.rank, 0, count, dtype)
            if dtype != torch.bool and H.gloo(lambda: dist.broadcast(ref, root, group=ctx.ref)):
                ch.equal(what + " (gloo)", ref, expected)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes())
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_broadcast(world, dtype):
    H.check_reports(world.run(_broadcast, dtype, FAST_COUNTS))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "bfloat16", "int8", "bool")))
@pytest.mark.parametrize("world", H.sizes(fast=(2, 5), slow=(8,)), indirect=True)
def test_broadcast_large(world, dtype):
    H.check_reports(world.run(_broadcast, dtype, SLOW_COUNTS, timeout=300))


def _reduce(ctx, dtype_name, counts, ops):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    for op in ops:
        for root in range(ctx.size):
            for count in counts:
                what = f"reduce {dtype_name} {op} root={root} count={count}"
                inputs = [H.make_input(r, count, dtype, op, salt=root) for r in range(ctx.size)]
                expected = H.closed_form(inputs, op, ctx.size)
                t = inputs[ctx.rank].clone()
                dist.reduce(t, dst=root, op=H.reduce_op(op))
                if ctx.rank == root:  # non-root buffers are unspecified after reduce
                    ch.reduced(what, t, expected, op)
                # Every rank enters gloo's reduce; only the root's result is checked.
                ref = inputs[ctx.rank].clone()
                if H.gloo_reference_ok(dtype, op) and H.gloo(
                        lambda: dist.reduce(ref, root, op=H.reduce_op(op), group=ctx.ref)) \
                        and ctx.rank == root:
                    ch.equal(what + " (gloo)", ref, expected)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes())
@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3, 4, 5)), indirect=True)
def test_reduce(world, dtype):
    ops = H.ops_for(dtype)
    reports = world.run(_reduce, dtype, (0, 1, 257) if world.n > 3 else FAST_COUNTS, ops)
    H.check_reports(reports)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "bfloat16", "int32")))
@pytest.mark.parametrize("world", H.sizes(fast=(3,), slow=(8,)), indirect=True)
def test_reduce_large(world, dtype):
    H.check_reports(world.run(_reduce, dtype, SLOW_COUNTS, ["SUM", "MAX"], timeout=300))


def _gather(ctx, dtype_name, counts):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    n = ctx.size
    for root in range(n):
        for count in counts:
            what = f"gather {dtype_name} root={root} count={count}"
            x = H.pattern(ctx.rank, root, count, dtype)
            outs = [torch.empty(count, dtype=dtype) for _ in range(n)] if ctx.rank == root \
                else None
            dist.gather(x, gather_list=outs, dst=root)
            ch.equal(what + " input untouched", x, H.pattern(ctx.rank, root, count, dtype))
            if ctx.rank == root:
                for r in range(n):
                    ch.equal(f"{what} from rank {r}", outs[r], H.pattern(r, root, count, dtype))
            refs = [torch.empty(count, dtype=dtype) for _ in range(n)] if ctx.rank == root \
                else None
            if dtype != torch.bool and H.gloo(
                    lambda: dist.gather(x, gather_list=refs, dst=root, group=ctx.ref)) \
                    and ctx.rank == root:
                for r in range(n):
                    ch.equal(f"{what} gloo from rank {r}", refs[r], H.pattern(r, root, count,
                                                                              dtype))
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "float16", "bfloat16", "int8",
                                                 "int64", "bool"), slow=H.DTYPES))
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_gather(world, dtype):
    H.check_reports(world.run(_gather, dtype, FAST_COUNTS))


def _scatter(ctx, dtype_name, counts):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    n = ctx.size
    for root in range(n):
        for count in counts:
            what = f"scatter {dtype_name} root={root} count={count}"
            chunks = [H.pattern(root, j, count, dtype) for j in range(n)] \
                if ctx.rank == root else None
            out = torch.zeros(count, dtype=dtype)
            dist.scatter(out, scatter_list=chunks, src=root)
            expected = H.pattern(root, ctx.rank, count, dtype)
            ch.equal(what, out, expected)
            if ctx.rank == root:
                for j in range(n):
                    ch.equal(f"{what} source {j} untouched", chunks[j],
                             H.pattern(root, j, count, dtype))
            ref = torch.zeros(count, dtype=dtype)
            if dtype != torch.bool and H.gloo(
                    lambda: dist.scatter(ref, scatter_list=chunks, src=root, group=ctx.ref)):
                ch.equal(what + " (gloo)", ref, expected)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "float16", "bfloat16", "int8",
                                                 "int64", "bool"), slow=H.DTYPES))
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_scatter(world, dtype):
    H.check_reports(world.run(_scatter, dtype, FAST_COUNTS))


@pytest.mark.slow
@pytest.mark.parametrize("world", H.sizes(fast=(3,), slow=(8,)), indirect=True)
def test_gather_scatter_large(world):
    H.check_reports(world.run(_gather, "float32", SLOW_COUNTS, timeout=300))
    H.check_reports(world.run(_scatter, "float32", SLOW_COUNTS, timeout=300))

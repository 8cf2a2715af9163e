"""reduce_scatter (lists), reduce_scatter_tensor and _reduce_scatter_base.

gloo lacks these on torch 1.13; the gloo reference is then an allreduce of the
same inputs, sliced (what gloo itself does on 2.x, see anchors.md).
"""

import pytest
import torch.distributed as dist

import harness as H

FAST_COUNTS = (0, 1, 1023)
SLOW_COUNTS = (1 << 18,)


def _gloo_reference(ctx, chunks, op):
    """Rank's chunk of the allreduce of the concatenated inputs, via gloo."""
    flat = ctx.torch.cat(chunks)
    if not H.gloo(lambda: ctx.dist.all_reduce(flat, op=H.reduce_op(op), group=ctx.ref)):
        return None
    count = chunks[0].numel()
    return flat[ctx.rank * count:(ctx.rank + 1) * count]


def _reduce_scatter(ctx, dtype_name, counts, ops, api):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    n = ctx.size
    for op in ops:
        for count in counts:
            what = f"{api} {dtype_name} {op} count={count}"
            # chunks[r][j]: what rank r contributes to rank j's output.
            chunks = [[H.make_input(r, count, dtype, op, salt=j) for j in range(n)]
                      for r in range(n)]
            expected = H.closed_form([chunks[r][ctx.rank] for r in range(n)], op, n)
            mine = [c.clone() for c in chunks[ctx.rank]]
            out = torch.zeros(count, dtype=dtype)
            if api == "reduce_scatter":
                dist.reduce_scatter(out, mine, op=H.reduce_op(op))
            else:
                getattr(dist, api)(out, torch.cat(mine), op=H.reduce_op(op))
            ch.reduced(what, out, expected, op)
            for j in range(n):
                ch.equal(f"{what} input {j} untouched", mine[j], chunks[ctx.rank][j])
            if H.gloo_reference_ok(dtype, op):
                ref = _gloo_reference(ctx, chunks[ctx.rank], op)
                if ref is not None:
                    ch.equal(what + " (gloo allreduce, sliced)", ref, expected)
    return ch.report()


APIS = ["reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base"]


def _skip_missing(api):
    if not hasattr(dist, api):
        pytest.skip(f"torch.distributed.{api} does not exist in this torch")


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("dtype", H.dtypes())
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_reduce_scatter(world, dtype, api):
    _skip_missing(api)
    H.check_reports(world.run(_reduce_scatter, dtype, FAST_COUNTS, H.ops_for(dtype), api))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "bfloat16", "int32")))
@pytest.mark.parametrize("world", H.sizes(fast=(2, 5), slow=(8,)), indirect=True)
def test_reduce_scatter_large(world, dtype):
    H.check_reports(world.run(_reduce_scatter, dtype, SLOW_COUNTS, ["SUM", "MIN"],
                              "reduce_scatter_tensor", timeout=300))


def _reduce_scatter_2d(ctx):
    """torch 2.x accepts an [n, count] input for reduce_scatter_tensor."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    n, count = ctx.size, 6
    x = torch.stack([H.make_input(ctx.rank, count, torch.float32, "SUM", salt=j)
                     for j in range(n)])
    out = torch.zeros(count)
    dist.reduce_scatter_tensor(out, x)
    expected = H.closed_form([H.make_input(r, count, torch.float32, "SUM", salt=ctx.rank)
                              for r in range(n)], "SUM")
    ch.equal("reduce_scatter_tensor [n, count] input", out, expected)
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(2, 3)), indirect=True)
def test_reduce_scatter_tensor_2d(world, require_torch2):
    H.check_reports(world.run(_reduce_scatter_2d))

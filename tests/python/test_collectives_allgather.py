"""allgather, all_gather_into_tensor (_all_gather_base) and all_gather_coalesced."""

import pytest
import torch.distributed as dist

import harness as H

FAST_COUNTS = (0, 1, 1023)
SLOW_COUNTS = (1 << 18, 1 << 20)
DATA_DTYPES = H.dtypes(fast=("float32", "float16", "bfloat16", "int8", "int64", "bool"),
                       slow=H.DTYPES)


def _allgather(ctx, dtype_name, counts):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    n = ctx.size
    for count in counts:
        if count == 0 and not ctx.is_braid:
            continue  # gloo dies of SIGFPE on a zero-size allgather (torch 1.13)
        what = f"allgather {dtype_name} count={count}"
        x = H.pattern(ctx.rank, 1, count, dtype)
        outs = [torch.zeros(count, dtype=dtype) for _ in range(n)]
        dist.all_gather(outs, x)
        for r in range(n):
            ch.equal(f"{what} from rank {r}", outs[r], H.pattern(r, 1, count, dtype))
        refs = [torch.zeros(count, dtype=dtype) for _ in range(n)]
        if count and dtype != torch.bool and H.gloo(lambda: dist.all_gather(refs, x,
                                                                            group=ctx.ref)):
            for r in range(n):
                ch.equal(f"{what} gloo from rank {r}", refs[r], H.pattern(r, 1, count, dtype))
    return ch.report()


@pytest.mark.parametrize("dtype", DATA_DTYPES)
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_allgather(world, dtype):
    H.check_reports(world.run(_allgather, dtype, FAST_COUNTS))


@pytest.mark.slow
@pytest.mark.parametrize("world", H.sizes(fast=(2, 5), slow=(8,)), indirect=True)
def test_allgather_large(world):
    H.check_reports(world.run(_allgather, "float32", SLOW_COUNTS, timeout=300))


def _int64_metadata(ctx):
    """What DDP does at construction: allgather of an int64 count, broadcast of shapes."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    outs = [torch.zeros(1, dtype=torch.int64) for _ in range(ctx.size)]
    dist.all_gather(outs, torch.tensor([1000 + ctx.rank]))
    ch.equal("int64 count allgather", torch.cat(outs), 1000 + torch.arange(ctx.size))
    shapes = torch.tensor([3, 4, 5, 6], dtype=torch.int64) * (ctx.rank == 0)
    dist.broadcast(shapes, 0)
    ch.equal("int64 shape broadcast", shapes, torch.tensor([3, 4, 5, 6]))
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3)), indirect=True)
def test_ddp_construction_metadata(world):
    H.check_reports(world.run(_int64_metadata))


def _gather_into_tensor(ctx, dtype_name, counts, api, shape2d):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    n = ctx.size
    fn = getattr(dist, api)
    for count in counts:
        what = f"{api} {dtype_name} count={count}"
        x = H.pattern(ctx.rank, 2, count, dtype)
        expected = torch.cat([H.pattern(r, 2, count, dtype) for r in range(n)])
        if shape2d:  # torch 2.x also accepts a stacked [n, count] output
            out = torch.zeros(n, count, dtype=dtype)
            fn(out, x)
            ch.equal(what + " [n, count] output", out, expected.view(n, count))
        else:
            out = torch.zeros(n * count, dtype=dtype)
            fn(out, x)
            ch.equal(what, out, expected)
        ref = torch.zeros(n * count, dtype=dtype)
        if dtype != torch.bool and H.gloo(lambda: fn(ref, x, group=ctx.ref)):
            ch.equal(what + " (gloo)", ref, expected)
    return ch.report()


GATHER_APIS = ["all_gather_into_tensor", "_all_gather_base"]


@pytest.mark.parametrize("api", GATHER_APIS)
@pytest.mark.parametrize("dtype", DATA_DTYPES)
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_all_gather_into_tensor(world, dtype, api):
    if not hasattr(dist, api):
        pytest.skip(f"torch.distributed.{api} does not exist in this torch")
    H.check_reports(world.run(_gather_into_tensor, dtype, FAST_COUNTS, api, False))


@pytest.mark.parametrize("world", H.sizes(fast=(2, 3)), indirect=True)
def test_all_gather_into_tensor_2d(world, require_torch2):
    H.check_reports(world.run(_gather_into_tensor, "float32", (5,), "all_gather_into_tensor",
                              True))


@pytest.mark.slow
@pytest.mark.parametrize("world", H.sizes(fast=(3,), slow=(8,)), indirect=True)
def test_all_gather_into_tensor_large(world):
    H.check_reports(world.run(_gather_into_tensor, "bfloat16", SLOW_COUNTS,
                              "all_gather_into_tensor", False, timeout=300))


def _gather_coalesced(ctx, dtype_name, counts):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    n = ctx.size
    inputs = [H.pattern(ctx.rank, 10 + j, c, dtype) for j, c in enumerate(counts)]
    # One list per rank, each holding one tensor per input.
    outs = [[torch.zeros(c, dtype=dtype) for c in counts] for _ in range(n)]
    dist.all_gather_coalesced(outs, inputs)
    for r in range(n):
        for j, c in enumerate(counts):
            ch.equal(f"all_gather_coalesced {dtype_name} rank {r} tensor {j}", outs[r][j],
                     H.pattern(r, 10 + j, c, dtype))
    refs = [[torch.zeros(c, dtype=dtype) for c in counts] for _ in range(n)]
    if dtype != torch.bool and H.gloo(lambda: dist.all_gather_coalesced(refs, inputs,
                                                                          group=ctx.ref)):
        for r in range(n):
            for j, c in enumerate(counts):
                ch.equal(f"all_gather_coalesced gloo rank {r} tensor {j}", refs[r][j],
                         H.pattern(r, 10 + j, c, dtype))
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "int64", "bool"), slow=H.DTYPES))
@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3, 5), slow=(8,)), indirect=True)
def test_all_gather_coalesced(world, dtype):
    H.check_reports(world.run(_gather_coalesced, dtype, (3, 0, 1000, 1)))

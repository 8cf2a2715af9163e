"""all_to_all_single (equal and uneven splits) and all_to_all (lists).

Block (r -> j), what rank r sends to rank j, is pattern(r, j, size): the
receiver can tell both the sender and the position of every element.
"""

import pytest

import harness as H

DATA_DTYPES = H.dtypes(fast=("float32", "float16", "bfloat16", "int8", "int64", "bool"),
                       slow=H.DTYPES)


def split_size(r, j, n, unit, uneven):
    """Elements rank r sends to rank j; uneven splits include zeros."""
    if not uneven:
        return unit
    return (r * 3 + j * 5 + unit) % (n + 2)  # 0 .. n+1, varies with both ends


def _all_to_all_single(ctx, dtype_name, units, uneven):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    n, me = ctx.size, ctx.rank
    for unit in units:
        what = f"all_to_all_single {dtype_name} unit={unit} uneven={uneven}"
        send = [split_size(me, j, n, unit, uneven) for j in range(n)]
        recv = [split_size(r, me, n, unit, uneven) for r in range(n)]
        inp = torch.cat([H.pattern(me, j, send[j], dtype) for j in range(n)])
        expected = torch.cat([H.pattern(r, me, recv[r], dtype) for r in range(n)])
        out = torch.zeros(sum(recv), dtype=dtype)
        if uneven:
            dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
        else:
            dist.all_to_all_single(out, inp)
        ch.equal(what, out, expected)
        ref = torch.zeros(sum(recv), dtype=dtype)
        if dtype != torch.bool and H.gloo(lambda: dist.all_to_all_single(
                ref, inp, output_split_sizes=recv, input_split_sizes=send, group=ctx.ref)):
            ch.equal(what + " (gloo)", ref, expected)
    return ch.report()


@pytest.mark.parametrize("uneven", [False, True], ids=["equal", "uneven"])
@pytest.mark.parametrize("dtype", DATA_DTYPES)
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_all_to_all_single(world, dtype, uneven):
    H.check_reports(world.run(_all_to_all_single, dtype, (0, 1, 97), uneven))


@pytest.mark.slow
@pytest.mark.parametrize("world", H.sizes(fast=(3,), slow=(8,)), indirect=True)
def test_all_to_all_single_large(world):
    H.check_reports(world.run(_all_to_all_single, "float32", (1 << 17,), False, timeout=300))
    H.check_reports(world.run(_all_to_all_single, "float32", (1 << 17,), True, timeout=300))


def _all_to_all_2d(ctx):
    """Equal splits along dim 0 of a [n * rows, cols] tensor."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    n, me, rows, cols = ctx.size, ctx.rank, 2, 3
    inp = torch.cat([H.pattern(me, j, rows * cols, torch.float64).view(rows, cols)
                     for j in range(n)])
    out = torch.zeros(n * rows, cols, dtype=torch.float64)
    dist.all_to_all_single(out, inp)
    expected = torch.cat([H.pattern(r, me, rows * cols, torch.float64).view(rows, cols)
                          for r in range(n)])
    ch.equal("all_to_all_single 2-D", out, expected)
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3)), indirect=True)
def test_all_to_all_single_2d(world):
    H.check_reports(world.run(_all_to_all_2d))


def _all_to_all_lists(ctx, dtype_name, unit, uneven):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    n, me = ctx.size, ctx.rank
    inputs = [H.pattern(me, j, split_size(me, j, n, unit, uneven), dtype) for j in range(n)]
    outputs = [torch.zeros(split_size(r, me, n, unit, uneven), dtype=dtype) for r in range(n)]
    dist.all_to_all(outputs, inputs)
    for r in range(n):
        ch.equal(f"all_to_all {dtype_name} from rank {r} uneven={uneven}", outputs[r],
                 H.pattern(r, me, split_size(r, me, n, unit, uneven), dtype))
    return ch.report()


@pytest.mark.parametrize("uneven", [False, True], ids=["equal", "uneven"])
@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "int8", "bool"), slow=H.DTYPES))
@pytest.mark.parametrize("world", H.sizes(), indirect=True)
def test_all_to_all(world, dtype, uneven):
    H.check_reports(world.run(_all_to_all_lists, dtype, 5, uneven))

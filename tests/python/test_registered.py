"""Registered buffers (Note [Registered buffers] in csrc/collectives/shm/registered.h).

A braid group's _registered_empty() gives every rank a tensor in memory that all of them map;
an allreduce of one, past the one-shot threshold, reduces and writes in the peers' buffers in
place. Checked against closed forms (harness.make_input: small integers, exact in every dtype),
and the ways ranks can disagree: a registered buffer against a plain one, buffers of different
registrations, sizes that differ, and BRAID_SHARED_BUFFERS=0 on one rank only.
"""

import os

import pytest

import harness as H

pytestmark = pytest.mark.skipif(H.BACKEND != "braid", reason="braid's own registered buffers")

# 16385 float32: just past the 64 KiB one-shot threshold; 1 and 0 stay on the one-shot path
FAST_COUNTS = (0, 1, 16385, 100003)
SLOW_COUNTS = (1 << 20, (1 << 22) + 5)


def _registered_allreduce(ctx, dtype_name, counts, ops):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    pg = ctx.backend_object()
    dtype = getattr(torch, dtype_name)
    for count in counts:
        t = pg._registered_empty(count, dtype)
        # (an empty tensor has no data pointer to look up)
        ch.true(f"count={count}: registered", pg._is_registered(t) == (count > 0))
        ch.equal(f"count={count}: zeroed", t, torch.zeros(count, dtype=dtype))
        for op in ops:
            inputs = [H.make_input(r, count, dtype, op) for r in range(ctx.size)]
            expected = H.closed_form(inputs, op, ctx.size)
            t.copy_(inputs[ctx.rank])
            dist.all_reduce(t, op=H.reduce_op(op))
            ch.reduced(f"allreduce {dtype_name} {op} count={count} (registered)", t, expected, op)
            # a slice of the buffer lies in the region too, at an offset
            if count > 2:
                part = t[1:]
                part.copy_(inputs[ctx.rank][1:])
                dist.all_reduce(part, op=H.reduce_op(op))
                ch.reduced(f"allreduce {dtype_name} {op} count={count} offset 1", part,
                           expected[1:], op)
        del t  # releases the region on every rank alike
    return ch.report()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "float64"])
@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3, 4), slow=(5,)), indirect=True)
def test_registered_allreduce(world, dtype):
    H.check_reports(world.run(_registered_allreduce, dtype, FAST_COUNTS, H.ops_for(dtype)))


@pytest.mark.slow
@pytest.mark.parametrize("world", H.sizes(fast=(2, 3), slow=(8,)), indirect=True)
def test_registered_allreduce_large(world):
    H.check_reports(world.run(_registered_allreduce, "float32", SLOW_COUNTS, ["SUM", "AVG"],
                              timeout=300))


def _then_plain_works(ctx, ch, what):
    t = ctx.torch.full((5,), float(ctx.rank + 1))
    ctx.dist.all_reduce(t)
    ch.equal(f"{what}: the next allreduce", t, ctx.torch.full((5,), ctx.size * (ctx.size + 1) / 2))


def _error_text(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the message is what is checked)
        return str(e)
    return None


def _mixed(ctx, case):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    pg = ctx.backend_object()
    n = 20000
    a = pg._registered_empty(n, torch.float32)
    b = pg._registered_empty(n, torch.float32)
    if case == "plain":  # rank 0's buffer is registered, the others' are not
        t = a if ctx.rank == 0 else torch.zeros(n)
        want = "registered-buffer path"
    elif case == "regions":  # rank 0 passes its first registration, the others their second
        t = a if ctx.rank == 0 else b
        want = "different registered regions"
    else:
        raise ValueError(case)
    msg = _error_text(lambda: dist.all_reduce(t))
    ch.true(f"{case}: every rank fails", msg is not None and want in msg, repr(msg))
    ch.true(f"{case}: the error names the op and the rank",
            msg is not None and "allreduce" in msg and f"rank {ctx.rank}" in msg, repr(msg))
    _then_plain_works(ctx, ch, case)
    return ch.report()


@pytest.mark.parametrize("case", ["plain", "regions"])
@pytest.mark.parametrize("world", [2, 3], indirect=True)
def test_ranks_that_disagree_fail_together(world, case):
    H.check_reports(world.run(_mixed, case))


def _sizes_differ(ctx):
    ch = H.Checker(ctx)
    pg = ctx.backend_object()
    msg = _error_text(lambda: pg._registered_empty(1000 + ctx.rank, ctx.torch.float32))
    ch.true("every rank fails, naming the op", msg is not None and "register_buffer" in msg,
            repr(msg))
    _then_plain_works(ctx, ch, "sizes")
    return ch.report()


@pytest.mark.parametrize("world", [2], indirect=True)
def test_registration_sizes_must_agree(world):
    H.check_reports(world.run(_sizes_differ))


def _one_rank_opts_out(ctx):
    """BRAID_SHARED_BUFFERS=0 on the last rank only: no rank registers, every op still works."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    pg = ctx.backend_object()
    last = ctx.rank == ctx.size - 1
    if last:
        os.environ["BRAID_SHARED_BUFFERS"] = "0"
    try:
        t = pg._registered_empty(30000, torch.float32)
    finally:
        os.environ.pop("BRAID_SHARED_BUFFERS", None)
    ch.true("registered on no rank", not pg._is_registered(t))
    t.fill_(ctx.rank + 1)
    dist.all_reduce(t)
    ch.equal("allreduce of ordinary memory", t, torch.full_like(t, ctx.size * (ctx.size + 1) / 2))
    return ch.report()


@pytest.mark.parametrize("world", [2, 3], indirect=True)
def test_one_rank_opting_out_leaves_every_rank_unregistered(world):
    H.check_reports(world.run(_one_rank_opts_out))

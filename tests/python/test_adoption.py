"""Buffers moved into registered memory (Note [Adopting a repeated buffer] in
csrc/c10d/buffer_adoption.h), which BRAID_ADOPT_BUFFERS=1 turns on: each test makes a group
with it set.

A CPU buffer that a braid group allreduces for the third time, that the CPU allocator owns,
that other tensors view and that is at least BRAID_ADOPT_MIN_BYTES, moves into memory every
rank maps, where every rank offered it. Checked: every allreduce's values against closed forms
(harness.make_input, a new salt per step, so stale memory would show), through the views too;
which buffers move and which stay (lone, small, numpy-backed, a slice, one rank's differs,
BRAID_ADOPT_BUFFERS=0 on one rank); and PyTorch's DDP, whose gradients match the closed form
at every step, with and without bucket views, once its buckets have moved.
"""

import os

import pytest

import harness as H

pytestmark = pytest.mark.skipif(H.BACKEND != "braid", reason="braid's own registered buffers")

MIB_F32 = 1 << 18  # float32 elements in 1 MiB, BRAID_ADOPT_MIN_BYTES's default


def _adopting_group(ctx, on=True):
    """A new braid group over every rank, made with BRAID_ADOPT_BUFFERS=1 (read when a group is
    made) where `on`, and its backend."""
    if on:
        os.environ["BRAID_ADOPT_BUFFERS"] = "1"
    try:
        group = ctx.dist.new_group(list(range(ctx.size)), backend="braid")
    finally:
        os.environ.pop("BRAID_ADOPT_BUFFERS", None)
    return group, ctx.backend_object(group)


def _steps(ctx, ch, flat, views, op, steps, what, group):
    """Allreduces `flat` `steps` times, each with fresh values written through `views`."""
    torch, dist = ctx.torch, ctx.dist
    count = flat.numel()
    for step in range(steps):
        inputs = [H.make_input(r, count, flat.dtype, op, salt=step) for r in range(ctx.size)]
        expected = H.closed_form(inputs, op, ctx.size)
        at = 0
        for v in views:  # the values arrive through the views, as DDP's gradients do
            v.copy_(inputs[ctx.rank][at:at + v.numel()].view_as(v))
            at += v.numel()
        dist.all_reduce(flat, op=H.reduce_op(op), group=group)
        ch.reduced(f"{what} {op} step {step}", flat, expected, op)
        at = 0
        for i, v in enumerate(views):
            ch.reduced(f"{what} {op} step {step} view {i}", v.reshape(-1),
                       expected[at:at + v.numel()], op)
            at += v.numel()


def _bucket(torch, count, dtype):
    flat = torch.empty(count, dtype=dtype)
    half = count // 2
    return flat, [flat[:half], flat[half:]]


def _moves(ctx, count, dtype_name, ops):
    torch = ctx.torch
    ch = H.Checker(ctx)
    group, pg = _adopting_group(ctx)
    dtype = getattr(torch, dtype_name)
    for op in ops:
        before = pg._adopted_buffers()
        flat, views = _bucket(torch, count, dtype)
        _steps(ctx, ch, flat, views, op, 2, f"{dtype_name} count={count}", group)
        ch.true(f"{op}: not moved after two allreduces", not pg._is_registered(flat))
        _steps(ctx, ch, flat, views, op, 3, f"{dtype_name} count={count} moved", group)
        ch.true(f"{op}: moved at the third allreduce", pg._is_registered(flat))
        ch.true(f"{op}: its views moved with it", pg._is_registered(views[1]))
        ch.true(f"{op}: counted once", pg._adopted_buffers() == before + 1,
                f"{pg._adopted_buffers()} != {before} + 1")
        del flat, views  # releases the region on every rank alike
    ctx.dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("world", H.sizes(fast=(2, 3, 4), slow=(5,)), indirect=True)
def test_a_viewed_buffer_moves_and_stays_right(world, dtype):
    ops = ["SUM", "MAX", "AVG"] if dtype == "float32" else ["SUM", "MIN"]
    H.check_reports(world.run(_moves, MIB_F32 + 3, dtype, ops))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3], indirect=True)
def test_a_large_buffer_moves(world):
    H.check_reports(world.run(_moves, (1 << 23) + 1, "float32", ["SUM"], timeout=300))


def _stays(ctx):
    """Buffers the Note leaves alone: each allreduced five times, right, and not moved."""
    import numpy as np

    torch = ctx.torch
    ch = H.Checker(ctx)
    group, pg = _adopting_group(ctx)
    n = MIB_F32 + 1
    lone = torch.empty(n)
    small, small_views = _bucket(torch, 1000, torch.float32)
    arr = np.zeros(n, dtype=np.float32)
    from_numpy = torch.from_numpy(arr)
    numpy_views = [from_numpy[:10], from_numpy[10:]]
    backing, _ = _bucket(torch, n + 7, torch.float32)
    part = backing[7:]  # a slice: its storage holds more than it
    # a buffer viewed on rank 0 only: the ranks do not all offer it
    lopsided = torch.empty(n)
    lopsided_views = [lopsided[:5], lopsided[5:]] if ctx.rank == 0 else [lopsided]
    cases = [("lone", lone, [lone]), ("small", small, small_views),
             ("numpy", from_numpy, numpy_views), ("slice", part, [part]),
             ("viewed on rank 0 only", lopsided, lopsided_views)]
    for what, t, views in cases:
        _steps(ctx, ch, t, views, "SUM", 5, what, group)
        ch.true(f"{what}: not moved", not pg._is_registered(t))
    ch.true("numpy's array sees the last result", np.array_equal(arr, from_numpy.numpy()))
    ch.true("nothing counted", pg._adopted_buffers() == 0, str(pg._adopted_buffers()))
    # and by default (BRAID_ADOPT_BUFFERS unset) a bucket-like buffer stays too
    plain, pg_plain = _adopting_group(ctx, on=False)
    flat, views = _bucket(torch, n, torch.float32)
    _steps(ctx, ch, flat, views, "SUM", 5, "default", plain)
    ch.true("off by default", not pg_plain._is_registered(flat) and
            pg_plain._adopted_buffers() == 0)
    ctx.dist.destroy_process_group(plain)
    ctx.dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("world", [2, 3], indirect=True)
def test_other_buffers_stay(world):
    H.check_reports(world.run(_stays))


def _one_rank_opts_out(ctx):
    """BRAID_ADOPT_BUFFERS=1 on every rank but the last (which keeps the default, off): nothing
    moves."""
    torch = ctx.torch
    ch = H.Checker(ctx)
    group, pg = _adopting_group(ctx, on=ctx.rank != ctx.size - 1)
    flat, views = _bucket(torch, MIB_F32, torch.float32)
    for step in range(5):
        for v in views:
            v.fill_(ctx.rank + step)
        ctx.dist.all_reduce(flat, group=group)
        want = ctx.size * (ctx.size - 1) / 2 + ctx.size * step
        ch.equal(f"step {step}", flat, torch.full_like(flat, want))
    ch.true("moved on no rank", not pg._is_registered(flat) and pg._adopted_buffers() == 0)
    ctx.dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("world", [2, 3], indirect=True)
def test_one_rank_opting_out_moves_nothing(world):
    H.check_reports(world.run(_one_rank_opts_out))


def _torch_ddp(ctx, view):
    """PyTorch's DDP over braid: each step's gradients equal the sum in rank order of every
    rank's own gradient divided by the world size (how braid reduces DDP's pre-divided
    buckets), before and after its buckets move."""
    torch = ctx.torch
    from torch.nn.parallel import DistributedDataParallel

    ch = H.Checker(ctx)
    group, pg = _adopting_group(ctx)
    n = ctx.size
    torch.manual_seed(7)
    local = torch.nn.Sequential(torch.nn.Linear(600, 700), torch.nn.Tanh(),
                                torch.nn.Linear(700, 3))  # 1.6 MiB of fp32 gradients
    ddp = DistributedDataParallel(local, process_group=group, gradient_as_bucket_view=view,
                                  bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(5):
        torch.manual_seed(1000 * step + ctx.rank)
        x, y = torch.randn(4, 600), torch.randn(4, 3)
        loss = lambda net: (net(x) - y).square().mean()  # noqa: E731
        loss(local).backward()  # this rank's own gradient, no communication
        own = [p.grad.clone() for p in local.parameters()]
        opt.zero_grad(set_to_none=not view)
        loss(ddp).backward()
        for i, (name, p) in enumerate(local.named_parameters()):
            every = [torch.empty_like(own[i]) for _ in range(n)]
            ctx.dist.all_gather(every, own[i], group=ctx.ref)
            want = every[0] / n
            for r in range(1, n):
                want = want + every[r] / n
            ch.true(f"view={view} step {step}: {name}.grad", torch.allclose(p.grad, want,
                    rtol=1e-5, atol=1e-7), f"max abs diff {(p.grad - want).abs().max().item():.3g}")
        opt.step()
        opt.zero_grad(set_to_none=not view)
    ch.true("a bucket moved", pg._adopted_buffers() > 0, f"{pg._adopted_buffers()}")
    if view:
        big = local[0].weight
        ch.true("the gradients are views of a moved bucket", pg._is_registered(big.grad))
    del ddp, opt
    ctx.dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize("world", [2, 3], indirect=True)
def test_torch_ddp_buckets_move(world, view):
    H.check_reports(world.run(_torch_ddp, view))

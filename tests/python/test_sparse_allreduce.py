"""allreduce of sparse COO tensors (ReduceOp.SUM), as gloo does it.

Each case is checked against gloo's result on the same input (indices and
values bit for bit, coalesced, written back into the input tensor) and against
a closed form (the dense sum of every rank's input; values are small integers,
so every summation order gives the same sum). Then DDP with
nn.Embedding(sparse=True) on braid against DDP on gloo, and the error cases.
"""

import re

import pytest

import harness as H

DTYPES = ["float32", "float64", "int64"]
# (name, shape, sparse dims, nnz of rank r); nnz may repeat indices (uncoalesced input)
CASES = [
    ("nnz0", (7,), 1, lambda r: 0),
    ("nnz1", (7,), 1, lambda r: 1),
    ("odd", (11,), 1, lambda r: 2 * r + 3),
    ("some_empty", (9, 2), 1, lambda r: 0 if r % 2 == 0 else 5),
    ("overlap_2d", (5, 4), 2, lambda r: 9),
    ("disjoint", (128,), 1, lambda r: 8),  # rows [16r, 16r + 8): up to 8 ranks
    ("dense_dims", (6, 2, 3), 1, lambda r: 4 + r),
    ("hybrid_3d", (4, 3, 5), 2, lambda r: 7),
]


def sparse_input(rank, name, shape, sparse_dims, nnz, dtype, salt=0):
    """Rank r's input: a pure function of its arguments, so every rank can rebuild it."""
    import torch

    g = H._gen("sparse", name, rank, salt)
    if name == "disjoint":  # rank r owns rows [16r, 16r + 8)
        idx = (16 * rank + torch.randperm(8, generator=g)[:nnz]).view(1, nnz)
    elif name == "overlap_2d":  # a few hot entries shared by every rank
        idx = torch.stack([torch.randint(0, 2, (nnz,), generator=g),
                           torch.randint(0, 2, (nnz,), generator=g)])
    else:
        idx = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g)
                           for d in range(sparse_dims)]) if nnz else \
            torch.zeros(sparse_dims, 0, dtype=torch.int64)
    vals = torch.randint(-6, 7, (nnz,) + tuple(shape[sparse_dims:]), generator=g)
    return torch.sparse_coo_tensor(idx, vals.to(getattr(torch, dtype)), shape)


def _check_case(ch, ctx, what, make, async_op=False):
    """all_reduce(make(rank)) on braid against gloo and the dense closed form."""
    torch, dist = ctx.torch, ctx.dist
    n = ctx.size
    t = make(ctx.rank)
    ref = make(ctx.rank)
    if async_op:
        work = dist.all_reduce(t, async_op=True)
        value = work.get_future().wait()
        ch.true(what + " future value", isinstance(value, list) and len(value) == 1,
                repr(value)[:200])
        ch.true(what + " future value is the input tensor", value[0] is t or
                torch.equal(value[0].to_dense(), t.to_dense()))
        ch.true(what + " wait()", work.wait() is True)
    else:
        dist.all_reduce(t)
    dist.all_reduce(ref, group=ctx.ref)
    expected = sum(make(r).to_dense() for r in range(n))
    ch.true(what + " is sparse and coalesced", t.is_sparse and t.is_coalesced(),
            f"layout {t.layout}, coalesced {t.is_sparse and t.is_coalesced()}")
    ch.equal(what + " dense value (closed form)", t.to_dense(), expected)
    ch.equal(what + " indices (gloo)", t._indices(), ref._indices())
    ch.equal(what + " values (gloo)", t._values(), ref._values())


def _cases(ctx, dtype, async_op):
    ch = H.Checker(ctx)
    for name, shape, sd, nnz in CASES:
        _check_case(ch, ctx, f"{name}/{dtype}",
                    lambda r: sparse_input(r, name, shape, sd, nnz(r), dtype), async_op)
    return ch.report()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3, 4), slow=(5, 8)), indirect=True)
def test_sparse_allreduce_matches_gloo(world, dtype):
    H.check_reports(world.run(_cases, dtype, False))


@pytest.mark.parametrize("world", H.sizes(fast=(2, 3), slow=(4,)), indirect=True)
def test_sparse_allreduce_async_future(world):
    H.check_reports(world.run(_cases, "float32", True))


def _large(ctx, nnz, dtype):
    # 8 dense columns: 200 KB of indices and 320 KB of values per rank at 20000
    # nnz, past the 256 KiB where allgather reads peers' memory directly.
    ch = H.Checker(ctx)
    shape = (50000, 8)
    _check_case(ch, ctx, f"large/{nnz}", lambda r: sparse_input(
        r, "large", shape, 1, nnz + 17 * r, dtype))
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(2, 3), slow=(4,)), indirect=True)
def test_sparse_allreduce_large(world):
    H.check_reports(world.run(_large, 20000, "float32"))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("world", [pytest.param(4, id="n4")], indirect=True)
def test_sparse_allreduce_very_large(world, dtype):
    H.check_reports(world.run(_large, 300000, dtype))


# -- DDP with a sparse embedding --------------------------------------------------


def _sparse_net(torch, dense):
    """An nn.Embedding(sparse=True), whose gradient is a sparse COO tensor, and
    with `dense` a Linear after it."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(40, 6, sparse=True)
            self.out = torch.nn.Linear(6, 1) if dense else None

        def forward(self, ids):
            x = self.emb(ids).sum(1)
            return self.out(x) if dense else x

    return Net()


def _ddp(ctx, steps, dense):
    """Trains the same model with DDP on braid and on gloo; compares the parameters.

    The sparse path gives gloo's bits. With a dense layer, from 3 ranks on, its
    gradients are summed in another order than gloo's ring (README: every
    rank combines in rank order), so the parameters then agree to rounding.
    """
    torch = ctx.torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    ch = H.Checker(ctx)
    runs = {}
    for name, group in (("braid", None), ("gloo", ctx.ref)):
        net = _sparse_net(torch, dense)
        start = net.emb.weight.detach().clone()
        ddp = DDP(net, process_group=group)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for s in range(steps):
            g = H._gen("ddp", ctx.rank, s)
            ids = torch.randint(0, 40, (5, 3), generator=g)  # repeats: uncoalesced gradients
            y = torch.randint(-3, 4, (5, 1 if dense else 6), generator=g).float()
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(ids), y).backward()
            ch.true(f"{name} step {s}: the embedding's gradient is sparse",
                    net.emb.weight.grad.is_sparse)
            opt.step()
        runs[name] = [p.detach().clone() for p in net.parameters()]
        ch.true(name + ": training changed the embedding", not torch.equal(start, net.emb.weight))
    for i, (a, b) in enumerate(zip(runs["braid"], runs["gloo"])):
        what = f"parameter {i} after {steps} steps (braid vs gloo)"
        if dense and ctx.size > 2:
            ch.true(what, torch.allclose(a, b, rtol=1e-5, atol=1e-6),
                    f"max difference {(a - b).abs().max().item()}")
        else:
            ch.equal(what, a, b)
    return ch.report()


@pytest.mark.braid_only
@pytest.mark.parametrize("dense", [False, True], ids=["embedding", "embedding+linear"])
@pytest.mark.parametrize("world", H.sizes(fast=(2, 3), slow=(4,)), indirect=True)
def test_ddp_sparse_embedding_matches_gloo(world, dense):
    H.check_reports(world.run(_ddp, 4, dense))


# -- errors -------------------------------------------------------------------------


def _attempt(ctx, case):
    """A faulty sparse allreduce, then correct ones; returns (error or None, recovered?)."""
    torch, dist = ctx.torch, ctx.dist
    me, n = ctx.rank, ctx.size

    def make(shape=(5, 4)):
        return torch.sparse_coo_tensor([[0, 2, 2], [1, 0, 1]], [1.0, 2.0, 3.0], shape)

    odd = me == 1
    try:
        if case == "op_all":
            dist.all_reduce(make(), op=dist.ReduceOp.MAX)
        elif case == "op_one":
            dist.all_reduce(make(), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
        elif case == "shape":
            dist.all_reduce(make((3, 4) if odd else (5, 4)))
        elif case == "dtype":
            dist.all_reduce(make().double() if odd else make())
        elif case == "sparse_dims":
            dist.all_reduce(make().to_dense().to_sparse(1) if odd else make())
        elif case == "dense_peer":
            dist.all_reduce(make().to_dense() if odd else make())
        error = None
    except RuntimeError as e:
        error = str(e)
    dense = torch.full((5,), float(me + 1))
    dist.all_reduce(dense)
    s = torch.sparse_coo_tensor([[me]], [1.0], (n,))
    dist.all_reduce(s)
    ok = torch.equal(dense, torch.full((5,), n * (n + 1) / 2)) and torch.equal(
        s.to_dense(), torch.ones(n))
    return error, ok


def _expected(case, r, n):
    """The message rank r must raise (rank 1 is the odd one out)."""
    peer = r"\d+" if n > 2 else str(1 - r)
    me = rf"braid allreduce \(rank {r}\): "
    if case == "op_all" or (case == "op_one" and r == 1):
        return me + "sparse tensors support only reduce op SUM, got MAX"
    if case == "op_one":
        return me + (r"rank 1 failed this op: braid allreduce \(rank 1\): sparse tensors "
                     r"support only reduce op SUM, got MAX")
    if case in ("shape", "dtype"):
        odd = "[3, 4] (float32)" if case == "shape" else "[5, 4] (float64)"
        mine = odd if r == 1 else "[5, 4] (float32)"
        return (me + rf"rank {peer} passed shape \[[\d, ]+\] \(float\d\d\), "
                rf"this rank shape {re.escape(mine)}")
    if case == "sparse_dims":
        return me + rf"rank {peer} passed a sparse tensor with [12] sparse dims, this rank [12]"
    # dense_peer: the header's element counts differ; the sparse ranks say so
    same = re.escape("[5, 4] (float32)")
    return me + (rf"rank 0 passed shape {same}, this rank shape {same}$" if r == 1 else
                 rf"rank 1 passed shape {same}, this rank shape {same} \(this rank's tensor is "
                 rf"sparse, the peer's is not\)")


SPARSE_ERRORS = ["op_all", "op_one", "shape", "dtype", "sparse_dims", "dense_peer"]


@pytest.mark.braid_only
@pytest.mark.parametrize("case", SPARSE_ERRORS)
@pytest.mark.parametrize("world", [pytest.param((2, "errors"), id="n2"),
                                   pytest.param((3, "errors"), id="n3")], indirect=True)
def test_sparse_errors_name_op_rank_and_values(world, case):
    for r, (error, recovered) in enumerate(world.run(_attempt, case)):
        assert error is not None, f"rank {r}: {case} did not raise"
        assert re.search(_expected(case, r, world.n), error), \
            f"rank {r}: {error!r} does not match {_expected(case, r, world.n)!r}"
        assert recovered, f"rank {r}: the allreduces after the failed {case} call were wrong"

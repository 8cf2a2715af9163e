"""float16/bfloat16 reductions of random values, against a float64 reference.

braid accumulates in fp32 and rounds once, so each element must be within half
an ulp of the exact sum (plus fp32 accumulation slack), and its total error must
not exceed gloo's, which rounds at every hop of its ring. Where gloo lacks the
dtype (bf16 on torch 1.13) its per-hop rounding is emulated: a sequential sum
rounded to the dtype after each addition.
"""

import pytest

import harness as H

MANTISSA = {"float16": 10, "bfloat16": 7}
MIN_EXP = {"float16": -14, "bfloat16": -126}


def _inputs(ctx, dtype, count, salt):
    torch = ctx.torch
    xs = []
    for r in range(ctx.size):
        g = H._gen("precision", salt, r, count)
        xs.append((torch.randn(count, generator=g, dtype=torch.float64) * 8).to(dtype))
    return xs


def _half_ulp(torch, exact, dtype_name):
    """Half the spacing of `dtype` around each element of `exact` (float64)."""
    mag = exact.abs().clamp_min(2.0 ** MIN_EXP[dtype_name])
    exp = torch.floor(torch.log2(mag))
    return torch.pow(2.0, exp - MANTISSA[dtype_name] - 1)


def _per_hop(torch, xs, dtype):
    acc = xs[0].clone()
    for x in xs[1:]:
        acc = (acc.double() + x.double()).to(dtype)
    return acc


def _precision(ctx, dtype_name, count, api):
    torch, dist = ctx.torch, ctx.dist
    dtype = getattr(torch, dtype_name)
    n, me = ctx.size, ctx.rank
    if api == "allreduce":
        xs = _inputs(ctx, dtype, count, 0)
        exact = torch.stack([x.double() for x in xs]).sum(0)
        got = xs[me].clone()
        dist.all_reduce(got)
        ref = xs[me].clone()
        if H.gloo(lambda: dist.all_reduce(ref, group=ctx.ref)):
            ref_kind = "gloo"
        else:
            ref, ref_kind = _per_hop(torch, xs, dtype), "per-hop rounding (gloo emulated)"
    else:  # reduce_scatter_tensor: this rank's chunk
        xs = _inputs(ctx, dtype, count * n, 1)
        exact = torch.stack([x.double() for x in xs]).sum(0)[me * count:(me + 1) * count]
        got = torch.empty(count, dtype=dtype)
        dist.reduce_scatter_tensor(got, xs[me].clone())
        ref = _per_hop(torch, [x[me * count:(me + 1) * count] for x in xs], dtype)
        ref_kind = "per-hop rounding (gloo emulated)"
    err = (got.double() - exact).abs()
    ref_err = (ref.double() - exact).abs()
    # fp32 accumulation of n values is exact to ~n * 2^-24 relative: allow that.
    slack = exact.abs() * (n * 2.0 ** -24) + 2.0 ** -40
    worst = (err - _half_ulp(torch, exact, dtype_name) - slack).max().item() if count else 0.0
    return {"err": err.sum().item(), "ref_err": ref_err.sum().item(), "ref_kind": ref_kind,
            "single_rounding_excess": worst, "count": count}


@pytest.mark.parametrize("api", ["allreduce", "reduce_scatter_tensor"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("world", H.sizes(fast=(2, 3, 5), slow=(8,)), indirect=True)
def test_half_precision_sum(world, dtype, api):
    results = world.run(_precision, dtype, 4099, api)
    for rank, res in enumerate(results):
        if H.BACKEND == "braid":
            assert res["single_rounding_excess"] <= 0, (
                f"rank {rank}: {api} {dtype} is not a single rounding of the exact sum: an "
                f"element is {res['single_rounding_excess']:.3g} beyond half an ulp")
        if H.BACKEND != "braid" and res["ref_kind"] != "gloo":
            continue  # gloo under test rounds per hop too, in its own order
        assert res["err"] <= res["ref_err"] * (1 + 1e-9) + 1e-12, (
            f"rank {rank}: {api} {dtype} total error {res['err']:.6g} exceeds the "
            f"{res['ref_kind']} reference's {res['ref_err']:.6g}")

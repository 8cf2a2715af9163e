"""Compiled DDP on braid: torch.compile(DistributedDataParallel(model), backend="aot_eager").

torch.compile splits a DDP model's graph at its bucket boundaries (DDPOptimizer), so each
bucket's allreduce is issued from inside the compiled code as the backward reaches it. The
same training runs over braid and over gloo (ctx.ref) in the same ranks, and in one process
on the concatenated batch. DDP divides each gradient by the world size before the SUM
allreduce: at 2 ranks both backends add the same two values, so losses and parameters must
be equal bit for bit; at 4 ranks each adds in its own order (FP32_TOL, scripts/clients.py).
"""
import os
import sys

import pytest

import harness as H

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
import clients as C  # noqa: E402

MISSING = C.compile_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))

STEPS = 3


def _model():
    import torch

    torch.manual_seed(4321)
    return torch.nn.Sequential(torch.nn.Linear(16, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))


def _batch(step, r):
    import torch

    g = torch.Generator().manual_seed(31 * step + r)
    return torch.randn(4, 16, generator=g), torch.randn(4, 8, generator=g)


def _train(ctx, group):
    import torch
    import torch._dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    model = _model()
    # 1 MiB buckets (torch 2.14's DDPOptimizer wants none smaller than DDP's first, 1 MiB):
    # each 512 x 512 layer fills one, so the graph splits at each.
    ddp = DDP(model, process_group=group, bucket_cap_mb=1)
    compiled = torch.compile(ddp, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step, ctx.rank)
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
    torch._dynamo.reset()
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()]


def _reference(ctx):
    import torch

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        batches = [_batch(step, r) for r in range(ctx.size)]
        with torch.no_grad():
            losses.append(torch.nn.functional.mse_loss(model(batches[ctx.rank][0]),
                                                       batches[ctx.rank][1]))
        loss = torch.nn.functional.mse_loss(model(torch.cat([b[0] for b in batches])),
                                            torch.cat([b[1] for b in batches]))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()]


def _compiled_ddp(ctx):
    b_loss, b_params = _train(ctx, ctx.dist.group.WORLD)
    g_loss, g_params = _train(ctx, ctx.ref)
    r_loss, r_params = _reference(ctx)
    tol = None if ctx.size == 2 else C.FP32_TOL
    me = ctx.rank
    failures = C.compare_tensors(f"rank {me} losses braid vs gloo", [b_loss], [g_loss], tol)
    failures += C.compare_tensors(f"rank {me} params braid vs gloo", b_params, g_params, tol)
    failures += C.compare_tensors(f"rank {me} losses braid vs one process", [b_loss], [r_loss],
                                  C.FP32_TOL)
    failures += C.compare_tensors(f"rank {me} params braid vs one process", b_params, r_params,
                                  C.FP32_TOL)
    moved = max((p - q).abs().max().item()
                for p, q in zip(b_params, [p.detach() for p in _model().parameters()]))
    if moved < 1e-4:
        failures.append(f"rank {me}: training did not move the parameters ({moved})")
    return {"count": 4 + 2 * len(b_params), "failures": failures}


@pytest.mark.parametrize("world", H.sizes(fast=(2, 4), slow=()), indirect=True)
def test_compiled_ddp(world):
    H.check_reports(world.run(_compiled_ddp, timeout=240))

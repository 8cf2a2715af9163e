"""Hugging Face Accelerate on braid, where Debian ships it for the leg's torch.

Debian has python3-accelerate in forky (torch 2.14; tools/torch2_root.sh installs it
there) but not in trixie (torch 2.6) or bookworm (torch 1.13): those legs skip.

On CPU, Accelerate picks "gloo" itself and refuses any other backend name passed to it
("Your assigned backend braid is not available"), but it uses the default group that the
script initialized before creating the Accelerator. That is how a script runs Accelerate on
braid: `dist.init_process_group("braid")`, then `Accelerator(cpu=True)`. The test does
that in a world whose default group is braid, trains a few steps through
accelerator.prepare() and accelerator.backward(), checks that the prepared DDP model talks
over the braid group, and compares losses and parameters with plain DDP over gloo in the
same ranks: at 2 ranks DDP's averaged gradients add two values, so bit for bit.
"""
import os
import sys

import pytest

import harness as H

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
import clients as C  # noqa: E402


def _missing():
    try:
        import accelerate  # noqa: F401
    except ImportError as e:
        import torch

        return (f"accelerate is not installed for torch {torch.__version__} ({e}); Debian ships "
                f"python3-accelerate only from forky (torch 2.14) on: apt-cache finds none for "
                f"bookworm or trixie")
    return None


MISSING = _missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
STEPS = 3


def _model():
    import torch

    torch.manual_seed(99)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _batch(step, r):
    import torch

    g = torch.Generator().manual_seed(17 * step + r)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


def _accelerate_steps(ctx):
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(RANK=str(ctx.rank), LOCAL_RANK=str(ctx.rank), WORLD_SIZE=str(ctx.size),
                      LOCAL_WORLD_SIZE=str(ctx.size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(ctx.port))
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    failures = []
    acc = Accelerator(cpu=True)
    try:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        pmodel, popt = acc.prepare(model, opt)
        group = getattr(pmodel, "process_group", None)
        name = ctx.dist.get_backend(group) if group is not None else None
        if not isinstance(pmodel, DDP) or name != ctx.backend:
            failures.append(f"rank {ctx.rank}: prepared model {type(pmodel).__name__} on "
                            f"backend {name!r}, expected DDP on {ctx.backend}")
        if acc.num_processes != ctx.size or acc.process_index != ctx.rank:
            failures.append(f"rank {ctx.rank}: Accelerator sees {acc.num_processes} processes, "
                            f"index {acc.process_index}")
        losses = []
        for step in range(STEPS):
            x, y = _batch(step, ctx.rank)
            loss = torch.nn.functional.mse_loss(pmodel(x), y)
            acc.backward(loss)
            popt.step()
            popt.zero_grad()
            losses.append(loss.detach().clone())
        a_params = [p.detach().clone() for p in acc.unwrap_model(pmodel).parameters()]
    finally:
        # Accelerate keeps process-wide state; the world's groups stay as they were.
        AcceleratorState._reset_state(True)
        PartialState._reset_state()

    ref = _model()
    ddp = DDP(ref, process_group=ctx.ref)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g_losses = []
    for step in range(STEPS):
        x, y = _batch(step, ctx.rank)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        g_losses.append(loss.detach().clone())
    g_params = [p.detach().clone() for p in ref.parameters()]

    failures += C.compare_tensors(f"rank {ctx.rank} losses accelerate/braid vs DDP/gloo",
                                  [torch.stack(losses)], [torch.stack(g_losses)])
    failures += C.compare_tensors(f"rank {ctx.rank} params accelerate/braid vs DDP/gloo",
                                  a_params, g_params)
    moved = max((p - q).abs().max().item() for p, q in zip(a_params, _model().parameters()))
    if moved < 1e-4:
        failures.append(f"rank {ctx.rank}: training did not move the parameters ({moved})")
    return {"count": 3 + len(a_params), "failures": failures}


@pytest.mark.parametrize("world", [pytest.param((2, "accelerate"), id="n2")], indirect=True)
def test_accelerate_ddp_on_braid(world):
    H.check_reports(world.run(_accelerate_steps, timeout=120))

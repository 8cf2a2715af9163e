"""DDP training on CUDA tensors, checked against the same training on CPU.

Without a GPU (CI), each rank installs braid's simulated device (braid_sim;
Note [ATen on the simulated device] in tests/sim/torch/sim_aten.cc): the model, its
gradients and its buckets are "CUDA" tensors, ATen runs their CPU kernels in the order
of the current simulated stream, and braid's CUDA path reduces the buckets. The same
model, data and group trained on CPU tensors must then end with the same parameters
bit for bit: the forward and backward kernels are the same CPU kernels, and both paths
sum each bucket with braid's CPU collectives in the same order. A gradient reduced from
the wrong bytes, a bucket read before backward wrote it, or a result read before the
copy back to the device ran differs by far more.

With a CUDA torch and a GPU (tools/gpu_check.sh) the same tests run on the real device,
rank r on GPU r % count, and compare within 1e-4 relative (the GPU's kernels sum in
their own order; TF32 is off for these matmuls by torch's default).

On the simulated device each backward is also checked against what it implies for the
group's CUDA executor (tests/python/cuda_counts.py): its collectives are the buckets'
allreduces, which together reduce every gradient once, and the executor (staged, or the
same-GPU one when every rank shares a GPU) counts exactly those ops and bytes, so that a
bucket reduced off the device fails.

Backward over CUDA tensors needs torch's CUDA hooks to answer for the device (Note
[The simulated device as torch's accelerator] in tests/sim/torch/sim_hooks.cc).
"""

import pytest

import cuda_counts as C
import harness as H

pytestmark = [pytest.mark.braid_only]

SIM_DEVICES = 2
STEPS = 4


def _devices(ctx, gpus):
    """How many CUDA devices the ranks share: the GPUs, else `gpus` simulated ones (1: every
    rank on one GPU, braid's same-GPU collectives; 2: rank r on r % 2, staged or mixed)."""
    torch = ctx.torch
    if torch.version.cuda and torch.cuda.is_available():
        return torch.cuda.device_count(), True
    import braid_sim

    braid_sim.install(gpus)
    return gpus, False


def _model(torch, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 4))


def _batches(torch, rank):
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g))
            for _ in range(STEPS)]


def _train(ctx, device, wrap, watch=None, **ddp_kwargs):
    """Trains a wrapped model on `device`; returns its parameters on the CPU. watch(step,
    backward) runs each backward."""
    torch = ctx.torch
    model = _model(torch, seed=7 + ctx.rank).to(device)  # ranks differ: DDP broadcasts rank 0's
    ddp = wrap(model, device, **ddp_kwargs)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step, (x, y) in enumerate(_batches(torch, ctx.rank)):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        if watch:
            watch(step, loss.backward)
        else:
            loss.backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()]


def _watch_backward(ctx, ch, cuda, executor):
    """Runs a backward and checks what the group's CUDA executor counted for it: its
    collectives (the flight recorder's) are allreduces that reduce every gradient once,
    each a staged op copying its bucket in and back, or an op of the same-GPU executor."""
    backend = C.backend(ctx, cuda)
    param_bytes = sum(p.numel() * 4 for p in _model(ctx.torch, seed=0).parameters())

    def watch(step, backward):
        mark, before = C.recorded_mark(), C.snapshot(backend)
        backward()
        ops = C.recorded_since(mark)
        what = f"step {step}: the backward's {len(ops)} collectives"
        ch.true(f"{what} are allreduces of every gradient once",
                {name for name, _, _ in ops} == {"braid:all_reduce"}
                and sum(nin for _, nin, _ in ops) == param_bytes,
                f"{ops}, {param_bytes} bytes of parameters")
        C.check(ch, what, backend, before,
                C.Expected().recorded(ops, nccl=executor != "staged"), executor)

    return watch


def _torch_ddp(model, device, **kwargs):
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=ids, bucket_cap_mb=0.01, **kwargs)


def _braid_ddp(model, device, **kwargs):
    from torch_braid.ddp import DistributedDataParallel as DDP

    return DDP(model, bucket_cap_mb=0.01, first_bucket_mb=0.005, **kwargs)


def _same_as_cpu(ctx, which, kwargs, gpus):
    torch = ctx.torch
    devices, real = _devices(ctx, gpus)
    ch = H.Checker(ctx)
    wrap = {"torch": _torch_ddp, "braid": _braid_ddp}[which]
    cuda = torch.device("cuda", ctx.rank % devices)
    if real:
        torch.cuda.set_device(cuda)
    on_cpu = _train(ctx, torch.device("cpu"), wrap, **kwargs)
    # Every rank on one GPU: the same-GPU collectives; else (one rank, or ranks on 2
    # simulated GPUs without NCCL) staged.
    executor = "same-gpu" if gpus == 1 and ctx.size > 1 else "staged"
    watch = None if real else _watch_backward(ctx, ch, cuda, executor)
    on_cuda = _train(ctx, cuda, wrap, watch, **kwargs)
    start = _model(torch, seed=7)  # rank 0's initial parameters
    ch.true("training moved the parameters",
            any(not torch.equal(a, b) for a, b in zip(on_cpu, start.parameters())), "")
    for i, (a, b) in enumerate(zip(on_cpu, on_cuda)):
        what = f"{which} DDP {kwargs} parameter {i}: CUDA ({'GPU' if real else 'simulated'}) vs CPU"
        if real:
            ch.true(what, torch.allclose(b, a, rtol=1e-4, atol=1e-6),
                    f"max |diff| {(b - a).abs().max().item():.3g}")
        else:
            ch.equal(what, b, a)
    # Every rank ends with rank 0's replica.
    gathered = [torch.zeros_like(on_cuda[0]) for _ in range(ctx.size)]
    ctx.dist.all_gather(gathered, on_cuda[0])
    for q in range(ctx.size):
        ch.equal(f"{which} DDP replica of rank {q}", gathered[q], on_cuda[0])
    return ch.report()


@pytest.mark.parametrize("kwargs", [{}, {"gradient_as_bucket_view": True}],
                         ids=["default", "bucket_view"])
@pytest.mark.parametrize("which", ["torch", "braid"])
@pytest.mark.parametrize("world", [pytest.param((n, "cuda"), id=f"n{n}") for n in (1, 2, 3)],
                         indirect=True)
def test_ddp_on_cuda_matches_cpu(world, which, kwargs):
    H.check_reports(world.run(_same_as_cpu, which, kwargs, SIM_DEVICES))


# Every rank on one GPU: the buckets go through braid's same-GPU collectives (CUDA IPC).
@pytest.mark.parametrize("which", ["torch", "braid"])
@pytest.mark.parametrize("world", [pytest.param((n, "cuda1"), id=f"n{n}") for n in (2, 4)],
                         indirect=True)
def test_ddp_with_every_rank_on_one_gpu_matches_cpu(world, which):
    H.check_reports(world.run(_same_as_cpu, which, {}, 1))

"""The C++ DDP communication hooks (csrc/hooks) on CUDA buckets, on braid's
simulated device (Note [Simulated CUDA in tests], Note [ATen on the simulated
device]; rank r uses cuda:r % 2).

Each case runs a hook on a CPU bucket and, with a fresh state and the same
inputs, on a simulated CUDA bucket: the CUDA path (Note [Hooks on CUDA buckets]
in csrc/hooks/comm_hook.h) is ATen ops in stream order, the CPU path the fused
loops. Both are checked against the closed forms of test_hooks.py and against
each other. The simulated device runs every ATen op through its CPU kernel, so
where the CUDA path repeats the CPU loop's arithmetic op by op (allreduce, the
fp16/bf16 casts, int8) the two must agree bit for bit; PowerSGD's Gram-Schmidt
sums its dot products in another order (BLAS instead of the loop), so there
they agree to a stated tolerance. Then PyTorch's DDP and braid's reducer train
a small model with each hook on CUDA and on CPU.

Equal bits cannot tell which branch ran (a CUDA bucket copied to the CPU loops
gives them too), so every run also counts: the hook's steps on the device and on
the host (Note [Which branch a hook ran] in csrc/hooks/comm_hook.h: a CUDA bucket
takes the device branch as often as its arithmetic implies and the host branch
never, a CPU bucket the other way round), and what the group's staged CUDA
executor moved for the hook's collectives (tests/python/cuda_counts.py: exactly
their bytes on CUDA, nothing on the CPU).
"""

import contextlib
import math

import pytest

import cuda_counts as C
import harness as H
import test_hooks as T

import torch_braid.hooks  # noqa: E402,F401  (an import bug fails, it does not skip)


pytestmark = [pytest.mark.braid_only, H.simulated_cuda_only()]

SIM_DEVICES = 2
WORLDS = [pytest.param((n, "cuda"), id=f"n{n}") for n in (2, 3)]
# PowerSGD, CUDA vs CPU: the same algorithm, its double dot products summed in
# another order: a few float32 ulps in P and Q, which the products carry on.
PSGD_RTOL, PSGD_ATOL = 1e-4, 1e-5


def _cuda(ctx):
    import braid_sim

    braid_sim.install(SIM_DEVICES)
    return ctx.torch.device("cuda", ctx.rank % SIM_DEVICES)


def _devices(ctx):
    return [ctx.torch.device("cpu"), _cuda(ctx)]


def _run(fn, state, buf, shapes=None):
    """Runs a hook on buf (on its device); the result, checked to be the bucket, on the CPU."""
    bucket = T._layout_bucket(buf, shapes) if shapes else T.FakeBucket(buf)
    out = fn(state, bucket).wait()
    assert out.device == buf.device, (out.device, buf.device)
    assert out.data_ptr() == buf.data_ptr()  # the result is the bucket itself
    return out.cpu()


# ---- what a hook run implies: (steps, C.Expected) ---------------------------------
# Steps per Note [Which branch a hook ran]; the staged executor's bytes per
# collective: an allreduce copies its tensor in and back, an allgather its input
# in and the group's n outputs back.

def _allreduce_counts(nbytes, steps=0):
    return steps, C.Expected().staged(d2h=nbytes, h2d=nbytes)


def _cast_counts(numel, steps=2):
    """fp16/bf16: one allreduce of the 16-bit values; 2 steps on a float32 bucket."""
    return _allreduce_counts(2 * numel, steps)


def _int8_counts(n, numel, chunk):
    """int8: one allgather of the packed scales and values; quantize and dequantize."""
    packed = 4 * -(-numel // chunk) + numel
    return 2, C.Expected().staged(d2h=packed, h2d=n * packed)


def _psgd_counts(shapes, rank, min_rate=2.0):
    """A compressing PowerSGD step (torch's _should_compress): one allreduce of the
    uncompressed values and the Ps, one of the Qs if any matrix is compressed; two
    Gram-Schmidt passes per compressed matrix."""
    mats, first, qs = 0, 0, 0
    for s in shapes:
        numel = math.prod(s)
        if len(s) >= 2 and numel > 0:
            rows, cols = s[0], numel // s[0]
            r = min(rows, cols, rank)
            if (rows + cols) * r * min_rate < rows * cols:
                mats, first, qs = mats + 1, first + rows * r, qs + cols * r
                continue
        first += numel
    exp = C.Expected().staged(d2h=4 * first, h2d=4 * first)
    if mats:
        exp.staged(d2h=4 * qs, h2d=4 * qs)
    return 2 * mats, exp


@contextlib.contextmanager
def _counted(ctx, state, dev, counts):
    """The hook runs inside on a bucket on `dev`: (steps, expected) = counts. On CUDA its
    device branch runs `steps` times, its host branch never, and the staged executor counts
    exactly `expected`; on the CPU the other way round, and the executor nothing."""
    steps, expected = counts
    hook = state._cpp_hook()
    backend = C.chosen_backend(ctx, _cuda(ctx))
    d0, h0, before = hook.device_steps, hook.host_steps, C.snapshot(backend)
    yield
    on_cuda = dev.type == "cuda"
    got = (hook.device_steps - d0, hook.host_steps - h0)
    want = (steps, 0) if on_cuda else (0, steps)
    assert got == want, f"{hook.name} on {dev}: (device, host) steps {got}, expected {want}"
    C.require(f"{hook.name} on {dev}", backend, before, expected if on_cuda else C.Expected(),
              "staged" if on_cuda else None)


def torch_equal_nan(a, b):
    """torch.equal, with NaN equal to NaN."""
    import torch

    return a.dtype == b.dtype and a.shape == b.shape and bool(
        torch.all((a == b) | (torch.isnan(a) & torch.isnan(b))))


# ---- worker-side cases ---------------------------------------------------------

def _allreduce(ctx):
    import torch_braid.hooks as hooks

    torch = ctx.torch
    xs = T._inputs(ctx, 1001, seed=1)
    outs, states = [], []
    for dev in _devices(ctx):
        states.append(hooks.allreduce_state())
        with _counted(ctx, states[-1], dev, _allreduce_counts(1001 * 4)):
            outs.append(_run(hooks.allreduce, states[-1], xs[ctx.rank].to(dev, copy=True)))
    cpu, cuda = outs
    assert torch.equal(cuda, cpu)  # the same division, the same sum
    assert torch.allclose(cuda, T._mean(xs), rtol=1e-6, atol=1e-6)
    assert states[1].payload_bytes == states[0].payload_bytes == 1001 * 4
    return cuda


def _cast(ctx, kind, dtype_name):
    import torch_braid.hooks as hooks

    torch = ctx.torch
    dtype = getattr(torch, dtype_name)
    fn = getattr(hooks, kind + "_compress")
    make = getattr(hooks, kind + "_state")
    xs = T._inputs(ctx, 1001, seed=2 if kind == "fp16" else 3)
    for r, x in enumerate(xs):  # beyond float16's range, but not once divided by n
        x[0] = 70000.0 if r % 2 == 0 else -70000.0
    want = T._cast_mean(xs, dtype)
    results = {}
    for dev in _devices(ctx):
        state = make()
        with _counted(ctx, state, dev, _cast_counts(1001)):
            out = _run(fn, state, xs[ctx.rank].to(dev, copy=True))
        assert out.dtype == torch.float32 and torch.equal(out, want), (dev, (out - want).abs())
        assert torch.isfinite(out[0])
        # Buckets in float64 (divide, round) and in the wire type (plain mean): ATen
        # ops on either device, no branch to count.
        with _counted(ctx, state, dev, _cast_counts(1001, steps=0)):
            f64 = _run(fn, state, xs[ctx.rank].double().to(dev, copy=True))
        with _counted(ctx, state, dev, _cast_counts(1001, steps=0)):
            wire = _run(fn, state, xs[ctx.rank].to(dtype).to(dev, copy=True))
        results[dev.type] = (out, f64, wire, state.wire_bytes)
    cpu, cuda = results["cpu"], results["cuda"]
    # (A float16 bucket holds +-70000 as +-inf already: its element 0 is NaN on both.)
    for what, a, b in zip(["float32", "float64", dtype_name], cpu[:3], cuda[:3]):
        assert torch_equal_nan(b, a), (kind, what, (b - a).abs().max())
    assert cuda[3] == cpu[3]  # the same bytes on the wire
    return cuda[0]


def _int8(ctx):
    import torch_braid.hooks as hooks

    torch = ctx.torch
    n, chunk = 1000, 64  # a partial last chunk
    xs = T._inputs(ctx, n, seed=7, scale=3.0)
    for x in xs:
        x[192:256] = 0  # an all-zero chunk is exact
    xs[-1][130:140] = 0
    outs = []
    for dev in _devices(ctx):
        state = hooks.int8_state(chunk_size=chunk, use_error_feedback=False)
        with _counted(ctx, state, dev, _int8_counts(ctx.size, n, chunk)):
            out = _run(hooks.int8_compress, state, xs[ctx.rank].to(dev, copy=True))
        assert torch.allclose(out, T._int8_mean(xs, chunk), rtol=1e-6, atol=1e-7)
        bound = sum(T._int8_quantize(x, chunk)[2] for x in xs) / 2 / ctx.size
        assert torch.all((out - T._mean(xs)).abs() <= bound * (1 + 1e-5) + 1e-7)
        assert torch.all(out[192:256] == 0)
        assert state.residual(0) is None
        nchunks = -(-n // chunk)
        assert state.payload_bytes == n + 4 * nchunks
        # A bfloat16 bucket is quantized from its float32 copy.
        with _counted(ctx, state, dev, _int8_counts(ctx.size, n, chunk)):
            half = _run(hooks.int8_compress, state,
                        xs[ctx.rank].to(torch.bfloat16).to(dev, copy=True))
        outs.append((out, half))
    (cpu, cpu_half), (cuda, cuda_half) = outs
    assert torch.equal(cuda, cpu), (cuda - cpu).abs().max()  # same rules, op by op
    assert torch.equal(cuda_half, cpu_half)
    return cuda


def _int8_error_feedback(ctx):
    import torch_braid.hooks as hooks

    torch = ctx.torch
    n, chunk = 700, 128
    states = {dev.type: (dev, hooks.int8_state(chunk_size=chunk)) for dev in _devices(ctx)}
    residuals = [torch.zeros(n) for _ in range(ctx.size)]  # every rank's, recomputed here
    outs = []
    for it in range(3):
        xs = T._inputs(ctx, n, seed=20 + it)
        vs = [xs[r] + residuals[r] for r in range(ctx.size)]
        got = {}
        for kind, (dev, state) in states.items():
            with _counted(ctx, state, dev, _int8_counts(ctx.size, n, chunk)):
                out = _run(hooks.int8_compress, state, xs[ctx.rank].to(dev, copy=True))
            assert torch.allclose(out, T._int8_mean(vs, chunk), rtol=1e-6, atol=1e-6), kind
            res = state.residual(0)
            assert res.device == dev
            got[kind] = (out, res.cpu())
        residuals = [v - T._int8_quantize(v, chunk)[0] for v in vs]
        res = got["cuda"][1]
        assert torch.allclose(res, residuals[ctx.rank], atol=1e-6)
        scale = T._int8_quantize(vs[ctx.rank], chunk)[2]
        assert torch.all(res.abs() <= scale / 2 * (1 + 1e-5) + 1e-7)
        assert torch.equal(got["cuda"][0], got["cpu"][0]), it
        assert torch.equal(got["cuda"][1], got["cpu"][1]), it
        outs.append(got["cuda"][0])
    return torch.stack(outs)


def _int8_nonfinite(ctx):
    import torch_braid.hooks as hooks

    torch = ctx.torch
    n, chunk = 256, 64
    x = T._inputs(ctx, n, seed=8)[ctx.rank]
    if ctx.rank == 0:
        x[70] = float("inf")
    got = []
    for dev in _devices(ctx):
        state = hooks.int8_state(chunk_size=chunk)
        with _counted(ctx, state, dev, _int8_counts(ctx.size, n, chunk)):
            out = _run(hooks.int8_compress, state, x.to(dev, copy=True))
        assert torch.all(torch.isnan(out[64:128]))  # never a plausible number
        assert torch.all(torch.isfinite(out[:64])) and torch.all(torch.isfinite(out[128:]))
        res = state.residual(0).cpu()
        assert torch.all(torch.isfinite(res))  # the next step starts clean
        if ctx.rank == 0:
            assert torch.all(res[64:128] == 0)
        got.append((out, res))
    assert torch_equal_nan(got[1][0], got[0][0]) and torch.equal(got[1][1], got[0][1])


def _powersgd_full_rank(ctx):
    import torch_braid.hooks as hooks

    torch = ctx.torch
    shapes = [(16, 8), (8,), (4, 3, 2)]
    xs = T._inputs(ctx, sum(math.prod(s) for s in shapes), seed=5)
    mean = T._mean(xs)
    outs = []
    for dev in _devices(ctx):
        state = hooks.powersgd_state(matrix_approximation_rank=16, start_powerSGD_iter=0,
                                     min_compression_rate=0, use_error_feedback=False,
                                     warm_start=False)
        with _counted(ctx, state, dev, _psgd_counts(shapes, rank=16, min_rate=0)):
            out = _run(hooks.powersgd, state, xs[ctx.rank].to(dev, copy=True), shapes)
        assert torch.allclose(out, mean, rtol=1e-4, atol=1e-5), (dev, (out - mean).abs().max())
        assert state.payload_bytes == 4 * ((8 + 16 * 8 + 4 * 4) + (8 * 8 + 6 * 4))
        outs.append(out)
    assert torch.allclose(outs[1], outs[0], rtol=PSGD_RTOL, atol=PSGD_ATOL)
    return outs[1]


def _powersgd_low_rank(ctx):
    import torch_braid.hooks as hooks

    torch = ctx.torch
    shapes = [(32, 16), (7,), (3, 2)]
    xs = T._inputs(ctx, sum(math.prod(s) for s in shapes), seed=6)
    mean = T._mean(xs)
    outs = []
    for dev in _devices(ctx):
        state = hooks.powersgd_state(matrix_approximation_rank=1, start_powerSGD_iter=0,
                                     use_error_feedback=False, warm_start=False)
        with _counted(ctx, state, dev, _psgd_counts(shapes, rank=1)):
            out = _run(hooks.powersgd, state, xs[ctx.rank].to(dev, copy=True), shapes)
        T._check_rank_one_projection(torch, out, mean, state)
        outs.append(out)
    # The same random Q on both devices (drawn on the CPU), hence the same projection.
    assert torch.allclose(outs[1], outs[0], rtol=PSGD_RTOL, atol=PSGD_ATOL)
    assert torch.equal(outs[1][512:], outs[0][512:])  # the uncompressed part: plain sums
    return outs[1]


def _powersgd_error_feedback(ctx):
    import torch_braid.hooks as hooks

    torch = ctx.torch
    shapes = [(24, 12), (12,)]
    n = 24 * 12 + 12
    states = {dev.type: (dev, hooks.powersgd_state(matrix_approximation_rank=2,
                                                   start_powerSGD_iter=2))
              for dev in _devices(ctx)}
    carried = torch.zeros(n)
    outs = []
    for it in range(5):  # warm start: Q carries over from step to step
        xs = T._inputs(ctx, n, seed=10 + it)
        corrected = xs[ctx.rank] + carried
        got = {}
        # Plain allreduce before start_powerSGD_iter, then compressed steps.
        counts = _allreduce_counts(4 * n) if it < 2 else _psgd_counts(shapes, rank=2)
        for kind, (dev, state) in states.items():
            with _counted(ctx, state, dev, counts):
                out = _run(hooks.powersgd, state, xs[ctx.rank].to(dev, copy=True), shapes)
            res = state.residual(0)
            got[kind] = (out, None if res is None else res.cpu())
        out, res = got["cuda"]
        assert torch.allclose(out, got["cpu"][0], rtol=PSGD_RTOL, atol=PSGD_ATOL), it
        if it < 2:  # plain allreduce before start_powerSGD_iter
            assert torch.equal(out, got["cpu"][0]) and res is None
            continue
        assert torch.allclose(res, corrected - out, atol=1e-5)  # residual = input - output
        assert torch.allclose(res, got["cpu"][1], rtol=PSGD_RTOL, atol=PSGD_ATOL), it
        carried = res
        outs.append(out)
    return torch.stack(outs)


def _slow_streams(ctx):
    """Stream order, with slow streams (each task sleeps first). The caller's
    stream: the bucket's values land there 20 ms after the hook is called, and
    the hook must compress them, not what the memory held before. braid's comm
    stream: the hooks' ATen ops after the collective (decompression in a Future
    callback, PowerSGD's after its wait in run) must still come after its
    copies back to the device. (The simulation cannot catch a host loop over
    device memory: any ATen op on the device, an allocation included, first
    drains the stream on the host.)"""
    import torch_braid.hooks as hooks

    torch, dist = ctx.torch, ctx.dist
    dev = _cuda(ctx)
    dist.all_reduce(torch.ones(4, device=dev))  # the group's CUDA state exists from here
    group = dist.distributed_c10d._get_default_group()
    # torch 2.x: the group holds braid per device; 1.13: the group is braid.
    backend = group._get_backend(dev) if ctx.torch2 else group
    shapes = [(16, 8), (8,), (4, 3, 2)]
    xs = T._inputs(ctx, sum(math.prod(s) for s in shapes), seed=30)
    cases = [("fp16", hooks.fp16_state, hooks.fp16_compress),
             ("int8", lambda: hooks.int8_state(chunk_size=32), hooks.int8_compress),
             ("powersgd", T._full_rank_powersgd, hooks.powersgd)]
    numel = xs[ctx.rank].numel()
    counts = {"fp16": _cast_counts(numel), "int8": _int8_counts(ctx.size, numel, 32),
              "powersgd": _psgd_counts(shapes, rank=64, min_rate=0)}
    want = {name: _run(fn, make(), xs[ctx.rank].clone(), shapes) for name, make, fn in cases}
    import braid_sim

    def check(name, got):
        ok = (torch.equal(got, want[name]) if name != "powersgd" else
              torch.allclose(got, want[name], rtol=PSGD_RTOL, atol=PSGD_ATOL))
        assert ok, (name, (got - want[name]).abs().max())

    for name, make, fn in cases:
        buf = torch.zeros(xs[ctx.rank].numel(), device=dev)
        braid_sim.delay_current_stream(dev.index, 20_000)
        braid_sim.write(buf, xs[ctx.rank])
        braid_sim.delay_current_stream(dev.index, 0)
        state = make()
        with _counted(ctx, state, dev, counts[name]):
            check(name, _run(fn, state, buf, shapes))
    braid_sim.delay_comm_stream(backend, 20_000)
    try:
        for name, make, fn in cases:
            state = make()
            with _counted(ctx, state, dev, counts[name]):
                check(name, _run(fn, state, xs[ctx.rank].to(dev, copy=True), shapes))
    finally:
        braid_sim.delay_comm_stream(backend, 0)


# ---- DDP on the simulated device -------------------------------------------------

def _hooks():
    import torch_braid.hooks as hooks

    return {
        "allreduce": (hooks.allreduce_state, hooks.allreduce),
        "fp16": (hooks.fp16_state, hooks.fp16_compress),
        "bf16": (hooks.bf16_state, hooks.bf16_compress),
        "int8": (lambda: hooks.int8_state(chunk_size=64), hooks.int8_compress),
        "powersgd": (lambda: hooks.powersgd_state(matrix_approximation_rank=2,
                                                  start_powerSGD_iter=2), hooks.powersgd),
        "powersgd_full": (T._full_rank_powersgd, hooks.powersgd),
    }


def _model(torch, seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(ctx, device, which, hook):
    """3 SGD steps of a small model wrapped by DDP with the hook on `device`;
    returns its parameters on the CPU and the hook state."""
    torch = ctx.torch
    make, fn = _hooks()[hook]
    model = _model(torch, 7 + ctx.rank).to(device)  # ranks differ: DDP broadcasts rank 0's
    if which == "torch":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=0.0005)
    else:
        from torch_braid.ddp import DistributedDataParallel as DDP

        ddp = DDP(model, bucket_cap_mb=0.0005, first_bucket_mb=0.0002)
    state = make()
    ddp.register_comm_hook(state, fn)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + ctx.rank)
    backend = C.backend(ctx, device) if device.type == "cuda" else None
    for _ in range(3):  # the hooks see the rebuilt buckets from step 2, PowerSGD compresses at 3
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 3, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        # The backward's collectives are the hook's (the flight recorder's).
        mark, before = C.recorded_mark(), backend and C.snapshot(backend)
        loss.backward()
        ops = C.recorded_since(mark)
        if backend:
            C.require(f"{which} DDP {hook}: a backward's collectives {ops}", backend, before,
                      C.Expected().recorded(ops), "staged")
        opt.step()
    return [p.detach().cpu() for p in model.parameters()], state


def _ddp_same_as_cpu(ctx, which):
    torch = ctx.torch
    cuda = _cuda(ctx)
    ch = H.Checker(ctx)
    start = list(_model(torch, 7).parameters())  # rank 0's, which DDP broadcasts
    for hook in _hooks():
        on_cpu, cpu_state = _train(ctx, torch.device("cpu"), which, hook)
        on_cuda, state = _train(ctx, cuda, which, hook)
        ch.true(f"{which} DDP {hook}: the C++ hook ran", state.wire_bytes > 0, "no bytes")
        # The same buckets and steps: the CUDA run takes the device branch exactly as
        # often as the CPU run takes the host branch (the casts, quantizations and
        # Gram-Schmidt passes; none for allreduce), and never the host branch.
        on, off = state._cpp_hook(), cpu_state._cpp_hook()
        got = (on.device_steps, on.host_steps, off.device_steps)
        ch.true(f"{which} DDP {hook}: the CUDA buckets' steps ran on the device",
                got == (off.host_steps, 0, 0) and (off.host_steps > 0) == (hook != "allreduce"),
                f"CUDA run (device, host) steps {got[:2]}, CPU run (device, host) steps "
                f"{(got[2], off.host_steps)}")
        ch.true(f"{which} DDP {hook}: training moved the parameters",
                all(not torch.equal(a, b) for a, b in zip(on_cuda, start)), "")
        for i, (a, b) in enumerate(zip(on_cpu, on_cuda)):
            what = f"{which} DDP {hook} parameter {i}: CUDA (simulated) vs CPU"
            if hook.startswith("powersgd"):  # see PSGD_RTOL
                ch.true(what, torch.allclose(b, a, rtol=PSGD_RTOL, atol=PSGD_ATOL),
                        f"max difference {(b - a).abs().max().item()}")
            else:  # the same kernels and the same hook arithmetic: the same bits
                ch.equal(what, b, a)
    return ch.report()


# ---- tests -----------------------------------------------------------------------

@pytest.mark.parametrize("world", WORLDS, indirect=True)
def test_allreduce_on_cuda(world):
    T._same_on_all_ranks(world.run(_allreduce))


@pytest.mark.parametrize("kind,dtype", [("fp16", "float16"), ("bf16", "bfloat16")])
@pytest.mark.parametrize("world", WORLDS, indirect=True)
def test_cast_compress_on_cuda(world, kind, dtype):
    T._same_on_all_ranks(world.run(_cast, kind, dtype))


@pytest.mark.parametrize("world", WORLDS, indirect=True)
def test_int8_on_cuda(world):
    T._same_on_all_ranks(world.run(_int8))


@pytest.mark.parametrize("world", WORLDS, indirect=True)
def test_int8_error_feedback_on_cuda(world):
    T._same_on_all_ranks(world.run(_int8_error_feedback))


@pytest.mark.parametrize("world", WORLDS[:1], indirect=True)
def test_int8_nonfinite_chunk_on_cuda(world):
    world.run(_int8_nonfinite)


@pytest.mark.parametrize("world", WORLDS, indirect=True)
def test_powersgd_full_rank_on_cuda(world):
    T._same_on_all_ranks(world.run(_powersgd_full_rank))


@pytest.mark.parametrize("world", WORLDS, indirect=True)
def test_powersgd_low_rank_on_cuda(world):
    T._same_on_all_ranks(world.run(_powersgd_low_rank))


@pytest.mark.parametrize("world", WORLDS, indirect=True)
def test_powersgd_error_feedback_on_cuda(world):
    T._same_on_all_ranks(world.run(_powersgd_error_feedback))


@pytest.mark.parametrize("world", WORLDS[:1], indirect=True)
def test_hooks_keep_stream_order(world):
    world.run(_slow_streams)


@pytest.mark.parametrize("which", ["torch", "braid"])
@pytest.mark.parametrize("world", WORLDS[:1], indirect=True)
def test_ddp_with_hooks_on_cuda_matches_cpu(world, which):
    H.check_reports(world.run(_ddp_same_as_cpu, which))

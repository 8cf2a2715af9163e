"""Compute capabilities and kernel images on the simulated device (Note [Kernel images] in
csrc/cuda/kernel_images.h, Note [Simulated kernel images] in tests/sim/device/sim_arch.h).

A group whose ranks would run braid's same-GPU or hierarchical collectives, which launch
braid's kernels, stages instead when a rank's device cannot run them: a Turing GPU (7.5)
for a build whose kernels start at sm_80, or a build without nvcc. _cuda_executor() says
which device, its sm_XY and CUDA's text; the results are the closed forms, and every op
was staged. Asked for by name (BRAID_CUDA_EXECUTOR=same-gpu), the group's first op fails
saying why, instead of a kernel launch failing later. Issue 42, defect 3.
"""

import contextlib
import datetime
import os
import threading

import pytest

import cuda_counts as C
import harness as H

pytestmark = [pytest.mark.braid_only, H.simulated_cuda_only()]


@contextlib.contextmanager
def _capability(device, cc):
    """The simulated `device` has compute capability `cc` within; the default after (the
    worlds are pooled: a capability left behind would reach the next test's groups)."""
    import braid_sim

    braid_sim.set_compute_capability(device, cc)
    try:
        yield
    finally:
        braid_sim.set_compute_capability(device, (0, 0))


@contextlib.contextmanager
def _env(name, value):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


def _staged_on_turing(ctx, count):
    """Every rank on simulated GPU 0, of compute capability 7.5."""
    import braid_sim

    torch, dist = ctx.torch, ctx.dist
    braid_sim.install(1)
    ch = H.Checker(ctx)
    n, r = ctx.size, ctx.rank
    cuda = torch.device("cuda", 0)
    with _capability(0, (7, 5)):
        ch.equal("torch sees the device's capability", torch.tensor(
            torch.cuda.get_device_capability(0)), torch.tensor((7, 5)))
        group = dist.new_group(list(range(n)))
        backend = C.chosen_backend(ctx, cuda, group)
        executor = backend._cuda_executor()
        ch.true("staged, naming the device and CUDA's text",
                executor.startswith(f"staged: all {n} ranks share GPU ")
                and "but the same-GPU collectives cannot run there: braid's kernels do not "
                    "load on device 0 (sm_75) of rank 0: no kernel image is available for "
                    "execution on the device" in executor, executor)
        exp, before = C.Expected(), C.snapshot(backend)
        for op in ("SUM", "MAX", "AVG"):
            inputs = [H.make_input(q, count, torch.float32, "SUM" if op == "AVG" else op)
                      for q in range(n)]
            t = inputs[r].to(cuda)
            dist.all_reduce(t, op=H.reduce_op(op), group=group)
            exp.staged(d2h=4 * count, h2d=4 * count)
            ch.reduced(f"all_reduce {op} count={count}", t.cpu(), H.closed_form(inputs, op, n), op)
        t = H.pattern(r, 0, count, torch.float32).to(cuda)
        dist.broadcast(t, src=n - 1, group=group)
        exp.staged(d2h=4 * count, h2d=4 * count)
        ch.equal(f"broadcast count={count}", t.cpu(), H.pattern(n - 1, 0, count, torch.float32))
        C.check(ch, f"count={count}", backend, before, exp, "staged")
        dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((n, "cuda1"), id=f"n{n}") for n in (2, 3)],
                         indirect=True)
def test_ranks_on_a_gpu_without_kernels_stage_and_say_why(world):
    H.check_reports(world.run(_staged_on_turing, 1023))


def _same_gpu_asked_for(ctx):
    import braid_sim

    torch, dist = ctx.torch, ctx.dist
    braid_sim.install(1)
    with _capability(0, (7, 5)), _env("BRAID_CUDA_EXECUTOR", "same-gpu"):
        group = dist.new_group(list(range(ctx.size)))
        try:
            dist.all_reduce(torch.ones(3, device="cuda:0"), group=group)
            return "no error"
        except RuntimeError as e:
            return str(e)
        finally:
            dist.destroy_process_group(group)


@pytest.mark.parametrize("world", [pytest.param((2, "cuda1"), id="n2")], indirect=True)
def test_same_gpu_asked_for_on_a_gpu_without_kernels_fails_saying_why(world):
    for r, message in enumerate(world.run(_same_gpu_asked_for)):
        assert (f"braid init (rank {r}): BRAID_CUDA_EXECUTOR=same-gpu, but braid's kernels do "
                "not load on device 0 (sm_75) of rank 0: no kernel image is available") in message, \
            message


def _build_without_kernels(ctx):
    """The simulated build holds no kernel images, as one built without nvcc: the group
    stages from the start (it chose same-gpu and threw at the first op before)."""
    import braid_sim

    torch, dist = ctx.torch, ctx.dist
    braid_sim.install(1)
    ch = H.Checker(ctx)
    braid_sim.set_kernel_images([])
    try:
        group = dist.new_group(list(range(ctx.size)))
        t = H.make_input(ctx.rank, 300, torch.float32).to("cuda:0")
        dist.all_reduce(t, group=group)
        executor = C.backend(ctx, torch.device("cuda", 0), group)._cuda_executor()
        ch.true("staged: a build without kernels", "device 0 (sm_90) of rank 0: this braid was "
                "built without nvcc" in executor and executor.startswith("staged: "), executor)
        ch.reduced("all_reduce", t.cpu(),
                   H.closed_form([H.make_input(q, 300, torch.float32) for q in range(ctx.size)],
                                 "SUM", ctx.size), "SUM")
        dist.destroy_process_group(group)
    finally:
        braid_sim.set_kernel_images(None)
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((2, "cuda1"), id="n2")], indirect=True)
def test_a_build_without_kernels_stages(world):
    H.check_reports(world.run(_build_without_kernels))


def test_hierarchical_ranks_with_a_turing_gpu_stage():
    """4 ranks (threads) on 2 simulated GPUs, the second of 7.5: the layout would run
    hierarchically (tests/python/test_cuda_sim_multi_gpu.py), but GPU 1 cannot run braid's
    kernels, so the group stages, naming it; all_reduce still gives the closed form."""
    import torch
    import torch.distributed as dist
    import braid_sim
    from torch_braid import _C

    n = 4
    braid_sim.install(2)
    braid_sim.nccl_install()
    store = torch.distributed.HashStore()
    results = [None] * n

    def main(r):
        pg = _C.ProcessGroupBraid(store, r, n, datetime.timedelta(seconds=30))
        try:
            cuda = torch.device("cuda", r // 2)
            t = (torch.arange(1001, dtype=torch.float32) % 7 + r).to(cuda)
            pg.allreduce([t], dist.AllreduceOptions()).wait()
            results[r] = (pg._cuda_executor(), t.cpu(), dict(pg._cuda_executor_stats()))
        except BaseException as e:  # noqa: BLE001 - reported below
            results[r] = e
        finally:
            pg.shutdown()

    with _capability(1, (7, 5)):
        threads = [threading.Thread(target=main, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
            assert not t.is_alive(), "a rank hangs"
    want = sum(torch.arange(1001, dtype=torch.float32) % 7 + q for q in range(n))
    for r, res in enumerate(results):
        assert not isinstance(res, BaseException), f"rank {r}: {res!r}"
        executor, got, stats = res
        assert executor.startswith("staged: ranks 0 and 1 share GPU"), executor
        assert ("; and braid's kernels do not load on device 1 (sm_75) of rank 2: no kernel image "
                "is available for execution on the device") in executor, executor
        assert torch.equal(got, want), r
        assert stats["staged_ops"] == 1 and stats["nccl_ops"] == 0, stats

"""CUDA graph capture on braid's simulated device (Note [Simulated graph capture] in
tests/sim/device/sim_device.h, Note [Graph capture in the front end] in
csrc/c10d/cuda/cuda_context.cc).

A collective issued while the caller's current stream captures a graph is refused before
anything is enqueued, with an error naming the op, the rank and the capture, on the staged
and the same-GPU executors alike; the capture ends with nothing in it, and the group stays
usable. A capture in global mode on another thread survives braid's ops on another device:
braid's own queries and allocations run in relaxed capture mode.
"""

import threading

import pytest

import harness as H

pytestmark = [pytest.mark.braid_only, H.simulated_cuda_only()]


def _refused_then_usable(ctx, devices):
    torch, dist = ctx.torch, ctx.dist
    import braid_sim as sim

    sim.install(devices)
    ch = H.Checker(ctx)
    dev, n, r = ctx.rank % devices, ctx.size, ctx.rank
    t = sim.empty([8], torch.float32, dev)
    sim.write(t, torch.full((8,), float(r)))
    dist.all_reduce(t)  # binds the group to cuda:dev, chooses its executor
    out = sim.empty([8 * n], torch.float32, dev)  # allocating in the capture is prohibited
    sim.begin_capture(dev, "global")
    ch.true("the current stream is capturing", sim.is_current_stream_capturing(dev), "")
    msg = ""
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        msg = str(e)
    others = {}
    gather = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    for name, fn in (("broadcast", lambda: dist.broadcast(t, src=0)),
                     ("all_gather_into_tensor", lambda: gather(out, t))):
        try:
            fn()
            others[name] = ""
        except RuntimeError as e:
            others[name] = str(e)
    tasks = sim.end_capture(dev)
    for name, m in others.items():
        ch.true(f"{name} on a capturing stream is refused",
                f"(rank {r}): the current stream is capturing a CUDA graph" in m, m)
    expected = (f"braid allreduce (rank {r}): the current stream is capturing a CUDA graph; "
                "braid's collectives cannot be captured")
    ch.true("a collective on a capturing stream is refused with op, rank and capture",
            expected in msg, msg)
    ch.equal("nothing was enqueued into the capture", torch.tensor([tasks]), torch.tensor([0]))
    u = sim.empty([8], torch.float32, dev)
    sim.write(u, torch.ones(8))
    dist.all_reduce(u)
    ch.equal("the group works after the refused call", sim.read(u), torch.full((8,), float(n)))
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((2, "cuda"), id="n2")], indirect=True)
def test_staged_refuses_a_capturing_stream(world):
    H.check_reports(world.run(_refused_then_usable, 2))


@pytest.mark.parametrize("world", [pytest.param((2, "cuda1"), id="n2")], indirect=True)
def test_same_gpu_refuses_a_capturing_stream(world):
    H.check_reports(world.run(_refused_then_usable, 1))


def _capture_on_another_thread(ctx):
    torch, dist = ctx.torch, ctx.dist
    import braid_sim as sim

    sim.install(2)
    ch = H.Checker(ctx)
    n, dev = ctx.size, ctx.rank % 2
    other = 1 - dev
    # The ops on this rank's device; the capture on the other device's stream, from
    # another thread of this process.
    t = sim.empty([64], torch.float32, dev)
    sim.write(t, torch.ones(64))
    dist.all_reduce(t)
    started, done = threading.Event(), threading.Event()
    outcome = {}

    def capture():
        sim.begin_capture(other, "global")
        started.set()
        done.wait()
        try:
            outcome["tasks"] = sim.end_capture(other)
        except RuntimeError as e:
            outcome["error"] = str(e)

    # The user's own allocations and reads are prohibited during a global-mode capture
    # (as in CUDA): the tensors are made before it and read after it.
    us = []
    for i in range(4):
        u = sim.empty([1000 + i], torch.float32, dev)  # a new size: new pinned blocks
        sim.write(u, torch.ones(1000 + i))
        us.append(u)
    th = threading.Thread(target=capture)
    th.start()
    started.wait()
    try:
        for u in us:
            dist.all_reduce(u)
    finally:
        done.set()
        th.join()
    for i, u in enumerate(us):
        ch.equal(f"all_reduce {i} during the capture", sim.read(u),
                 torch.full((1000 + i,), float(n)))
    ch.true("the capture on another thread in global mode was not invalidated",
            "error" not in outcome, outcome.get("error", ""))
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((2, "cuda"), id="n2")], indirect=True)
def test_capture_on_another_thread_survives_braid(world):
    H.check_reports(world.run(_capture_on_another_thread))


def _premul_tensor_factor_in_capture(ctx):
    """The factor of PREMUL_SUM as a CUDA tensor: reading it (.item(), a host sync) during a
    capture is what the simulator catches; braid refuses the collective before it reads the
    factor, so the capture survives, and outside a capture the op is right."""
    torch, dist = ctx.torch, ctx.dist
    import braid_sim as sim

    sim.install(2)
    ch = H.Checker(ctx)
    dev, n, r = ctx.rank % 2, ctx.size, ctx.rank
    factor = sim.empty([1], torch.float32, dev)
    sim.write(factor, torch.tensor([0.5]))
    t = sim.empty([8], torch.float32, dev)
    sim.write(t, torch.full((8,), float(r + 1)))
    # torch 1.13 takes a list of factor tensors, 2.x one tensor.
    op = dist._make_nccl_premul_sum(factor if ctx.torch2 else [factor])
    # The simulator's own check: a host sync during a global-mode capture invalidates it.
    sim.begin_capture(dev, "global")
    sync = ""
    try:
        factor.item()
    except RuntimeError as e:
        sync = str(e)
    end = ""
    try:
        sim.end_capture(dev)
    except RuntimeError as e:
        end = str(e)
    ch.true("the simulator catches a host sync during a capture",
            "prohibited while a CUDA graph is captured" in sync and "invalidated" in end,
            f"{sync!r} / {end!r}")
    sim.begin_capture(dev, "global")
    msg = ""
    try:
        dist.all_reduce(t, op=op)
    except RuntimeError as e:
        msg = str(e)
    end = ""
    try:
        sim.end_capture(dev)
    except RuntimeError as e:
        end = str(e)
    ch.true("PREMUL_SUM with a tensor factor is refused during a capture",
            f"braid allreduce (rank {r}): the current stream is capturing a CUDA graph" in msg,
            msg)
    ch.true("refusing it read no factor: the capture is intact", end == "", end)
    dist.all_reduce(t, op=op)
    ch.equal("PREMUL_SUM with a tensor factor after the capture", sim.read(t),
             torch.full((8,), 0.5 * n * (n + 1) / 2))
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((2, "cuda"), id="n2")], indirect=True)
def test_premul_sum_tensor_factor_during_capture(world):
    H.check_reports(world.run(_premul_tensor_factor_in_capture))

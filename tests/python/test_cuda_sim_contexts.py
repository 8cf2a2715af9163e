"""Each rank's process holds a CUDA context on its own device only (Note [A current device
per thread] in csrc/cuda/on_device.h).

On CUDA 12+ a CUDA call on a thread whose device was never set (a worker, the NCCL
watchdog, a point-to-point thread) creates device 0's primary context in that process:
about 0.5 GiB of GPU 0 per rank. The simulated device keeps the same rules and lists a
process's contexts (braid_sim.contexts(), Note [Simulated contexts] in
tests/sim/device/sim_device.h), as nvidia-smi --query-compute-apps does.

4 ranks, each a process that sets its device as a user does (torch.cuda.set_device). Rank
r on device r: the staged executor (collectives and point-to-point), then NCCL's (braid's
same-GPU collectives standing in for NCCL across processes), then an abort with an op
pending. Ranks on devices that leave device 0 unused: all four on device 1 (the same-GPU
executor), and two per device on devices 2 and 3 (the hierarchical one). After each, every
process holds exactly its own device's context.
"""

import datetime
import os
import threading

import pytest

import cuda_counts as C
import harness as H

pytestmark = [pytest.mark.braid_only, H.simulated_cuda_only()]

N = 4
DEVICES = 4
HALF = 4096  # BRAID_CUDA_SAME_GPU_BYTES / 2: several chunks per op


def _start(ctx, device, nccl):
    import braid_sim

    braid_sim.install(DEVICES)
    ctx.torch.cuda.set_device(device)
    if nccl:
        braid_sim.nccl_install(cross_process=True)
    os.environ["BRAID_CUDA_SAME_GPU_BYTES"] = str(2 * HALF)
    return braid_sim


def _group(ctx, cuda):
    group = ctx.dist.new_group(list(range(ctx.size)),
                               timeout=datetime.timedelta(seconds=30))
    ctx.dist.all_reduce(ctx.torch.zeros(1, device=cuda), group=group)  # chooses the executor
    backend = C.backend(ctx, cuda, group)
    return group, backend, backend._cuda_executor()


def _ops(ctx, group, cuda, p2p=False):
    """Collectives, their results checked (a context bug must not hide a wrong result)."""
    torch, dist = ctx.torch, ctx.dist
    n, r = ctx.size, ctx.rank
    for count in (1, 7, 3 * HALF + 1):
        t = torch.full((count,), float(r + 1), device=cuda)
        dist.all_reduce(t, group=group)
        assert torch.equal(t.cpu(), torch.full((count,), n * (n + 1) / 2)), count
        t = torch.full((count,), float(r), device=cuda)
        dist.broadcast(t, src=n - 1, group=group)
        assert torch.equal(t.cpu(), torch.full((count,), float(n - 1))), count
        out = [torch.zeros(count, device=cuda) for _ in range(n)]
        dist.all_gather(out, torch.full((count,), float(r), device=cuda), group=group)
        for q in range(n):
            assert torch.equal(out[q].cpu(), torch.full((count,), float(q))), (count, q)
        # An op completed by the worker while the caller goes on (async_op).
        t = torch.full((count,), 1.0, device=cuda)
        work = dist.all_reduce(t, group=group, async_op=True)
        work.wait()
        assert torch.equal(t.cpu(), torch.full((count,), float(n))), count
    if p2p:
        # Completed on the point-to-point threads.
        got = torch.zeros(5, device=cuda)
        reqs = [dist.isend(torch.full((5,), float(r), device=cuda), (r + 1) % n, group=group),
                dist.irecv(got, (r - 1) % n, group=group)]
        for q in reqs:
            q.wait()
        assert torch.equal(got.cpu(), torch.full((5,), float((r - 1) % n)))


def _contexts(sim, what):
    return (what, sim.contexts())


def _own_device(ctx):
    """Rank r on device r: the staged executor, NCCL's, then an abort."""
    device = _device("own", ctx.rank)
    cuda = ctx.torch.device("cuda", device)
    sim = _start(ctx, device, nccl=False)
    seen = [_contexts(sim, "after set_device")]
    group, _, executor = _group(ctx, cuda)
    assert executor.startswith("staged"), executor
    _ops(ctx, group, cuda, p2p=True)
    ctx.dist.destroy_process_group(group)
    seen.append(_contexts(sim, f"after the {executor.split(':')[0]} executor"))

    _start(ctx, device, nccl=True)
    group, backend, executor = _group(ctx, cuda)
    assert executor.startswith("nccl"), executor
    _ops(ctx, group, cuda)
    seen.append(_contexts(sim, f"after the {executor.split(':')[0]} executor"))

    # Rank n-1 aborts from a thread that never set its device while the others are in an
    # all_reduce it never joins; their executors fail and abort their communicators. Then
    # every rank aborts again, from another such thread.
    if ctx.rank == ctx.size - 1:
        aborter = threading.Timer(0.5, backend.abort)
        aborter.start()
        aborter.join(30)
        assert not aborter.is_alive(), "abort hangs"
    else:
        try:
            ctx.dist.all_reduce(ctx.torch.ones(3, device=cuda), group=group)
            raise AssertionError("an all_reduce that rank n-1 never joined completed")
        except RuntimeError as e:
            assert "abort" in str(e), e
    aborter = threading.Thread(target=backend.abort)
    aborter.start()
    aborter.join(30)
    assert not aborter.is_alive(), "abort hangs"
    ctx.dist.destroy_process_group(group)
    seen.append(_contexts(sim, "after the abort"))
    return seen


def _device(layout, r):
    return {"own": r, "one": 1, "pairs": 2 + r // 2}[layout]


def _shared_devices(ctx, layout, want):
    device = _device(layout, ctx.rank)
    cuda = ctx.torch.device("cuda", device)
    sim = _start(ctx, device, nccl=True)
    seen = [_contexts(sim, "after set_device")]
    group, _, executor = _group(ctx, cuda)
    assert executor.startswith(want), executor
    _ops(ctx, group, cuda)
    ctx.dist.destroy_process_group(group)
    seen.append(_contexts(sim, f"after the {executor.split(':')[0]} executor"))
    return seen


def _check(layout, body, *args):
    world = H.World(N, pg_timeout=30.0, name=f"contexts-{layout}")
    try:
        reports = world.run(body, *args, timeout=180)
    finally:
        world.close(timeout=30)
    bad = []
    for r, seen in enumerate(reports):
        for what, contexts in seen:
            if contexts != [_device(layout, r)]:
                bad.append(f"rank {r} (device {_device(layout, r)}) {what}: contexts on "
                           f"devices {contexts}")
    assert not bad, "\n".join(bad)


def test_each_rank_holds_its_own_device_only_after_every_executor_and_abort():
    _check("own", _own_device)


@pytest.mark.parametrize("layout,want", [("one", "same-gpu"), ("pairs", "hier")])
def test_ranks_sharing_a_gpu_leave_device_0_alone(layout, want):
    _check(layout, _shared_devices, layout, want)

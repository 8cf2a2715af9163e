"""Ranks that share several GPUs: braid's hierarchical CUDA collectives through torch_braid.

4 ranks on 2 simulated GPUs (ranks 0 and 1 on cuda:0, 2 and 3 on cuda:1): the group
chooses the hierarchical executor (Note [Hierarchical CUDA collectives] in
csrc/cuda/shared_gpu/multi_gpu.h): braid's same-GPU collectives within each GPU, NCCL between the GPUs'
leaders. The simulated NCCL meets its communicators inside one process, so the ranks
here are threads, each with its own ProcessGroupBraid over one store, as
tests/cpp/test_cuda_multi_gpu.cc's are. all_reduce (SUM, MAX, AVG) and broadcast are checked
against closed forms at counts 0, 1, odd and several same-GPU halves, the executor's
op counter shows they ran hierarchically; so do reduce, allgather and reduce_scatter,
in a contiguous and an interleaved layout; and gather, which the hierarchical executor
lacks (as AVG of integers), is staged and still right. Across processes (below): every
op with braid's same-GPU collectives standing in for NCCL between the leaders, and a rank
that exits mid-op.
"""

import datetime
import os
import threading

import pytest

import cuda_counts as C
import harness as H

pytestmark = [pytest.mark.braid_only, H.simulated_cuda_only()]

HALF = 4096  # BRAID_CUDA_SAME_GPU_BYTES / 2: several chunks per op
N = 4


def _run_ranks(body, n=N, timeout_s=60, device_of=lambda r: r // 2, as_processes=True):
    import torch
    import braid_sim
    from torch_braid import _C

    braid_sim.install(2)
    braid_sim.nccl_install()
    os.environ["BRAID_CUDA_SAME_GPU_BYTES"] = str(2 * HALF)
    store = torch.distributed.HashStore()
    errors = [None] * n

    def main(r):
        # Each rank thread a process to CUDA IPC's rules (Note [Thread ranks on one GPU] in
        # csrc/cuda/nccl/executor_choice.h): real thread ranks get no same-GPU collectives.
        braid_sim.set_thread_process(r + 1 if as_processes else 0)
        pg = _C.ProcessGroupBraid(store, r, n, datetime.timedelta(seconds=30))
        try:
            body(r, pg, torch.device("cuda", device_of(r)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[r] = e
        finally:
            pg.shutdown()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), "a rank hangs"
    for r, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"rank {r}: {e!r}") from e


def _value(torch, r, count, dtype):
    return (torch.arange(count, dtype=torch.float64) % 5 + r + 1).to(dtype)


def test_all_reduce_and_broadcast_run_hierarchically():
    import torch
    import torch.distributed as dist

    def body(r, pg, cuda):
        exp, before = C.Expected(), C.snapshot(pg)
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for op in ("SUM", "MAX", "AVG"):
                if op == "AVG" and not dtype.is_floating_point:
                    continue
                for count in (0, 1, 7, 3 * HALF // 4 + 1, 2 * HALF + 3):
                    t = _value(torch, r, count, dtype).to(cuda)
                    opts = dist.AllreduceOptions()
                    opts.reduceOp = getattr(dist.ReduceOp, op)
                    pg.allreduce([t], opts).wait()
                    exp.nccl(count * t.element_size())
                    got = t.cpu().double()
                    inputs = [_value(torch, q, count, dtype).double() for q in range(N)]
                    if op == "MAX":
                        want = torch.stack(inputs).max(0).values if count else got
                        assert torch.equal(got, want), (dtype, op, count)
                    elif op == "SUM":
                        assert torch.equal(got, sum(inputs)), (dtype, op, count)
                    else:
                        # AVG within each GPU, then among the leaders: rounded
                        # twice (Note [Hierarchical CUDA collectives]), so within
                        # 2u of the exact mean for inputs of one sign.
                        u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -24
                        want = sum(inputs) / N
                        assert torch.all((got - want).abs() <= 2 * u * want), (dtype, count)
        executor = pg._cuda_executor()
        assert executor.startswith("hier: 4 ranks on 2 GPUs"), executor
        C.require(f"rank {r}: the all_reduces", pg, before, exp, "hier")
        exp, before = C.Expected(), C.snapshot(pg)
        for root in range(N):
            for count in (0, 1, 7, 2 * HALF + 3):
                t = _value(torch, r, count, torch.float32).to(cuda)
                opts = dist.BroadcastOptions()
                opts.rootRank = root
                pg.broadcast([t], opts).wait()
                exp.nccl(4 * count)
                assert torch.equal(t.cpu(), _value(torch, root, count, torch.float32)), (root, count)
        C.require(f"rank {r}: the broadcasts", pg, before, exp, "hier")

    _run_ranks(body)


# Note [Thread ranks on one GPU] in csrc/cuda/nccl/executor_choice.h: threads of one process
# cannot open each other's CUDA IPC handles, so they get no same-GPU collectives.
@pytest.mark.parametrize("setting", ["auto", "same-gpu"])
def test_thread_ranks_on_one_gpu_get_no_same_gpu_collectives(setting):
    import torch

    def body(r, pg, cuda):
        t = torch.full((5,), float(r + 1), device=cuda)
        if setting == "auto":
            pg.allreduce([t]).wait()
            executor = pg._cuda_executor()
            assert executor.startswith("staged"), executor
            assert "ranks 0 and 1 share GPU" in executor, executor
            assert "are threads of one process" in executor, executor
            assert torch.equal(t.cpu(), torch.full((5,), 3.0)), t.cpu()
        else:
            with pytest.raises(RuntimeError) as e:
                pg.allreduce([t]).wait()
            assert ("BRAID_CUDA_EXECUTOR=same-gpu, but ranks 0 and 1 share GPU" in str(e.value)
                    and "are threads of one process" in str(e.value)), str(e.value)

    saved = os.environ.get("BRAID_CUDA_EXECUTOR")
    os.environ["BRAID_CUDA_EXECUTOR"] = setting
    try:
        _run_ranks(body, n=2, device_of=lambda r: 0, as_processes=False)
    finally:
        if saved is None:
            del os.environ["BRAID_CUDA_EXECUTOR"]
        else:
            os.environ["BRAID_CUDA_EXECUTOR"] = saved


def test_ops_it_lacks_are_staged():
    import torch
    import torch.distributed as dist

    def body(r, pg, cuda):
        t = torch.ones(3, device=cuda)
        pg.allreduce([t]).wait()  # the executor is chosen at the first op
        assert pg._cuda_executor().startswith("hier"), pg._cuda_executor()
        before = C.snapshot(pg)
        count = 2 * HALF + 3
        inp = _value(torch, r, count, torch.float32).to(cuda)
        outs = [torch.zeros(count, device=cuda) for _ in range(N)] if r == 1 else []
        opts = dist.GatherOptions()
        opts.rootRank = 1
        pg.gather([outs] if r == 1 else [], [inp], opts).wait()
        if r == 1:
            for q in range(N):
                assert torch.equal(outs[q].cpu(), _value(torch, q, count, torch.float32)), q
        # AVG of integers: the same-GPU kernels divide floats only, so staged
        # (the integer sum divided, truncating, as braid's CPU path does).
        t = _value(torch, r, 11, torch.int32).to(cuda)
        aopts = dist.AllreduceOptions()
        aopts.reduceOp = dist.ReduceOp.AVG
        pg.allreduce([t], aopts).wait()
        total = sum(_value(torch, q, 11, torch.int32) for q in range(N))
        assert torch.equal(t.cpu(), torch.div(total, N, rounding_mode="trunc").int())
        # gather: the input staged in, the root's N outputs copied back; AVG: 11 int32s.
        exp = C.Expected().staged(d2h=4 * count, h2d=N * 4 * count if r == 1 else 0)
        C.require(f"rank {r}: gather and int AVG were staged", pg, before,
                  exp.staged(d2h=44, h2d=44), "hier")

    _run_ranks(body)


@pytest.mark.parametrize("layout", ["blocks", "interleaved"])
def test_reduce_allgather_reduce_scatter_run_hierarchically(layout):
    """reduce (to a leader and to a non-leader), _allgather_base and _reduce_scatter_base
    (Note [Hierarchical reduce, allgather and reduce_scatter] in csrc/cuda/shared_gpu/multi_gpu.h), with
    ranks 0, 1 on cuda:0 (blocks) or ranks 0, 2 on cuda:0 (interleaved: the GPUs' blocks
    are not in rank order), against closed forms; the executor's op counter moves by one
    per op, which the staged path never touches."""
    import torch
    import torch.distributed as dist

    def body(r, pg, cuda):
        t = torch.ones(3, device=cuda)
        pg.allreduce([t]).wait()
        executor = pg._cuda_executor()
        assert executor.startswith("hier: 4 ranks on 2 GPUs"), executor
        exp, before = C.Expected(), C.snapshot(pg)
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for count in (0, 1, 7, 2 * HALF + 3):
                b = count * torch.empty(0, dtype=dtype).element_size()
                inputs = [_value(torch, q, count, dtype) for q in range(N)]
                for root in (1, 2):
                    t = inputs[r].to(cuda)
                    ropts = dist.ReduceOptions()
                    ropts.rootRank = root
                    ropts.reduceOp = dist.ReduceOp.MAX if dtype == torch.int32 else dist.ReduceOp.SUM
                    pg.reduce([t], ropts).wait()
                    want = (torch.stack(inputs).max(0).values if count else inputs[r]) \
                        if dtype == torch.int32 else sum(x.double() for x in inputs).to(dtype)
                    got = t.cpu()
                    if r == root:
                        assert torch.equal(got, want), ("reduce", dtype, count, root)
                    else:
                        assert torch.equal(got, inputs[r]), ("reduce kept input", dtype, count)
                    exp.nccl(b)
                out = torch.full((N * count,), -1, dtype=dtype, device=cuda)
                pg._allgather_base(out, inputs[r].to(cuda)).wait()
                assert torch.equal(out.cpu(), torch.cat(inputs)), ("allgather", dtype, count)
                full = [_value(torch, q, N * count, dtype) for q in range(N)]
                got = torch.full((count,), -1, dtype=dtype, device=cuda)
                pg._reduce_scatter_base(got, full[r].to(cuda)).wait()
                want = sum(x.double() for x in full).to(dtype)[r * count:(r + 1) * count]
                assert torch.equal(got.cpu(), want), ("reduce_scatter", dtype, count)
                exp.nccl(N * b, ops=2)  # allgather's output, reduce_scatter's input
        C.require(f"rank {r}: they ran hierarchically", pg, before, exp, "hier")

    _run_ranks(body, device_of=(lambda r: r // 2) if layout == "blocks" else (lambda r: r % 2))


# ---- Across processes --------------------------------------------------------
# The simulated NCCL meets its communicators in one process, so here braid's
# same-GPU collectives stand in for NCCL between the GPUs' leaders
# (braid_sim.nccl_install(cross_process=True); the simulated device's memory and
# events are shared memory, so one communicator may span its devices). Each
# rank is a process: the same-GPU level inside each GPU opens the peers'
# memory and events across processes, as on a real GPU, and a rank that
# exits is seen by the others.


def _xp_group(ctx):
    import braid_sim
    from torch_braid import _C

    braid_sim.install(2)
    braid_sim.nccl_install(cross_process=True)
    os.environ["BRAID_CUDA_SAME_GPU_BYTES"] = str(2 * HALF)
    group = ctx.dist.new_group(list(range(ctx.size)))
    cuda = ctx.torch.device("cuda", ctx.rank // 2)
    ctx.dist.all_reduce(ctx.torch.zeros(1, device=cuda), group=group)
    backend = group._get_backend(cuda) if ctx.torch2 else group
    return group, backend, cuda


def _xp_collectives(ctx, dtype_name):
    torch, dist = ctx.torch, ctx.dist
    group, backend, cuda = _xp_group(ctx)
    ch = H.Checker(ctx)
    executor = backend._cuda_executor()
    ch.true("the group runs hierarchically", executor.startswith("hier: 4 ranks on 2 GPUs"),
            executor)
    n, r = ctx.size, ctx.rank
    gather = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    scatter = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    exp, before = C.Expected(), C.snapshot(backend)
    for dtype in (getattr(torch, dtype_name),):
        for count in (0, 1, 7, 2 * HALF + 3):
            what = f"{dtype} count={count}"
            b = count * torch.empty(0, dtype=dtype).element_size()
            inputs = [_value(torch, q, count, dtype) for q in range(n)]
            total = sum(x.double() for x in inputs).to(dtype)
            t = inputs[r].to(cuda)
            dist.all_reduce(t, group=group)
            ch.equal(f"all_reduce {what}", t.cpu(), total)
            for root in (1, 2):
                t = inputs[r].to(cuda)
                dist.broadcast(t, src=root, group=group)
                ch.equal(f"broadcast root={root} {what}", t.cpu(), inputs[root])
                t = inputs[r].to(cuda)
                dist.reduce(t, dst=root, group=group)
                ch.equal(f"reduce root={root} {what}", t.cpu(),
                         total if r == root else inputs[r])
            out = torch.full((n * count,), -1, dtype=dtype, device=cuda)
            gather(out, inputs[r].to(cuda), group=group)
            ch.equal(f"all_gather_into_tensor {what}", out.cpu(), torch.cat(inputs))
            full = [_value(torch, q, n * count, dtype) for q in range(n)]
            got = torch.empty(count, dtype=dtype, device=cuda)
            scatter(got, full[r].to(cuda), group=group)
            ch.equal(f"reduce_scatter_tensor {what}", got.cpu(),
                     sum(x.double() for x in full).to(dtype)[r * count:(r + 1) * count])
            # all_reduce, 2 broadcasts, 2 reduces: b; allgather, reduce_scatter: n * b.
            exp.nccl(b, ops=5).nccl(n * b, ops=2)
    C.check(ch, "every op ran hierarchically", backend, before, exp, "hier")
    dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32",), slow=("bfloat16",)))
def test_across_processes_every_op_runs_hierarchically(dtype):
    world = H.World(N, pg_timeout=30.0, name="hier-xp")
    try:
        H.check_reports(world.run(_xp_collectives, dtype, timeout=120))
    finally:
        world.close(timeout=30)
    assert not world.leaks, world.leaks


def _xp_die_or_allreduce(ctx):
    torch, dist = ctx.torch, ctx.dist
    group, _, cuda = _xp_group(ctx)
    t = torch.ones(3 * HALF, device=cuda)
    dist.all_reduce(t, group=group)  # every level's communicator is made and used
    if ctx.rank == 3:
        os._exit(1)
    return H.timed_allreduce(ctx, t, group)


def test_across_processes_a_rank_that_exits_mid_op_fails_every_other_rank():
    """Rank 3 (GPU 1, not its leader) exits: its GPU's leader, rank 2, names it (its pid)
    within GPU 1; rank 2's abort reaches GPU 0's leader between the leaders, and rank 0's
    reaches rank 1: every survivor fails well within the group's 30 s timeout, and nothing
    is left in /dev/shm."""
    world = H.World(N, pg_timeout=30.0, name="hier-xp-dead")
    pid3 = world.pids[3]
    try:
        outcomes = world.run_outcomes(_xp_die_or_allreduce, expect_exit=True, timeout=60)
    finally:
        world.close(timeout=30, graceful=True)
    assert outcomes[3].exitcode == 1, outcomes[3].describe()
    for r in range(3):
        assert outcomes[r].ok, outcomes[r].describe()
        message, took = outcomes[r].value
        assert message != "no error", f"rank {r}: the allreduce returned without rank 3"
        # Note [Timing bounds in tests] in tests/cpp/timing.h
        assert took < H.early_bound(30.0), (
            f"rank {r} failed after {took:.1f} s (group timeout 30 s)")
    message = outcomes[2].value[0]
    assert f"(pid {pid3})" in message and "exited" in message, message
    assert "GPU 1 (ranks 2, 3 as its local ranks 0, 1)" in message, message
    assert not world.leaks, world.leaks


# ---- The scratch arena (Note [Hierarchical scratch arena] in multi_gpu.h) ----
ARENA = 3 * 4096  # BRAID_CUDA_SCRATCH_BYTES for these cases


def _run_counted(body, device_of=lambda r: r % 2):
    """_run_ranks with braid's device calls counted (braid_sim.faults_install: the
    simulated tensors' memory is not counted) and a small arena."""
    import braid_sim

    os.environ["BRAID_CUDA_SCRATCH_BYTES"] = str(ARENA)
    braid_sim.install(2)
    braid_sim.faults_install()
    try:
        _run_ranks(body, device_of=device_of)
    finally:
        del os.environ["BRAID_CUDA_SCRATCH_BYTES"]


def _device_memory_calls():
    import braid_sim
    return {c: braid_sim.device_calls(c)
            for c in ("deviceAlloc", "deviceFree", "deviceAllocShareable")}


def test_no_device_allocation_after_the_communicator_is_created():
    """Interleaved layout (ranks 0, 2 on cuda:0): reduce to a non-leader root, allgather and
    reduce_scatter all use scratch. Once the first op has created the communicators, ops of
    growing size (reduce up to 4x the arena, in chunks) make no deviceAlloc or deviceFree
    at all, and their results match the closed forms."""
    import torch
    import torch.distributed as dist

    barrier = threading.Barrier(N, timeout=20)
    counts = {}

    def body(r, pg, cuda):
        t = torch.ones(3, device=cuda)
        pg.allreduce([t]).wait()
        assert pg._cuda_executor().startswith("hier: 4 ranks on 2 GPUs"), pg._cuda_executor()
        barrier.wait()
        if r == 0:
            counts["before"] = _device_memory_calls()
        barrier.wait()
        dtype = torch.float32
        for count in (1, 100, 700, ARENA // 4 + 5, ARENA + 3):
            inputs = [_value(torch, q, count, dtype) for q in range(N)]
            t = inputs[r].to(cuda)
            ropts = dist.ReduceOptions()
            ropts.rootRank = 2  # on cuda:0, not its leader: scratch on both GPUs
            pg.reduce([t], ropts).wait()
            if r == 2:
                assert torch.equal(t.cpu(), sum(inputs)), ("reduce", count)
            if N * count * 4 <= ARENA:
                out = torch.full((N * count,), -1.0, device=cuda)
                pg._allgather_base(out, inputs[r].to(cuda)).wait()
                assert torch.equal(out.cpu(), torch.cat(inputs)), ("allgather", count)
            if 2 * N * count * 4 <= ARENA:
                full = [_value(torch, q, N * count, dtype) for q in range(N)]
                got = torch.full((count,), -1.0, device=cuda)
                pg._reduce_scatter_base(got, full[r].to(cuda)).wait()
                assert torch.equal(got.cpu(), sum(full)[r * count:(r + 1) * count]), count
        barrier.wait()
        if r == 0:
            counts["after"] = _device_memory_calls()
        barrier.wait()

    _run_counted(body)
    assert counts["after"] == counts["before"], counts


def test_an_allgather_larger_than_the_arena_fails_naming_the_bytes():
    """Interleaved layout: the leaders stage all n blocks; past the arena the op fails
    with the op, the rank, the bytes needed and reserved, and the setting."""
    import torch

    count = ARENA // 4  # N * count * 4 bytes needed at the leaders: 4x the arena
    errors = {}

    barrier = threading.Barrier(N, timeout=20)

    def body(r, pg, cuda):
        # Done on every rank before any fails (the group's failure aborts what is in flight).
        pg.allreduce([torch.ones(3, device=cuda)]).wait(datetime.timedelta(seconds=20))
        barrier.wait()
        out = torch.empty(N * count, device=cuda)
        try:
            # wait(timeout) blocks the host until the op completes or fails.
            pg._allgather_base(out, torch.ones(count, device=cuda)).wait(
                datetime.timedelta(seconds=20))
        except Exception as e:  # noqa: BLE001 - checked below
            errors[r] = str(e)

    _run_counted(body)
    # Every rank fails; the leader that reaches its scratch first names the bytes, and the
    # others may see only the group's abort that follows.
    assert sorted(errors) == list(range(N)), errors
    named = {r: e for r, e in errors.items() if "allgather: gathering within" in e}
    assert named and set(named) <= {0, 1}, errors  # cuda:0's and cuda:1's leaders
    for r, e in named.items():
        assert f"(rank {r})" in e, errors
        assert f"needs {N * count * 4} bytes" in e and f"has {ARENA}" in e, errors
        assert "BRAID_CUDA_SCRATCH_BYTES" in e, errors

"""Ranks that share one GPU, across processes, on braid's simulated device.

Every rank installs a simulated device with one GPU, so all ranks share it and the
group runs braid's same-GPU collectives (Note [Same-GPU collectives] in
csrc/cuda/shared_gpu/same_gpu.h): each rank's device buffer and event are opened by every other
process (memfds through /proc, Note [Simulated IPC]), the barriers order the ranks'
streams through interprocess events, and the reductions read the peers' memory
directly. Results are checked against the harness's closed forms, with the buffer made
small so that ops run in several chunks. A rank that exits mid-op makes the others
fail within the timeout, naming it, and nothing is left in /dev/shm.
"""

import contextlib
import os

import pytest

import cuda_counts as C
import harness as H

pytestmark = [pytest.mark.braid_only, H.simulated_cuda_only()]

HALF = 4096  # BRAID_CUDA_SAME_GPU_BYTES / 2 in these groups: several chunks per op


def _group(ctx):
    """A new group whose CUDA ops run the same-GPU collectives (the setting is read
    when the group's communicator is made)."""
    import braid_sim

    braid_sim.install(1)
    with _env("BRAID_CUDA_SAME_GPU_BYTES", str(2 * HALF)):
        group = ctx.dist.new_group(list(range(ctx.size)))
        t = ctx.torch.zeros(1, device="cuda:0")
        ctx.dist.all_reduce(t, group=group)
    backend = group._get_backend(ctx.torch.device("cuda", 0)) if ctx.torch2 else group
    return group, backend._cuda_executor()


@contextlib.contextmanager
def _env(name, value):
    """`name` set to `value` while the group is made, then as it was: the worlds are pooled,
    and a setting left behind would reach the next test's groups."""
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved


def _collectives(ctx, dtype_name, counts):
    torch, dist = ctx.torch, ctx.dist
    group, executor = _group(ctx)
    ch = H.Checker(ctx)
    ch.true("the group runs the same-GPU collectives", executor.startswith("same-gpu"), executor)
    dtype = getattr(torch, dtype_name)
    n, r = ctx.size, ctx.rank
    cuda = torch.device("cuda", 0)
    backend = C.backend(ctx, cuda, group)
    ops = ["SUM", "MAX", "MIN"] + (["AVG", "PREMUL_SUM"] if dtype.is_floating_point else [])
    for count in counts:
        # Every op on the same-GPU executor, none staged: b bytes per block.
        b = count * torch.empty(0, dtype=dtype).element_size()
        exp, before = C.Expected(), C.snapshot(backend)
        for op in ops:
            base = "SUM" if op in ("AVG", "PREMUL_SUM") else op
            inputs = [H.make_input(q, count, dtype, base) for q in range(n)]
            t = inputs[r].to(cuda)
            dist.all_reduce(t, op=H.reduce_op(op), group=group)
            exp.nccl(b)
            ch.reduced(f"all_reduce {dtype_name} {op} count={count}", t.cpu(),
                       H.closed_form(inputs, op, n), op)
        for root in (0, n - 1):
            t = H.pattern(r, 0, count, dtype).to(cuda)
            dist.broadcast(t, src=root, group=group)
            exp.nccl(b)
            ch.equal(f"broadcast root={root} count={count}", t.cpu(), H.pattern(root, 0, count, dtype))
        inputs = [H.make_input(q, count, dtype, "SUM", salt=3) for q in range(n)]
        t = inputs[r].to(cuda)
        dist.reduce(t, dst=n - 1, group=group)
        exp.nccl(b)
        if r == n - 1:
            ch.equal(f"reduce count={count}", t.cpu(), H.closed_form(inputs, "SUM", n))
        flat = torch.empty(n * count, dtype=dtype, device=cuda)
        gather = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
        scatter = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
        gather(flat, H.pattern(r, 1, count, dtype).to(cuda), group=group)
        exp.nccl(n * b)
        ch.equal(f"all_gather_into_tensor count={count}", flat.cpu(),
                 torch.cat([H.pattern(q, 1, count, dtype) for q in range(n)]))
        full = [H.make_input(q, n * count, dtype, "SUM", salt=5) for q in range(n)]
        out = torch.empty(count, dtype=dtype, device=cuda)
        scatter(out, full[r].to(cuda), group=group)
        exp.nccl(n * b)
        ch.equal(f"reduce_scatter_tensor count={count}", out.cpu(),
                 H.closed_form(full, "SUM", n)[r * count:(r + 1) * count])
        C.check(ch, f"{dtype_name} count={count}", backend, before, exp, "same-gpu")
    dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "bfloat16", "int64"),
                                           slow=("float64", "float16", "int32", "uint8")))
@pytest.mark.parametrize("world", [pytest.param((n, "cuda1"), id=f"n{n}") for n in (2, 3, 4)],
                         indirect=True)
def test_collectives(world, dtype):
    H.check_reports(world.run(_collectives, dtype, (0, 1, 1023, 5 * HALF + 3)))


def _gather_scatter_alltoall(ctx, dtype_name, counts):
    """gather, scatter and all_to_all_single (no split sizes) through the same-GPU
    executor (Note [Same-GPU gather, scatter and alltoall] in csrc/cuda/shared_gpu/same_gpu.cc):
    its op counter moves by one per op and its byte counter by the ops' buffers, and the
    staged executor's by nothing; the uneven all_to_all_single that follows is staged (and
    counted there) and still comes out right beside them."""
    torch, dist = ctx.torch, ctx.dist
    group, executor = _group(ctx)
    backend = group._get_backend(torch.device("cuda", 0)) if ctx.torch2 else group
    ch = H.Checker(ctx)
    ch.true("the group runs the same-GPU collectives", executor.startswith("same-gpu"), executor)
    dtype = getattr(torch, dtype_name)
    n, r = ctx.size, ctx.rank
    cuda = torch.device("cuda", 0)
    for count in counts:
        b = count * torch.empty(0, dtype=dtype).element_size()
        exp, before = C.Expected(), C.snapshot(backend)
        # all_to_all_single: block q of rank r's input goes to rank q
        inp = torch.cat([H.pattern(r, 10 + q, count, dtype) for q in range(n)]).to(cuda)
        out = torch.empty(n * count, dtype=dtype, device=cuda)
        dist.all_to_all_single(out, inp, group=group)
        ch.equal(f"all_to_all_single count={count}", out.cpu(),
                 torch.cat([H.pattern(q, 10 + r, count, dtype) for q in range(n)]))
        # rows of two columns: the blocks are rows
        inp2 = inp.view(n * count, 1).expand(n * count, 2).contiguous()
        out2 = torch.empty_like(inp2)
        dist.all_to_all_single(out2, inp2, group=group)
        ch.equal(f"all_to_all_single 2-D count={count}", out2.cpu(),
                 out.cpu().view(n * count, 1).expand(n * count, 2).contiguous())
        exp.nccl(n * b).nccl(n * 2 * b)  # the 1-D and the 2-D one: n blocks each
        for root in sorted({0, n - 1}):
            t = H.pattern(r, 20 + root, count, dtype).to(cuda)
            gathered = ([torch.full((count,), 0, dtype=dtype, device=cuda) for _ in range(n)]
                        if r == root else None)
            dist.gather(t, gathered, dst=root, group=group)
            exp.nccl(n * b if r == root else b)  # the root's n outputs, else the input
            if r == root:
                for q in range(n):
                    ch.equal(f"gather root={root} count={count} from {q}", gathered[q].cpu(),
                             H.pattern(q, 20 + root, count, dtype))
            pieces = ([H.pattern(root, 30 + q, count, dtype).to(cuda) for q in range(n)]
                      if r == root else None)
            got = torch.zeros(count, dtype=dtype, device=cuda)
            dist.scatter(got, pieces, src=root, group=group)
            exp.nccl(n * b if r == root else b)
            ch.equal(f"scatter root={root} count={count}", got.cpu(),
                     H.pattern(root, 30 + r, count, dtype))
        C.check(ch, f"count={count}: every op on the same-GPU executor", backend, before, exp,
                "same-gpu")
    # Uneven splits stay on the staged path: rank r sends q + 1 elements to rank q.
    before = C.snapshot(backend)
    recv = [r + 1] * n
    send = [q + 1 for q in range(n)]
    inp = torch.cat([H.pattern(r, 40 + q, q + 1, dtype) for q in range(n)]).to(cuda)
    out = torch.empty(n * (r + 1), dtype=dtype, device=cuda)
    dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send, group=group)
    ch.equal("all_to_all_single uneven", out.cpu(),
             torch.cat([H.pattern(q, 40 + r, r + 1, dtype) for q in range(n)]))
    es = torch.empty(0, dtype=dtype).element_size()
    C.check(ch, "the uneven all_to_all_single was staged", backend, before,
            C.Expected().staged(d2h=n * (n + 1) // 2 * es, h2d=n * (r + 1) * es), "same-gpu")
    dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "int64"), slow=("bfloat16", "uint8")))
@pytest.mark.parametrize("world", [pytest.param((n, "cuda1"), id=f"n{n}") for n in (2, 3, 4)],
                         indirect=True)
def test_gather_scatter_alltoall(world, dtype):
    H.check_reports(world.run(_gather_scatter_alltoall, dtype, (0, 1, 1023, 5 * HALF + 3)))


def _die_or_allreduce(ctx, count):
    torch, dist = ctx.torch, ctx.dist
    group, _ = _group(ctx)
    t = torch.ones(count, device="cuda:0")
    dist.all_reduce(t, group=group)  # every rank has opened every peer's memory
    if ctx.rank == 1:
        os._exit(1)
    return H.timed_allreduce(ctx, t, group)


# 3 halves: the chunked path; 7 elements: one barrier and one kernel (Note
# [Same-GPU small messages]).
@pytest.mark.parametrize("count", [3 * HALF, 7], ids=["chunked", "small"])
def test_a_rank_that_exits_mid_op_is_named_and_nothing_leaks(count):
    world = H.World(2, pg_timeout=30.0, name="same-gpu-dead")
    pid1 = world.pids[1]
    try:
        outcomes = world.run_outcomes(_die_or_allreduce, count, expect_exit=True, timeout=60)
    finally:
        world.close(timeout=30, graceful=True)
    assert outcomes[1].exitcode == 1, outcomes[1].describe()
    assert outcomes[0].ok, outcomes[0].describe()
    message, took = outcomes[0].value
    assert message != "no error", "an allreduce with a dead peer returned normally"
    assert f"rank 1 (pid {pid1})" in message and "exited" in message, message
    # Note [Timing bounds in tests] in tests/cpp/timing.h
    assert took < H.early_bound(30.0), (
        f"the dead rank was noticed after {took:.1f} s (group timeout 30 s)")
    assert not world.leaks, world.leaks


SMALL = 1024  # BRAID_CUDA_SAME_GPU_SMALL_BYTES in these groups (a half is 4 KiB)


def _small_group(ctx, small):
    with _env("BRAID_CUDA_SAME_GPU_SMALL_BYTES", str(small)):
        return _group(ctx)


def _small_messages(ctx, dtype_name):
    """Every reduce op of all_reduce, and reduce, at counts 0, 1, odd, and just below,
    at and just above the small-message threshold (Note [Same-GPU small messages] in
    csrc/cuda/shared_gpu/same_gpu.h: one barrier and one kernel at or below it, the chunked path
    above it), against closed forms."""
    torch, dist = ctx.torch, ctx.dist
    group, executor = _small_group(ctx, SMALL)
    ch = H.Checker(ctx)
    ch.true("the group runs the same-GPU collectives", executor.startswith("same-gpu"), executor)
    dtype = getattr(torch, dtype_name)
    n, r = ctx.size, ctx.rank
    cuda = torch.device("cuda", 0)
    at = SMALL // torch.empty(0, dtype=dtype).element_size()
    ops = ["SUM", "PRODUCT", "MIN", "MAX"] + (["AVG", "PREMUL_SUM"] if dtype.is_floating_point
                                              else [])
    backend = C.backend(ctx, cuda, group)
    for count in (0, 1, 7, at - 1, at, at + 1):
        before = C.snapshot(backend)
        for op in ops:
            base = "SUM" if op in ("AVG", "PREMUL_SUM") else op
            inputs = [H.make_input(q, count, dtype, base, salt=7) for q in range(n)]
            t = inputs[r].to(cuda)
            dist.all_reduce(t, op=H.reduce_op(op), group=group)
            ch.reduced(f"all_reduce {dtype_name} {op} count={count}", t.cpu(),
                       H.closed_form(inputs, op, n), op)
        inputs = [H.make_input(q, count, dtype, "MAX", salt=8) for q in range(n)]
        t = inputs[r].to(cuda)
        dist.reduce(t, dst=n - 1, op=dist.ReduceOp.MAX, group=group)
        if r == n - 1:
            ch.equal(f"reduce MAX count={count}", t.cpu(), H.closed_form(inputs, "MAX", n))
        # len(ops) all_reduces and a reduce, each of count elements, none staged.
        C.check(ch, f"{dtype_name} count={count}", backend, before,
                C.Expected().nccl(count * t.element_size(), ops=len(ops) + 1), "same-gpu")
    dist.destroy_process_group(group)
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float16", "bfloat16", "int32"),
                                           slow=("float32", "float64", "int8", "uint8", "int64")))
@pytest.mark.parametrize("world", [pytest.param((n, "cuda1"), id=f"n{n}") for n in (2, 3, 4)],
                         indirect=True)
def test_small_messages(world, dtype):
    H.check_reports(world.run(_small_messages, dtype))


def _disagree_on_small(ctx):
    try:
        _small_group(ctx, 512 if ctx.rank == 0 else 2048)
        return "no error"
    except RuntimeError as e:
        return str(e)


def test_ranks_that_disagree_on_the_small_threshold_fail_naming_both():
    world = H.World(2, pg_timeout=30.0, name="same-gpu-small-disagree")
    try:
        outcomes = world.run_outcomes(_disagree_on_small, expect_errors=True, timeout=60)
    finally:
        world.close(timeout=30)
    for r, other, mine, theirs in ((0, 1, 512, 2048), (1, 0, 2048, 512)):
        assert outcomes[r].ok, outcomes[r].describe()
        message = outcomes[r].value
        assert "BRAID_CUDA_SAME_GPU_SMALL_BYTES" in message, message
        assert f"({r}) runs with {mine}, rank {other} with {theirs}" in message, message


def _killed_mid_op(ctx, count):
    """Rank 1 holds its stream back (a slow kernel), enqueues an allreduce (its barrier
    published on the host, its event record still pending on the stream) and is SIGKILLed:
    the record never runs. Rank 0's allreduce must raise, and its device synchronize
    return, on a worker so that a hang is an answer, not a stuck test."""
    import signal
    import threading
    import time

    import braid_sim

    torch, dist = ctx.torch, ctx.dist
    group, _ = _group(ctx)
    t = torch.ones(count, device="cuda:0")
    if ctx.rank == 1:
        braid_sim.delay_current_stream(0, 60_000_000)  # every task from now on: 60 s first
        t.add_(1)
        dist.all_reduce(t, group=group, async_op=True)
        time.sleep(2.0)
        os.kill(os.getpid(), signal.SIGKILL)
    out = {}

    def survivor():
        out["op"] = H.timed_allreduce(ctx, t, group)
        t0 = time.monotonic()
        try:
            braid_sim.synchronize(0)
            out["sync"] = ("returned", time.monotonic() - t0)
        except RuntimeError as e:
            out["sync"] = (f"raised: {e}", time.monotonic() - t0)

    w = threading.Thread(target=survivor, daemon=True)
    w.start()
    w.join(45.0)
    return out.get("op", ("hung: the allreduce did not end in 45 s", None)), \
        out.get("sync", ("hung: the device synchronize did not end", None))


# Note [A stream never waits on a dead peer] in csrc/cuda/shared_gpu/same_gpu.h; the
# simulated device's waits end only by the record (Note [Simulated IPC]), as on a GPU.
def test_a_peer_killed_before_its_record_ran_leaves_no_stream_waiting():
    world = H.World(2, pg_timeout=20.0, name="same-gpu-killed")
    pid1 = world.pids[1]
    try:
        outcomes = world.run_outcomes(_killed_mid_op, 7, expect_exit=True, timeout=90)
    finally:
        world.close(timeout=30, graceful=True)
    assert outcomes[1].exitcode == -9, outcomes[1].describe()
    assert outcomes[0].ok, outcomes[0].describe()
    (message, took), (sync, _) = outcomes[0].value
    assert not message.startswith("hung"), message
    assert message != "no error", "an allreduce with a killed peer returned normally"
    assert f"rank 1 (pid {pid1})" in message and "exited" in message, message
    # Note [Timing bounds in tests] in tests/cpp/timing.h
    assert took < H.early_bound(20.0), f"the killed rank was noticed after {took:.1f} s"
    assert not sync.startswith("hung"), sync

"""Process-group lifecycle: init methods, torchrun, re-init, and what destroy leaves.

Each case spawns its own world (init=False: the test's function does the init),
because what is tested is the process lifecycle itself. World.close() checks
that every rank exits with code 0 and that no braid shm entry is left.
"""

import gc
import os
import socket
import subprocess
import sys
import time

import pytest

import harness as H


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _collectives_ok(ctx, group=None):
    """A few collectives on the default group; True when all are right."""
    torch, dist = ctx.torch, ctx.dist
    n = ctx.size
    t = torch.full((100,), float(ctx.rank + 1))
    dist.all_reduce(t, group=group)
    b = torch.arange(7) * (ctx.rank == 0)
    dist.broadcast(b, 0, group=group)
    dist.barrier(group=group)
    return bool(torch.equal(t, torch.full((100,), n * (n + 1) / 2))
                and torch.equal(b, torch.arange(7)))


def _init_with(ctx, method, where):
    dist = ctx.dist
    kwargs = dict(rank=ctx.rank, world_size=ctx.size, timeout=ctx.timeout)
    if method == "env":
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(where),
                          RANK=str(ctx.rank), WORLD_SIZE=str(ctx.size))
        dist.init_process_group(ctx.backend, init_method="env://", timeout=ctx.timeout)
    elif method == "tcp":
        dist.init_process_group(ctx.backend, init_method=f"tcp://127.0.0.1:{where}", **kwargs)
    elif method == "file":
        dist.init_process_group(ctx.backend, init_method=f"file://{where}", **kwargs)
    elif method == "store":
        dist.init_process_group(ctx.backend, store=ctx.store(where), **kwargs)
    else:  # a device:backend string (torch 2.x)
        dist.init_process_group(method, store=ctx.store(where), **kwargs)


def _init_method_case(ctx, method, where):
    _init_with(ctx, method, where)
    ok = _collectives_ok(ctx)
    name = ctx.dist.get_backend()
    ctx.dist.destroy_process_group()
    return ok, name


def _closed_cleanly(world):
    codes = world.close()
    assert not world.exit_errors, world.exit_errors
    assert all(c == 0 for c in codes.values()), f"exit codes: {codes}"
    assert not world.leaks, f"/dev/shm entries left: {world.leaks}"


@pytest.mark.parametrize("method", ["env", "tcp", "file"])
def test_init_method(method, tmp_path):
    where = str(tmp_path / "filestore") if method == "file" else free_port()
    world = H.World(2, init=False, name=f"init-{method}")
    try:
        results = world.run(_init_method_case, method, where)
    finally:
        _closed_cleanly(world)
    for r, (ok, name) in enumerate(results):
        assert ok, f"rank {r}: wrong collective results after {method}:// init"
        assert name == H.BACKEND, f"rank {r}: get_backend() is {name!r}"


def _reinit(ctx, rounds):
    """destroy_process_group() then init_process_group() again, in the same process."""
    results = []
    for i in range(rounds):
        _init_with(ctx, "store", f"reinit{i}")
        sub = ctx.dist.new_group([0, 1], backend=ctx.backend, timeout=ctx.timeout)
        results.append(_collectives_ok(ctx) and _collectives_ok(ctx, sub))
        ctx.dist.destroy_process_group()
        results.append(not ctx.dist.is_initialized())
    return results


def test_destroy_then_init_again():
    world = H.World(2, init=False, name="reinit")
    try:
        results = world.run(_reinit, 3)
    finally:
        _closed_cleanly(world)
    for r, res in enumerate(results):
        assert all(res), f"rank {r}: per-round [collectives ok, destroyed]: {res}"


def _threads_after_destroy(ctx):
    """Python threads and braid's own threads, before init and after destroy."""
    import threading

    torch = ctx.torch
    torch.ones(1 << 16).sum()  # start torch's own lazily-created threads first
    before = (threading.active_count(), H.braid_threads())
    _init_with(ctx, "store", "threads")
    sub = ctx.dist.new_group(list(range(ctx.size)), backend=ctx.backend, timeout=ctx.timeout)
    ok = _collectives_ok(ctx) and _collectives_ok(ctx, sub)
    during = H.braid_threads()
    t = torch.ones(4)
    w = ctx.dist.all_reduce(t, async_op=True)
    w.wait()
    ok = ok and torch.equal(t, torch.full((4,), float(ctx.size)))  # the async result, read
    del sub, w
    ctx.dist.destroy_process_group()
    gc.collect()
    deadline = time.monotonic() + 5.0  # threads may take a moment to be joined
    while H.braid_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    after = (threading.active_count(), H.braid_threads())
    mine = [n for n in H.shm_entries() if f".{os.getpid()}." in n]
    return ok, before, during, after, mine


def test_destroy_leaves_no_threads():
    world = H.World(2, init=False, name="threads")
    try:
        results = world.run(_threads_after_destroy)
    finally:
        _closed_cleanly(world)
    for r, (ok, before, during, after, segments) in enumerate(results):
        assert ok, f"rank {r}: wrong collective results"
        if H.BACKEND == "braid":
            # Two groups (default and sub) each run a worker: the count is
            # only meaningful if braid's threads are visible while they live.
            assert during.count("braid-worker") >= 2, f"rank {r}: braid threads {during}"
        assert after == before, (f"rank {r}: (python threads, braid threads) before init "
                                 f"{before}, after destroy {after}")
        assert not segments, f"rank {r}: shm entries after destroy: {segments}"


def _threads_after_destroying_held_groups(ctx):
    """destroy_process_group while the script still holds both groups (as DDP's reducer may)."""
    _init_with(ctx, "store", "held")
    held = [ctx.dist.new_group(list(range(ctx.size)), backend=ctx.backend, timeout=ctx.timeout),
            ctx.dist.group.WORLD]
    ok = _collectives_ok(ctx) and _collectives_ok(ctx, held[0])
    during = H.braid_threads()
    ctx.dist.destroy_process_group()
    deadline = time.monotonic() + 5.0
    while H.braid_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    after = H.braid_threads()
    del held
    return ok, during, after


def test_destroy_ends_the_threads_of_groups_still_held():
    """torch 1.13 and 2.6 only drop their references on destroy (2.8+ call shutdown()):
    torch_braid's destroy_process_group shuts braid's groups down on every torch."""
    world = H.World(2, init=False, name="held")
    try:
        results = world.run(_threads_after_destroying_held_groups)
    finally:
        _closed_cleanly(world)
    for r, (ok, during, after) in enumerate(results):
        assert ok, f"rank {r}: wrong collective results"
        if H.BACKEND == "braid":
            assert during.count("braid-worker") >= 2, f"rank {r}: braid threads {during}"
        assert not after, f"rank {r}: threads left after destroy: {after}"


def _destroy_with_work_in_flight(ctx, rounds):
    """Async collectives on temporaries whose Works are dropped, then destroy at once.

    The backend's thread may then drop the last reference to a tensor that has
    a Python object (freeing it needs the GIL) while the main thread, holding
    the GIL, tears the group down and waits for that thread: a deadlock unless
    the teardown releases the GIL.
    """
    torch, dist = ctx.torch, ctx.dist
    results = []
    for i in range(rounds):
        _init_with(ctx, "store", f"inflight{i}")
        # One kept and read before the dropped ones go in: the group worked this round.
        kept = torch.full((1 << 10,), float(ctx.rank + 1 + i))
        dist.all_reduce(kept, async_op=True).wait()
        results.append(kept.eq(sum(r + 1 + i for r in range(ctx.size))).all().item())
        for _ in range(16):
            dist.all_reduce(torch.full((1 << 16,), 1.0), async_op=True)
        dist.destroy_process_group()
    return results


def test_destroy_with_dropped_async_work():
    world = H.World(2, init=False, name="inflight")
    try:
        results = world.run(_destroy_with_work_in_flight, 10, timeout=30)
    finally:
        _closed_cleanly(world)
    for r, res in enumerate(results):
        assert res == [True] * 10, f"rank {r}: per round, the kept allreduce right: {res}"


@pytest.mark.parametrize("use_libuv", [None, "0"], ids=["USE_LIBUV-unset", "USE_LIBUV=0"])
def test_torchrun(tmp_path, use_libuv):
    """tools/torchrun.py on any torch, with USE_LIBUV unset (as on a machine where nobody set
    it) or set to 0 beforehand (as tools/torch2_root.sh does). The workers must find 0 where
    this torch has no libuv (Note [torchrun without libuv] in tools/torchrun.py), what was set
    otherwise. USE_LIBUV=0 on torch 1.13, which has no libuv option, once made torchrun's
    agent fail (TypeError: use_libuv)."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "torchrun_allreduce.py")
    extra = {} if use_libuv is None else {"USE_LIBUV": use_libuv}
    env = H.torchrun_env(BRAID_TEST_BACKEND=H.BACKEND, BRAID_TORCHRUN_OUT=str(tmp_path), **extra)
    want = "0" if use_libuv == "0" or H.torch_lacks_libuv() else "-"
    before = H.shm_entries()
    # Per-rank --redirects/--tee maps: torch 1.13's parser turns the plain values
    # 0 and 3 into None under Python 3.11 (IntFlag iteration changed) and fails.
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "torchrun.py"),  # see tools/torchrun.py
           "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           "--redirects=0:2,1:2", "--tee=0:2,1:2", f"--log_dir={tmp_path / 'logs'}", script]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240,
                              cwd=str(tmp_path))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in 240 s:\n{e.stdout}\n{e.stderr}")
    out = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, f"torchrun exit code {proc.returncode}:\n{out}"
    for r in range(2):
        result = tmp_path / f"rank{r}"
        assert result.exists(), out
        got = result.read_text()
        assert got == f"ok {r} of 2, USE_LIBUV={want}", f"rank {r} wrote {got!r}:\n{out}"
    leaked = H.orphaned_segments(before)
    assert not leaked, f"/dev/shm entries of exited processes: {leaked}"


@pytest.mark.parametrize("spec", ["cpu:{b}", "cpu:{b},cuda:nccl"])
def test_device_backend_string(spec, require_torch2):
    import torch
    import torch.distributed as dist

    if "nccl" in spec and not (dist.is_nccl_available() and torch.cuda.is_available()):
        pytest.skip("no NCCL or no GPU (ProcessGroupNCCL refuses to start without one)")
    world = H.World(2, init=False, name="devstr")
    try:
        results = world.run(_init_method_case, spec.format(b=H.BACKEND), "devstr")
    finally:
        _closed_cleanly(world)
    for r, (ok, _) in enumerate(results):
        assert ok, f"rank {r}: wrong collective results after init_process_group({spec!r})"

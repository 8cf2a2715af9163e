"""Concurrency: more ranks than cores, several groups at once, waits from other threads.

One world of 4 ranks of the backend under test (BRAID_TEST_BACKEND, default braid; spawned once,
FileStore; on a 2-core machine that is oversubscribed) runs three scenarios in turn; each test
below asserts one of them on every rank:

  oversubscribed   200 small allreduces (each with its own values) and 20 large ones (several
                   shared-memory slots, odd count) on the default group, each checked.
  two_groups       two extra groups over the same ranks, each driven by its own thread at
                   the same time (mixed sizes), each call checked; after the groups are
                   destroyed none of their threads is left.
  async_threads    async allreduces issued by one thread, waited for by another (alternately
                   Work.wait() and Work.get_future().wait()), and issued by two threads taking
                   turns, each op waited for by the thread that did not issue it.

Every result is compared exactly with its closed form: rank q's input is
x_q[i] = (i + q) % 5 - 2 + c with an integer c per call, so the sum over ranks is an exact
integer in fp32 and data crossing between calls or groups changes it.

Timeouts: the group timeout is PG_TIMEOUT (a stuck collective raises), and the whole world has a
hard deadline (DEADLINE) after which its processes are killed and the tests fail with the
scenario each rank was in. Speed is measured by benchmarks/concurrency.py, not here.
"""

import ctypes
import datetime
import os
import queue
import re
import signal
import sys
import tempfile
import threading
import time
import traceback

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORLD = 4
# As in the other suites: BRAID_TEST_BACKEND=gloo runs the same scenarios against gloo.
BACKEND = os.environ.get("BRAID_TEST_BACKEND", "braid")
PG_TIMEOUT = float(os.environ.get("BRAID_TEST_PG_TIMEOUT", "30"))
DEADLINE = float(os.environ.get("BRAID_TEST_CONCURRENCY_DEADLINE", "150"))
SCENARIOS = ("oversubscribed", "two_groups", "async_threads")
SMALL_OPS, LARGE_OPS = 200, 20
LARGE_COUNT = 655_361  # 2.5 MiB + 4 B of fp32: several 1 MiB slots and a ragged tail
_SEGMENT_RE = re.compile(r"^braid\.([^.]+)\.(\d+)\.")


# ---- worker side ---------------------------------------------------------------------------------
def _periodic(torch, tile, count):
    return tile.repeat(-(-count // tile.numel()))[:count].clone()


def _pattern(torch, q, count, c):
    """x_q[i] = (i + q) % 5 - 2 + c; built from one period, as the checks run on every call."""
    return _periodic(torch, torch.tensor([(i + q) % 5 - 2 + c for i in range(5)],
                                         dtype=torch.float32), count)


def _expected(torch, n, count, c):
    tile = [sum((i + q) % 5 - 2 + c for q in range(n)) for i in range(5)]
    return _periodic(torch, torch.tensor(tile, dtype=torch.float32), count)


def _check(torch, got, n, c, what):
    want = _expected(torch, n, got.numel(), c)
    if not torch.equal(got, want):
        bad = int((got != want).nonzero()[0])
        raise AssertionError(f"{what}: element {bad} of {got.numel()} is {got[bad].item():g}, "
                             f"expected {want[bad].item():g}")


def _tids():
    return {int(t) for t in os.listdir("/proc/self/task")}


def _thread_names(tids):
    names = []
    for t in sorted(tids):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                names.append(f"{t}:{f.read().strip()}")
        except OSError:
            pass  # exited meanwhile
    return names


def _run_threads(fns, timeout, what):
    """Runs each fn on its own thread, released together; re-raises the first failure."""
    start = threading.Barrier(len(fns))
    errors = []

    def body(fn):
        try:
            start.wait(timeout)
            fn()
        except BaseException:  # noqa: B902  re-raised below with its traceback
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=body, args=(fn,), daemon=True) for fn in fns]
    for th in threads:
        th.start()
    deadline = time.monotonic() + timeout
    for th in threads:
        th.join(max(deadline - time.monotonic(), 0.0))
    if any(th.is_alive() for th in threads):
        raise AssertionError(f"{what}: a thread did not finish within {timeout:.0f} s")
    if errors:
        raise AssertionError(f"{what}: a thread failed:\n{errors[0]}")


def scenario_oversubscribed(torch, dist, rank, n):
    for k in range(SMALL_OPS):
        count = 1 + (k * 37) % 1024  # 4 B .. 4 KiB, one-shot path
        c = k % 13 - 6
        t = _pattern(torch, rank, count, c)
        dist.all_reduce(t)
        _check(torch, t, n, c, f"small allreduce #{k} ({count} floats, rank {rank})")
    for k in range(LARGE_OPS):
        c = k % 7 - 3
        t = _pattern(torch, rank, LARGE_COUNT, c)
        dist.all_reduce(t)
        _check(torch, t, n, c, f"large allreduce #{k} ({LARGE_COUNT} floats, rank {rank})")


def scenario_two_groups(torch, dist, rank, n):
    timeout = datetime.timedelta(seconds=PG_TIMEOUT)
    before = _tids()
    groups = [dist.new_group(backend=BACKEND, timeout=timeout) for _ in range(2)]

    def drive(k, g):
        for it in range(40):
            count = 1000 + 7 * it if it % 4 else 300_001  # one-shot and pipelined paths
            c = 10 * k + it % 5  # different values per group: crossing data shows
            t = _pattern(torch, rank, count, c)
            dist.all_reduce(t, group=g)
            _check(torch, t, n, c, f"group {k} call #{it} ({count} floats, rank {rank})")

    _run_threads([lambda k=k, g=g: drive(k, g) for k, g in enumerate(groups)], PG_TIMEOUT + 10,
                 "two groups")
    for g in groups:
        dist.destroy_process_group(g)
    groups.clear()
    g = None
    # The groups' threads end when their last reference goes; give them a moment to be joined.
    deadline = time.monotonic() + 10
    while _tids() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _tids() - before
    if left:
        raise AssertionError(f"threads left after destroying both groups (rank {rank}): "
                             f"{_thread_names(left)}")


def scenario_async_threads(torch, dist, rank, n):
    # (1) one issuer, one waiter.
    q = queue.Queue()
    ops = 40

    def issue():
        for j in range(ops):
            count = 513 if j % 3 else 200_003
            c = j % 9 - 4
            t = _pattern(torch, rank, count, c)
            q.put((j, c, t, dist.all_reduce(t, async_op=True)))

    def wait():
        for _ in range(ops):
            j, c, t, work = q.get(timeout=PG_TIMEOUT + 10)
            if j % 2:
                value = work.get_future().wait()
                assert isinstance(value, list) and len(value) == 1 and \
                    value[0].data_ptr() == t.data_ptr(), \
                    f"op {j}: future value is not [the op's tensor]: {value!r:.200}"
            else:
                assert work.wait() is True, f"op {j}: Work.wait() did not return True"
                assert work.is_completed(), f"op {j}: not completed after wait()"
            _check(torch, t, n, c, f"async op #{j} waited by another thread (rank {rank})")

    _run_threads([issue, wait], PG_TIMEOUT + 10, "issuer + waiter")

    # (2) two threads take turns issuing (global order j); op j is waited for by the other one.
    works, bufs, consts = [None] * ops, [None] * ops, [j % 11 - 5 for j in range(ops)]
    cond, state = threading.Condition(), {"next": 0}

    def turn(j):
        with cond:
            assert cond.wait_for(lambda: state["next"] >= j, PG_TIMEOUT + 10), f"op {j} stuck"

    def finish(j, me):
        turn(j + 1)
        work = works[j]
        if j % 2:
            work.get_future().wait()
        else:
            work.wait()
        _check(torch, bufs[j], n, consts[j],
               f"op #{j} issued by thread {j % 2}, waited by thread {me} (rank {rank})")

    def body(me):
        for j in range(me, ops, 2):
            turn(j)
            with cond:
                bufs[j] = _pattern(torch, rank, 4099 if j % 4 else 70_000, consts[j])
                works[j] = dist.all_reduce(bufs[j], async_op=True)
                state["next"] = j + 1
                cond.notify_all()
            if j >= 1:
                finish(j - 1, me)
        if ops % 2 == me:
            finish(ops - 1, me)

    _run_threads([lambda me=me: body(me) for me in range(2)], PG_TIMEOUT + 10, "two issuers")


def _die_with_parent():
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _rank_main(rank, n, store_path, out):
    _die_with_parent()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.append(os.path.join(REPO, "python"))  # the in-tree build, unless one is installed
    results = {}
    try:
        import torch
        import torch.distributed as dist
        if BACKEND == "braid":
            import torch_braid

            assert torch_braid.__version__  # importing it registers "braid"

        torch.set_num_threads(1)
        timeout = datetime.timedelta(seconds=PG_TIMEOUT)
        store = dist.FileStore(store_path, n)
        store.set_timeout(timeout)
        dist.init_process_group(BACKEND, store=store, rank=rank, world_size=n, timeout=timeout)
        for name in SCENARIOS:
            out.put(("start", rank, name, time.time()))
            try:
                globals()["scenario_" + name](torch, dist, rank, n)
                results[name] = None
            except BaseException:  # noqa: B902  reported to the parent
                results[name] = traceback.format_exc()
            # Ranks leave a scenario together; after a failure anywhere the rest is skipped,
            # as the ranks may be out of step.
            store.set(f"done/{name}/{rank}", "fail" if results[name] else "ok")
            verdicts = [store.get(f"done/{name}/{r}").decode() for r in range(n)]
            if "fail" in verdicts:
                break
        dist.destroy_process_group()
    except BaseException:  # noqa: B902
        results["setup"] = traceback.format_exc()
    out.put(("done", rank, results, time.time()))


# ---- parent side ---------------------------------------------------------------------------------
def _braid_segments():
    try:
        return {x for x in os.listdir("/dev/shm") if x.startswith("braid")}
    except FileNotFoundError:
        return set()


def _ours(names, pids):
    return sorted(x for x in names
                  if not (m := _SEGMENT_RE.match(x)) or int(m.group(2)) in pids)


@pytest.fixture(scope="module")
def concurrency_world():
    """Runs every scenario once in a 4-rank world; returns {scenario: {rank: error or None}}."""
    import multiprocessing as mp

    pytest.importorskip("torch")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    shm_before = _braid_segments()
    with tempfile.TemporaryDirectory(prefix="braid-conc-test-") as tmp:
        procs = [ctx.Process(target=_rank_main, args=(r, WORLD, os.path.join(tmp, "store"), out),
                             daemon=True) for r in range(WORLD)]
        t_spawn = time.time()
        for p in procs:
            p.start()
        where, results = {r: "starting" for r in range(WORLD)}, {}
        deadline = time.monotonic() + DEADLINE
        try:
            while len(results) < WORLD:
                left = deadline - time.monotonic()
                try:
                    kind, rank, payload, when = out.get(timeout=max(min(left, 1.0), 0.01))
                except queue.Empty:
                    dead = [r for r, p in enumerate(procs) if r not in results
                            and p.exitcode is not None]
                    if dead:
                        pytest.fail(f"rank(s) {dead} exited (codes "
                                    f"{[procs[r].exitcode for r in dead]}) in {where}")
                    if left <= 0:
                        seen = "".join(f"\nrank {r} reported: {res}" for r, res in results.items())
                        pytest.fail(f"HANG: the world missed its {DEADLINE:.0f} s deadline; "
                                    f"each rank was in: {where}{seen}")
                    continue
                if rank == 0:  # shown with -s: where the time goes
                    print(f"[rank 0 {when - t_spawn:6.1f} s] {kind} "
                          f"{payload if kind == 'start' else ''}")
                if kind == "start":
                    where[rank] = payload
                else:
                    results[rank] = payload
                    where[rank] = "done"
            for p in procs:
                p.join(30)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join(5)
    pids = {p.pid for p in procs}
    leaked = _ours(_braid_segments() - shm_before, pids)
    for r, res in results.items():
        assert "setup" not in res, f"rank {r} failed outside the scenarios:\n{res['setup']}"
    assert not leaked, f"/dev/shm entries left behind by the ranks: {leaked}"
    return {name: {r: results[r].get(name, "skipped: an earlier scenario failed")
                   for r in range(WORLD)} for name in SCENARIOS}


def _assert_ok(results, name):
    errors = {r: e for r, e in results[name].items() if e}
    assert not errors, "\n".join(f"rank {r}:\n{e}" for r, e in sorted(errors.items()))


def test_oversubscribed_small_and_large_allreduce(concurrency_world):
    """4 ranks on 2 cores: 200 small + 20 large allreduces, every result exact."""
    _assert_ok(concurrency_world, "oversubscribed")


def test_two_groups_driven_from_two_threads(concurrency_world):
    """Two groups used concurrently from two threads; results exact, no thread left behind."""
    _assert_ok(concurrency_world, "two_groups")


def test_async_ops_waited_from_other_threads(concurrency_world):
    """wait() and get_future().wait() from threads that did not issue the op."""
    _assert_ok(concurrency_world, "async_threads")

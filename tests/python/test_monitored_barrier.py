"""dist.monitored_barrier on braid groups (gloo's semantics, Note [Monitored barrier]).

Passing barriers run in pooled worlds; the failing ones (ranks that never
arrive, arrive late, or wait for an absent rank 0) share one world of 4 ranks
with a short group timeout, each scenario ending with every rank in step again.
"""

import datetime
import os
import re
import time

import pytest

import harness as H


def _seconds(s):
    return datetime.timedelta(seconds=s)


def _passes(ctx):
    """Several monitored barriers (all argument forms), each followed by a collective."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    n = ctx.size
    for i, kwargs in enumerate([{}, {"timeout": _seconds(20)},
                                {"timeout": _seconds(20), "wait_all_ranks": True},
                                {"timeout": 20.0}]):
        t0 = time.monotonic()
        ch.true(f"barrier {i} returns None", dist.monitored_barrier(**kwargs) is None)
        # Note [Timing bounds in tests] in tests/cpp/timing.h (20 s: the shortest timeout here)
        ch.true(f"barrier {i} is prompt", time.monotonic() - t0 < H.early_bound(20.0),
                f"{time.monotonic() - t0:.1f} s")
        t = torch.full((3,), float(ctx.rank + i))
        dist.all_reduce(t)
        ch.equal(f"allreduce after barrier {i}", t,
                 torch.full((3,), float(sum(r + i for r in range(n)))))
    # torch's own path still serves gloo groups.
    dist.monitored_barrier(group=ctx.ref, timeout=_seconds(20))
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(1, 2, 3, 4), slow=(5, 8)), indirect=True)
def test_monitored_barrier_passes_and_group_stays_usable(world):
    H.check_reports(world.run(_passes))


def _subgroup(ctx):
    """On a braid subgroup of ranks 1.., its rank 0 (global rank 1) is the monitor."""
    dist = ctx.dist
    g = dist.new_group(list(range(1, ctx.size)), backend="braid", timeout=ctx.timeout)
    if ctx.rank != 0:
        dist.monitored_barrier(group=g, timeout=_seconds(20), wait_all_ranks=True)
    return True


@pytest.mark.braid_only
@pytest.mark.parametrize("world", [pytest.param(3, id="n3")], indirect=True)
def test_monitored_barrier_on_subgroup(world):
    assert all(world.run(_subgroup))


# -- failures ------------------------------------------------------------------------

TIMEOUT = 1.0  # the barriers' timeout in the failure scenarios
# The group's: non-zero ranks wait max(this, TIMEOUT) for rank 0. Long enough that a rank
# that must fail at once (told by rank 0) is told well within it: Note [Timing bounds in
# tests] in tests/cpp/timing.h.
PG_TIMEOUT = 4.0


def _try_barrier(ctx, **kwargs):
    """(error message or None, seconds)."""
    t0 = time.monotonic()
    try:
        ctx.dist.monitored_barrier(timeout=_seconds(TIMEOUT), **kwargs)
        return None, time.monotonic() - t0
    except RuntimeError as e:
        return str(e), time.monotonic() - t0


def _late(ctx, name, late, waited):
    """The barrier with `late` ranks arriving once every rank in `waited` has given up on
    theirs (through the store, outside the group: a fixed sleep could end first on a loaded
    machine)."""
    store = ctx.store(f"{name}/gave-up")
    if ctx.rank in late:
        store.wait([str(r) for r in waited], datetime.timedelta(seconds=60))
    result = _try_barrier(ctx, **({"wait_all_ranks": True} if name == "missing" else {}))
    if ctx.rank in waited:
        store.set(str(ctx.rank), "1")
    return result


def _scenario(ctx, name):
    if name == "missing":  # ranks 1 and 3 arrive late, after rank 0 gave up
        result = _late(ctx, name, late=(1, 3), waited=(0,))
    elif name == "missing_first":  # everyone but rank 0 late; without wait_all_ranks
        result = _late(ctx, name, late=(1, 2, 3), waited=(0,))
    elif name == "rank0_absent":  # rank 0 arrives after the others' PG_TIMEOUT
        result = _late(ctx, name, late=(0,), waited=(1, 2, 3))
    else:  # "all": a healthy barrier
        result = _try_barrier(ctx)
    t = ctx.torch.ones(4)
    ctx.dist.all_reduce(t)  # the collectives are unaffected
    return result, bool(ctx.torch.equal(t, ctx.torch.full((4,), float(ctx.size))))


@pytest.mark.braid_only
def test_monitored_barrier_failures_name_ranks_in_time():
    world = H.World(4, pg_timeout=PG_TIMEOUT, name="monitored")
    try:
        def run(name):
            out = world.run(_scenario, name, timeout=60)
            assert all(ok for _, ok in out), f"{name}: allreduce after the barrier was wrong"
            return [r for r, _ in out]

        ms = int(TIMEOUT * 1000)
        res = run("missing")
        err, took = res[0]
        assert err and re.search(rf"braid monitored_barrier \(rank 0\): Ranks 1, 3 failed to "
                                 rf"pass monitoredBarrier in {ms} ms", err), err
        # Note [Timing bounds in tests] in tests/cpp/timing.h
        late_by = H.timeout_bound(TIMEOUT)
        assert TIMEOUT - 0.05 <= took <= late_by, f"rank 0 failed after {took:.2f} s"
        err, took = res[2]  # arrived in time: told by rank 0 as soon as it gave up
        assert err and "rank 0 reported that rank 1 and 1 more failed to pass" in err, err
        assert took <= late_by, f"rank 2 failed after {took:.2f} s"
        for r in (1, 3):  # arrived late: failed at once on arrival, not after waiting
            err, took = res[r]
            assert err and "rank 0 reported that rank 1" in err, (r, err)
            assert took < H.early_bound(PG_TIMEOUT), (
                f"rank {r} failed {took:.2f} s after arriving late")
        assert "this rank arrived after rank 0 stopped waiting" in res[1][0], res[1][0]

        assert all(e is None for e, _ in run("all")), "no recovery after missing"

        res = run("missing_first")
        err, took = res[0]
        assert err and re.search(rf"\(rank 0\): Rank 1 failed to pass monitoredBarrier in {ms} ms",
                                 err), err
        assert TIMEOUT - 0.05 <= took <= late_by, f"rank 0 failed after {took:.2f} s"
        assert all(e is None for e, _ in run("all")), "no recovery after missing_first"

        res = run("rank0_absent")
        for r in (1, 2, 3):
            err, took = res[r]
            assert err and re.search(rf"\(rank {r}\): Rank {r} reached monitoredBarrier, but "
                                     rf"rank 0 did not release it within {int(PG_TIMEOUT * 1000)}"
                                     rf" ms", err), err
            assert PG_TIMEOUT - 0.05 <= took <= H.timeout_bound(PG_TIMEOUT), (
                f"rank {r}: {took:.2f} s")
        # Rank 0 came late and found every arrival: it passes; the others'
        # releases are left over, and dropped by the next barrier.
        assert res[0][0] is None, res[0][0]
        assert all(e is None for e, _ in run("all")), "no recovery after rank0_absent"
    finally:
        codes = world.close(timeout=30)
    assert codes == {r: 0 for r in range(4)}, codes
    assert not world.leaks, world.leaks


def _die_or_barrier(ctx):
    if ctx.rank == 1:
        os._exit(1)
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        ctx.dist.monitored_barrier(timeout=_seconds(20))
        return None, time.monotonic() - t0
    except RuntimeError as e:
        return str(e), time.monotonic() - t0


@pytest.mark.slow
@pytest.mark.braid_only
def test_monitored_barrier_reports_a_dead_rank_at_once():
    world = H.World(2, pg_timeout=30.0, name="monitored-dead")
    pid1 = world.pids[1]
    try:
        outcomes = world.run_outcomes(_die_or_barrier, expect_exit=True, timeout=60)
    finally:
        world.close(timeout=30, graceful=True)
    err, took = outcomes[0].value
    assert err and re.search(rf"Rank 1 failed to pass monitoredBarrier in 20000 ms.*"
                             rf"rank 1 \(pid {pid1}\) exited", err), err
    # Note [Timing bounds in tests] in tests/cpp/timing.h
    assert took < H.early_bound(20.0), (
        f"dead rank noticed after {took:.1f} s (barrier timeout 20 s)")


# -- the call's own timeout, from both entry points ----------------------------------


def _rank0_timeout(ctx):
    """torch's test_monitored_barrier_gloo_rank_0_timeout, and the timeout of both entry points.

    Only rank 0 calls: a zero timeout fails at once with gloo's words; a 1 s
    timeout, through the method on the group object (torch's test) and
    through dist.monitored_barrier, names the absent rank 1 within about 1 s,
    not the group's timeout (20 s here; 30 min by default).
    """
    dist = ctx.dist
    pg = dist.new_group(list(range(ctx.size)), backend="braid", timeout=_seconds(20))
    out = {}
    if ctx.rank == 0:
        calls = [("zero", lambda: pg.monitored_barrier(_seconds(0))),
                 ("zero_all", lambda: pg.monitored_barrier(_seconds(0), wait_all_ranks=True)),
                 ("method", lambda: pg.monitored_barrier(_seconds(1))),
                 ("function", lambda: dist.monitored_barrier(pg, timeout=_seconds(1))),
                 ("float", lambda: dist.monitored_barrier(pg, timeout=1.0))]
        for name, call in calls:
            t0 = time.monotonic()
            try:
                call()
                out[name] = (None, time.monotonic() - t0)
            except RuntimeError as e:
                out[name] = (str(e), time.monotonic() - t0)
    t = ctx.torch.ones(2)
    dist.all_reduce(t, group=pg)  # every rank waits here while rank 0 runs its barriers
    ok = bool(ctx.torch.equal(t, ctx.torch.full((2,), float(ctx.size))))
    dist.destroy_process_group(pg)
    return out, ok


@pytest.mark.braid_only
@pytest.mark.parametrize("world", [pytest.param(2, id="n2"), pytest.param(3, id="n3")],
                         indirect=True)
def test_monitored_barrier_uses_the_calls_timeout(world):
    results = world.run(_rank0_timeout, timeout=60)
    assert all(ok for _, ok in results), "allreduce after the barriers was wrong"
    out = results[0][0]
    err, took = out["zero"]
    # gloo's text (ProcessGroupGloo's checkRemainingTime), which torch's test matches.
    assert err and re.search(r"Rank 0 timed out in monitoredBarrier after 0 ms\.\n"
                             r"No ranks successfully processed in monitoredBarrier\.", err), err
    # At once, not after the group's 20 s (Note [Timing bounds in tests] in tests/cpp/timing.h).
    assert took < H.early_bound(20.0), f"a zero timeout failed after {took:.2f} s"
    err, took = out["zero_all"]
    absent = ", ".join(str(r) for r in range(1, world.n))
    assert err and f"Ranks {absent} failed to pass monitoredBarrier in 0 ms" in err, err
    assert took < H.early_bound(20.0), f"a zero timeout failed after {took:.2f} s"
    for name in ("method", "function", "float"):
        err, took = out[name]
        assert err and "Rank 1 failed to pass monitoredBarrier in 1000 ms" in err, (name, err)
        assert 0.95 <= took <= H.timeout_bound(1.0), (
            f"{name}: rank 0 failed after {took:.2f} s (timeout 1 s)")

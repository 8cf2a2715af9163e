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
        ch.true(f"barrier {i} is prompt", time.monotonic() - t0 < 10,
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
PG_TIMEOUT = 3.0  # the group's: non-zero ranks wait max(this, TIMEOUT) for rank 0


def _try_barrier(ctx, **kwargs):
    """(error message or None, seconds)."""
    t0 = time.monotonic()
    try:
        ctx.dist.monitored_barrier(timeout=_seconds(TIMEOUT), **kwargs)
        return None, time.monotonic() - t0
    except RuntimeError as e:
        return str(e), time.monotonic() - t0


def _scenario(ctx, name):
    me = ctx.rank
    if name == "missing":  # ranks 1 and 3 arrive 1.5 s late, after rank 0 gave up
        if me in (1, 3):
            time.sleep(TIMEOUT + 0.5)
        result = _try_barrier(ctx, wait_all_ranks=True)
    elif name == "missing_first":  # everyone but rank 0 late; without wait_all_ranks
        if me != 0:
            time.sleep(TIMEOUT + 0.5)
        result = _try_barrier(ctx)
    elif name == "rank0_absent":  # rank 0 arrives after the others' PG_TIMEOUT
        if me == 0:
            time.sleep(PG_TIMEOUT + 0.5)
        result = _try_barrier(ctx)
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
        assert TIMEOUT - 0.05 <= took <= TIMEOUT + 1.0, f"rank 0 failed after {took:.2f} s"
        err, took = res[2]  # arrived in time: told by rank 0 as soon as it gave up
        assert err and "rank 0 reported that rank 1 and 1 more failed to pass" in err, err
        assert took <= TIMEOUT + 1.0, f"rank 2 failed after {took:.2f} s"
        for r in (1, 3):  # arrived late: failed at once on arrival
            err, took = res[r]
            assert err and "rank 0 reported that rank 1" in err, (r, err)
            assert took < 1.0, f"rank {r} failed {took:.2f} s after arriving late"
        assert "this rank arrived after rank 0 stopped waiting" in res[1][0], res[1][0]

        assert all(e is None for e, _ in run("all")), "no recovery after missing"

        res = run("missing_first")
        err, took = res[0]
        assert err and re.search(rf"\(rank 0\): Rank 1 failed to pass monitoredBarrier in {ms} ms",
                                 err), err
        assert took <= TIMEOUT + 1.0, f"rank 0 failed after {took:.2f} s"
        assert all(e is None for e, _ in run("all")), "no recovery after missing_first"

        res = run("rank0_absent")
        for r in (1, 2, 3):
            err, took = res[r]
            assert err and re.search(rf"\(rank {r}\): Rank {r} reached monitoredBarrier, but "
                                     rf"rank 0 did not release it within {int(PG_TIMEOUT * 1000)}"
                                     rf" ms", err), err
            assert PG_TIMEOUT - 0.05 <= took <= PG_TIMEOUT + 1.0, f"rank {r}: {took:.2f} s"
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
    assert took < 5.0, f"dead rank noticed after {took:.1f} s (barrier timeout 20 s)"


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
    assert took < 1.0, f"a zero timeout failed after {took:.2f} s"
    err, took = out["zero_all"]
    absent = ", ".join(str(r) for r in range(1, world.n))
    assert err and f"Ranks {absent} failed to pass monitoredBarrier in 0 ms" in err, err
    assert took < 1.0, f"a zero timeout failed after {took:.2f} s"
    for name in ("method", "function", "float"):
        err, took = out[name]
        assert err and "Rank 1 failed to pass monitoredBarrier in 1000 ms" in err, (name, err)
        assert 0.95 <= took <= 3.0, f"{name}: rank 0 failed after {took:.2f} s (timeout 1 s)"

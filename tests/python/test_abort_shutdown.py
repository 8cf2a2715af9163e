"""abort() and shutdown() on the backend, as torch 2.x calls them.

abort() fails every pending op at once, from any thread; shutdown() lets the
ops already issued finish, then stops the group (destroy_process_group calls
it on torch 2.8+; braid binds both on every torch).
"""
import datetime
import threading

import pytest

import harness as H


def _abort_from_another_thread(ctx):
    """Rank 0 blocks in an allreduce rank 1 never joins; a thread aborts it."""
    torch, dist = ctx.torch, ctx.dist
    ctx.init_default_group("abort")
    be = ctx.backend_object()
    done = ctx.store("abort/done")  # the test's own signalling, outside the group
    outcome = None
    if ctx.rank == 0:
        timer = threading.Timer(0.5, be.abort)
        timer.start()
        outcome = H.timed_allreduce(ctx)
        timer.join()
        try:
            dist.all_reduce(torch.ones(4))  # the group is aborted: fails at once
            later = "no error"
        except RuntimeError as e:
            later = str(e)
        outcome += (later,)
        done.set("0", "1")
    else:
        # Stays in the group until rank 0 is done, so only the abort can end rank 0's op
        # (a fixed sleep could end first on a loaded machine).
        done.wait(["0"], datetime.timedelta(seconds=60))
    dist.destroy_process_group()
    return outcome


@pytest.mark.braid_only
def test_abort_fails_a_blocked_op_at_once():
    world = H.World(2, init=False, pg_timeout=30.0, name="abort")
    try:
        outcome = world.run(_abort_from_another_thread, timeout=60)[0]
    finally:
        codes = world.close(timeout=30)
    message, elapsed, later = outcome
    assert message != "no error", "the aborted allreduce returned normally"
    # Note [Timing bounds in tests] in tests/cpp/timing.h
    assert elapsed < H.early_bound(30.0), (
        f"abort took {elapsed:.1f} s to fail the op (group timeout 30 s)")
    assert "shut down" in message, message
    assert later != "no error" and "shut down" in later, later
    assert codes == {0: 0, 1: 0}, codes
    assert not world.leaks, world.leaks


def _shutdown_after_async_ops(ctx):
    """Async allreduces, then shutdown(): every one completes with the right sum."""
    torch, dist = ctx.torch, ctx.dist
    ctx.init_default_group("shutdown")
    ts = [torch.full((1000 + i,), float(ctx.rank + 1)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    ctx.backend_object().shutdown()
    for w in works:
        w.wait()
    n = ctx.size
    ok = all(torch.equal(t, torch.full_like(t, n * (n + 1) / 2)) for t in ts)
    try:
        dist.all_reduce(torch.ones(1))
        after = "no error"
    except RuntimeError as e:
        after = str(e)
    dist.destroy_process_group()
    return ok, after


@pytest.mark.braid_only
@pytest.mark.parametrize("n", [2, 3])
def test_shutdown_lets_issued_ops_finish(n):
    world = H.World(n, init=False, name=f"shutdown{n}")
    try:
        results = world.run(_shutdown_after_async_ops, timeout=60)
    finally:
        codes = world.close(timeout=30)
    for r, (ok, after) in enumerate(results):
        assert ok, f"rank {r}: an op issued before shutdown() gave a wrong result"
        assert "shut down" in after, f"rank {r}: an op after shutdown(): {after}"
    assert set(codes.values()) == {0}, codes
    assert not world.leaks, world.leaks


def _lonely_after_set_timeout(ctx):
    """set_timeout(1 s) on a 30 s group: rank 0's lonely allreduce fails after 1 s."""
    ctx.init_default_group("settimeout")
    ctx.backend_object().set_timeout(datetime.timedelta(seconds=1))
    done = ctx.store("settimeout/done")
    outcome = None
    if ctx.rank == 0:
        outcome = H.timed_allreduce(ctx)
        done.set("0", "1")
    else:
        # In the group until rank 0's op ended, so that it times out rather than sees
        # rank 1 leave.
        done.wait(["0"], datetime.timedelta(seconds=60))
    ctx.dist.destroy_process_group()
    return outcome


@pytest.mark.braid_only
def test_set_timeout_applies_to_later_ops():
    world = H.World(2, init=False, pg_timeout=30.0, name="settimeout")
    try:
        message, elapsed = world.run(_lonely_after_set_timeout, timeout=60)[0]
    finally:
        codes = world.close(timeout=30)
    assert 0.9 <= elapsed <= H.timeout_bound(1.0), f"failed after {elapsed:.2f} s, expected 1 s"
    assert "Timed out after 1000 ms" in message, message
    assert codes == {0: 0, 1: 0}, codes

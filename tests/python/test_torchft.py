"""torchft's protocol on braid: configure, abort, errored, set_timeout.

torchft (pytorch/torchft, torchft/process_group.py) wraps a backend in a
reconfigurable ProcessGroup. Its configure(store_addr, rank, world_size)
aborts the current group and builds a new one over PrefixStore(<new prefix>,
TCPStore client); abort() calls abort() on the ProcessGroup (where torch binds
it) or on its backend; errored() says whether an error requires
reconfiguring; set_timeout() changes the timeout. BraidFT below follows that
wrapper, with a braid backend built the way torchft builds gloo's (torch 2.x:
a ProcessGroup with the backend registered for CPU; torch 1.13: the backend is
the ProcessGroup).

The flow, over 3 ranks: train a few steps (allreduce sums checked); rank 2
stops answering; ranks 0 and 1 see their op fail, either by timeout
(set_timeout(1 s)) or because another thread calls abort() while they wait
(group timeout 30 s; the blocked op and two queued behind it all fail at
once); errored() reports why; every rank then reconfigures
under a new prefix (a quorum of the two survivors, or of all three with rank
2 back) and trains on with correct sums. Nothing is left: no braid threads, no
/dev/shm entries.
"""
import datetime
import threading
import time

import pytest

import harness as H

STEPS = 5


class BraidFT:
    """torchft's ProcessGroupWrapper, as it would wrap braid (see the module doc)."""

    def __init__(self, ctx, timeout):
        self.ctx = ctx
        self.timeout = timeout
        self.pg = None
        self.backend = None

    def configure(self, prefix, rank, world_size):
        import torch
        import torch.distributed as dist
        import torch_braid

        self.abort()
        store = self.ctx.store(prefix)  # PrefixStore(prefix, TCPStore client), as torchft's
        backend = torch_braid._C.ProcessGroupBraid(store, rank, world_size, self.timeout)
        if self.ctx.torch2:
            pg = dist.ProcessGroup(store, rank, world_size)
            kind = dist.ProcessGroup.BackendType.CUSTOM
            pg._set_default_backend(kind)
            pg._register_backend(torch.device("cpu"), kind, backend)
        else:
            pg = backend
        self.pg, self.backend = pg, backend

    def abort(self):
        if self.pg is None:
            return
        if hasattr(self.pg, "abort"):  # torch 2.8+ binds ProcessGroup.abort; braid's on 1.13
            self.pg.abort()
        else:
            self.backend.abort()

    def errored(self):
        return self.backend.errored() if self.backend is not None else None

    def set_timeout(self, timeout):
        self.timeout = timeout  # for the next configure, as torchft's wrapper
        self.backend.set_timeout(timeout)  # braid applies it to the current group too

    def shutdown(self):
        if self.backend is not None:
            self.backend.shutdown()
        self.pg = self.backend = None

    def allreduce_sum(self, t, async_op=False):
        import torch.distributed as dist

        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        work = self.pg.allreduce([t], opts)
        return work if async_op else work.wait()


def _train(ft, ch, rank, members, first_step, tag):
    """STEPS allreduces whose sums every rank knows: sum over members of (m+1)*(step+1)."""
    import torch
    import torch.distributed as dist

    for step in range(first_step, first_step + STEPS):
        t = torch.full((1000 + step,), float((rank + 1) * (step + 1)))
        ft.allreduce_sum(t)
        expected = sum(m + 1 for m in members) * (step + 1)
        ch.equal(f"{tag} step {step}", t, torch.full_like(t, float(expected)))
    # And one op of another kind on the same group.
    b = torch.arange(7.0) if rank == members[0] else torch.zeros(7)
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    ft.pg.broadcast([b], opts).wait()
    ch.equal(f"{tag} broadcast", b, torch.arange(7.0))


def _torchft_flow(ctx, how, quorum):
    torch = ctx.torch
    ch = H.Checker(ctx)
    rank = ctx.rank
    coord = ctx.store(f"{how}/coord")  # the test's own signalling, outside the groups
    ft = BraidFT(ctx, datetime.timedelta(seconds=30))
    ft.configure(f"{how}/q0", rank, ctx.size)
    _train(ft, ch, rank, list(range(ctx.size)), 0, "q0")
    ch.true("healthy group: errored() is None", ft.errored() is None, repr(ft.errored()))

    failure, elapsed = None, 0.0
    if rank == 2:
        # Stops answering: stays in the group (so only a timeout or abort can end
        # the others' op) until both have seen theirs fail.
        coord.wait(["failed/0", "failed/1"], datetime.timedelta(seconds=60))
    else:
        timer = None
        if how == "timeout":
            ft.set_timeout(datetime.timedelta(seconds=1))
        else:
            timer = threading.Timer(0.5, ft.abort)  # torchft's watchdog does this
            timer.start()
        t0 = time.monotonic()
        # The first op waits for rank 2; with abort, two more are queued behind it.
        works = [ft.allreduce_sum(torch.ones(8), async_op=True)
                 for _ in range(1 if how == "timeout" else 3)]
        failures = []
        for w in works:
            try:
                w.wait()
            except RuntimeError as e:
                failures.append(str(e))
        elapsed = time.monotonic() - t0
        failure = failures[0] if failures else None
        ch.true("every pending and queued op failed", len(failures) == len(works),
                f"{len(works) - len(failures)} of {len(works)} returned normally")
        if timer is not None:
            timer.join()
        err = ft.errored()
        # By the 1 s timeout (its own, or the other survivor's that gave up first), or at
        # once on abort, not at the group's 30 s: Note [Timing bounds in tests] in
        # tests/cpp/timing.h.
        if how == "timeout":
            ch.true("it failed by its timeout", elapsed <= H.timeout_bound(1.0),
                    f"after {elapsed:.1f} s")
        else:
            ch.true("it failed at once", elapsed < H.early_bound(30.0), f"after {elapsed:.1f} s")
        ch.true("errored() is an exception", isinstance(err, RuntimeError), repr(err))
        want = "Timed out" if how == "timeout" else "aborted"
        ch.true(f"errored() says {want!r}", want in str(err), str(err))
        coord.set(f"failed/{rank}", "1")

    # Reconfigure: every rank aborts its group and builds a new one.
    members = [0, 1] if quorum == "survivors" else [0, 1, 2]
    if rank in members:
        ft.configure(f"{how}/q1", members.index(rank), len(members))
        ch.true("new group: errored() is None", ft.errored() is None, repr(ft.errored()))
        _train(ft, ch, members.index(rank), list(range(len(members))), STEPS, "q1")
    ft.abort()
    ft.shutdown()
    ch.true("no braid threads left", H.braid_threads() == [], str(H.braid_threads()))
    return ch.report(), failure, elapsed


@pytest.fixture(scope="module")
def ft_world():
    """3 ranks without a default group; both cases use it in turn (fresh prefixes)."""
    world = H.World(3, init=False, pg_timeout=30.0, name="torchft")
    yield world
    codes = world.close(timeout=30)
    assert set(codes.values()) == {0}, codes
    assert not world.leaks, world.leaks


@pytest.mark.braid_only
@pytest.mark.parametrize("how,quorum", [("timeout", "survivors"), ("abort", "all")])
def test_torchft_reconfigure_after_failure(ft_world, how, quorum):
    results = ft_world.run(_torchft_flow, how, quorum, timeout=120)
    H.check_reports([r[0] for r in results])
    for rank in (0, 1):
        print(f"rank {rank}: op failed after {results[rank][2]:.2f} s: {results[rank][1]}")

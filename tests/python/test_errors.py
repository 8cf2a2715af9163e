"""Error reporting: mismatched calls, unsupported arguments, timeouts, dead peers.

Messages are braid's stable formats (issue 2). Each mismatch case then runs a
correct allreduce in the same call, to show the group still works. The cases
that only braid reports (or reports in its own words) are braid_only; gloo
runs the backend-neutral part of the rest (that an error is raised, in time).
"""

import os
import re
import time

import pytest

import harness as H

ERROR_WORLDS = [pytest.param((2, "errors"), id="n2"), pytest.param((3, "errors"), id="n3")]


def raise_outcome(value):
    """Re-raises, in the test process, the error a rank caught (message or None)."""
    if value is not None:
        raise RuntimeError(value)


def _attempt(ctx, case):
    """Runs a faulty call, then a correct one; returns (error message, recovered?)."""
    torch, dist = ctx.torch, ctx.dist
    me = ctx.rank
    try:
        if case == "shape":
            dist.all_reduce(torch.ones(3 if me == 1 else 4))
        elif case == "dtype":
            dist.all_reduce(torch.ones(4, dtype=torch.float16 if me == 1 else torch.float32))
        elif case == "op":
            if me == 1:
                dist.all_reduce(torch.ones(4))
            else:
                dist.broadcast(torch.ones(4), 0)
        elif case == "root":
            dist.broadcast(torch.ones(4), 1 if me == 1 else 0)
        elif case == "reduce_op":
            dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX if me == 1 else dist.ReduceOp.SUM)
        elif case == "complex":  # the backend directly: dist.all_reduce views complex as real
            ctx.backend_object().allreduce([torch.ones(4, dtype=torch.complex64)]).wait()
        elif case == "band_float":
            dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND)
        elif case == "sparse":  # sparse allreduce is SUM only (test_sparse_allreduce.py)
            dist.all_reduce(torch.eye(3).to_sparse(), op=dist.ReduceOp.MAX)
        elif case == "meta":  # on torch 2.x the dispatcher would reject meta first
            ctx.backend_object().allreduce([torch.empty(4, device="meta")]).wait()
        error = None
    except RuntimeError as e:
        error = str(e)
    t = torch.full((5,), float(me + 1))
    dist.all_reduce(t)
    n = ctx.size
    return error, bool(torch.equal(t, torch.full((5,), n * (n + 1) / 2)))


def _expected(case, r, n):
    """The message rank r must raise in a world of n (rank 1 is the odd one out)."""
    other = 0 if r == 1 else 1
    peer = r"\d+" if n > 2 else str(other)
    if case in ("shape", "dtype"):
        mine = "[3] (float32)" if case == "shape" and r == 1 else (
            "[4] (float16)" if case == "dtype" and r == 1 else "[4] (float32)")
        theirs = r"\[\d\] \(float\d\d\)" if n > 2 else re.escape(
            "[4] (float32)" if r == 1 else ("[3] (float32)" if case == "shape" else
                                            "[4] (float16)"))
        return (rf"braid allreduce \(rank {r}\): rank {peer} passed shape {theirs}, "
                rf"this rank shape {re.escape(mine)}")
    if case == "op":
        mine, theirs = ("allreduce", "broadcast") if r == 1 else ("broadcast", "allreduce")
        return (rf"braid {mine} \(rank {r}\): rank {peer} called {theirs} at this point "
                rf"\(op #\d+\), this rank {mine}")
    if case == "root":
        mine = 1 if r == 1 else 0
        return (rf"braid broadcast \(rank {r}\): rank {peer} passed root {1 - mine}, "
                rf"this rank root {mine}")
    if case == "reduce_op":
        mine, theirs = ("MAX", "SUM") if r == 1 else ("SUM", "MAX")
        return (rf"braid allreduce \(rank {r}\): rank {peer} passed reduce op {theirs}, "
                rf"this rank {mine}")
    return {
        "complex": rf"braid allreduce \(rank {r}\): unsupported dtype complex64",
        "band_float": rf"braid allreduce \(rank {r}\): reduce op BAND is not supported for "
                      rf"float32",
        "sparse": rf"braid allreduce \(rank {r}\): sparse tensors support only reduce op SUM",
        # torch 1.13 routes even ProcessGroup.allreduce through the c10d dispatcher,
        # which has no Meta kernel: there the tensor never reaches braid.
        "meta": rf"braid allreduce \(rank {r}\): tensors must be on the CPU or a CUDA device, got meta"
                + ("" if H.torch_major() >= 2 else
                   r"|Could not run 'c10d::allreduce_' with arguments from the '\w*Meta' "),
    }[case]


MISMATCHES = ["shape", "dtype", "op", "root", "reduce_op"]
LOCAL = ["complex", "sparse", "meta"]


@pytest.mark.braid_only
@pytest.mark.parametrize("case", MISMATCHES + LOCAL)
@pytest.mark.parametrize("world", ERROR_WORLDS, indirect=True)
def test_error_message_and_recovery(world, case):
    results = world.run(_attempt, case)
    for r, (error, recovered) in enumerate(results):
        with pytest.raises(RuntimeError, match=_expected(case, r, world.n)):
            raise_outcome(error)
        assert recovered, f"rank {r}: the allreduce after the failed {case} call was wrong"


@pytest.mark.parametrize("world", ERROR_WORLDS, indirect=True)
def test_bitwise_op_on_float(world):
    """gloo rejects BAND on floats too; braid's message is checked when it is under test."""
    for r, (error, recovered) in enumerate(world.run(_attempt, "band_float")):
        pattern = _expected("band_float", r, world.n) if H.BACKEND == "braid" else "BAND"
        with pytest.raises(RuntimeError, match=pattern):
            raise_outcome(error)
        assert recovered, f"rank {r}: the allreduce after the failed call was wrong"


# -- lifecycle cases: each in a world of its own ---------------------------------


def _lonely_allreduce(ctx):
    """Rank 0 enters an allreduce that rank 1 never joins."""
    if ctx.rank != 0:
        return None
    return H.timed_allreduce(ctx)


def test_peer_timeout_then_clean_exit():
    world = H.World(2, pg_timeout=2.0, name="timeout")
    try:
        message, elapsed = world.run(_lonely_allreduce, timeout=60)[0]
    finally:
        codes = world.close(timeout=30)
    assert message != "no error", "allreduce without its peer returned normally"
    # Note [Timing bounds in tests] in tests/cpp/timing.h
    assert 1.9 <= elapsed <= H.timeout_bound(2.0), f"error after {elapsed:.2f} s, expected 2 s"
    if H.BACKEND == "braid":
        with pytest.raises(RuntimeError,
                           match=r"Timed out after 2000 ms waiting for rank\(s\) \[1\]"):
            raise_outcome(message)
    assert not world.exit_errors, world.exit_errors
    assert codes == {0: 0, 1: 0}, f"exit codes after the timeout: {codes}"
    assert not world.leaks, world.leaks


def _die_or_allreduce(ctx):
    if ctx.rank == 1:
        os._exit(1)
    time.sleep(0.5)  # let rank 1 be gone before the collective starts
    return H.timed_allreduce(ctx)


def test_dead_peer_is_reported_quickly():
    world = H.World(2, pg_timeout=30.0, name="deadpeer")
    pid1 = world.pids[1]
    try:
        outcomes = world.run_outcomes(_die_or_allreduce, expect_exit=True, timeout=60)
    finally:
        codes = world.close(timeout=30, graceful=True)
    assert outcomes[1].exitcode == 1, outcomes[1].describe()
    assert outcomes[0].ok, outcomes[0].describe()
    message, elapsed = outcomes[0].value
    assert message != "no error", "allreduce with a dead peer returned normally"
    assert elapsed < H.early_bound(30.0), (
        f"dead peer noticed after {elapsed:.1f} s (group timeout 30 s)")
    if H.BACKEND == "braid":
        with pytest.raises(RuntimeError, match=rf"rank 1 \(pid {pid1}\) exited"):
            raise_outcome(message)
    assert codes[0] == 0, f"rank 0 exit code {codes[0]}: {world.exit_errors}"
    assert not world.leaks, world.leaks


def _init_other_host(ctx):
    torch = ctx.torch
    ctx.init_default_group("spans")
    t = torch.full((1,), float(ctx.rank + 1))
    ctx.dist.all_reduce(t)
    big = torch.full((300001,), float(ctx.rank + 1))  # the ring, in 1 MiB segments
    ctx.dist.all_reduce(big)
    try:
        ctx.dist.all_reduce(torch.ones(3 + ctx.rank))
        mismatch = None
    except RuntimeError as e:
        mismatch = str(e)
    ctx.dist.barrier()
    ctx.dist.destroy_process_group()
    return t.item(), [big[0].item(), big[-1].item()], mismatch


@pytest.mark.braid_only
def test_group_spanning_hosts_runs_over_tcp():
    """Rank 1 claims another host: the group runs over TCP (through loopback here; real
    hosts are simulated in test_hosts*.py), and a mismatch still fails both ranks."""
    world = H.World(2, init=False, name="hosts",
                    rank_env={1: {"BRAID_HOST_ID_OVERRIDE": "some-other-host"}})
    try:
        results = world.run(_init_other_host)
    finally:
        codes = world.close()
    for r, (small, large, mismatch) in enumerate(results):
        assert small == 3.0 and large == [3.0, 3.0], (r, small, large)
        with pytest.raises(RuntimeError, match=r"passed shape \[\d\] \(float32\), this rank shape"):
            raise_outcome(mismatch)
    assert codes == {0: 0, 1: 0}, f"exit codes: {codes}"

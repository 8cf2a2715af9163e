"""Ranks with different settings that shape an op's steps (issue 8; Note
[Settings that shape an op] in csrc/collectives/shm/plan.h).

Every rank must raise a RuntimeError naming the op, the setting and both
values before any data moves, so no rank ever returns wrong values; the ranks
then run another op correctly on the same group. Settings are read when a
group is created, so one world without a default group serves every case:
each case sets its rank's environment, creates a braid group, runs the op
that must fail and one that must succeed, and destroys the group (a spawned
world per case would cost seconds of CPU each; see Note [Why worlds are
pooled] in harness.py).
"""

import os

import pytest

import harness as H

GIB = "1073741824"

# case: (setting, (rank 0's value, rank 1's value), values as the error prints them,
#        (op that must fail, float32 elements), (op that must then succeed, elements))
CASES = {
    # The reproduction of issue 8: a 4 KiB allreduce, one-shot on one rank only.
    "allreduce_oneshot": ("BRAID_ALLREDUCE_ONESHOT_MAX", ("0", GIB), ("0", GIB),
                          ("all_reduce", 1024), ("broadcast", 1024)),
    "reduce_oneshot": ("BRAID_REDUCE_ONESHOT_MAX", ("0", GIB), ("0", GIB),
                       ("reduce", 1024), ("all_reduce", 1024)),
    "direct_ops_alltoall": ("BRAID_DIRECT_OPS", ("allgather,alltoall", "allgather"),
                            ("allgather,alltoall", "allgather"),
                            ("all_to_all", 1024), ("all_gather", 1024)),
    "direct_ops_allgather": ("BRAID_DIRECT_OPS", ("alltoall,allgather", "alltoall"),
                             ("allgather,alltoall", "alltoall"),
                             ("all_gather", 1024), ("all_to_all", 1024)),
    "direct_min_bytes": ("BRAID_DIRECT_MIN_BYTES", ("0", "1M"), ("0", "1048576"),
                         ("all_gather", 1024), ("all_reduce", 1024)),
    # 128 KiB: above the one-shot threshold, so pipelined; the next allreduce is one-shot.
    "chunk_bytes": ("BRAID_CHUNK_BYTES", ("65536", "131072"),
                    ("65536 (65536-byte chunks)", "131072 (131072-byte chunks)"),
                    ("all_reduce", 32768), ("all_reduce", 1024)),
}


def _run(ctx, op, count):
    """Runs `op` on `count` float32 per rank: (error or None, outputs as they must be).

    After an error the outputs must be untouched (no data moved); otherwise
    they must hold the closed form."""
    torch, dist = ctx.torch, ctx.dist
    n, me = ctx.size, ctx.rank
    xs = [torch.arange(count, dtype=torch.float32) + 1000 * (r + 1) for r in range(n)]
    x = xs[me]
    if op in ("all_reduce", "reduce", "broadcast"):
        outs = [x.clone()]
        want = {"all_reduce": sum(xs), "broadcast": xs[n - 1],
                "reduce": sum(xs) if me == 0 else None}[op]
        want = [want]
        call = {"all_reduce": lambda: dist.all_reduce(outs[0]),
                "reduce": lambda: dist.reduce(outs[0], dst=0),
                "broadcast": lambda: dist.broadcast(outs[0], src=n - 1)}[op]
    elif op == "all_gather":
        outs = [torch.full((count,), -1.0) for _ in range(n)]
        want = xs
        call = lambda: dist.all_gather(outs, x)  # noqa: E731
    else:  # all_to_all: even splits
        c = count // n
        outs = [torch.full((count,), -1.0)]
        want = [torch.cat([xs[q][me * c:(me + 1) * c] for q in range(n)])]
        call = lambda: dist.all_to_all_single(outs[0], x)  # noqa: E731
    before = [o.clone() for o in outs]
    try:
        call()
        error = None
    except RuntimeError as e:
        error = str(e)
    expected = before if error else want
    return error, all(w is None or torch.equal(o, w) for o, w in zip(outs, expected))


def _with_setting(ctx, case):
    """Creates a braid group with this rank's value of the case's setting, runs the
    failing op and the next one, destroys the group: (error, outputs ok, next op's outcome)."""
    setting, values, _, failing, following = CASES[case]
    old = os.environ.get(setting)
    os.environ[setting] = values[ctx.rank]
    try:
        ctx.dist.init_process_group("braid", store=ctx.store(f"settings/{case}/"),
                                    rank=ctx.rank, world_size=ctx.size, timeout=ctx.timeout)
        try:
            error, outputs_ok = _run(ctx, *failing)
            after = _run(ctx, *following)
        finally:
            ctx.dist.destroy_process_group()
    finally:
        if old is None:
            del os.environ[setting]
        else:
            os.environ[setting] = old
    return error, outputs_ok, after


@pytest.fixture(scope="module")
def settings_world():
    world = H.World(2, init=False, name="settings")
    yield world
    codes = world.close()
    assert codes == {0: 0, 1: 0}, f"exit codes: {codes} {world.exit_errors}"
    assert not world.leaks, world.leaks


@pytest.mark.braid_only
@pytest.mark.parametrize("case", list(CASES))
def test_different_settings_fail_every_rank_before_data_moves(settings_world, case):
    setting, _, printed, (failing, _), (following, _) = CASES[case]
    op = {"all_reduce": "allreduce", "reduce": "reduce", "all_gather": "allgather",
          "all_to_all": "alltoall"}[failing]
    for r, (error, outputs_ok, (next_error, next_ok)) in enumerate(settings_world.run(
            _with_setting, case)):
        assert error is not None, f"rank {r}: {failing} with different {setting} did not fail"
        want = (f"braid {op} (rank {r}): rank {1 - r} runs with {setting}={printed[1 - r]}, "
                f"this rank with {setting}={printed[r]}")
        assert want in error, f"rank {r}: expected\n  {want}\nin\n  {error}"
        assert outputs_ok, f"rank {r}: {failing} failed but changed its outputs"
        assert next_error is None, f"rank {r}: {following} after the failed op: {next_error}"
        assert next_ok, f"rank {r}: {following} after the failed op returned wrong values"


def _init_with_slot_bytes(ctx):
    os.environ["BRAID_SHM_SLOT_BYTES"] = ["1M", "2M"][ctx.rank]
    try:
        ctx.dist.init_process_group("braid", store=ctx.store("settings/slot/"), rank=ctx.rank,
                                    world_size=ctx.size, timeout=ctx.timeout)
    except RuntimeError as e:
        return str(e)
    finally:
        del os.environ["BRAID_SHM_SLOT_BYTES"]
    ctx.dist.destroy_process_group()
    return None


@pytest.mark.braid_only
def test_different_slot_sizes_fail_group_creation_on_every_rank(settings_world):
    sizes = ["1048576", "2097152"]
    for r, error in enumerate(settings_world.run(_init_with_slot_bytes)):
        assert error is not None, f"rank {r}: a group with different slot sizes was created"
        want = (f"braid init (rank {r}): rank {1 - r} runs with BRAID_SHM_SLOT_BYTES="
                f"{sizes[1 - r]}, this rank with BRAID_SHM_SLOT_BYTES={sizes[r]}")
        assert want in error, f"rank {r}: expected\n  {want}\nin\n  {error}"

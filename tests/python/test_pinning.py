"""Binding each rank to one CPU where a host's ranks outnumber its cores (Note [Pinning ranks on a
full host] in csrc/common/rank_pinning.h; BRAID_PIN_RANKS).

Each test starts fresh processes (a pooled world's default group would hold its binding across
tests), makes a braid group, and checks where every thread of the rank may run: the calling
thread, a thread started afterwards, braid's worker; that a second group joins the binding
rather than making another; that an allreduce is right; and that destroying the groups gives
every thread its old mask back. Whether "auto" binds is computed from this machine (its CPUs,
the usable cores braid counts), so the test checks the right outcome on any machine.
"""
import gc
import os
import threading

import pytest

import harness as H

pytestmark = pytest.mark.braid_only


def _masks_of_braid_threads():
    """{thread name: mask} of this process's braid threads (comm starting with braid-)."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            if name.startswith("braid-"):
                found[f"{name}/{tid}"] = sorted(os.sched_getaffinity(int(tid)))
        except OSError:  # the thread ended meanwhile
            pass
    return found


def _bind_and_release(ctx, place=None):
    """Makes the default group (and a subgroup), reports every mask, destroys both."""
    import torch_braid

    torch, dist = ctx.torch, ctx.dist
    if place is not None:  # as a launcher or taskset would, before the group
        os.sched_setaffinity(0, place)
    before = sorted(os.sched_getaffinity(0))
    usable = torch_braid._C.cores_info()["cores"]
    ctx.init_default_group("pin")
    t = torch.full((5,), float(ctx.rank + 1))
    dist.all_reduce(t)
    summed = t.tolist() == [ctx.size * (ctx.size + 1) / 2] * 5
    seen = []
    th = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))
    th.start()
    th.join()
    info = torch_braid._C.cores_info()
    sub = dist.new_group(list(range(ctx.size)), backend="braid")
    dist.barrier(group=sub)
    with_sub = sorted(os.sched_getaffinity(0))
    during = dict(caller=sorted(os.sched_getaffinity(0)), later_thread=seen[0],
                  braid=_masks_of_braid_threads(), usable_then=info["cores"],
                  bound=info["bound_by_braid"])
    dist.destroy_process_group()
    del sub
    gc.collect()
    after = sorted(os.sched_getaffinity(0))
    return dict(before=before, usable=usable, online=os.cpu_count(), summed=summed,
                during=during, with_sub=with_sub, after=after,
                bound_after=torch_braid._C.cores_info()["bound_by_braid"])


def _expect_bound(r, rep, ctx_rank):
    cpu = rep["before"][ctx_rank % len(rep["before"])]
    d = rep["during"]
    assert d["bound"], f"rank {ctx_rank}: cores_info says not bound: {rep}"
    assert d["caller"] == [cpu], f"rank {ctx_rank}: caller's mask {d['caller']}, want [{cpu}]"
    assert d["later_thread"] == [cpu], f"rank {ctx_rank}: a later thread's mask {d['later_thread']}"
    assert d["braid"], f"rank {ctx_rank}: no braid thread found"
    for name, mask in d["braid"].items():
        assert mask == [cpu], f"rank {ctx_rank}: {name} may run on {mask}, want [{cpu}]"
    # The spin policy still counts the cores the process had (Note [Counting cores]).
    assert d["usable_then"] == rep["usable"], rep
    assert rep["with_sub"] == [cpu], f"rank {ctx_rank}: the subgroup moved it to {rep['with_sub']}"


def _run(n, env, **kwargs):
    world = H.World(n, init=False, env=env, name=f"pin{n}")
    try:
        reports = world.run(_bind_and_release, timeout=120, **kwargs)
    finally:
        codes = world.close(timeout=30)
    assert set(codes.values()) == {0}, codes
    assert not world.leaks, world.leaks
    return reports


@pytest.mark.parametrize("mode,n", [("auto", 3), ("auto", 2), ("1", 2), ("0", 3)])
def test_binding_follows_the_setting(mode, n):
    reports = _run(n, {"BRAID_PIN_RANKS": mode})
    for r, rep in enumerate(reports):
        assert rep["summed"], f"rank {r}: wrong allreduce: {rep}"
        unplaced = len(rep["before"]) == rep["online"]
        want = mode == "1" or (mode == "auto" and unplaced and n > rep["usable"])
        if want:
            _expect_bound(r, rep, r)
        else:
            d = rep["during"]
            assert not d["bound"] and d["caller"] == rep["before"], f"rank {r}: bound: {rep}"
            for name, mask in d["braid"].items():
                assert mask == rep["before"], f"rank {r}: {name} moved to {mask}"
        # Undone with the groups, whether bound or not.
        assert rep["after"] == rep["before"], f"rank {r}: mask {rep['after']} after destroy"
        assert not rep["bound_after"], f"rank {r}: still bound after destroy"


@pytest.mark.machine(None if (os.cpu_count() or 1) >= 2 else "needs two CPUs to place a rank")
def test_a_placed_rank_is_left_alone():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    reports = _run(3, {"BRAID_PIN_RANKS": "auto"}, place={cpu})
    for r, rep in enumerate(reports):
        assert rep["before"] == [cpu]
        d = rep["during"]
        assert not d["bound"], f"rank {r}: a placed rank was bound again: {rep}"
        assert d["caller"] == [cpu] and rep["after"] == [cpu], rep
        assert rep["summed"], rep


def _init_fails(ctx):
    try:
        ctx.init_default_group("badpin")
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return str(e)
    ctx.dist.destroy_process_group()
    return "no error"


def test_a_bad_value_names_itself():
    world = H.World(2, init=False, env={"BRAID_PIN_RANKS": "yes"}, name="badpin")
    try:
        messages = world.run(_init_fails, timeout=120)
    finally:
        codes = world.close(timeout=30)
    assert set(codes.values()) == {0}, codes
    assert not world.leaks, world.leaks
    for r, m in enumerate(messages):
        assert "BRAID_PIN_RANKS must be auto, 0 or 1" in m and "'yes'" in m, m
        assert f"rank {r}" in m, m

"""Subgroups made with dist.new_group(ranks, backend=<under test>).

Overlapping groups are used alternately with each other and with the default
group; ranks outside a group see no effect from calling into it.
"""

import pytest

import harness as H


def group_specs(n):
    """Named rank lists for a world of n: overlapping, disjoint, single and unsorted."""
    half = (n + 1) // 2
    return {
        "even": list(range(0, n, 2)),
        "low": list(range(half)),
        "high": list(range(half - 1, n)),  # overlaps "low" in one rank
        "single": [n - 1],
        "unsorted": list(range(n - 1, 0, -1)),  # every rank but 0, given backwards
    }


def _groups(ctx):
    """Creates the groups once per world; every rank creates all of them, in order."""
    if "groups" not in ctx.cache:
        groups = {}
        for name, ranks in group_specs(ctx.size).items():
            g = ctx.dist.new_group(ranks, timeout=ctx.timeout, backend=ctx.backend)
            groups[name] = (sorted(ranks), g)
        ctx.cache["groups"] = groups
    return ctx.cache["groups"]


def _alternate(ctx, rounds):
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    me = ctx.rank
    groups = _groups(ctx)
    for i in range(rounds):
        for name in ("low", "high", "even", "unsorted", "single"):
            ranks, g = groups[name]
            t = torch.full((9,), float(me + 1 + i))
            if me in ranks:
                dist.all_reduce(t, group=g)
                ch.equal(f"round {i} allreduce in {name}", t,
                         torch.full((9,), float(sum(r + 1 + i for r in ranks))))
            else:
                ret = dist.all_reduce(t, group=g)  # outside the group: a no-op
                ch.true(f"round {i} non-member allreduce in {name} returns None", ret is None)
                ch.equal(f"round {i} non-member tensor untouched", t,
                         torch.full((9,), float(me + 1 + i)))
        w = torch.full((3,), float(i))
        dist.all_reduce(w)  # the default group between subgroup calls
        ch.equal(f"round {i} default group", w, torch.full((3,), float(i * ctx.size)))
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(2, 3, 4, 5), slow=(8,)), indirect=True)
def test_overlapping_groups_alternately(world):
    H.check_reports(world.run(_alternate, 3))


def _membership(ctx):
    ch = H.Checker(ctx)
    dist = ctx.dist
    for name, (ranks, g) in _groups(ctx).items():
        if ctx.rank in ranks:
            ch.true(f"group rank in {name}", dist.get_rank(g) == ranks.index(ctx.rank),
                    f"{dist.get_rank(g)} vs {ranks.index(ctx.rank)}")
            ch.true(f"group size of {name}", dist.get_world_size(g) == len(ranks),
                    str(dist.get_world_size(g)))
        else:
            ch.true(f"non-member rank in {name}", dist.get_rank(g) == -1, str(dist.get_rank(g)))
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(2, 3, 5), slow=(8,)), indirect=True)
def test_group_membership(world):
    H.check_reports(world.run(_membership))


def _collectives_in_group(ctx, name):
    """Rooted and gathering collectives in a subgroup: roots are global ranks."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    ranks, g = _groups(ctx)[name]
    me = ctx.rank
    if me not in ranks:  # outside the group: a no-op that returns None, the tensor untouched
        b = H.pattern(me, 0, 11, torch.float32)
        ret = dist.broadcast(b, ranks[-1], group=g)
        ch.true(f"non-member broadcast in {name} returns None", ret is None, repr(ret))
        ch.equal(f"non-member tensor untouched by broadcast in {name}", b,
                 H.pattern(me, 0, 11, torch.float32))
        return ch.report()
    k = len(ranks)
    root = ranks[-1]
    b = H.pattern(me, 0, 11, torch.float32)
    dist.broadcast(b, root, group=g)
    ch.equal(f"broadcast in {name} from {root}", b, H.pattern(root, 0, 11, torch.float32))
    r = H.make_input(me, 11, torch.int32, "MAX")
    dist.reduce(r, ranks[0], op=dist.ReduceOp.MAX, group=g)
    if me == ranks[0]:
        ch.equal(f"reduce in {name}", r,
                 H.closed_form([H.make_input(x, 11, torch.int32, "MAX") for x in ranks], "MAX"))
    outs = [torch.zeros(5, dtype=torch.int64) for _ in range(k)]
    dist.all_gather(outs, H.pattern(me, 1, 5, torch.int64), group=g)
    for i, x in enumerate(ranks):  # ordered by group rank
        ch.equal(f"allgather in {name} slot {i}", outs[i], H.pattern(x, 1, 5, torch.int64))
    flat = torch.zeros(k * 4)
    dist.all_gather_into_tensor(flat, H.pattern(me, 2, 4, torch.float32), group=g)
    ch.equal(f"all_gather_into_tensor in {name}", flat,
             torch.cat([H.pattern(x, 2, 4, torch.float32) for x in ranks]))
    a2a = torch.zeros(k * 2)
    inp = torch.cat([H.pattern(me, x, 2, torch.float32) for x in ranks])
    dist.all_to_all_single(a2a, inp, group=g)
    ch.equal(f"all_to_all_single in {name}", a2a,
             torch.cat([H.pattern(x, me, 2, torch.float32) for x in ranks]))
    dist.barrier(group=g)
    return ch.report()


@pytest.mark.parametrize("name", ["even", "high", "unsorted", "single"])
@pytest.mark.parametrize("world", H.sizes(fast=(3, 5), slow=(8,)), indirect=True)
def test_collectives_in_group(world, name):
    H.check_reports(world.run(_collectives_in_group, name))


def _p2p_in_group(ctx):
    """send/recv inside a subgroup address peers by global rank."""
    torch, dist = ctx.torch, ctx.dist
    ch = H.Checker(ctx)
    ranks, g = _groups(ctx)["unsorted"]
    me = ctx.rank
    if me in ranks and len(ranks) >= 2:
        first, last = ranks[0], ranks[-1]
        if me == first:
            sent = H.pattern(me, last, 7, torch.float32)
            dist.send(sent, last, group=g)
            ch.equal("subgroup send buffer untouched", sent, H.pattern(me, last, 7, torch.float32))
        elif me == last:
            buf = torch.zeros(7)
            dist.recv(buf, first, group=g)
            ch.equal("subgroup recv", buf, H.pattern(first, last, 7, torch.float32))
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(3, 5), slow=(8,)), indirect=True)
def test_p2p_in_group(world):
    H.check_reports(world.run(_p2p_in_group))

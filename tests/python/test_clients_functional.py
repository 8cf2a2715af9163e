"""torch.distributed._functional_collectives on braid, against gloo and closed forms.

The functional collectives are what DTensor, tensor parallelism, FSDP2 under compile and
compiled graphs call (torch.ops._c10d_functional.*, which reach the group's backend through
the c10d ops: allreduce, _allgather_base, reduce_scatter_tensor_coalesced, alltoall_base,
broadcast and the *_coalesced forms). Every op is issued, on braid and on gloo at once,
before any is waited; the waits come late (after local work) and out of order (last issued
first). Inputs are small integers in fp32, so every sum is exact in any order: braid's
results must equal gloo's and the closed forms bit for bit.

AVG is compared with the closed form only where gloo refuses it (torch 2.6: "Cannot use
ReduceOp.AVG with Gloo"); where this torch's gloo has it, with gloo too.
"""
import os
import sys

import pytest

import harness as H

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
import clients as C  # noqa: E402

MISSING = C.funcol_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))


def _a2a_rows(src, dst):
    """Rows that rank src sends rank dst in all_to_all_single (uneven, 1 to 3)."""
    return (src + 2 * dst) % 3 + 1


def _inputs(r, n, salt):
    """Rank r's inputs (every rank can rebuild every other's)."""
    import torch

    def mk(count, k, shape=None):
        v = H.make_input(r, count, torch.float32, salt=salt * 100 + k)
        return v.view(*shape) if shape else v

    a2a_rows = sum(_a2a_rows(r, d) for d in range(n))
    return {
        "ar": mk(13, 0),
        "ag": mk(15, 1, (3, 5)),
        "rs": mk(n * 4 * 3, 2, (n * 4, 3)),
        "a2a": mk(a2a_rows * 2, 3, (a2a_rows, 2)),
        "bc": mk(9, 4),
        "arc": [mk(7, 5), mk(1, 6)],
        "agc": [mk(4, 7), mk(6, 8, (2, 3))],
        "rsc": [mk(n * 2, 9), mk(n * 3 * 2, 10, (n * 3, 2))],
        "max": mk(11, 11),
        "avg": mk(n * 5, 12),
    }


def _expected(me, n, salt):
    import torch

    ins = [_inputs(r, n, salt) for r in range(n)]
    total = lambda key, i=None: sum(  # noqa: E731
        (x[key] if i is None else x[key][i]) for x in ins)
    a2a = []
    for s in range(n):
        start = sum(_a2a_rows(s, d) for d in range(me))
        a2a.append(ins[s]["a2a"][start:start + _a2a_rows(s, me)])
    return {
        "ar": total("ar"),
        "ag0": torch.cat([x["ag"] for x in ins], 0),
        "ag1": torch.cat([x["ag"] for x in ins], 1),
        "rs": total("rs").chunk(n, 0)[me],
        "a2a": torch.cat(a2a, 0),
        "bc": ins[n - 1]["bc"],
        "arc": [total("arc", 0), total("arc", 1)],
        "agc": [torch.cat([x["agc"][0] for x in ins], 0),
                torch.cat([x["agc"][1] for x in ins], 0)],
        "rsc": [total("rsc", 0).chunk(n, 0)[me], total("rsc", 1).chunk(n, 0)[me]],
        "max": torch.stack([x["max"] for x in ins]).max(0).values,
        "avg": (torch.stack([x["avg"] for x in ins]).double().mean(0)
                .float().chunk(n, 0)[me]),
    }


def _issue_eager(ctx, group, x):
    """Every op through the public functional API; returns AsyncCollectiveTensors unwaited."""
    import torch.distributed._functional_collectives as fc

    n, me = ctx.size, ctx.rank
    return {
        "ar": fc.all_reduce(x["ar"], "sum", group),
        "ag0": fc.all_gather_tensor(x["ag"], 0, group),
        "ag1": fc.all_gather_tensor(x["ag"], 1, group),
        "rs": fc.reduce_scatter_tensor(x["rs"], "sum", 0, group),
        "a2a": fc.all_to_all_single(x["a2a"], [_a2a_rows(s, me) for s in range(n)],
                                    [_a2a_rows(me, d) for d in range(n)], group),
        "bc": fc.broadcast(x["bc"], n - 1, group),
        "arc": fc.all_reduce_coalesced(x["arc"], "sum", group),
        "agc": fc.all_gather_into_tensor_coalesced(x["agc"], group),
        "rsc": fc.reduce_scatter_tensor_coalesced(x["rsc"], "sum", [0, 0], group),
        "max": fc.all_reduce(x["max"], "max", group),
    }


def _wait_all(issued):
    """Waits every result, last issued first; returns plain tensors."""
    import torch
    import torch.distributed._functional_collectives as fc

    def wait(t):
        if isinstance(t, fc.AsyncCollectiveTensor):
            return t.wait()
        return fc.wait_tensor(t)

    out = {}
    for key in reversed(list(issued)):
        v = issued[key]
        out[key] = [wait(t) for t in reversed(v)][::-1] if isinstance(v, list) else wait(v)
        torch.mm(torch.ones(32, 32), torch.ones(32, 32))  # local work between the waits
    return out


def _check(ch, label, got, expected):
    for key, e in expected.items():
        if key not in got:
            continue
        g = got[key]
        if isinstance(e, list):
            for i, (gi, ei) in enumerate(zip(g, e)):
                ch.equal(f"{label} {key}[{i}]", gi.contiguous(), ei)
        else:
            ch.equal(f"{label} {key}", g.contiguous(), e)


def _avg(ctx, ch, group, label, x, expected):
    """reduce_scatter_tensor and all_reduce with "avg". Returns how gloo fared (None: ran)."""
    import torch.distributed._functional_collectives as fc

    try:
        rs = fc.reduce_scatter_tensor(x["avg"], "avg", 0, group).wait()
        ar = fc.all_reduce(x["avg"], "avg", group).wait()
    except Exception as e:
        if label == "gloo" and C.gloo_error(e):
            return f"gloo refuses avg: {str(e).splitlines()[0][:120]}"
        raise
    n = ctx.size
    # n * (1/n) against a division: an ulp apart at most (Checker.reduced).
    ch.reduced(f"{label} avg reduce_scatter", rs, expected["avg"], "AVG")
    full = (sum(_inputs(r, n, 7)["avg"].double() for r in range(n)) / n).float()
    ch.reduced(f"{label} avg all_reduce", ar, full, "AVG")
    return None


def _eager_case(ctx):
    """Issues everything on braid and on gloo, then waits it all, out of order."""
    dist = ctx.dist
    ch = H.Checker(ctx)
    salt = 7
    x = _inputs(ctx.rank, ctx.size, salt)
    expected = _expected(ctx.rank, ctx.size, salt)
    braid_issued = _issue_eager(ctx, dist.group.WORLD, x)
    gloo_issued = _issue_eager(ctx, ctx.ref, x)  # in flight together with braid's
    gloo_got = _wait_all(gloo_issued)
    braid_got = _wait_all(braid_issued)
    _check(ch, "braid", braid_got, expected)
    _check(ch, "gloo", gloo_got, expected)
    for key in braid_got:  # and against each other, the same way
        b, g = braid_got[key], gloo_got[key]
        for i, (bi, gi) in enumerate(zip(b if isinstance(b, list) else [b],
                                         g if isinstance(g, list) else [g])):
            ch.equal(f"braid vs gloo {key}[{i}]", bi.contiguous(), gi.contiguous())
    notes = []
    for label, group in (("braid", dist.group.WORLD), ("gloo", ctx.ref)):
        note = _avg(ctx, ch, group, label, x, expected)
        if note:
            notes.append(note)
    return {"report": ch.report(), "notes": notes}


def _compiled_fn(group_name, n, me):
    """A function of the inputs that issues every op through the native _c10d_functional
    ops, then waits them in reverse order: late and out of order inside the graph (the public
    API waits at once when traced)."""
    import torch

    F = torch.ops._c10d_functional
    in_splits = [_a2a_rows(me, d) for d in range(n)]
    out_splits = [_a2a_rows(s, me) for s in range(n)]

    def fn(ar, ag, rs, a2a, bc, arc0, arc1, agc0, agc1, rsc0, rsc1, mx):
        outs = [
            F.all_reduce(ar, "sum", group_name),
            F.all_gather_into_tensor(ag, n, group_name),
            F.reduce_scatter_tensor(rs, "sum", n, group_name),
            F.all_to_all_single(a2a, out_splits, in_splits, group_name),
            F.broadcast(bc, n - 1, group_name),
            *F.all_reduce_coalesced([arc0, arc1], "sum", group_name),
            *F.all_gather_into_tensor_coalesced([agc0, agc1], n, group_name),
            *F.reduce_scatter_tensor_coalesced([rsc0, rsc1], "sum", n, group_name),
            F.all_reduce(mx, "max", group_name),
        ]
        local = torch.mm(ar.view(1, -1), ar.view(-1, 1))  # work before the first wait
        waited = [F.wait_tensor(t) for t in reversed(outs)][::-1]
        return waited, local

    return fn


def _compiled_case(ctx):
    import torch
    import torch._dynamo

    dist = ctx.dist
    ch = H.Checker(ctx)
    n, me, salt = ctx.size, ctx.rank, 11
    x = _inputs(me, n, salt)
    e = _expected(me, n, salt)
    args = [x["ar"], x["ag"], x["rs"], x["a2a"], x["bc"], *x["arc"], *x["agc"], *x["rsc"],
            x["max"]]
    expected = [e["ar"], e["ag0"], e["rs"], e["a2a"], e["bc"], *e["arc"], *e["agc"], *e["rsc"],
                e["max"]]
    results = {}
    for label, group in (("braid", dist.group.WORLD), ("gloo", ctx.ref)):
        torch._dynamo.reset()
        fn = torch.compile(_compiled_fn(group.group_name, n, me), backend="aot_eager",
                           fullgraph=True)
        got, local = fn(*args)
        ch.equal(f"{label} local work", local, torch.mm(x["ar"].view(1, -1),
                                                         x["ar"].view(-1, 1)))
        for i, (g, want) in enumerate(zip(got, expected)):
            ch.equal(f"{label} compiled op {i}", g.contiguous(), want)
        results[label] = got
    for i, (b, g) in enumerate(zip(results["braid"], results["gloo"])):
        ch.equal(f"braid vs gloo compiled op {i}", b, g)
    torch._dynamo.reset()
    return ch.report()


@pytest.mark.parametrize("world", H.sizes(fast=(2, 4), slow=(3,)), indirect=True)
def test_functional_collectives_eager(world):
    results = world.run(_eager_case)
    H.check_reports([r["report"] for r in results])
    notes = sorted({note for r in results for note in r["notes"]})
    if notes:  # what gloo lacked: braid was checked against the closed form alone there
        print("\n".join(notes))


@pytest.mark.parametrize("world", H.sizes(fast=(2, 4), slow=()), indirect=True)
def test_functional_collectives_compiled(world):
    why = C.compile_missing()
    if why:
        pytest.skip(why)
    H.check_reports(world.run(_compiled_case, timeout=240))

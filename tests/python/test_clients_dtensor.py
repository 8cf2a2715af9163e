"""DTensor and tensor parallelism on braid, against gloo in the same ranks.

distribute_tensor and every redistribution between Shard(0), Shard(1), Replicate() and
Partial() (sum), on a 1-D mesh of all ranks and on a 2 x 2 mesh (4 ranks), with shapes
that do not divide evenly (5 x 6 over 4 ranks: DTensor pads and unpads around even
all-gathers). Each redistribution runs on a braid mesh (init_device_mesh on the braid
default group) and on a gloo mesh of the same ranks (DeviceMesh.from_group); the local
shards must be equal bit for bit, and full_tensor() must give back the global tensor.
Values are small integers in fp32 (and sums of them, or quarters of them for
Replicate -> Partial): every sum is exact in any order, so bit for bit holds at every size.

Redistribution reaches braid through the functional collectives: all_reduce (Partial ->
Replicate), reduce_scatter_tensor (Partial -> Shard), all_gather_tensor (Shard ->
Replicate, and Shard(i) -> Shard(j), which DTensor does as all-gather and chunk on CPU
meshes), broadcast and scatter (distribute_tensor).

Tensor parallelism: parallelize_module with ColwiseParallel then RowwiseParallel, one SGD
step, compared with gloo (bit for bit at 2 ranks; at 4 the rowwise all-reduce adds four
partial sums in each backend's order: FP32_TOL, scripts/clients.py) and with the same model
in one process (FP32_TOL).
"""
import itertools
import os
import sys

import pytest

import harness as H

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
import clients as C  # noqa: E402

MISSING = C.dtensor_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))

SHAPE = (5, 6)


def _meshes(ctx, dims):
    """(braid mesh, gloo mesh): 1-D over all ranks, or 2 x 2 (rows [0, 1] and [2, 3])."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    key = ("dtensor-meshes", dims)
    if key not in ctx.cache:
        if dims == 1:
            braid = init_device_mesh("cpu", (ctx.size,))
            gloo = DeviceMesh.from_group(ctx.ref, "cpu")
        else:
            braid = init_device_mesh("cpu", (2, 2), mesh_dim_names=("a", "b"))
            groups = {tuple(r): ctx.dist.new_group(r, backend="gloo", timeout=ctx.timeout)
                      for r in ([0, 2], [1, 3], [0, 1], [2, 3])}
            me = ctx.rank
            g0 = groups[(0, 2)] if me % 2 == 0 else groups[(1, 3)]  # along dim 0 (a column)
            g1 = groups[(0, 1)] if me < 2 else groups[(2, 3)]  # along dim 1 (a row)
            gloo = DeviceMesh.from_group([g0, g1], "cpu", mesh=torch.tensor([[0, 1], [2, 3]]),
                                         mesh_dim_names=("a", "b"))
        ctx.cache[key] = (braid, gloo)
    return ctx.cache[key]


def _placements():
    from torch.distributed.tensor import Partial, Replicate, Shard

    return {"S0": Shard(0), "S1": Shard(1), "R": Replicate(), "P": Partial()}


def _global(salt):
    import torch

    return H.make_input(0, SHAPE[0] * SHAPE[1], torch.float32, salt=salt).view(*SHAPE)


def _partial_part(mesh, salt):
    """This rank's local value of a Partial tensor whose sum is _global(salt): each rank a
    rank-dependent integer tensor, the last rank of the mesh the remainder."""
    import torch

    n, me = mesh.size(), mesh.get_rank()
    ranks = mesh.mesh.flatten().tolist()
    parts = [H.make_input(r, SHAPE[0] * SHAPE[1], torch.float32, salt=salt + 1).view(*SHAPE)
             for r in ranks[:-1]]
    mine = ranks.index(me)
    if mine < n - 1:
        return parts[mine]
    return _global(salt) - sum(parts)


def _make(mesh, src, salt):
    """A DTensor with placements `src` (names) whose full value is _global(salt)."""
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    pl = _placements()
    if "P" not in src:
        return distribute_tensor(_global(salt), mesh, [pl[s] for s in src])
    # Partial on some dims: start from a replicated tensor whose value is already split
    # over every rank (Partial on all dims), then turn the non-Partial dims into their
    # placements by redistributing (their reductions are checked by the other pairs).
    if mesh.ndim == 1:
        return DTensor.from_local(_partial_part(mesh, salt), mesh, [pl["P"]])
    d = DTensor.from_local(_partial_part(mesh, salt), mesh, [pl["P"]] * mesh.ndim)
    return _redistribute(d, mesh, [pl[s] for s in src])


def _redistribute(d, mesh, placements):
    """d.redistribute(); to a Partial target, where the public method refuses one ("for
    internal use only", torch 2.6), through the same internal path it would take."""
    try:
        return d.redistribute(mesh, placements)
    except RuntimeError as e:
        if "internal use only" not in str(e):
            raise
    from torch.distributed.tensor._redistribute import Redistribute

    return Redistribute.apply(d, mesh, tuple(placements), False)


def _redistributions(ctx, dims, pairs):
    """Every pair (src, dst) on both meshes: local shards equal, full_tensor() exact."""
    torch = ctx.torch
    braid_mesh, gloo_mesh = _meshes(ctx, dims)
    pl = _placements()
    failures, count, unsupported = [], 0, []
    for i, (src, dst) in enumerate(pairs):
        salt = 100 + i
        full = _global(salt)
        locals_ = {}
        for label, mesh in (("braid", braid_mesh), ("gloo", gloo_mesh)):
            d = _make(mesh, src, salt)
            count += 1
            got = d.full_tensor()
            if not torch.equal(got, full):
                failures.append(f"rank {ctx.rank} {label} {src}: full_tensor() of the source "
                                f"differs from the global tensor")
            try:
                r = _redistribute(d, mesh, [pl[s] for s in dst])
            except (RuntimeError, NotImplementedError, AssertionError) as e:
                locals_[label] = f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
                continue
            locals_[label] = r.to_local().clone()
            got = r.full_tensor()
            count += 1
            if not torch.equal(got, full):
                failures.append(f"rank {ctx.rank} {label} {src} -> {dst}: full_tensor() "
                                f"differs from the global tensor")
            if r.placements != tuple(pl[s] for s in dst):
                failures.append(f"rank {ctx.rank} {label} {src} -> {dst}: placements "
                                f"{r.placements}")
        b, g = locals_["braid"], locals_["gloo"]
        if isinstance(b, str) or isinstance(g, str):
            # DTensor itself refuses some pairs; then it must refuse them on both.
            if not (isinstance(b, str) and isinstance(g, str)):
                failures.append(f"rank {ctx.rank} {src} -> {dst}: braid {b!s:.200}, "
                                f"gloo {g!s:.200}")
            unsupported.append(f"{src}->{dst}")
            continue
        count += 1
        failures += C.compare_tensors(f"rank {ctx.rank} {src} -> {dst} local shard braid vs "
                                      f"gloo", [b], [g])
    return {"count": count, "failures": failures, "unsupported": unsupported}


def _distribute_uneven(ctx, dims):
    """distribute_tensor of uneven shapes on both meshes: shards as torch.chunk cuts them."""
    torch = ctx.torch
    from torch.distributed.tensor import Shard, distribute_tensor

    braid_mesh, gloo_mesh = _meshes(ctx, dims)
    failures, count = [], 0
    for shape in ((1, 3), (3, 7), (5, 6), (9, 2)):
        full = H.make_input(0, shape[0] * shape[1], torch.float32, salt=7).view(*shape)
        for dim in (0, 1):
            place = [Shard(dim)] * dims
            got = {}
            for label, mesh in (("braid", braid_mesh), ("gloo", gloo_mesh)):
                d = distribute_tensor(full, mesh, place)
                got[label] = d.to_local().clone()
                count += 1
                if not torch.equal(d.full_tensor(), full):
                    failures.append(f"rank {ctx.rank} {label} {shape} Shard({dim}): "
                                    f"full_tensor() differs")
            if dims == 1:
                chunks = torch.chunk(full, ctx.size, dim)
                want = (chunks[ctx.rank] if ctx.rank < len(chunks)
                        else full.narrow(dim, 0, 0))
                failures += C.compare_tensors(f"rank {ctx.rank} {shape} Shard({dim}) shard",
                                              [got["braid"]], [want.contiguous()])
            failures += C.compare_tensors(f"rank {ctx.rank} {shape} Shard({dim}) braid vs gloo",
                                          [got["braid"]], [got["gloo"]])
    return {"count": count, "failures": failures, "unsupported": []}


def _pairs(dims):
    """Every (source, target) pair of placements: 16 on a 1-D mesh, 256 on a 2-D one."""
    names = _names()
    if dims == 1:
        return list(itertools.product([(a,) for a in names], [(b,) for b in names]))
    combos = list(itertools.product(names, names))
    return list(itertools.product(combos, combos))


def _names():
    return ("S0", "S1", "R", "P")


def _check(results):
    H.check_reports(results)
    pairs = sorted({p for r in results for p in r["unsupported"]})
    if pairs:
        print(f"DTensor itself refuses (on both backends): {', '.join(pairs)}")


@pytest.mark.parametrize("world", H.sizes(fast=(2, 4), slow=(3,)), indirect=True)
def test_redistribute_1d(world):
    _check(world.run(_redistributions, 1, _pairs(1), timeout=120))


@pytest.mark.parametrize("world", H.sizes(fast=(2, 4), slow=(3,)), indirect=True)
def test_distribute_uneven_1d(world):
    _check(world.run(_distribute_uneven, 1))


@pytest.mark.parametrize("world", [pytest.param(4, id="n4")], indirect=True)
def test_redistribute_2d(world):
    _check(world.run(_redistributions, 2, _pairs(2), timeout=300))


@pytest.mark.parametrize("world", [pytest.param(4, id="n4")], indirect=True)
def test_distribute_uneven_2d(world):
    _check(world.run(_distribute_uneven, 2))


# ---- tensor parallelism ---------------------------------------------------------------------


def _tp_model():
    import torch

    torch.manual_seed(77)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 16))


def _tp_step(ctx, mesh, x, y):
    import torch
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    model = _tp_model()
    if mesh is not None:
        model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().clone())
    params = [p.full_tensor() if hasattr(p, "full_tensor") else p.detach().clone()
              for p in model.parameters()]
    return torch.stack(losses), [p.detach().clone() for p in params]


def _tensor_parallel(ctx):
    torch = ctx.torch
    braid_mesh, gloo_mesh = _meshes(ctx, 1)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)  # same everywhere
    b_loss, b_params = _tp_step(ctx, braid_mesh, x, y)
    g_loss, g_params = _tp_step(ctx, gloo_mesh, x, y)
    r_loss, r_params = _tp_step(ctx, None, x, y)
    tol = None if ctx.size == 2 else C.FP32_TOL
    failures = []
    failures += C.compare_tensors(f"rank {ctx.rank} TP losses braid vs gloo", [b_loss], [g_loss],
                                  tol)
    failures += C.compare_tensors(f"rank {ctx.rank} TP params braid vs gloo", b_params, g_params,
                                  tol)
    failures += C.compare_tensors(f"rank {ctx.rank} TP losses braid vs one process", [b_loss],
                                  [r_loss], C.FP32_TOL)
    failures += C.compare_tensors(f"rank {ctx.rank} TP params braid vs one process", b_params,
                                  r_params, C.FP32_TOL)
    moved = max((p - q).abs().max().item() for p, q in zip(
        b_params, [p.detach() for p in _tp_model().parameters()]))
    if moved < 1e-4:
        failures.append(f"rank {ctx.rank}: the step did not move the parameters ({moved})")
    return {"count": 4 + len(b_params), "failures": failures}


@pytest.mark.parametrize("world", H.sizes(fast=(2, 4), slow=()), indirect=True)
def test_tensor_parallel_colwise_rowwise(world):
    H.check_reports(world.run(_tensor_parallel, timeout=120))


# ---- what the clients expect of the backend ---------------------------------------------------


def _fr_names(ctx):
    """The flight recorder names the mesh's groups as torch does (name, desc, global ranks),
    and records each op under its group."""
    import torch_braid.fr as fr
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    failures = []
    # Off only when asked for (the test skips then): braid's own switch failing is a failure.
    assert fr.enabled(), (f"rank {ctx.rank}: braid's flight recorder is off with "
                          f"BRAID_FR_BUFFER_SIZE={os.environ.get('BRAID_FR_BUFFER_SIZE')!r}")
    braid_mesh, _ = _meshes(ctx, 2)
    d = distribute_tensor(_global(3), braid_mesh, [Shard(0), Shard(1)])
    d.redistribute(braid_mesh, [Replicate(), Replicate()]).to_local()
    dump = fr.entries()
    count = 0
    for dim in range(2):
        g = braid_mesh.get_group(dim)
        name, desc = g.group_name, getattr(g, "group_desc", "")
        cfg = dump["pg_config"].get(name)
        count += 1
        want = {"name": name, "desc": desc, "ranks": str(ctx.dist.get_process_group_ranks(g))}
        if cfg != want:
            failures.append(f"rank {ctx.rank} mesh dim {dim}: pg_config {cfg}, expected {want}")
        ops = [e for e in dump["entries"] if tuple(e.get("process_group", ())) == (name, desc)]
        count += 1
        if not ops:
            failures.append(f"rank {ctx.rank} mesh dim {dim}: no entry under ({name}, {desc})")
    return {"count": count, "failures": failures}


@pytest.mark.braid_only
@pytest.mark.parametrize("world", [pytest.param(4, id="n4")], indirect=True)
def test_flight_recorder_names_mesh_groups(world):
    if os.environ.get("BRAID_FR_BUFFER_SIZE") == "0":
        pytest.skip("the flight recorder is off (BRAID_FR_BUFFER_SIZE=0)")
    H.check_reports(world.run(_fr_names))


def _subgroups_and_mesh(ctx):
    """new_subgroups and a 2-D init_device_mesh on the braid default group, each checked with
    a closed-form all_reduce; and what braid tells torch about splitting."""
    torch, dist = ctx.torch, ctx.dist
    from torch.distributed.device_mesh import init_device_mesh
    import torch.distributed._functional_collectives as fc

    ch = H.Checker(ctx)
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    splits = bool(getattr(be, "supports_splitting", False))
    n, me = ctx.size, ctx.rank
    if "subgroups" not in ctx.cache:
        ctx.cache["subgroups"] = dist.new_subgroups(group_size=2)
    cur, _ = ctx.cache["subgroups"]
    t = torch.tensor([float(me + 1)])
    dist.all_reduce(t, group=cur)
    base = me - me % 2
    ch.equal("new_subgroups all_reduce", t, torch.tensor([float(base + 1 + base + 2)]))
    if "mesh-n2x2" not in ctx.cache:
        ctx.cache["mesh-n2x2"] = init_device_mesh("cpu", (n // 2, 2), mesh_dim_names=("a", "b"))
    mesh = ctx.cache["mesh-n2x2"]
    for dim in range(2):
        got = fc.all_reduce(torch.tensor([float(me + 1)]), "sum", (mesh, dim)).wait()
        ranks = mesh.mesh[:, me % 2] if dim == 0 else mesh.mesh[me // 2, :]
        ch.equal(f"mesh dim {dim} all_reduce", got,
                 torch.tensor([float(sum(r + 1 for r in ranks.tolist()))]))
    return {**ch.report(), "splits": splits}


@pytest.mark.braid_only
@pytest.mark.parametrize("world", H.sizes(fast=(2, 4), slow=()), indirect=True)
def test_new_subgroups_and_mesh(world):
    """torch 2.14 would split subgroups off a default group bound to a device whose backend
    says it supports splitting (new_group, new_subgroups, DeviceMesh). A CPU-only default
    group cannot be bound ("device_id parameter must be an accelerator with an index"), and
    braid says it does not split, so torch makes these groups with new_group: checked here."""
    results = world.run(_subgroups_and_mesh)
    H.check_reports(results)
    assert not any(r["splits"] for r in results), "braid claims supports_splitting"

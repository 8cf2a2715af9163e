"""braid's DDP reducer from Python (torch_braid.ddp.DistributedDataParallel).

Cases run in pooled worlds (harness.py: spawned once, hard deadline per call)
over the default group, i.e. the backend under test (BRAID_TEST_BACKEND: braid,
or gloo), and some over the gloo reference group. Each rank also trains a
reference model alone on the concatenated batch (every rank can rebuild every
rank's data) and, after every step, its gradients must match the reference's
within float tolerance. Error cases compare the exact message text.
"""

import contextlib
import zlib

import pytest

import harness as H

import torch_braid.ddp  # noqa: E402,F401  (an import bug fails, it does not skip)

import torch  # noqa: E402
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

IN, HIDDEN, OUT, BATCH, LR = 6, 10, 3, 5, 0.1
TINY = dict(first_bucket_mb=16 / 2**20, bucket_cap_mb=32 / 2**20)  # ~a bucket per parameter


# ---- models: forward(x, rank, step) ---------------------------------------------

class Mlp(nn.Module):
    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.fc1 = nn.Linear(IN, hidden)
        self.fc2 = nn.Linear(hidden, OUT)

    def forward(self, x, rank=0, step=0):
        return self.fc2(torch.tanh(self.fc1(x)))


class Shared(nn.Module):
    """`mid` is registered twice and applied twice; `out` reuses `inp`'s weight."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(IN, HIDDEN)
        self.mid = nn.Linear(HIDDEN, HIDDEN)
        self.mid_again = self.mid
        self.out = nn.Linear(HIDDEN, OUT)

    def forward(self, x, rank=0, step=0):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.mid_again(torch.tanh(self.mid(h))))
        back = h @ self.inp.weight  # tied: HIDDEN -> IN
        return self.out(h) + back[:, :OUT]


class Branchy(nn.Module):
    """`side`: rank 0 only; `never`: nowhere; `odd`: odd steps only."""

    def __init__(self):
        super().__init__()
        self.main = nn.Linear(IN, OUT)
        self.side = nn.Linear(IN, OUT)
        self.never = nn.Linear(IN, OUT)
        self.odd = nn.Linear(IN, OUT)

    def forward(self, x, rank=0, step=0):
        y = self.main(x)
        if rank == 0:
            y = y + self.side(x)
        if step % 2 == 1:
            y = y + self.odd(x)
        return y


class FixedBranchy(Branchy):
    """Branchy with the same graph at every step (for static_graph)."""

    def forward(self, x, rank=0, step=0):
        return super().forward(x, rank, 0)


class Buffered(nn.Module):
    """Output scaled by a buffer that ranks drift apart between steps."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(IN, OUT)
        self.register_buffer("scale", torch.full((OUT,), 1.5))

    def forward(self, x, rank=0, step=0):
        return self.fc(x) * self.scale


class Chain(nn.Module):
    """Registered c, a, b; used a -> b -> c: gradients ready c (0), b (2), a (1)."""

    def __init__(self):
        super().__init__()
        self.c = nn.Parameter(torch.randn(HIDDEN, OUT) * 0.3)
        self.a = nn.Parameter(torch.randn(IN, HIDDEN) * 0.3)
        self.b = nn.Parameter(torch.randn(HIDDEN, HIDDEN) * 0.3)

    def forward(self, x, rank=0, step=0):
        return torch.tanh(torch.tanh(x @ self.a) @ self.b) @ self.c


MODELS = dict(mlp=Mlp, shared=Shared, branchy=Branchy, fixed_branchy=FixedBranchy,
              buffered=Buffered, chain=Chain)


# ---- worker side -----------------------------------------------------------------

def _data(step, rank):
    g = torch.Generator().manual_seed(zlib.crc32(repr(("reducer", step, rank)).encode()))
    return torch.randn(BATCH, IN, generator=g), torch.randn(BATCH, OUT, generator=g)


def _group(ctx, which):
    return ctx.dist.distributed_c10d._get_default_group() if which == "default" else ctx.ref


class _CppState:
    """A state the way torch_braid.hooks makes them: _cpp_hook() gives the C++ hook."""

    def __init__(self, hook):
        self._hook = hook

    def _cpp_hook(self):
        return self._hook


def _register_hook(ddp, kind, pg):
    from torch_braid import _C

    if kind == "python":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(pg, default_hooks.allreduce_hook)
    elif kind == "cpp":
        ddp.register_comm_hook(_CppState(_C._AllreduceMeanCommHook(pg)), None)
    elif kind == "braid_hooks":
        import torch_braid.hooks as hooks
        ddp.register_comm_hook(hooks.allreduce_state(pg), hooks.allreduce)
    else:
        raise ValueError(kind)


def _zero(model, to_none, keep=()):
    for n, p in model.named_parameters():
        if n in keep or p.grad is None:
            continue
        if to_none:
            p.grad = None
        else:
            p.grad.zero_()


def _sgd(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(p.grad * LR)


def _close(a, b):
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def _train(ctx, model, group="default", steps=4, accumulate=1, to_none=False,
           rank_dependent=False, hook=None, untouched=(), drift=False, expect_rebuilt=None,
           step_shift=0, **options):
    """Trains `model` under braid's DDP and alone on the concatenated batch."""
    from torch_braid.ddp import DistributedDataParallel

    chk = H.Checker(ctx)
    pg = _group(ctx, group)
    n, rank = ctx.size, ctx.rank
    torch.manual_seed(100 + rank)  # different start: DDP must broadcast rank 0's
    local = MODELS[model]()
    torch.manual_seed(100)
    ref = MODELS[model]()
    for name in untouched:  # unused everywhere: must keep this rank's own grad
        p = dict(local.named_parameters())[name]
        p.grad = torch.full_like(p, 7.0 + rank)
    ddp = DistributedDataParallel(local, process_group=pg, **options)
    if hook:
        _register_hook(ddp, hook, pg)
    for s in range(steps):
        _zero(ref, to_none)
        _zero(local, to_none, untouched)
        for a in range(accumulate):
            t = s * accumulate + a + step_shift
            xs, ys = zip(*[_data(t, r) for r in range(n)])
            if rank_dependent:  # mean over the batch == mean of equal shard means
                loss = sum(F.mse_loss(ref(xs[r], r, t), ys[r]) for r in range(n)) / n
            else:
                loss = F.mse_loss(ref(torch.cat(xs), 0, t), torch.cat(ys))
            loss.backward()
            sync = a + 1 == accumulate
            with contextlib.nullcontext() if sync else ddp.no_sync():
                F.mse_loss(ddp(xs[rank], rank, t), ys[rank]).backward()
        ref_params = dict(ref.named_parameters())
        for name, p in local.named_parameters():
            what = f"step {s} {name}.grad"
            if name in untouched:
                chk.true(what, p.grad is not None and torch.equal(
                    p.grad, torch.full_like(p, 7.0 + rank)), "was modified")
                continue
            want = ref_params[name].grad
            if want is None or p.grad is None:
                chk.true(what, want is None and p.grad is None,
                         f"defined: reference {want is not None}, ddp {p.grad is not None}")
            else:
                chk.true(what, _close(p.grad, want),
                         f"max abs diff {(p.grad - want).abs().max().item():.3g}")
        if options.get("gradient_as_bucket_view"):
            # Each bucket's gradients share one storage.
            storages = {}
            for b, members in enumerate(ddp._bucket_indices()):
                params = [p for p in local.parameters() if p.requires_grad]
                names = [n for n, p in local.named_parameters() if p.requires_grad]
                for i in members:
                    g = params[i].grad
                    if g is not None and names[i] not in untouched:
                        storages.setdefault(b, set()).add(_storage_ptr(g))
            chk.true(f"step {s} grads are bucket views", all(len(v) == 1 for v in
                                                             storages.values()), str(storages))
        if expect_rebuilt is not None:
            chk.true(f"step {s} rebuilt", ddp._reducer.buckets_rebuilt() == (s >= 1))
            if s >= 1:
                chk.true("rebuilt order", ddp._bucket_indices() == expect_rebuilt,
                         str(ddp._bucket_indices()))
        _sgd(ref)
        _sgd(local)
        if drift:
            with torch.no_grad():
                local.scale.add_(0.25 + rank)
                ref.scale.add_(0.25)
    for name, p in local.named_parameters():
        if name not in untouched:
            chk.true(f"final {name}", _close(p, dict(ref.named_parameters())[name]))
    return chk.report()


def _storage_ptr(t):
    return (t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()).data_ptr()


def _error_of(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"
    return None


def _shape_mismatch(ctx):
    from torch_braid.ddp import DistributedDataParallel

    torch.manual_seed(1)
    model = Mlp(hidden=10 + 2 * ctx.rank)
    return _error_of(lambda: DistributedDataParallel(model))


def _unfinished(ctx):
    from torch_braid.ddp import DistributedDataParallel

    torch.manual_seed(1)
    model = Branchy()
    ddp = DistributedDataParallel(model)
    x = torch.randn(BATCH, IN)

    def run():
        for _ in range(2):  # uses `main` only, without find_unused_parameters
            ddp(x, 1, 0).sum().backward()
    return _error_of(run)


def _ready_twice(ctx):
    from torch_braid.ddp import DistributedDataParallel

    torch.manual_seed(1)
    model = Mlp()
    ddp = DistributedDataParallel(model)
    x = torch.randn(BATCH, IN)

    def run():
        y = ddp(x)
        model.fc1(x).sum().backward()  # fc1's hooks fire outside ddp's graph...
        y.sum().backward()             # ... and again
    return _error_of(run)


def _static_changed(ctx):
    from torch_braid.ddp import DistributedDataParallel

    torch.manual_seed(1)
    model = Branchy()
    ddp = DistributedDataParallel(model, static_graph=True)
    x = torch.randn(BATCH, IN)

    def run():
        for step in range(2):  # `odd` joins the graph at step 1
            ddp(x, 1, step).sum().backward()
    return _error_of(run)


def _bad_hook(ctx):
    from torch_braid.ddp import DistributedDataParallel

    ddp = DistributedDataParallel(Mlp())
    return [_error_of(lambda: ddp.register_comm_hook(object(), None)),
            _error_of(lambda: DistributedDataParallel(Mlp(), bucket_cap_mb=0))]


def _average_bits(ctx, view, dtype, group="default", hook=None):
    """Gradients after one synced backward, bit for bit: the sum in rank order of each rank's
    own gradient divided by the world size (Note [Averaging inside the allreduce]), whether
    the reducer divides first or the allreduce averages; and which of the two it did."""
    from torch_braid.ddp import DistributedDataParallel

    chk = H.Checker(ctx)
    pg = _group(ctx, group)
    n, rank = ctx.size, ctx.rank
    dt = getattr(torch, dtype)
    torch.manual_seed(100)
    # odd sizes, shares of unequal lengths; fc1's bucket (6 x 3001 + 3001 elements) is past the
    # one-shot threshold, so it takes the registered path (Note [Registered buffers])
    local = Mlp(hidden=3001).to(dt)
    ddp = DistributedDataParallel(local, process_group=pg, gradient_as_bucket_view=view)
    if hook:
        _register_hook(ddp, hook, pg)
    x, y = (t.to(dt) for t in _data(0, rank))
    loss = lambda net: (net(x) - y).square().mean()  # noqa: E731 (mse_loss: no bf16 on 1.13)
    loss(local).backward()  # this rank's own gradient, no communication
    own = [p.grad.clone() for p in local.parameters()]
    for p in local.parameters():
        p.grad = None
    loss(ddp).backward()
    for i, (name, p) in enumerate(local.named_parameters()):
        every = [torch.empty_like(own[i], dtype=torch.float64) for _ in range(n)]
        ctx.dist.all_gather(every, own[i].double(), group=ctx.ref)  # gloo 1.13: no bf16
        every = [e.to(dt) for e in every]
        # braid sums in rank order; bfloat16 in float32, rounded once
        acc = torch.float32 if dt == torch.bfloat16 else dt
        want = (every[0] / n).to(acc)
        for r in range(1, n):
            want = want + (every[r] / n).to(acc)
        want = want.to(dt)
        chk.true(f"{name}.grad bit for bit", torch.equal(p.grad, want),
                 f"max abs diff {(p.grad - want).abs().max().item():.3g}")
    rep = chk.report()
    rep["averaged"] = ddp._reducer.buckets_averaged_in_allreduce()
    rep["registered"] = ddp._reducer.buckets_registered()
    return rep


# ---- tests -------------------------------------------------------------------------

W2 = pytest.mark.parametrize("world", [2], indirect=True)
W3 = pytest.mark.parametrize("world", [3], indirect=True)


def _ok(world, **kwargs):
    H.check_reports(world.run(_train, **kwargs))


@W2
@pytest.mark.parametrize("group", ["default", "gloo"])
def test_mlp_matches_single_process(world, group):
    _ok(world, model="mlp", group=group)


@W3
def test_many_buckets_rebuilt_three_ranks(world):
    _ok(world, model="mlp", **TINY)


@W2
def test_buckets_rebuilt_in_ready_order(world):
    _ok(world, model="chain", expect_rebuilt=[[0], [2], [1]], **TINY)


@W2
@pytest.mark.parametrize("to_none", [False, True], ids=["zeroed", "none"])
def test_gradient_as_bucket_view(world, to_none):
    _ok(world, model="mlp", gradient_as_bucket_view=True, to_none=to_none)  # one bucket


@W2
def test_shared_parameters(world):
    _ok(world, model="shared", **TINY)


@W2
@pytest.mark.parametrize("view", [False, True], ids=["copy", "view"])
def test_unused_parameters(world, view):
    _ok(world, model="branchy", rank_dependent=True, find_unused_parameters=True, to_none=True,
        gradient_as_bucket_view=view, untouched=("never.weight",), **TINY)


@W2
def test_static_graph(world):
    # Rank-dependent but fixed graph: `side` on rank 0 only, `odd` and `never` unused.
    _ok(world, model="fixed_branchy", rank_dependent=True, static_graph=True, steps=3, **TINY)


@W2
def test_buffers_broadcast_before_forward(world):
    _ok(world, model="buffered", drift=True)


@W2
@pytest.mark.parametrize("view", [False, True], ids=["copy", "view"])
def test_no_sync_accumulation(world, view):
    _ok(world, model="mlp", accumulate=3, gradient_as_bucket_view=view, **TINY)


@W2
def test_no_sync_with_unused_parameters(world):
    # `odd` is used only in the no_sync micro-steps (t = 2s + 1): its accumulated
    # gradient must still be reduced by the synced step.
    _ok(world, model="branchy", rank_dependent=True, accumulate=2, to_none=True,
        find_unused_parameters=True, step_shift=1)


@pytest.mark.parametrize("world", [2, 3, 4], indirect=True)
@pytest.mark.parametrize("view", [False, True], ids=["copy", "view"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_average_bits(world, view, dtype):
    """A braid group averages inside the allreduce exactly where that gives the bits of
    dividing first: a power-of-two world, a float32 or float64 bucket."""
    if H.BACKEND != "braid":
        pytest.skip("the expected bits are braid's order of summation")
    reports = world.run(_average_bits, view=view, dtype=dtype)
    H.check_reports(reports)
    n = len(reports)
    fused = n & (n - 1) == 0 and dtype != "bfloat16"
    for rep in reports:
        assert rep["averaged"] == [fused] * len(rep["averaged"]), rep
        assert rep["registered"] and all(rep["registered"]), rep


@W2
@pytest.mark.parametrize("group,hook", [("gloo", None), ("default", "cpp")], ids=["gloo", "hook"])
def test_average_bits_divides_first(world, group, hook):
    """gloo has no AVG, and a comm hook decides the averaging itself: the divide pass stays."""
    reports = world.run(_average_bits, view=True, dtype="float32", group=group, hook=hook)
    H.check_reports(reports)
    for rep in reports:
        assert rep["averaged"] and not any(rep["averaged"]), rep
        # braid's buckets are registered with or without a hook; gloo's are ordinary memory
        assert rep["registered"] == [group == "default" and H.BACKEND == "braid"] * len(
            rep["registered"]), rep


@W2
@pytest.mark.parametrize("hook", ["python", "cpp", "braid_hooks"])
def test_comm_hooks(world, hook):
    _ok(world, model="mlp", hook=hook, **TINY)


@W2
def test_error_shape_mismatch(world):
    for rank, msg in enumerate(world.run(_shape_mismatch)):
        assert msg == (
            f"RuntimeError: braid ddp (rank {rank}): parameter 'fc1.weight' (index 0) differs "
            "across ranks: [10, 6] (Float) on rank 0 but [12, 6] (Float) on rank 1 (every rank "
            "must wrap the same model, with parameters in the same order)")


@W2
def test_error_unfinished_reduction(world):
    for rank, msg in enumerate(world.run(_unfinished)):
        assert msg == (
            f"RuntimeError: braid ddp (rank {rank}): expected to have finished reducing gradients "
            "in the prior iteration before starting a new one. Parameters that did not get a "
            f"gradient on rank {rank}: side.weight (index 2), side.bias (index 3), never.weight "
            "(index 4), never.bias (index 5), odd.weight (index 6), odd.bias (index 7). If your "
            "model has parameters that are not used to produce the loss, pass "
            "find_unused_parameters=true to DistributedDataParallel, and make sure every output "
            "of forward() takes part in the loss.")


@W2
def test_error_marked_ready_twice(world):
    for rank, msg in enumerate(world.run(_ready_twice)):
        assert msg.startswith(
            f"RuntimeError: braid ddp (rank {rank}): parameter 'fc1.bias' (index 1) was marked "
            "ready twice in one backward pass"), msg


@W2
def test_error_static_graph_changed(world):
    for rank, msg in enumerate(world.run(_static_changed)):
        assert msg.startswith(
            f"RuntimeError: braid ddp (rank {rank}): the autograd graph changed under "
            "static_graph=true: parameter 'odd."), msg
        assert "got 1 gradient hooks in this backward vs 0 in the first iteration" in msg, msg


@W2
def test_error_bad_arguments(world):
    for msgs in world.run(_bad_hook):
        assert msgs[0] == (
            "TypeError: register_comm_hook needs a state with _cpp_hook() (torch_braid.hooks) "
            "or a callable hook; got state=object, hook=None")
        assert msgs[1] == ("ValueError: bucket sizes must be positive: bucket_cap_mb=0, "
                           "first_bucket_mb=1")

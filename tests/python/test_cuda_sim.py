"""CUDA tensors on braid's simulated device (Note [Simulated CUDA in tests]).

Each rank registers braid's simulated CUDA device (braid_sim.install)
in its own process: "CUDA" tensors live in host memory, streams are threads, and
braid's real CUDA path runs, with CUDA's ordering rules (Note [The staged CUDA
executor] in csrc/c10d/cuda/cuda_op.h). Rank r uses device r % 2. Data goes in and out
through braid_sim.write/read, in the order of the current stream, as a user's kernels
would. Results are checked against the harness's closed forms.

Every case also checks the group's CUDA executor (staged: these ranks load no NCCL)
and the ops and bytes it counted against what the case's ops imply (tests/python/
cuda_counts.py), so that an op that silently ran elsewhere fails.

Ordering: test_waits_for_the_callers_stream fails if braid's comm stream does not
wait on the caller's current stream before copying the inputs; test_result_visible_on
_the_callers_stream fails if the caller can see an op complete before the copies back
to the device have run (the end event of step 3, or Work.wait's stream block).
"""

import pytest

import cuda_counts as C
import harness as H

pytestmark = [
    pytest.mark.braid_only,
    # On a GPU, test_cuda_ddp.py and tools/gpu_smoke.py run the real device.
    H.simulated_cuda_only(),
]

SIM_DEVICES = 2


def _sim(ctx):
    import braid_sim

    braid_sim.install(SIM_DEVICES)
    return braid_sim


def _dev(ctx):
    return ctx.rank % SIM_DEVICES


def _to_dev(sim, t, device):
    d = sim.empty(list(t.shape), t.dtype, device)
    sim.write(d, t)
    return d


def _collectives(ctx, dtype_name, counts):
    torch, dist = ctx.torch, ctx.dist
    sim = _sim(ctx)
    ch = H.Checker(ctx)
    dtype = getattr(torch, dtype_name)
    dev, n, r = _dev(ctx), ctx.size, ctx.rank
    backend = C.backend(ctx, torch.device("cuda", dev))
    ops = ["SUM", "MAX"] + (["AVG", "PREMUL_SUM"] if dtype.is_floating_point else ["BXOR"] if
                            dtype != torch.bool else [])
    for count in counts:
        # Per rank: b bytes in and out of each op's own block (staged: every input
        # copied to a shadow, every output copied back).
        b = count * torch.empty(0, dtype=dtype).element_size()
        exp, before = C.Expected(), C.snapshot(backend)
        for op in ops:
            what = f"all_reduce {dtype_name} {op} count={count}"
            base = "SUM" if op in ("AVG", "PREMUL_SUM") else op
            inputs = [H.make_input(q, count, dtype, base) for q in range(n)]
            t = _to_dev(sim, inputs[r], dev)
            work = dist.all_reduce(t, op=H.reduce_op(op), async_op=True)
            work.wait()
            exp.staged(d2h=b, h2d=b)
            ch.reduced(what, sim.read(t), H.closed_form(inputs, op, n), op)
        # broadcast from every root
        for root in range(n):
            t = _to_dev(sim, H.pattern(r, 0, count, dtype), dev)
            dist.broadcast(t, src=root)
            exp.staged(d2h=b, h2d=b)  # every rank stages in and copies back
            ch.equal(f"broadcast root={root} count={count}", sim.read(t),
                     H.pattern(root, 0, count, dtype))
        # reduce to rank n-1
        inputs = [H.make_input(q, count, dtype, "SUM", salt=3) for q in range(n)]
        t = _to_dev(sim, inputs[r], dev)
        dist.reduce(t, dst=n - 1)
        exp.staged(d2h=b, h2d=b if r == n - 1 else 0)
        if r == n - 1:
            ch.equal(f"reduce count={count}", sim.read(t), H.closed_form(inputs, "SUM", n))
        # allgather, list and flat forms
        src = _to_dev(sim, H.pattern(r, 1, count, dtype), dev)
        outs = [sim.empty([count], dtype, dev) for _ in range(n)]
        dist.all_gather(outs, src)
        exp.staged(d2h=b, h2d=n * b)
        for q in range(n):
            ch.equal(f"all_gather[{q}] count={count}", sim.read(outs[q]),
                     H.pattern(q, 1, count, dtype))
        flat = sim.empty([n * count], dtype, dev)
        dist.all_gather_into_tensor(flat, src)
        exp.staged(d2h=b, h2d=n * b)
        ch.equal(f"all_gather_into_tensor count={count}", sim.read(flat),
                 torch.cat([H.pattern(q, 1, count, dtype) for q in range(n)]))
        # reduce_scatter, flat form
        if dtype != torch.bool:
            full = [H.make_input(q, n * count, dtype, "SUM", salt=5) for q in range(n)]
            inp = _to_dev(sim, full[r], dev)
            out = sim.empty([count], dtype, dev)
            dist.reduce_scatter_tensor(out, inp)
            exp.staged(d2h=n * b, h2d=b)
            ch.equal(f"reduce_scatter_tensor count={count}", sim.read(out),
                     H.closed_form(full, "SUM", n)[r * count:(r + 1) * count])
        # alltoall, flat form: block q of rank r's input goes to rank q
        inp = _to_dev(sim, torch.cat([H.pattern(r, q, count, dtype) for q in range(n)]), dev)
        out = sim.empty([n * count], dtype, dev)
        dist.all_to_all_single(out, inp)
        exp.staged(d2h=n * b, h2d=n * b)
        ch.equal(f"all_to_all_single count={count}", sim.read(out),
                 torch.cat([H.pattern(q, r, count, dtype) for q in range(n)]))
        # gather and scatter at root 0
        src = _to_dev(sim, H.pattern(r, 2, count, dtype), dev)
        glist = [sim.empty([count], dtype, dev) for _ in range(n)] if r == 0 else None
        dist.gather(src, glist, dst=0)
        exp.staged(d2h=b, h2d=n * b if r == 0 else 0)
        if r == 0:
            for q in range(n):
                ch.equal(f"gather[{q}] count={count}", sim.read(glist[q]),
                         H.pattern(q, 2, count, dtype))
        slist = ([_to_dev(sim, H.pattern(q, 3, count, dtype), dev) for q in range(n)]
                 if r == 0 else None)
        out = sim.empty([count], dtype, dev)
        dist.scatter(out, slist, src=0)
        exp.staged(d2h=n * b if r == 0 else 0, h2d=b)
        ch.equal(f"scatter count={count}", sim.read(out), H.pattern(r, 3, count, dtype))
        C.check(ch, f"{dtype_name} count={count}", backend, before, exp, "staged")
    return ch.report()


@pytest.mark.parametrize("dtype", H.dtypes(fast=("float32", "bfloat16", "int64", "bool"),
                                           slow=("float64", "float16", "int8", "uint8",
                                                 "int16", "int32")))
@pytest.mark.parametrize("world", [pytest.param((n, "cuda"), id=f"n{n}") for n in (1, 2, 3, 4)],
                         indirect=True)
def test_collectives(world, dtype):
    H.check_reports(world.run(_collectives, dtype, (0, 1, 1023)))


def _send_recv(ctx, count):
    torch, dist = ctx.torch, ctx.dist
    sim = _sim(ctx)
    ch = H.Checker(ctx)
    dev, n, r = _dev(ctx), ctx.size, ctx.rank
    # A ring: each rank sends to the next and receives from the previous.
    send = _to_dev(sim, H.pattern(r, 9, count, torch.float32), dev)
    recv = sim.empty([count], torch.float32, dev)
    backend = C.chosen_backend(ctx, torch.device("cuda", dev))
    before = C.snapshot(backend)
    reqs = [dist.isend(send, (r + 1) % n), dist.irecv(recv, (r - 1) % n)]
    for q in reqs:
        q.wait()
    # Two staged ops: the send's tensor to its shadow, the message back into recv.
    C.check(ch, "send/recv", backend, before,
            C.Expected().staged(d2h=4 * count).staged(h2d=4 * count), "staged")
    ch.equal(f"send/recv count={count}", sim.read(recv), H.pattern((r - 1) % n, 9, count,
                                                                         torch.float32))
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((n, "cuda"), id=f"n{n}") for n in (2, 3)],
                         indirect=True)
def test_send_recv(world):
    H.check_reports(world.run(_send_recv, 4099))


def _waits_for_callers_stream(ctx, count):
    torch, dist = ctx.torch, ctx.dist
    sim = _sim(ctx)
    ch = H.Checker(ctx)
    dev, n, r = _dev(ctx), ctx.size, ctx.rank
    t = _to_dev(sim, torch.zeros(count), dev)
    dist.all_reduce(t)  # the group's CUDA state exists from here
    # The caller's stream is slow: the new input lands 50 ms after it was
    # enqueued. An executor that copies the input without waiting on the
    # caller's stream reads the zeros.
    backend = C.backend(ctx, torch.device("cuda", dev))
    before = C.snapshot(backend)
    sim.delay_current_stream(dev, 50_000)
    sim.write(t, torch.full((count,), float(r + 1)))
    sim.delay_current_stream(dev, 0)
    dist.all_reduce(t)
    C.check(ch, "all_reduce after a slow write", backend, before,
            C.Expected().staged(d2h=4 * count, h2d=4 * count), "staged")
    ch.equal("all_reduce after a slow write on the caller's stream", sim.read(t),
             torch.full((count,), float(n * (n + 1) // 2)))
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((2, "cuda"), id="n2")], indirect=True)
def test_waits_for_the_callers_stream(world):
    H.check_reports(world.run(_waits_for_callers_stream, 1 << 16))


def _result_visible(ctx, count, use_future):
    torch, dist = ctx.torch, ctx.dist
    sim = _sim(ctx)
    ch = H.Checker(ctx)
    dev, n, r = _dev(ctx), ctx.size, ctx.rank
    t = _to_dev(sim, torch.full((count,), float(r + 1)), dev)
    dist.all_reduce(t)  # makes the group's CUDA state, then slow it down
    group = dist.distributed_c10d._get_default_group()
    # torch 2.x: the group holds braid per device; 1.13: the group is braid.
    backend = group._get_backend(torch.device("cuda", dev)) if ctx.torch2 else group
    sim.delay_comm_stream(backend, 30_000)
    sim.write(t, torch.full((count,), float(r + 1)))
    before = C.snapshot(backend)
    work = dist.all_reduce(t, async_op=True)
    if use_future:
        value = work.get_future().wait()
        ch.true("future value is the tensor", value[0].data_ptr() == t.data_ptr(),
                f"{value[0].data_ptr()} != {t.data_ptr()}")
    else:
        work.wait()
    # Read on the caller's stream right away: the result must be there.
    ch.equal("result on the caller's stream after wait()", sim.read(t),
             torch.full((count,), float(n * (n + 1) // 2)))
    C.check(ch, "all_reduce on a slow comm stream", backend, before,
            C.Expected().staged(d2h=4 * count, h2d=4 * count), "staged")
    sim.delay_comm_stream(backend, 0)
    return ch.report()


@pytest.mark.parametrize("use_future", [False, True], ids=["work", "future"])
@pytest.mark.parametrize("world", [pytest.param((2, "cuda"), id="n2")], indirect=True)
def test_result_visible_on_the_callers_stream(world, use_future):
    H.check_reports(world.run(_result_visible, 1 << 16, use_future))


def _bad_input(ctx):
    torch, dist = ctx.torch, ctx.dist
    sim = _sim(ctx)
    ch = H.Checker(ctx)
    dev, r = _dev(ctx), ctx.rank
    t = sim.empty([8], torch.float32, dev)
    dist.all_reduce(t)  # binds the group to cuda:dev
    backend = C.backend(ctx, torch.device("cuda", dev))
    before = C.snapshot(backend)

    def error_of(fn):
        try:
            fn()
        except RuntimeError as e:
            return str(e)
        return ""

    other = sim.empty([8], torch.float32, (dev + 1) % SIM_DEVICES)
    msg = error_of(lambda: dist.all_reduce(other))
    ch.true("another device is refused", f"rank {r}" in msg and f"cuda:{dev}" in msg
            and f"cuda:{(dev + 1) % SIM_DEVICES}" in msg, msg)
    out = torch.zeros(8 * ctx.size)
    msg = error_of(lambda: dist.all_gather_into_tensor(out, t))
    ch.true("CPU and CUDA mixed in one call are refused", "one device" in msg and "cpu" in msg
            and f"cuda:{dev}" in msg and "all" in msg, msg)
    strided = sim.empty([4, 4], torch.float32, dev, [1, 4])  # a transpose's layout
    msg = error_of(lambda: dist.all_reduce(strided))
    ch.true("a non-contiguous CUDA tensor is refused", "contiguous" in msg and f"rank {r}" in msg,
            msg)
    # The group still works: the refused calls told the peers (poison headers).
    t2 = _to_dev(sim, torch.ones(8), dev)
    dist.all_reduce(t2)
    ch.equal("the group works after refused calls", sim.read(t2),
             torch.full((8,), float(ctx.size)))
    C.check(ch, "refused calls stage nothing", backend, before,
            C.Expected().staged(d2h=32, h2d=32), "staged")
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((2, "cuda"), id="n2")], indirect=True)
def test_bad_input_names_op_rank_and_devices(world):
    H.check_reports(world.run(_bad_input))


def _cpu_and_cuda_side_by_side(ctx):
    torch, dist = ctx.torch, ctx.dist
    sim = _sim(ctx)
    ch = H.Checker(ctx)
    dev, n, r = _dev(ctx), ctx.size, ctx.rank
    backend = C.backend(ctx, torch.device("cuda", dev))
    before = C.snapshot(backend)
    works = []
    for i in range(6):
        if i % 2:
            t = _to_dev(sim, torch.full((100,), float(r + i)), dev)
        else:
            t = torch.full((100,), float(r + i))
        works.append((t, dist.all_reduce(t, async_op=True), i))
    for t, w, i in works:
        w.wait()
        got = sim.read(t) if t.is_cuda else t
        ch.equal(f"op {i} ({t.device})", got,
                 torch.full((100,), float(n * (n - 1) // 2 + n * i)))
    # The three CUDA ops staged; the CPU ones never touch the device.
    C.check(ch, "CPU and CUDA ops", backend, before,
            C.Expected().staged(d2h=400, h2d=400, ops=3), "staged")
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((3, "cuda"), id="n3")], indirect=True)
def test_cpu_and_cuda_ops_in_one_group(world):
    H.check_reports(world.run(_cpu_and_cuda_side_by_side))


def _coalesced(ctx):
    torch, dist = ctx.torch, ctx.dist
    sim = _sim(ctx)
    ch = H.Checker(ctx)
    dev, n, r = _dev(ctx), ctx.size, ctx.rank
    # The list forms pack on the worker, where the CUDA values have reached their shadows.
    counts = (0, 1, 1023)
    ins = [_to_dev(sim, H.pattern(r, k, c, torch.float32), dev) for k, c in enumerate(counts)]
    outs = [[sim.empty([c], torch.float32, dev) for c in counts] for _ in range(n)]
    backend = C.chosen_backend(ctx, torch.device("cuda", dev))
    before = C.snapshot(backend)
    dist.all_gather_coalesced(outs, ins)
    # One staged op for the list: every input in, every output back.
    C.check(ch, "all_gather_coalesced", backend, before,
            C.Expected().staged(d2h=4 * sum(counts), h2d=4 * n * sum(counts)), "staged")
    for q in range(n):
        for k, c in enumerate(counts):
            ch.equal(f"all_gather_coalesced[{q}][{k}]", sim.read(outs[q][k]),
                     H.pattern(q, k, c, torch.float32))
    if hasattr(dist, "all_reduce_coalesced"):
        # Where torch has the entry point it reaches braid's allreduce_coalesced (torch 1.13
        # and 2.6 register its kernel for CUDA tensors): any error is a failure, shown whole.
        ts = [_to_dev(sim, torch.full((c,), float(r + 1)), dev) for c in counts]
        dist.all_reduce_coalesced(ts)
        for k, c in enumerate(counts):
            ch.equal(f"all_reduce_coalesced[{k}]", sim.read(ts[k]),
                     torch.full((c,), float(n * (n + 1) // 2)))
        C.check(ch, "all_gather_coalesced, all_reduce_coalesced", backend, before,
                C.Expected().staged(d2h=4 * sum(counts), h2d=4 * n * sum(counts))
                .staged(d2h=4 * sum(counts), h2d=4 * sum(counts)), "staged")
    return ch.report()


@pytest.mark.parametrize("world", [pytest.param((n, "cuda"), id=f"n{n}") for n in (1, 3)],
                         indirect=True)
def test_coalesced_list_forms(world):
    H.check_reports(world.run(_coalesced))

#!/usr/bin/env python3
"""CUDA smoke test for braid: collectives on CUDA tensors checked against closed forms, and a
few DDP steps on CUDA compared with gloo's CUDA run, in worlds of 1, 2 and 4 ranks.

    python tools/gpu_smoke.py                      # worlds 1,2,4 on CUDA (rank r on GPU r % ngpu)
    python tools/gpu_smoke.py --world 4 --ddp-steps 10
    python tools/gpu_smoke.py --device cpu --world 2   # the same checks on braid's CPU path
    python tools/gpu_smoke.py --dry-run            # print the plan, spawn nothing

Run by tools/gpu_check.sh on the GPU machine. With one GPU, world 1 is braid's NCCL executor
and worlds 2, 4 and 8 put every rank on the one GPU (braid's same-GPU collectives over CUDA
IPC, a layout NCCL refuses). Exit codes: 0 every check passed; 1 a check failed or a rank crashed or hung;
77 skipped (--device cuda and no CUDA device: the reason is printed); 2 bad arguments.

What is checked, per world (each rank r on its device, inputs x_r[i] = r + 1 + i % 5):
  - all_reduce SUM, MAX and AVG (floating types), broadcast from the last rank,
    all_gather_into_tensor and all_gather (list), reduce_scatter_tensor, for fp32, fp64, fp16,
    bf16, int32 and int64 at 1, 5, 1003 and 2^20 + 7 elements (and 2^24 fp32 elements with
    --large): every element compared exactly (the values are small integers and halves, exact
    in every type);
  - stream order (CUDA only): an input written by the current stream behind a ~30 ms
    torch.cuda._sleep, reduced, then read by the current stream without a synchronize, on the
    default stream and on a side stream; async_op=True with wait() and with get_future();
  - barrier;
  - DDP: --ddp-steps SGD steps of a small MLP under DistributedDataParallel (device_ids set on
    CUDA) on braid and on gloo from the same initial weights and data; the parameters must agree
    with gloo's within 1e-5, and braid's replicas must be equal on every rank.
A wrong value does not end the world (the ranks stay in step); an exception does: the rank
prints it, and the world is stopped.
"""

import argparse
import copy
import datetime
import faulthandler
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The in-tree package (setup.py build_ext --inplace) when torch_braid is not installed.
sys.path.append(os.path.join(REPO, "python"))

SKIP = 77
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
COUNTS = (1, 5, 1003, (1 << 20) + 7)
LARGE = 1 << 24
OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "stream", "async", "barrier",
       "ddp")
SLEEP_CYCLES = 50_000_000  # torch.cuda._sleep: ~30 ms at H100 clocks


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", default=None,
                   help="comma list of world sizes (default: 1,2,4 on cuda, 2 on cpu)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--backend", default="braid",
                   help="init_process_group's backend string (e.g. braid, cpu:braid,cuda:braid)")
    p.add_argument("--compare", default="gloo", help="backend the DDP run is compared with")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--large", action="store_true", help=f"add {LARGE} fp32 elements")
    p.add_argument("--ddp-steps", type=int, default=5)
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds per world before its ranks are stopped (stacks are printed)")
    p.add_argument("--json", default=None, help="write every world's result here")
    p.add_argument("--inject-wrong-result", action="store_true",
                   help="testing only: the last rank corrupts one element of its first "
                        "all_reduce output, to show that the check fails")
    p.add_argument("--dry-run", action="store_true",
                   help="check the arguments and imports, print the plan, spawn nothing")
    args = p.parse_args(argv)
    args.world = [int(w) for w in (args.world or ("1,2,4" if args.device == "cuda" else "2"))
                  .split(",") if w.strip()]
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for o in args.ops:
        if o not in OPS:
            p.error(f"unknown op {o!r}; choose from {','.join(OPS)}")
    for d in args.dtypes:
        if d not in DTYPES:
            p.error(f"unknown dtype {d!r}; choose from {','.join(DTYPES)}")
    if any(w < 1 for w in args.world):
        p.error("world sizes must be >= 1")
    return args


# ---- checks (in the ranks) -----------------------------------------------------------------------
class Checks:
    """Counts passed checks; keeps the first few failures' messages."""

    def __init__(self, rank):
        self.rank, self.passed, self.failed = rank, 0, []

    def equal(self, what, got, want):
        import torch

        # Compared where the output lives, in the current stream's order: an op whose result
        # is not ready for the current stream shows up here as wrong values.
        g, w = got.detach(), want.detach().to(got.device)
        if g.shape != w.shape:
            self.fail(f"{what}: shape {tuple(g.shape)}, expected {tuple(w.shape)}")
            return
        if g.dtype != w.dtype:
            self.fail(f"{what}: dtype {g.dtype}, expected {w.dtype}")
            return
        bad = g.double() != w.double()
        if g.dtype.is_floating_point:
            bad |= torch.isnan(g.double())
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            n_bad = int(bad.sum())
            self.fail(f"{what}: {n_bad} of {g.numel()} elements wrong; element {i} is "
                      f"{g.flatten()[i].item()!r}, expected {w.flatten()[i].item()!r} (and "
                      f"{torch.unique(g.flatten()[bad.flatten()])[:5].tolist()} among the wrong)")
        else:
            self.passed += 1

    def close(self, what, got, want, atol):
        diff = (got.detach().double().cpu() - want.detach().double().cpu()).abs().max().item()
        if not diff <= atol:
            self.fail(f"{what}: max |difference| {diff:.3g} > {atol:g}")
        else:
            self.passed += 1
        return diff

    def fail(self, msg):
        self.failed.append(f"rank {self.rank}: {msg}")


def pattern(count, offset, dev, dtype):
    """i % 5 for i in [offset, offset + count), as dtype on dev."""
    import torch

    return ((torch.arange(count, device=dev, dtype=torch.int64) + offset) % 5).to(dtype)


def check_allreduce(ctx, dtype, count):
    import torch
    import torch.distributed as dist

    r, n, dev, ck = ctx.rank, ctx.n, ctx.dev, ctx.checks
    ops = [("SUM", dist.ReduceOp.SUM, n * (n + 1) / 2, n), ("MAX", dist.ReduceOp.MAX, n, 1)]
    if dtype.is_floating_point and hasattr(dist.ReduceOp, "AVG") and ctx.avg:
        ops.append(("AVG", dist.ReduceOp.AVG, (n + 1) / 2, 1))
    for name, op, base, scale in ops:
        x = pattern(count, 0, dev, dtype) + (r + 1)
        dist.all_reduce(x, op=op)
        if ctx.inject and r == n - 1:
            x[0] += 1
            ctx.inject = False
        want = (pattern(count, 0, dev, torch.float64) * scale + base).to(dtype)
        ck.equal(f"all_reduce {name} {dtype} x{count}", x, want)


def check_broadcast(ctx, dtype, count):
    import torch.distributed as dist

    r, n, dev = ctx.rank, ctx.n, ctx.dev
    root = n - 1
    x = pattern(count, 0, dev, dtype) + (r + 1) if r == root else \
        pattern(count, 0, dev, dtype).fill_(-7)
    dist.broadcast(x, root)
    ctx.checks.equal(f"broadcast from {root} {dtype} x{count}", x,
                     pattern(count, 0, dev, dtype) + n)


def all_gather_into(out, inp):
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    fn(out, inp)


def reduce_scatter_into(out, inp):
    import torch.distributed as dist

    fn = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    fn(out, inp)


def check_allgather(ctx, dtype, count):
    import torch
    import torch.distributed as dist

    r, n, dev = ctx.rank, ctx.n, ctx.dev
    x = pattern(count, 0, dev, dtype) + (r + 1)
    out = torch.full((n * count,), -7, dtype=dtype, device=dev)
    all_gather_into(out, x)
    want = torch.cat([pattern(count, 0, dev, dtype) + (q + 1) for q in range(n)])
    ctx.checks.equal(f"all_gather_into_tensor {dtype} x{count}", out, want)
    outs = [torch.full((count,), -7, dtype=dtype, device=dev) for _ in range(n)]
    dist.all_gather(outs, x)
    ctx.checks.equal(f"all_gather(list) {dtype} x{count}", torch.cat(outs), want)


def check_reduce_scatter(ctx, dtype, count):
    import torch

    r, n, dev = ctx.rank, ctx.n, ctx.dev
    x = pattern(n * count, 0, dev, dtype) + (r + 1)
    out = torch.full((count,), -7, dtype=dtype, device=dev)
    reduce_scatter_into(out, x)
    want = (pattern(count, r * count, dev, torch.float64) * n + n * (n + 1) / 2).to(dtype)
    ctx.checks.equal(f"reduce_scatter_tensor {dtype} x{count}", out, want)


def check_stream_order(ctx):
    """An input the current stream writes late must be what the collective reads, and its
    output what the current stream reads next (no synchronize in between)."""
    import torch
    import torch.distributed as dist

    r, n, dev, count = ctx.rank, ctx.n, ctx.dev, (1 << 20) + 3
    want = (pattern(count, 0, dev, torch.float64) * n + n * (n + 1) / 2).float()
    for where in ("current stream", "side stream"):
        side = torch.cuda.Stream(device=dev) if where == "side stream" else None
        x = torch.full((count,), -7.0, device=dev)
        torch.cuda.synchronize(dev)
        with torch.cuda.stream(side) if side is not None else _nullcontext():
            torch.cuda._sleep(SLEEP_CYCLES)  # the fill below lands ~30 ms from now
            x.copy_(pattern(count, 0, dev, torch.float32) + (r + 1))
            dist.all_reduce(x)
            y = x * 1  # the current stream reads the output at once
        if side is not None:
            torch.cuda.current_stream(dev).wait_stream(side)
        ctx.checks.equal(f"stream order ({where}) all_reduce fp32 x{count}", y, want)


def check_async(ctx):
    import torch
    import torch.distributed as dist

    r, n, dev, count = ctx.rank, ctx.n, ctx.dev, 4099
    want = (pattern(count, 0, dev, torch.float64) * n + n * (n + 1) / 2).float()
    x = pattern(count, 0, dev, torch.float32) + (r + 1)
    if dev.type == "cuda":
        torch.cuda._sleep(SLEEP_CYCLES // 4)
    w = dist.all_reduce(x, async_op=True)
    w.wait()
    ctx.checks.equal(f"async all_reduce + wait() fp32 x{count}", x * 1, want)
    x = pattern(count, 0, dev, torch.float32) + (r + 1)
    fut = dist.all_reduce(x, async_op=True).get_future()
    val = fut.wait()
    got = val[0] if isinstance(val, (list, tuple)) else val
    ctx.checks.equal(f"async all_reduce + get_future().wait() fp32 x{count}", got * 1, want)
    # Several ops in flight at once, waited in reverse order.
    xs = [pattern(count, 0, dev, torch.float32) + (r + 1) for _ in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in xs]
    for w in reversed(works):
        w.wait()
    ctx.checks.equal(f"4 async all_reduce in flight fp32 x{count}", torch.cat(xs),
                     want.repeat(4))


def check_barrier(ctx):
    import torch.distributed as dist

    # Rank 0 enters late; no rank may leave before it entered.
    if ctx.rank == 0:
        time.sleep(0.2)
    t_enter = time.time() if ctx.rank == 0 else 0.0
    dist.barrier()
    t_exit = time.time()
    entered = gather_cpu(ctx, [t_enter])[0][0]
    if t_exit < entered - 0.01:
        ctx.checks.fail(f"barrier: left {1e3 * (entered - t_exit):.1f} ms before rank 0 entered")
    else:
        ctx.checks.passed += 1


def gather_cpu(ctx, values):
    """Every rank's list of floats, through the comparison (gloo) group on CPU tensors."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    out = [torch.zeros_like(t) for _ in range(ctx.n)]
    dist.all_gather(out, t, group=ctx.ref)
    return [o.tolist() for o in out]


def check_ddp(ctx, steps):
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = ctx.dev
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 8))
    params = {}
    for name, group in (("braid", None), ("ref", ctx.ref)):
        model = copy.deepcopy(base).to(dev)
        kw = {"device_ids": [dev.index]} if dev.type == "cuda" else {}
        net = DDP(model, process_group=group, **kw)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(1000 + ctx.rank)
        for _ in range(steps):
            x = torch.randn(16, 32, generator=g).to(dev)
            y = torch.randn(16, 8, generator=g).to(dev)
            opt.zero_grad()
            nn.functional.mse_loss(net(x), y).backward()
            opt.step()
        params[name] = torch.cat([p.detach().double().flatten().cpu()
                                  for p in model.parameters()])
        del net, opt, model
    diff = ctx.checks.close(f"DDP {steps} steps: braid's parameters against {ctx.ref_name}'s",
                            params["braid"], params["ref"], 1e-5)
    sums = gather_cpu(ctx, [float(params["braid"].sum()), float(params["braid"].abs().sum())])
    if any(s != sums[0] for s in sums):
        ctx.checks.fail(f"DDP: braid's replicas differ across ranks: {sums}")
    else:
        ctx.checks.passed += 1
    ctx.ddp_diff = diff


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class Ctx:
    pass


def rank_main(rank, args, n, store_dir):
    """One rank: run every check, write the result (rank 0), exit without finalization."""
    faulthandler.enable()
    # Print every thread's stack shortly before the parent stops the world.
    faulthandler.dump_traceback_later(max(args.timeout - 10, 5), exit=False)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    ctx = Ctx()
    ctx.rank, ctx.n, ctx.checks, ctx.ddp_diff = rank, n, Checks(rank), None
    ctx.ref_name = args.compare
    ctx.avg = not args.backend.startswith("gloo")  # gloo has no ReduceOp.AVG
    ctx.inject = args.inject_wrong_result
    rc, current = 0, "init"
    t0 = time.time()
    try:
        if args.device == "cuda":
            ctx.dev = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(ctx.dev)
        else:
            ctx.dev = torch.device("cpu")
        if "braid" in args.backend + args.compare:
            import torch_braid  # noqa: F401  registers "braid"

        timeout = datetime.timedelta(seconds=max(args.timeout - 20, 10))
        init = "file://" + os.path.join(store_dir, "store")
        dist.init_process_group(args.backend, init_method=init, rank=rank, world_size=n,
                                timeout=timeout)
        ctx.ref = dist.new_group(backend=args.compare, timeout=timeout)
        dtypes = [getattr(torch, d) for d in args.dtypes]
        per_type = {"allreduce": check_allreduce, "broadcast": check_broadcast,
                    "allgather": check_allgather, "reduce_scatter": check_reduce_scatter}
        for op in args.ops:
            current = op
            if op in per_type:
                for dtype in dtypes:
                    for count in COUNTS:
                        per_type[op](ctx, dtype, count)
                    if args.large and dtype == torch.float32:
                        per_type[op](ctx, dtype, LARGE // (n if op == "reduce_scatter" else 1))
            elif op == "stream":
                if ctx.dev.type == "cuda":
                    check_stream_order(ctx)
            elif op == "async":
                check_async(ctx)
            elif op == "barrier":
                check_barrier(ctx)
            elif op == "ddp" and args.ddp_steps > 0:
                check_ddp(ctx, args.ddp_steps)
        current = "gathering the results"
        executor = ""
        if ctx.dev.type == "cuda" and args.backend.endswith("braid"):
            try:  # which executor served the CUDA ops (nccl, same-gpu, hier or staged, and why)
                pg = dist.distributed_c10d._get_default_group()
                be = pg._get_backend(ctx.dev) if hasattr(pg, "_get_backend") else pg
                executor = be._cuda_executor()
            except Exception as e:  # noqa: BLE001 - informational only
                executor = f"unknown ({type(e).__name__}: {e})"
        counts = gather_cpu(ctx, [ctx.checks.passed, len(ctx.checks.failed)])
        failures = [None] * n
        dist.all_gather_object(failures, ctx.checks.failed, group=ctx.ref)
        if rank == 0:
            result = {"world": n, "device": args.device, "backend": args.backend,
                      "passed": int(sum(c[0] for c in counts)),
                      "failed": int(sum(c[1] for c in counts)),
                      "failures": [f for fs in failures for f in fs][:50],
                      "ddp_max_diff": ctx.ddp_diff, "seconds": time.time() - t0,
                      "executor": executor,
                      "devices": [str(ctx.dev)] if args.device == "cpu" else
                      [f"cuda:{q % torch.cuda.device_count()}" for q in range(n)]}
            with open(os.path.join(store_dir, "result.json"), "w") as f:
                json.dump(result, f)
        rc = 1 if sum(c[1] for c in counts) else 0
        current = "destroy_process_group"
        teardown(rc)
    except BaseException as e:
        print(f"gpu_smoke: rank {rank} raised during {current}:", file=sys.stderr)
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        try:
            with open(os.path.join(store_dir, f"rank{rank}.err"), "w") as f:
                f.write(f"rank {rank} raised during {current}: {type(e).__name__}: {first}")
        except OSError:
            pass
        for msg in ctx.checks.failed[:10]:
            print(f"gpu_smoke: rank {rank}: earlier failure: {msg}", file=sys.stderr)
        rc = 3
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def teardown(rc, grace_s=30):
    """destroy_process_group, bounded: a hang prints the stacks and fails the rank."""
    import torch.distributed as dist

    def watchdog():
        time.sleep(grace_s)
        print(f"gpu_smoke: destroy_process_group took over {grace_s} s; stacks:",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(4)

    threading.Thread(target=watchdog, daemon=True).start()
    dist.destroy_process_group()


# ---- the parent ----------------------------------------------------------------------------------
def run_world(args, n):
    import torch.multiprocessing as mp

    store_dir = tempfile.mkdtemp(prefix="braid-gpu-smoke-")
    t0 = time.time()
    status = "ok"
    try:
        ctx = mp.start_processes(rank_main, args=(args, n, store_dir), nprocs=n, join=False,
                                 start_method="spawn")
        deadline = t0 + args.timeout
        while True:
            try:
                if ctx.join(timeout=0.5):
                    break
            except Exception as e:  # a rank exited non-zero: the others are stopped
                status = f"a rank failed: {str(e).strip().splitlines()[0][:300]}"
                break
            if time.time() > deadline:
                status = f"timed out after {args.timeout:.0f} s"
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                break
        path = os.path.join(store_dir, "result.json")
        result = json.load(open(path)) if os.path.exists(path) else None
        errors = []
        for q in range(n):
            err = os.path.join(store_dir, f"rank{q}.err")
            if os.path.exists(err):
                errors.append(open(err).read())
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
    if result is None:
        result = {"world": n, "device": args.device, "passed": 0, "failed": 1,
                  "failures": errors + [status if status != "ok" else "rank 0 wrote no result"]}
    elif status != "ok" and not result["failed"]:
        result["failed"] = 1
        result["failures"] += errors + [status]
    result.setdefault("seconds", time.time() - t0)
    result["wall_seconds"] = time.time() - t0
    return result


def describe(args, n, ngpu):
    if args.device == "cpu":
        return f"world {n} on cpu"
    per_gpu = {}
    for q in range(n):
        per_gpu[q % ngpu] = per_gpu.get(q % ngpu, 0) + 1
    shared = max(per_gpu.values()) > 1
    how = ("ranks share a GPU: braid's same-GPU collectives (or staged where only some share); "
           "NCCL refuses this layout" if shared
           else "one rank per GPU: braid's NCCL executor")
    return f"world {n} on cuda, {n} rank(s) on {len(per_gpu)} GPU(s) ({how})"


def main(argv=None):
    args = parse_args(argv)
    import torch

    ngpu = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and (not torch.cuda.is_available() or ngpu == 0):
        print(f"gpu_smoke: SKIP: no CUDA device (torch {torch.__version__}, "
              f"torch.version.cuda={torch.version.cuda}); --device cpu runs the same checks on "
              "braid's CPU path")
        return 0 if args.dry_run else SKIP
    braid = "torch_braid not imported"
    try:
        import torch_braid  # noqa: F401
        braid = f"torch_braid {torch_braid.__version__} from {os.path.dirname(torch_braid.__file__)}"
    except Exception as e:
        if "braid" in args.backend + args.compare:
            print(f"gpu_smoke: torch_braid does not import: {e!r}", file=sys.stderr)
            return 1
    print(f"gpu_smoke: torch {torch.__version__} (cuda {torch.version.cuda}), {braid}; "
          f"backend {args.backend!r} against {args.compare!r}")
    if args.device == "cuda":
        print(f"gpu_smoke: {ngpu} GPU(s): "
              + ", ".join(torch.cuda.get_device_name(i) for i in range(ngpu)))
    for n in args.world:
        print(f"gpu_smoke: plan: {describe(args, n, ngpu)}: ops {','.join(args.ops)}; dtypes "
              f"{','.join(args.dtypes)}; counts {','.join(map(str, COUNTS))}"
              + (f",{LARGE} (fp32)" if args.large else ""))
    if args.dry_run:
        print("gpu_smoke: dry run: nothing spawned")
        return 0
    results, rc = [], 0
    for n in args.world:
        res = run_world(args, n)
        results.append(res)
        ok = res["failed"] == 0
        rc = rc or (0 if ok else 1)
        ddp = (f"; DDP max |{args.backend} - {args.compare}| {res['ddp_max_diff']:.2e}"
               if res.get("ddp_max_diff") is not None else "")
        print(f"gpu_smoke: {'PASS' if ok else 'FAIL'} {describe(args, n, ngpu)}: "
              f"{res['passed']} checks passed, {res['failed']} failed{ddp} "
              f"({res['wall_seconds']:.1f} s)", flush=True)
        if res.get("executor"):
            print(f"gpu_smoke:   braid's CUDA executor: {res['executor']}", flush=True)
        for msg in res["failures"][:20]:
            print(f"gpu_smoke:   {msg}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "results": results}, f,
                      indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())

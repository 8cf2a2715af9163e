#!/usr/bin/env python3
"""Collective benchmark in the style of nccl-tests: several c10d backends side by side.

    /usr/bin/python3 benchmarks/collectives.py --nprocs 2 --backends braid,gloo \
        --ops allreduce,allgather --dtypes fp32,bf16 --min-bytes 4 --max-bytes 256M --factor 4 \
        --json results/coll.json --plot results/coll.png
    torchrun --nproc-per-node 4 benchmarks/collectives.py --backends braid,gloo --sizes 4,4K,1M
    ... --env BRAID_X=1K,64K,1M        # repeat the whole run for each value (threshold sweeps)
    ... --nprocs 4 --hosts 2 --link-gbit 1   # ranks on 2 simulated hosts (tools/hosts.py, root)
    ... --nprocs 4 --device cuda --quick     # CUDA tensors: braid, gloo, nccl (Note [CUDA mode])
    ... --nprocs 8 --pin                      # rank r on CPU r % ncpus (sched_setaffinity)
    benchmarks/scaling.py sweeps world sizes, one job of this script per size and backend

The default process group is gloo and serves only as the control group (statuses, iteration
counts, times). Each backend under test gets its own dist.new_group(backend=...), created after
the --env values are set, and every (op, dtype, size) point is timed on each backend in turn,
rotating the order per size, so ratios compare like with like.

Definitions (nccl-tests, doc/PERFORMANCE.md): S = message size in bytes (total size for
allgather, reduce_scatter, alltoall, gather and scatter: the root's buffer of n blocks for the
last two); algbw = S / t; busbw = algbw * factor, with factor 2(n-1)/n for allreduce, (n-1)/n for
allgather, reduce_scatter, alltoall, gather and scatter (the root's link carries n-1 blocks), 1
for broadcast, reduce and sendrecv (nccl-tests' ring shift: every rank sends S to rank + 1 and
receives S from rank - 1, with isend and irecv; n >= 2); 1 GB = 1e9 B. t is the median over
rounds of the MEAN over ranks (as nccl-tests) of each rank's average time per call (the
per-round means, max and min are in the JSON). count = elements in S. %cpy = busbw / the single-thread memcpy bandwidth (torch copy_, best of
5) measured at the start of the same run.

Note [Rounds]
On a shared machine the speed available changes within seconds, so one timed block per backend
compares moments rather than backends. Each point is timed in --rounds blocks per backend,
alternating backends (A B, B A, ...), and each backend's time is the median of its blocks; a
ratio then compares blocks taken within the same few hundred milliseconds. All backends are
checked and warmed up before the first round, on buffers they share.

Note [Settling]
Alternating backends leaves traces: right after a block of gloo calls, braid's 4-byte allreduce
took 47-50 us for about 1000 calls (50 ms), then 12 us, on this 2-core machine, as the
scheduler re-places threads that gloo's had displaced. Each timed block is therefore preceded
by --settle-ms of untimed calls of the same backend (the count agreed across ranks), so that a
block measures the backend and not the one timed before it.

Note [What is checked]
Every point is checked twice: on its first call (before warm-up) and on one more call after the
timed iterations (which catches state that goes wrong only after many calls). The copying ops
get f(rank, i) = rank + 1 + (i % 7) - 3 and the reductions g(rank, i) = (rank + i) % 3 - 1 +
(i % 7) - 3; outputs are prefilled with a sentinel; every element is compared with its closed
form (e.g. allreduce: the sum of g over ranks, from the period-21 pattern). As |g| <= 4, sums
are exact integers while 4n is representable (n <= 64 for bf16, 512 for fp16) and are compared
exactly; beyond that within the rounding bound n * eps * 4n. Timed iterations are not checked
(a check costs more than the op); reductions run them on zeros, so repeated in-place sums
neither overflow nor change speed. A wrong result on any rank fails the whole run with the op,
dtype, size, backend and rank. barrier is checked by making rank 0 enter late and verifying
that no rank left before it entered (single host only). An op a backend rejects on its first
call (e.g. gloo on torch 1.13: bf16, reduce_scatter) is reported as n/a; an op that worked at a
smaller size and then raises fails the run.

Note [CUDA mode]
--device cuda times CUDA tensors: backends named without a device run on cuda (auto = braid if it
imports, gloo, nccl), and rank r uses GPU r % torch.cuda.device_count(), so with one GPU every
rank shares it. NCCL refuses ranks that share a GPU ("Duplicate GPU detected"; NCCL 2.30 allows it
with NCCL_MULTI_RANK_GPU_ENABLE=1), so then its group is not made and its cells read
"n/a (Duplicate GPU)". Times include the device work: each timed block ends with
torch.cuda.synchronize(). %cpy still compares with the host memcpy (braid's staged executor and
gloo both run their collective on host copies); the device's own copy rates are printed beside it.
The run ends with issue 28's targets: at 1 rank braid within 5% of NCCL's time at every point; at
2 or more ranks sharing a GPU at least 3x gloo's CUDA allreduce at 4 B and 64 MiB. --quick
(allreduce at 4 B and 64 MiB, shorter points) keeps a run under a minute.
"""

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
# The in-tree package (setup.py build_ext --inplace) when torch_braid is not installed.
sys.path.append(os.path.join(os.path.dirname(_HERE), "python"))

import _bench_common as bc  # noqa: E402

torch = dist = None  # imported in the ranks only: the launcher does not need torch

OPS = ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "gather",
       "scatter", "sendrecv", "barrier")
REDUCTIONS = ("allreduce", "reduce", "reduce_scatter")
SPLIT_OPS = ("allgather", "reduce_scatter", "alltoall", "gather", "scatter")  # S: n equal parts
DTYPE_NAMES = ("fp32", "bf16", "fp16", "int32")
ROOT = 0
PERIOD = 21  # inputs and expected outputs repeat with this period (see f_tile, g_tile)
SENTINEL = -1000  # never a valid output: f >= -2, and |sums of g| <= 4n
BARRIER_DELAY_S, BARRIER_TOL_S = 0.05, 0.005


def busbw_factor(op, n):
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in SPLIT_OPS:
        return (n - 1) / n
    return 1.0 if op in ("broadcast", "reduce", "sendrecv") else None


# ---- data and checks (Note [What is checked]) ----------------------------------------------------
def torch_dtype(name):
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
            "int32": torch.int32}[name]


def f_tile(q, start):
    """Input of rank q to the copying ops at positions start + j, j < PERIOD (float64)."""
    j = torch.arange(PERIOD, dtype=torch.float64) + start
    return j % 7 - 3 + (q + 1)


def g_tile(q, start):
    """Input of rank q to the reductions: small (|g| <= 4), so sums stay exact longer."""
    j = torch.arange(PERIOD, dtype=torch.float64) + start
    return (j + q) % 3 - 1 + j % 7 - 3


def sum_tile(n, start):
    j = torch.arange(PERIOD, dtype=torch.float64) + start
    q = torch.arange(n, dtype=torch.float64)[:, None]
    return ((j + q) % 3 - 1).sum(0) + n * (j % 7 - 3)


def sum_atol(n, dtype):
    """0 while every partial sum is an exactly representable integer (|partial| <= 4n);
    beyond that the worst case of rounding each of n additions at magnitude <= 4n."""
    exact_up_to = {torch.float32: 2 ** 24, torch.bfloat16: 2 ** 8, torch.float16: 2 ** 11}
    eps = {torch.float32: 2 ** -23, torch.bfloat16: 2 ** -7, torch.float16: 2 ** -10}
    bound = 4 * n
    if dtype not in eps or bound <= exact_up_to[dtype]:
        return 0.0
    return n * eps[dtype] * bound


def prepare_check(op, inp, out, r, n):
    """Fill inputs for a checked call; return [(what, view, expected tile, atol)]."""
    if op == "barrier":
        return []
    atol = sum_atol(n, inp.dtype)
    if op == "broadcast":
        if r == ROOT:
            bc.fill_periodic(inp, f_tile(ROOT, 0))
        else:
            inp.fill_(SENTINEL)
        return [("output", inp, f_tile(ROOT, 0), 0)]
    if op == "sendrecv":  # a ring shift: rank r's buffer goes to rank r + 1
        bc.fill_periodic(inp, f_tile(r, 0))
        out.fill_(SENTINEL)
        left = (r - 1) % n
        return [(f"buffer from rank {left}", out, f_tile(left, 0), 0)]
    if op == "scatter":  # the root's buffer, block q to rank q
        k = out.numel()
        bc.fill_periodic(inp, f_tile(ROOT, 0))
        out.fill_(SENTINEL)
        return [("block from the root", out, f_tile(ROOT, r * k), 0)]
    if op in REDUCTIONS:
        bc.fill_periodic(inp, g_tile(r, 0))
    else:
        bc.fill_periodic(inp, f_tile(r, 0))
    if op == "gather":  # rank q's input to block q of the root's output
        out.fill_(SENTINEL)
        k = inp.numel()
        return [(f"block from rank {q}", out[q * k:(q + 1) * k], f_tile(q, 0), 0)
                for q in range(n)] if r == ROOT else []
    if op in ("allreduce", "reduce"):
        return [("output", inp, sum_tile(n, 0), atol)] if op == "allreduce" or r == ROOT else []
    out.fill_(SENTINEL)
    k = inp.numel() // n if op != "allgather" else inp.numel()
    if op == "reduce_scatter":
        return [("output", out, sum_tile(n, r * k), atol)]
    start = 0 if op == "allgather" else r * k
    return [(f"block from rank {q}", out[q * k:(q + 1) * k], f_tile(q, start), 0) for q in range(n)]


def op_impls(op, group, inp, out, r, n, emulate):
    """[(name, call, emulated)] in order of preference; later ones are fallbacks."""
    if op == "allreduce":
        return [("all_reduce", lambda: dist.all_reduce(inp, group=group), False)]
    if op == "broadcast":
        return [("broadcast", lambda: dist.broadcast(inp, ROOT, group=group), False)]
    if op == "reduce":
        return [("reduce", lambda: dist.reduce(inp, ROOT, group=group), False)]
    if op == "alltoall":
        return [("all_to_all_single", lambda: dist.all_to_all_single(out, inp, group=group), False)]
    if op == "barrier":
        return [("barrier", lambda: dist.barrier(group=group), False)]
    if op == "gather":
        blocks = list(out.chunk(n)) if r == ROOT else None
        return [("gather", lambda: dist.gather(inp, blocks, dst=ROOT, group=group), False)]
    if op == "scatter":
        blocks = list(inp.chunk(n)) if r == ROOT else None
        return [("scatter", lambda: dist.scatter(out, blocks, src=ROOT, group=group), False)]
    if op == "sendrecv":
        def sendrecv():
            works = [dist.isend(inp, (r + 1) % n, group=group),
                     dist.irecv(out, (r - 1) % n, group=group)]
            for w in works:
                w.wait()
        return [("isend+irecv", sendrecv, False)]
    if op == "allgather":
        agt = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
        outs = list(out.chunk(n))
        return [("all_gather_into_tensor", lambda: agt(out, inp, group=group), False),
                ("all_gather(list)", lambda: dist.all_gather(outs, inp, group=group), False)]
    rst = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    ins, k = list(inp.chunk(n)), out.numel()

    def emulated():  # what gloo itself does on torch 2.x (pytorch #118911)
        dist.all_reduce(inp, group=group)
        out.copy_(inp[r * k:(r + 1) * k])

    impls = [("reduce_scatter_tensor", lambda: rst(out, inp, group=group), False),
             ("reduce_scatter(list)", lambda: dist.reduce_scatter(out, ins, group=group), False)]
    return impls + ([("all_reduce+copy", emulated, True)] if emulate else [])


def geometry(op, nbytes, esize, n):
    """(input elements, output elements, bytes in S) for a requested size, or None if too small."""
    if op == "barrier":
        return 0, 0, 0
    c = nbytes // esize
    if op == "sendrecv" and n == 1:
        return None  # no peer
    if op in SPLIT_OPS:
        c = c // n * n
    if c == 0:
        return None
    k = c // n
    ins, outs = {"allgather": (k, c), "reduce_scatter": (c, k), "alltoall": (c, c),
                 "gather": (k, c), "scatter": (c, k), "sendrecv": (c, c)}.get(op, (c, 0))
    return ins, outs, c * esize


# ---- the run -------------------------------------------------------------------------------------
class Point:
    """One backend at one (op, dtype, size) between its checked first call and its result."""

    def __init__(self, op, be, res, where, call, sync, inp, out):
        self.op, self.be, self.res, self.where = op, be, res, where
        self.call, self.sync, self.inp, self.out = call, sync, inp, out
        self.iters, self.rounds = 0, []  # rounds: per round, each rank's average time per call


class Runner:
    def __init__(self, args, info, backends, progress):
        self.args, self.info, self.backends, self.progress = args, info, backends, progress
        self.r, self.n = info.rank, info.world_size
        self.impl, self.errors = {}, {}  # per (backend, op, dtype): chosen impl / why n/a

    def checked_call(self, op, call, inp, out, sync):
        """One call of the op, checked on this rank: (0 ok | 1 raised | 2 wrong, message)."""
        expect = prepare_check(op, inp, out, self.r, self.n)
        if op == "barrier":
            bc.control_barrier()
        t_enter, err = 0.0, None
        try:
            if op == "barrier" and self.r == ROOT:
                time.sleep(BARRIER_DELAY_S)
                t_enter = time.time()
            call()
            sync()
        except Exception as e:
            err = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
        t_exit = time.time()
        if op == "barrier":  # every rank takes part in this gather, even one whose call raised
            t_enter = bc.gather_floats(t_enter)[ROOT]
        if err:
            return 1, err
        if op == "barrier" and self.info.single_host and t_exit < t_enter - BARRIER_TOL_S:
            return 2, f"left the barrier {1e3 * (t_enter - t_exit):.1f} ms before rank 0 entered"
        for what, view, tile, atol in expect:
            bad = bc.first_mismatch(view, tile, atol)
            if bad:
                got, want = bad[1], bad[2]
                return 2, f"{what}: element {bad[0]} is {got:g}, expected {want:g} (atol {atol:g})"
        return 0, ""

    def corrupting(self, op, call, inp, out):
        victim = ROOT if op in ("reduce", "gather") else self.n - 1

        def corrupted():
            call()
            if self.r == victim:
                (out if out is not None else inp)[0] += 1

        return corrupted

    def start_point(self, op, dt, be, bufs, res):
        """Pick the op's implementation on the checked first call, then warm up.

        Returns the finished result if the backend cannot run the op, else a Point to time."""
        key = (be.label, op, dt)
        where = f"op={op} dtype={dt} size={res['bytes']} B backend={be.label}"
        if be.group is None:  # its group could not be made (make_group)
            res = dict(res, status="unsupported", error=self.init_failed[be.label])
            if be.label in self.na_short:
                res["na_short"] = self.na_short[be.label]
            return res
        if self.impl.get(key) == "n/a":
            return dict(res, status="unsupported", error=self.errors[key])
        inp, out = bufs.get(be.device, (None, None))
        sync = torch.cuda.synchronize if be.device.startswith("cuda") else (lambda: None)
        chosen, errors = self.impl.get(key), []
        for name, call, emulated in op_impls(op, be.group, inp, out, self.r, self.n,
                                             not self.args.no_emulate):
            if chosen and name != chosen:
                continue
            checked = call
            if self.args.inject_wrong_result == op and op != "barrier":  # testing only
                checked = self.corrupting(op, call, inp, out)
            st, msg = bc.agree(*self.checked_call(op, checked, inp, out, sync))
            if st == 0:
                break
            if st == 2:
                raise bc.BenchFailure(f"WRONG RESULT: {where} impl={name}: {msg}")
            if chosen:
                raise bc.BenchFailure(f"FAILED (worked at smaller sizes): {where} impl={name}: "
                                      f"{msg}")
            errors.append(f"{name}: {msg}")
        else:
            self.impl[key], self.errors[key] = "n/a", " | ".join(errors)
            return dict(res, status="unsupported", error=self.errors[key])
        self.impl[key] = name
        p = Point(op, be, dict(res, impl=name, emulated=emulated), where, call, sync, inp, out)
        rounds = self.args.rounds
        with self.failing_on_exception(p):
            if op in REDUCTIONS:
                inp.zero_()
            t_est = bc.time_iters(call, max(self.args.warmup, 1), sync)
            p.iters = bc.agree_iters(t_est, self.args.time_per_point / rounds,
                                     -(-self.args.min_iters // rounds), self.args.max_iters)
            p.settle = bc.agree_iters(t_est, self.args.settle_ms / 1e3, 1, self.args.max_iters)
        return p

    @contextlib.contextmanager
    def failing_on_exception(self, p):
        try:
            yield
        except Exception as e:
            raise bc.BenchFailure(f"FAILED while timing on rank {self.r}: {p.where} "
                                  f"impl={p.res['impl']}: {e!r}", agreed=False) from e

    def time_round(self, p):
        with self.failing_on_exception(p):
            bc.control_barrier()
            bc.time_iters(p.call, p.settle, p.sync)  # Note [Settling]
            p.rounds.append(bc.gather_floats(bc.time_iters(p.call, p.iters, p.sync)))

    def finish_point(self, p):
        st, msg = bc.agree(*self.checked_call(p.op, p.call, p.inp, p.out, p.sync))
        if st:
            calls = p.iters * len(p.rounds)
            raise bc.BenchFailure(f"{'WRONG RESULT' if st == 2 else 'FAILED'} after {calls} "
                                  f"timed calls: {p.where} impl={p.res['impl']}: {msg}")
        means = [statistics.mean(ranks) for ranks in p.rounds]
        t = statistics.median(means)
        everything = [x for ranks in p.rounds for x in ranks]
        res = dict(p.res, status="ok", iters=p.iters, rounds=len(p.rounds), time_us=t * 1e6,
                   round_time_us=[m * 1e6 for m in means], time_us_max=max(everything) * 1e6,
                   time_us_min=min(everything) * 1e6)
        factor = busbw_factor(p.op, self.n)
        if factor is not None:
            res["algbw_GBps"] = res["bytes"] / t / 1e9
            res["busbw_GBps"] = res["algbw_GBps"] * factor
            res["busbw_frac_memcpy"] = res["busbw_GBps"] / self.memcpy["single_rank_GBps"]
        return res

    def run(self, env, sizes):
        self.impl, self.errors = {}, {}
        timeout = datetime.timedelta(seconds=self.args.timeout)
        self.init_failed, self.na_short = {}, {}
        for be in self.backends:
            if be.device.startswith("cuda"):
                torch.cuda.set_device(self.info.local_rank % torch.cuda.device_count())
            self.make_group(be, timeout)
        self.memcpy = bc.measure_memcpy(self.args.memcpy_bytes)
        self.device_copies = (measure_device_copies(self.args.memcpy_bytes)
                              if self.args.device == "cuda" else None)
        self.warm_up_groups()
        results = []
        for op in self.args.ops:
            for dt in (self.args.dtypes if op != "barrier" else ["-"]):
                table = []
                for si, nbytes in enumerate(sizes if op != "barrier" else [0]):
                    table += self.run_size(op, dt, nbytes, si)
                results += table
                if self.r == 0 and table:
                    self.progress.clear()
                    print(format_table(op, dt, table, self.backends, self.n, env), flush=True)
        accuracy = self.accuracy() if self.args.accuracy and "allreduce" in self.args.ops else []
        if self.r == 0 and accuracy:
            print(format_accuracy(accuracy, self.n), flush=True)
        self.memcpy_after = bc.measure_memcpy(self.args.memcpy_bytes)
        for be in self.backends:
            if be.group is not None:
                dist.destroy_process_group(be.group)
            be.group = None
        run = {"env": env, "init_failed": self.init_failed, "memcpy_before": self.memcpy, "memcpy_after": self.memcpy_after,
               "results": results, "accuracy": accuracy}
        if self.device_copies is not None:
            run["device_copies"] = self.device_copies
        return run

    def make_group(self, be, timeout):
        """be.group, or None with the reason in self.init_failed (e.g. braid across hosts
        before its TCP transport): the run goes on with the other backends, and the backend's
        every point reads n/a."""
        shared = nccl_shares_a_gpu(be, self.n)
        if shared:  # Note [CUDA mode]: every rank decides alike, without making the group
            be.group = None
            self.init_failed[be.label] = shared
            self.na_short[be.label] = "Duplicate GPU"
            if self.r == 0:
                print(f"# {be.label}: not measured: {shared}", flush=True)
            return
        try:
            be.group, st, msg = dist.new_group(backend=be.name, timeout=timeout), 0, ""
        except Exception as e:
            be.group, st, msg = None, 1, f"{type(e).__name__}: {str(e).strip()}"
        st, msg = bc.agree(st, msg)
        if st == 0:
            return
        if be.group is not None:  # made on some ranks only: unusable
            dist.destroy_process_group(be.group)
            be.group = None
        first = msg.split("; rank ")[0]
        failed = msg.count("; rank ") + 1
        why = f"group creation failed on {failed} of {self.n} ranks; {first}"
        self.init_failed[be.label] = why
        if self.r == 0:
            print(f"# {be.label}: not measured: {why}", flush=True)

    def warm_up_groups(self):
        """Note [Settling], for the first point: a fresh group's first few hundred calls run
        while threads and pages are still being set up (the first 4-byte point measured 17 us,
        the next size 7 us), so each backend makes small allreduces for about 0.3 s first."""
        for be in self.backends:
            if be.group is None or (be.device != "cpu" and self.args.device != "cuda"):
                continue
            x = torch.ones(1, device=be.device)
            sync = torch.cuda.synchronize if be.device != "cpu" else (lambda: None)
            t = bc.time_iters(lambda: dist.all_reduce(x, group=be.group), 20, sync)
            bc.time_iters(lambda: dist.all_reduce(x, group=be.group),
                          bc.agree_iters(t, 0.3, 1, 100000), sync)

    def accuracy(self):
        """Note [Accuracy]: low-precision allreduce SUM against an fp64 reference."""
        out = []
        count = ACCURACY_COUNT
        for dt in ("bf16", "fp16"):
            dtype = torch_dtype(dt)
            # Every rank can regenerate every rank's input, so each computes the reference.
            ins = [accuracy_input(q, count).to(dtype) for q in range(self.n)]
            ref = torch.stack([x.double() for x in ins]).sum(0)
            nearest = ref.to(dtype)
            for be in self.backends:
                if be.device != "cpu" or be.group is None:
                    continue
                buf = ins[self.r].clone()
                try:
                    dist.all_reduce(buf, group=be.group)
                    st, msg = 0, ""
                except Exception as e:  # e.g. gloo on torch 1.13 has no bf16
                    st, msg = 1, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                st, msg = bc.agree(st, msg)
                row = dict(dtype=dt, backend=be.label, count=count, ranks=self.n)
                if st:
                    parts = [m.split(": ", 1)[-1] for m in msg.split("; ")]
                    if len(set(parts)) == 1:
                        msg = f"{parts[0]} (every rank)"
                    out.append(dict(row, status="n/a", error=msg))
                    continue
                err = buf.double() - ref
                out.append(dict(row, status="ok",
                                rel_rms_error=float(err.norm() / ref.norm()),
                                max_abs_error=float(err.abs().max()),
                                frac_correctly_rounded=float((buf == nearest).double().mean())))
        return out

    def run_size(self, op, dt, nbytes, si):
        dtype = torch_dtype(dt) if dt != "-" else torch.float32
        esize = torch.tensor([], dtype=dtype).element_size()
        geo = geometry(op, nbytes, esize, self.n)
        order = self.backends[si % len(self.backends):] + self.backends[:si % len(self.backends)]
        bufs = {}
        if geo and op != "barrier":
            for dev in sorted({b.device for b in self.backends}):
                bufs[dev] = (torch.empty(geo[0], dtype=dtype, device=dev),
                             torch.empty(geo[1], dtype=dtype, device=dev) if geo[1] else None)
        done, points = [], []
        for be in order:
            res = {"op": op, "dtype": dt, "backend": be.label, "backend_name": be.name,
                   "device": be.device, "requested_bytes": nbytes}
            if geo is None:
                res.update(status="skipped", error="size below one element per rank", bytes=0)
            else:
                res.update(bytes=geo[2], count=geo[2] // esize)
                res = self.start_point(op, dt, be, bufs, res)
            (points if isinstance(res, Point) else done).append(res)
        for rnd in range(self.args.rounds):  # Note [Rounds]
            k = rnd % max(len(points), 1)
            for p in points[k:] + points[:k]:
                self.time_round(p)
        done += [self.finish_point(p) for p in points]
        for res in done:
            self.progress.update(f"{op} {dt} {bc.fmt_size(nbytes)} {res['backend']}")
        order_index = {b.label: i for i, b in enumerate(self.backends)}
        return sorted(done, key=lambda x: order_index[x["backend"]])


# ---- output --------------------------------------------------------------------------------------
# Note [Accuracy]
# Each rank's input is ACCURACY_COUNT normal values (seeded by rank, mean 1, so sums do not cancel
# to zero) rounded to bf16 or fp16; the reference is their exact sum in float64, and the best an
# allreduce can return is that sum rounded once to the dtype. Reported per backend: the relative
# RMS error against the reference, the largest absolute error, and the fraction of elements equal
# to the once-rounded sum. A backend that rounds after every addition (gloo) loses accuracy with
# the number of ranks; one that accumulates in fp32 and rounds once (braid) should not.
ACCURACY_COUNT = 1 << 20


def accuracy_input(q, count):
    g = torch.Generator().manual_seed(7919 + q)
    return torch.randn(count, generator=g, dtype=torch.float64) + 1.0


def format_accuracy(rows, n):
    lines = [f"\n# allreduce accuracy, SUM of {ACCURACY_COUNT} normal(1, 1) values per rank, "
             f"n={n}, against the fp64 sum (Note [Accuracy])",
             f"{'dtype':6s} {'backend':10s} {'rel rms err':>12s} {'max abs err':>12s} "
             f"{'correctly rounded':>18s}"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['dtype']:6s} {r['backend']:10s} n/a: {r['error']}")
            continue
        lines.append(f"{r['dtype']:6s} {r['backend']:10s} {r['rel_rms_error']:12.3e} "
                     f"{r['max_abs_error']:12.3e} {100 * r['frac_correctly_rounded']:17.2f}%")
    return "\n".join(lines)


def format_table(op, dt, results, backends, n, env):
    labels = [b.label for b in backends]
    by_size = {}
    for res in results:
        by_size.setdefault(res["requested_bytes"], {})[res["backend"]] = res
    barrier = op == "barrier"
    per_be = ["time(us)"] if barrier else ["time(us)", "algbw", "busbw", "%cpy"]
    pairs = [(labels[0], b) for b in labels[1:]]
    head = [("", ["size", "count"])] + [(lb, per_be) for lb in labels]
    head += [(f"{a}/{b}", ["time"] if barrier else ["busbw", "time"]) for a, b in pairs]
    rows = []
    for size, cells in sorted(by_size.items()):
        count = next(iter(cells.values())).get("count", "-")
        row = ["-", "-"] if barrier else [bc.fmt_size(size), str(count)]
        for lb in labels:
            r = cells[lb]
            if r["status"] != "ok":
                na = f"n/a ({r['na_short']})" if r.get("na_short") else "n/a"
                row += [na if r["status"] == "unsupported" else r["status"]]
                row += [""] * (len(per_be) - 1)
                continue
            row.append(f"{r['time_us']:.1f}" + ("*" if r.get("emulated") else ""))
            if not barrier:
                row += [f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}",
                        f"{100 * r['busbw_frac_memcpy']:.1f}"]
        for a, b in pairs:
            ra, rb = cells[a], cells[b]
            ok = ra["status"] == "ok" and rb["status"] == "ok"
            if not barrier:
                row.append(f"{ra['busbw_GBps'] / rb['busbw_GBps']:.2f}"
                           if ok and rb["busbw_GBps"] else "-")
            row.append(f"{ra['time_us'] / rb['time_us']:.2f}" if ok else "-")
        rows.append(row)
    notes = {f"{r['backend']}: emulated with {r['impl']}" for r in results if r.get("emulated")}
    notes |= {f"{r['backend']}: n/a: {r['error'][:200]}" for r in results
              if r["status"] == "unsupported"}
    env_s = " ".join(f"{k}={v}" for k, v in env.items())
    title = f"\n# {op} {dt if not barrier else ''}  n={n}  {env_s}".rstrip()
    return bc.render_table(title, head, rows, sorted(notes))


def write_plot(path, report):
    panels, multi_env = [], len(report["runs"]) > 1
    for op in report["meta"]["ops"]:
        panel = {"title": op, "bars" if op == "barrier" else "curves": {}}
        for run in report["runs"]:
            env_s = " ".join(f"{k}={v}" for k, v in run["env"].items()) if multi_env else ""
            for res in run["results"]:
                if res["op"] != op or res["status"] != "ok":
                    continue
                dt = res["dtype"] if res["dtype"] != "-" else ""
                label = " ".join(s for s in (res["backend"], dt, env_s) if s)
                if op == "barrier":
                    panel["bars"][label] = res["time_us"]
                else:
                    point = (res["bytes"], res["busbw_GBps"], res["time_us"])
                    panel["curves"].setdefault(label, []).append(point)
        panels.append(panel)
    mc = report["runs"][0]["memcpy_before"]["single_rank_GBps"]
    meta = report["meta"]
    bc.plot_sweep(path, f"collectives, n={meta['world_size']}, torch {meta['torch']}", panels,
                  hline=(f"memcpy 1 thread {mc:.1f} GB/s", mc))


# ---- CUDA mode (Note [CUDA mode]) ---------------------------------------------------------------
def cuda_unavailable():
    """Why --device cuda cannot run here, or None."""
    try:
        import torch as t
    except Exception as e:
        return f"torch does not import: {e!r}"
    if t.version.cuda is None:
        return f"torch {t.__version__} was built without CUDA (torch.version.cuda is None)"
    if not t.cuda.is_available() or t.cuda.device_count() == 0:
        return f"torch {t.__version__} (CUDA {t.version.cuda}) sees no CUDA device"
    return None


def cuda_spec(spec):
    """Backends named without a device run on cuda; 'auto' = braid (if it imports), gloo, nccl."""
    if spec == "auto":
        names = ["gloo", "nccl"]
        try:
            import torch_braid  # noqa: F401
            names.insert(0, "braid")
        except Exception as e:
            if int(os.environ.get("RANK", "0")) == 0:
                print(f"# braid not measured: torch_braid did not import: {e!r}", file=sys.stderr)
    else:
        names = [x.strip() for x in spec.split(",") if x.strip()]
    return ",".join(x if "@" in x or x == "nccl" else f"{x}@cuda" for x in names)


def nccl_version():
    try:
        v = torch.cuda.nccl.version()
    except Exception:
        return None
    return tuple(v) if isinstance(v, (tuple, list)) else (v // 1000, v // 100 % 10, v % 100)


def nccl_shares_a_gpu(be, n):
    """The reason NCCL cannot run these ranks (several on one GPU), or None."""
    if be.name != "nccl" or not torch.cuda.is_available():
        return None
    gpus = torch.cuda.device_count()
    if n <= gpus:
        return None
    v = nccl_version()
    if os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1" and v and v >= (2, 30):
        return None
    vs = ".".join(map(str, v)) if v else "unknown"
    return (f"Duplicate GPU: {n} ranks on {gpus} GPU(s), and NCCL {vs} refuses ranks that share "
            "a GPU (NCCL 2.30+ allows it with NCCL_MULTI_RANK_GPU_ENABLE=1)")


def measure_device_copies(nbytes, reps=5):
    """GB/s (bytes copied once, best of reps) of device-to-device and pinned host<->device
    copies of nbytes on rank 0 alone, while the other ranks wait."""
    out = {"bytes": nbytes}
    bc.control_barrier()
    if dist.get_rank() == 0:
        n = max(nbytes // 4, 1)
        dev = torch.empty(n, device="cuda")
        dev2 = torch.empty_like(dev)
        host = torch.empty(n, pin_memory=True)
        for name, dst, src in (("d2d", dev2, dev), ("d2h_pinned", host, dev),
                               ("h2d_pinned", dev, host)):
            dst.copy_(src)
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
            out[f"{name}_GBps"] = n * 4 / best / 1e9
        del dev, dev2, host
    vals = bc.gather_objects(out)[0]
    bc.control_barrier()
    return vals


def print_device_copies(d):
    print(f"# device copies {bc.fmt_size(d['bytes'])}B, rank 0 alone, best of 5: device to "
          f"device {d['d2d_GBps']:.1f} GB/s, device to pinned host {d['d2h_pinned_GBps']:.1f}, "
          f"pinned host to device {d['h2d_pinned_GBps']:.1f}")


# Issue 28's targets for CUDA tensors: (what, op, sizes or None for every point, other backend,
# ranks: 1 or "shared", kind, threshold). "time": braid's time / other's at most threshold;
# "speed": other's time / braid's at least threshold.
# Issue 29's (one GPU shared by every rank, braid's same-GPU collectives): "busbw", braid's
# allreduce bus bandwidth (2(n-1)/n bytes / time) at least threshold x the device-to-device copy
# rate measured in the same run; "us", braid's time at most threshold microseconds (2 ranks).
CUDA_TARGETS = [
    ("1 rank: braid within 5% of NCCL's time", None, None, "nccl", 1, "time", 1.05),
    ("ranks sharing a GPU: braid at least 3x gloo's CUDA allreduce", "allreduce",
     (4, 64 << 20), "gloo", "shared", "speed", 3.0),
    ("one GPU: braid allreduce busbw at least 40% of the device copy rate", "allreduce",
     (64 << 20, 256 << 20), None, "one-gpu", "busbw", 0.40),
    ("one GPU, 2 ranks: braid 4 B allreduce at most 30 us", "allreduce", (4,), None, "one-gpu-2",
     "us", 30.0),
]


def cuda_targets(results, n, gpus, copies=None):
    """[{target, point, value, threshold, met}] for the points this run measured."""
    shared = n > gpus
    by = {}
    for r in results:
        by.setdefault((r["op"], r["dtype"], r["requested_bytes"]), {})[r["backend_name"]] = r
    checks = []
    for what, op, sizes, other, ranks, kind, thr in CUDA_TARGETS:
        if (ranks == 1) != (n == 1) or (ranks == "shared" and not shared):
            continue
        if str(ranks).startswith("one-gpu") and (gpus != 1 or (ranks == "one-gpu-2" and n != 2)):
            continue
        if other is None:
            checks += absolute_checks(what, op, sizes, kind, thr, by, n, copies)
            continue
        for (o, dt, size), cells in sorted(by.items()):
            if (op and o != op) or (sizes and size not in sizes):
                continue
            a, b = cells.get("braid"), cells.get(other)
            point = f"{o} {dt if dt != '-' else ''} {bc.fmt_size(size)}B".replace("  ", " ")
            if not a or not b or a["status"] != "ok" or b["status"] != "ok":
                why = next((c.get("na_short") or c.get("error", c["status"])
                            for c in (a, b) if c and c["status"] != "ok"), "not measured")
                checks.append(dict(target=what, point=point, value=None, threshold=thr,
                                   met=None, why=str(why)[:120]))
                continue
            v = (a["time_us"] / b["time_us"] if kind == "time" else b["time_us"] / a["time_us"])
            met = v <= thr if kind == "time" else v >= thr
            checks.append(dict(target=what, point=point, value=v, threshold=thr, met=met,
                               kind=kind, other=other))
    return checks


def absolute_checks(what, op, sizes, kind, thr, by, n, copies):
    """Targets on braid's own figures: busbw against the device copy rate, or a time."""
    out = []
    for (o, dt, size), cells in sorted(by.items()):
        if o != op or size not in sizes:
            continue
        a = cells.get("braid")
        point = f"{o} {dt if dt != '-' else ''} {bc.fmt_size(size)}B".replace("  ", " ")
        if not a or a["status"] != "ok" or (kind == "busbw" and not copies):
            why = (a or {}).get("na_short") or (a or {}).get("error") or "not measured"
            out.append(dict(target=what, point=point, value=None, threshold=thr, met=None,
                            why=str(why)[:120]))
            continue
        if kind == "busbw":
            busbw = 2 * (n - 1) / n * size / (a["time_us"] * 1e-6) / 1e9
            v = busbw / copies["d2d_GBps"]
            met = v >= thr
        else:
            v = a["time_us"]
            met = v <= thr
        out.append(dict(target=what, point=point, value=v, threshold=thr, met=met, kind=kind,
                        other=None))
    return out


def print_cuda_targets(checks, n):
    print(f"\n# Targets (issues 28 and 29, CUDA tensors, n={n}):")
    if not checks:
        print("  (none applies to this world size and layout)")
    for c in checks:
        if c["met"] is None:
            print(f"  {c['target']}: {c['point']}: n/a ({c['why']})")
            continue
        if c["kind"] in ("busbw", "us"):
            rel, ratio = ((">=", "busbw / device copy rate") if c["kind"] == "busbw" else
                          ("<=", "braid time (us)"))
        else:
            rel, ratio = ("<=", f"braid/{c['other']} time") if c["kind"] == "time" else \
                (">=", f"{c['other']}/braid time")
        print(f"  {c['target']}: {c['point']}: {ratio} {c['value']:.2f} (target {rel} "
              f"{c['threshold']}): {'met' if c['met'] else 'NOT met'}")


# ---- entry points --------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=int, default=0, help="spawn this many ranks (else torchrun)")
    p.add_argument("--store", choices=("file", "tcp"), default="file", help="store for --nprocs")
    p.add_argument("--hosts", type=int, default=0,
                   help="with --nprocs: place the ranks on this many simulated hosts (network "
                        "namespaces, tools/hosts.py; needs root), rank r on host r*N//nprocs, "
                        "a TCP store on host 0")
    p.add_argument("--link-gbit", type=float, default=None,
                   help="with --hosts: cap each host's link at this many Gbit/s (tc tbf)")
    p.add_argument("--backends", default="auto",
                   help="comma list, e.g. braid,gloo (a name may repeat; NAME@cuda picks the "
                        "device); auto = braid if importable, gloo, nccl if CUDA")
    p.add_argument("--import", dest="imports", action="append", default=[],
                   help="module to import first (registers a third-party backend)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the tensors live (Note [CUDA mode]); backends named without "
                        "@DEVICE use it")
    p.add_argument("--quick", action="store_true",
                   help="a short run: allreduce at 4 B and 64 MiB, 3 rounds of 0.1 s per point, "
                        "no accuracy check (options given explicitly win)")
    p.add_argument("--ops", default=None, help=f"comma list (default: all: {','.join(OPS)})")
    p.add_argument("--dtypes", default="fp32")
    p.add_argument("--min-bytes", default="4")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--sizes", default=None, help="explicit list, e.g. 4,4K,1M,64M,256M")
    p.add_argument("--warmup", type=int, default=3, help="warm-up calls per point")
    p.add_argument("--min-iters", type=int, default=5, help="timed calls per point, all rounds")
    p.add_argument("--max-iters", type=int, default=100000)
    p.add_argument("--time-per-point", type=float, default=None,
                   help="seconds of timed calls per point and backend, over all rounds (0.2; "
                        "--quick: 0.1)")
    p.add_argument("--settle-ms", type=float, default=None,
                   help="untimed calls before each timed block, in ms (Note [Settling]; 50, "
                        "--quick: 20)")
    p.add_argument("--rounds", type=int, default=3,
                   help="timed blocks per point and backend, alternating backends (Note [Rounds])")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each rank")
    p.add_argument("--pin", action="store_true",
                   help="pin rank r to the (r %% k)-th of the k CPUs it may use "
                        "(os.sched_setaffinity, before torch starts a thread); the header line "
                        "and meta.pinned_cpus say where each rank ran")
    p.add_argument("--timeout", type=float, default=300, help="process group timeout, seconds")
    p.add_argument("--memcpy-bytes", default=None, help="256M (--quick: 64M)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=V1,V2",
                   help="repeat the run for each value (repeatable: all combinations)")
    p.add_argument("--no-emulate", action="store_true",
                   help="report reduce_scatter as n/a instead of all_reduce+copy where missing")
    p.add_argument("--no-accuracy", dest="accuracy", action="store_false", default=None,
                   help="skip the bf16/fp16 allreduce accuracy check (Note [Accuracy])")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--inject-wrong-result", metavar="OP", default=None,
                   help="testing only: corrupt one output element of OP on its first call, "
                        "to show that the run then fails")
    args = p.parse_args(argv)
    quick = {"ops": "allreduce",
             "sizes": "4,64M" if (args.min_bytes, args.max_bytes) == ("4", "256M") else None, "time_per_point": 0.1, "settle_ms": 20,
             "memcpy_bytes": "64M", "accuracy": False}
    normal = {"ops": ",".join(OPS), "sizes": None, "time_per_point": 0.2, "settle_ms": 50,
              "memcpy_bytes": "256M", "accuracy": True}
    for k, v in (quick if args.quick else normal).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if (args.hosts or args.link_gbit) and not (args.nprocs and args.hosts):
        p.error("--hosts needs --nprocs, and --link-gbit needs --hosts")
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for o in args.ops:
        if o not in OPS:
            p.error(f"unknown op {o!r}; choose from {','.join(OPS)}")
    for d in args.dtypes:
        if d not in DTYPE_NAMES:
            p.error(f"unknown dtype {d!r}; choose from {','.join(DTYPE_NAMES)}")
    try:
        if args.sizes:
            args.sizes = [bc.parse_size(s) for s in args.sizes.split(",")]
        else:
            args.sizes = bc.size_range(bc.parse_size(args.min_bytes),
                                       bc.parse_size(args.max_bytes), args.factor)
        args.memcpy_bytes = bc.parse_size(args.memcpy_bytes)
        args.env_combos = bc.env_combos(args.env)
    except ValueError as e:
        p.error(str(e))
    return args


def import_torch():
    global torch, dist
    import torch
    import torch.distributed as dist


def tcp_congestion():
    """The system's TCP congestion control, and braid's when BRAID_TCP_CONGESTION sets it."""
    try:
        with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
            system = f.read().strip()
    except OSError:
        system = "unknown"
    braid = os.environ.get("BRAID_TCP_CONGESTION")
    return f"{system} (braid: {braid})" if braid else system


def run_meta(args, info, backends):
    meta = dict(bc.machine_meta(), world_size=info.world_size, hosts=info.hosts, ops=args.ops,
                dtypes=args.dtypes, sizes=args.sizes,
                backends=[{"label": b.label, "name": b.name, "device": b.device}
                          for b in backends],
                time_stat="median over rounds of the mean over ranks of each rank's average "
                          "time per call", gb=1e9,
                args={k: v for k, v in vars(args).items() if k != "env_combos"})
    if info.rank == 0:
        print(f"# collectives: n={info.world_size} torch {meta['torch']} backends "
              f"{','.join(b.label for b in backends)} threads/rank {meta['torch_threads']}")
        if not info.single_host:
            per_host = {h: info.hosts.count(h) for h in dict.fromkeys(info.hosts)}
            cap = f", links capped at {args.link_gbit} Gbit/s" if args.link_gbit else ""
            # Note [Congestion control] (transport/tcp/socket.cc): it moves these numbers.
            meta["tcp_congestion"] = tcp_congestion()
            print(f"# hosts: {', '.join(f'{h} x{c}' for h, c in per_host.items())}{cap}; "
                  f"TCP congestion control {meta['tcp_congestion']}")
        if any(b.name == "braid" for b in backends):
            meta["braid_info"] = bc.braid_info()
            print(meta["braid_info"])
    return meta


def print_memcpy(m0, m1):
    busy = m0["single_rank_GBps"] / m0["single_rank_per_cpu_second_GBps"]
    print(f"\n# memcpy {bc.fmt_size(m0['bytes'])}B, torch copy_, 1 thread, best of 5, rank 0 "
          f"alone: {m0['single_rank_GBps']:.2f} GB/s before the run (median "
          f"{m0['single_rank_median_GBps']:.2f}), {m1['single_rank_GBps']:.2f} after; all ranks "
          f"at once: {statistics.mean(m0['concurrent_per_rank_GBps']):.2f} GB/s per rank")
    if busy < 0.7:
        print(f"# WARNING: busy machine: the memcpy got {100 * busy:.0f}% of a core "
              f"({m0['single_rank_per_cpu_second_GBps']:.2f} GB/s per CPU-second); compare "
              "backends only through ratios taken in the same run")


def save(args, report):
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot:
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        write_plot(args.plot, report)


def pin_rank():
    """--pin: this rank on the (RANK % k)-th of the k CPUs it may use; returns that CPU. Done
    before torch is imported, so that every thread the rank starts inherits the one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[int(os.environ["RANK"]) % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return cpu


def worker(args):
    cpu = pin_rank() if args.pin else None
    import_torch()
    info = bc.init_worker(timeout_s=args.timeout, threads=args.threads)
    pinned = bc.gather_objects(cpu) if args.pin else None
    progress = bc.Progress(0, enabled=False)
    try:
        if args.device == "cuda":
            why = cuda_unavailable()
            if why:
                raise bc.BenchFailure(f"--device cuda: {why}")
            backends = bc.resolve_backends(cuda_spec(args.backends), args.imports)
            labels = [b.label.replace("@cuda", "") for b in backends]
            for b, lb in zip(backends, labels):
                if labels.count(lb) == 1:
                    b.label = lb
        else:
            backends = bc.resolve_backends(args.backends, args.imports)
        points = sum(len(args.dtypes) * len(args.sizes) if op != "barrier" else 1
                     for op in args.ops) * len(backends) * len(args.env_combos)
        progress = bc.Progress(points, enabled=info.rank == 0 and not args.no_progress)
        meta = run_meta(args, info, backends)
        meta["pinned_cpus"] = pinned  # rank r ran on CPU pinned_cpus[r]; None: not pinned
        if info.rank == 0 and pinned:
            print(f"# pinned (--pin): rank r on CPU pinned[r], pinned = {pinned}", flush=True)
        runner, runs = Runner(args, info, backends, progress), []
        for env in args.env_combos:
            with bc.applied_env(env):
                runs.append(runner.run(env, args.sizes))
            if info.rank == 0:
                print_memcpy(runs[-1]["memcpy_before"], runs[-1]["memcpy_after"])
                if runs[-1].get("device_copies"):
                    print_device_copies(runs[-1]["device_copies"])
            if args.device == "cuda":
                runs[-1]["targets"] = cuda_targets(runs[-1]["results"], info.world_size,
                                                   torch.cuda.device_count(),
                                                   runs[-1].get("device_copies"))
                if info.rank == 0:
                    print_cuda_targets(runs[-1]["targets"], info.world_size)
        progress.clear()
        if info.rank == 0:
            save(args, {"schema": "braid-bench-collectives/1", "meta": meta, "runs": runs})
        return 0
    except bc.BenchFailure as e:
        progress.clear()
        if info.rank == 0 or not e.agreed:
            print(f"\nbench: {e}", file=sys.stderr, flush=True)
        return 3


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not bc.is_worker():
        why = cuda_unavailable()  # before spawning ranks that would all fail
        if why:
            print(f"bench: --device cuda: {why}", file=sys.stderr)
            return 2
    rc = bc.launch_if_requested(args.nprocs, args.store, hosts=args.hosts,
                                link_gbit=args.link_gbit)
    if rc is not None:
        return rc
    if not bc.is_worker():
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(bc.free_port()))
    bc.end_rank(bc.run_rank(worker, args))  # Note [Bounded teardown]


if __name__ == "__main__":
    sys.exit(main())

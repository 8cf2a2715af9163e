#!/usr/bin/env python3
"""Concurrency benchmark: oversubscribed cores, several groups at once, several threads per group.

    /usr/bin/python3 benchmarks/concurrency.py --nprocs 4 --json results/conc.json
    /usr/bin/python3 benchmarks/concurrency.py --nprocs 4 --quick          # < 60 s
    /usr/bin/python3 benchmarks/concurrency.py --nprocs 4 --modes oversubscribed \
        --env BRAID_SHM_SPIN_US=0,20,200 --env BRAID_WORKER_SPIN_US=0,20   # spin sweeps

Three modes, each timing braid and gloo in the same run (the default group is gloo and only
serves as the control group, as in collectives.py; see _bench_common.py):

  oversubscribed  every rank calls allreduce (fp32) on one group per backend, at 4 B, 4 KiB,
                  1 MiB and 16 MiB. With --nprocs 4 on a 2-core machine there are twice as many
                  ranks as cores, so any wait that spins steals the core from the peer it waits
                  for. Besides the time per op this reports the CPU time the whole job consumed
                  per op (all threads of all ranks), the cores it kept busy (CPU / wall), the time
                  its threads sat runnable but not running (run-queue wait, /proc schedstat),
                  context switches, and which threads burnt the CPU (the main thread, the threads
                  each backend started, the rest).
  groups          each rank creates K groups (--groups, default 2) per backend over the same ranks
                  and drives them concurrently from K Python threads, thread k on group k, the
                  same op sequence on each (allreduce at 4 KiB, 1 MiB, 16 MiB). Reports the
                  aggregate ops/s and busbw over all groups, next to K=1 (one thread, one group).
  threads         T threads per rank (--threads-per-rank, default 3) issue async allreduces
                  (async_op=True) on ONE group in a fixed global order, taking turns under a lock
                  (op j is issued by thread j % T), and each op is waited for by a thread that
                  did NOT issue it (op j by thread (j + 1) % T, alternately with Work.wait() and
                  Work.get_future().wait()). Reports the time per op, next to T=1.

Note [Concurrency checks]
Every result is compared with its closed form, on every rank, element by element (a mismatch
fails the run with the mode, backend, size and rank). Rank q's input at position i is
g(q, i) = (i + q) % 3 - 1 + i % 7 - 3 + c, with c a per-call constant: the group index in
`groups`, the op index in `threads`, so that data crossing between groups or between concurrent
ops shows up as a wrong sum. The allreduce of it is sum_q g(q, i), exact in fp32. oversubscribed
and groups check the first call of each point (before warm-up) and one more call after the timed
calls, as collectives.py does; the timed calls run on zeros. In threads mode a checked block of
ops (each on its own buffer with its own c, every op checked by its waiting thread, and the
future's value checked to be the op's tensor) precedes and follows the timed blocks.

Note [What collapse looks like]
With more ranks than cores, a wait loop that spins (or yields) instead of sleeping shows up as:
time per op far above gloo's, CPU per op far above gloo's (on an idle machine with about every
core busy, cores ~ the core count; on a shared one the job only gets its share, so cores stays
low and CPU per op is the signal), few voluntary context switches and many involuntary ones, and
the CPU concentrated in the backend's own threads. The table flags a point SLOW when braid's
time is above 2x gloo's and SPIN when braid's CPU per op is above 2x gloo's. These are flags,
not pass/fail: speed is never a test (the closed-form checks are). The machine may be shared:
compare backends only through ratios taken in the same run, and repeat runs (--repeat) to see
the spread.

Times: per point, --rounds timed blocks per backend, alternating backends and rotating the
order per size (Note [Rounds] in collectives.py). t = median over rounds of the mean over ranks
of each rank's wall time per op. CPU per op = median over rounds of the CPU consumed by all
ranks together (CLOCK_PROCESS_CPUTIME_ID, all threads, less the threads that the OTHER backends'
groups started, so that a worker still polling after its own round is not charged to the next
backend) divided by the ops of the round.
busbw = S / t * 2(n-1)/n (nccl-tests); in groups mode t is the wall time of a round divided by
the ops of all K groups. --env repeats everything in a fresh set of ranks per value, because
some BRAID_ settings are read once per process.
"""

import argparse
import datetime
import faulthandler
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
# The in-tree package (setup.py build_ext --inplace) when torch_braid is not installed.
sys.path.append(os.path.join(os.path.dirname(_HERE), "python"))

import _bench_common as bc  # noqa: E402

torch = dist = None  # imported in the ranks only: the launcher does not need torch

MODES = ("oversubscribed", "groups", "threads")
PERIOD = 21
PART_ENV = "BENCH_CONCURRENCY_PART"  # where a launched run's rank 0 leaves its results
DEFAULT_SIZES = {"oversubscribed": "4,4K,1M,16M", "groups": "4K,1M,16M", "threads": "4K,1M"}
QUICK_SIZES = {"oversubscribed": "4,4K,1M,16M", "groups": "4K,1M", "threads": "4K,1M"}


# ---- closed forms (Note [Concurrency checks]) ----------------------------------------------------
def in_tile(q, c):
    j = torch.arange(PERIOD, dtype=torch.float64)
    return (j + q) % 3 - 1 + j % 7 - 3 + c


def sum_tile(n, c):
    return sum(in_tile(q, c) for q in range(n))


class WrongResult(Exception):
    pass


def fill_input(buf, rank, c):
    bc.fill_periodic(buf, in_tile(rank, c))


def check_sum(buf, n, c, where):
    bad = bc.first_mismatch(buf, sum_tile(n, c), 0)
    if bad:
        raise WrongResult(f"{where}: element {bad[0]} is {bad[1]:g}, expected {bad[2]:g}")


def short(e):
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


# ---- CPU accounting ------------------------------------------------------------------------------
def _tids():
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _thread_stat(tid):
    """(run ns, run-queue wait ns, voluntary, involuntary context switches) of one thread."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            run, wait, _ = (int(x) for x in f.read().split())
        vol = invol = 0
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    vol = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol = int(line.split()[1])
        return run, wait, vol, invol
    except (OSError, ValueError):
        return None


class CpuMeter:
    """CPU use of this process between two snapshots, split by thread class.

    Classes: 'main' (the thread that called init), the label of the backend whose group
    creation started a thread (its worker, progress and device threads), and 'rest' (our own
    Python threads, torch's pools, the control group): the total minus the classes above."""

    def __init__(self):
        self.cls = {os.getpid(): "main"}

    def label_new_threads(self, before, label):
        for tid in _tids() - before:
            self.cls.setdefault(tid, label)

    def snap(self, start):
        """start: read the threads first, so that reading them is not counted in the CPU."""
        threads = {t: _thread_stat(t) for t in _tids()} if start else None
        cpu, ru = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
        threads = threads or {t: _thread_stat(t) for t in _tids()}
        return {"cpu": cpu, "ru": (ru.ru_nvcsw, ru.ru_nivcsw, ru.ru_stime), "threads": threads}

    def delta(self, a, b):
        d = {"cpu_s": b["cpu"] - a["cpu"], "vcsw": b["ru"][0] - a["ru"][0],
             "ivcsw": b["ru"][1] - a["ru"][1], "sys_s": b["ru"][2] - a["ru"][2],
             "runq_wait_s": 0.0, "by_class_s": {}}
        for tid, sb in b["threads"].items():
            sa = a["threads"].get(tid)
            if sa is None or sb is None:
                continue
            d["runq_wait_s"] += (sb[1] - sa[1]) / 1e9
            c = self.cls.get(tid, "rest")
            if c != "rest":
                d["by_class_s"][c] = d["by_class_s"].get(c, 0.0) + (sb[0] - sa[0]) / 1e9
        d["by_class_s"]["rest"] = max(d["cpu_s"] - sum(d["by_class_s"].values()), 0.0)
        return d


def summarize(rounds, ops_per_round, n_bytes, n, others=()):
    """rounds: per round, per rank {'wall_s', 'cpu_s', ...}. Times per op (see the docstring).

    others: labels of the backends NOT timed here; their threads' CPU (e.g. a worker still
    polling after its own round) is left out of cpu_us_per_op (kept in cpu_total_us_per_op)."""
    def med(f):
        return statistics.median(f(rnd) for rnd in rounds)

    def cpu(x):
        return x["cpu_s"] - sum(x["by_class_s"].get(o, 0.0) for o in others)

    t = med(lambda rnd: statistics.mean(x["wall_s"] for x in rnd)) / ops_per_round
    res = {
        "ops_per_round": ops_per_round, "rounds": len(rounds), "time_us": t * 1e6,
        "round_time_us": [statistics.mean(x["wall_s"] for x in rnd) / ops_per_round * 1e6
                          for rnd in rounds],
        "cpu_us_per_op": med(lambda rnd: sum(cpu(x) for x in rnd)) / ops_per_round * 1e6,
        "cpu_total_us_per_op":
            med(lambda rnd: sum(x["cpu_s"] for x in rnd)) / ops_per_round * 1e6,
        "sys_total_us_per_op":  # kernel time (syscalls, page faults, copies between processes)
            med(lambda rnd: sum(x["sys_s"] for x in rnd)) / ops_per_round * 1e6,
        "runq_wait_us_per_op":
            med(lambda rnd: sum(x["runq_wait_s"] for x in rnd)) / ops_per_round * 1e6,
        "vcsw_per_op": med(lambda rnd: sum(x["vcsw"] for x in rnd)) / ops_per_round,
        "ivcsw_per_op": med(lambda rnd: sum(x["ivcsw"] for x in rnd)) / ops_per_round,
        "busbw_GBps": n_bytes / t / 1e9 * 2 * (n - 1) / n if n > 1 else 0.0,
        "ops_per_s": 1.0 / t,
    }
    res["cores_busy"] = res["cpu_us_per_op"] / res["time_us"]
    classes = sorted({c for rnd in rounds for x in rnd for c in x["by_class_s"]})
    res["cpu_us_per_op_by_class"] = {
        c: med(lambda rnd: sum(x["by_class_s"].get(c, 0.0) for x in rnd)) / ops_per_round * 1e6
        for c in classes}
    return res


# ---- threads -------------------------------------------------------------------------------------
def hang_exit(msg):
    """A thread stuck in a collective past every timeout: report and leave without joining it."""
    print(f"\nbench: HANG: {msg}; thread stacks follow", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(all_threads=True)
    sys.stderr.flush()
    os._exit(4)


def run_in_threads(fns, join_timeout, what):
    """Runs fns[i]() on thread i, all released at once. Returns (wall seconds, [error or None])."""
    start = threading.Barrier(len(fns) + 1)
    errors = [None] * len(fns)

    def body(i):
        try:
            start.wait()
            fns[i]()
        except BaseException as e:  # noqa: B902  reported through agree()
            errors[i] = e

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(fns))]
    for th in threads:
        th.start()
    start.wait()
    t0 = time.perf_counter()
    deadline = time.monotonic() + join_timeout
    for th in threads:
        th.join(max(deadline - time.monotonic(), 0.0))
        if th.is_alive():
            hang_exit(f"{what}: a thread did not finish within {join_timeout:.0f} s")
    return time.perf_counter() - t0, errors


def agree_errors(errors, where):
    """Fails every rank if any thread of any rank raised (wrong results first)."""
    wrong = [e for e in errors if isinstance(e, WrongResult)]
    other = [e for e in errors if e is not None and not isinstance(e, WrongResult)]
    status = 2 if wrong else (1 if other else 0)
    st, msg = bc.agree(status, short((wrong or other)[0]) if status else "")
    if st:
        raise bc.BenchFailure(f"{'WRONG RESULT' if st == 2 else 'FAILED'}: {where}: {msg}")


# ---- the modes -----------------------------------------------------------------------------------
class Runner:
    def __init__(self, args, info, backends):
        self.args, self.info, self.backends = args, info, backends
        self.r, self.n = info.rank, info.world_size
        self.meter = CpuMeter()
        self.groups = {}  # label -> [group]
        self.join_timeout = args.timeout + 60

    def create_groups(self, count):
        timeout = datetime.timedelta(seconds=self.args.timeout)
        for be in self.backends:
            have = self.groups.setdefault(be.label, [])
            while len(have) < count:
                before = _tids()
                have.append(dist.new_group(backend=be.name, timeout=timeout))
                bc.control_barrier()
                self.meter.label_new_threads(before, be.label)

    def destroy_groups(self):
        for gs in self.groups.values():
            for g in gs:
                dist.destroy_process_group(g)
        self.groups = {}

    def others(self, be):
        return [b.label for b in self.backends if b.label != be.label]

    def order(self, i, items):
        k = i % len(items)
        return items[k:] + items[:k]

    def measure(self, fn):
        """One timed block on every rank: wall and CPU of fn(), gathered to every rank."""
        bc.control_barrier()
        a = self.meter.snap(start=True)
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
        d = self.meter.delta(a, self.meter.snap(start=False))
        d["wall_s"] = wall
        return bc.gather_objects(d)

    def iters_for(self, t_est):
        a = self.args
        return bc.agree_iters(t_est, a.time_per_point / a.rounds,
                              -(-a.min_iters // a.rounds), a.max_iters)

    # -- oversubscribed ----------------------------------------------------------------------------
    def oversubscribed(self):
        self.create_groups(1)
        out = []
        for si, nbytes in enumerate(self.args.sizes["oversubscribed"]):
            count = max(nbytes // 4, 1)
            buf = torch.empty(count, dtype=torch.float32)
            points = []
            for be in self.order(si, self.backends):
                g = self.groups[be.label][0]
                where = f"oversubscribed backend={be.label} size={nbytes} B"
                self.checked_allreduce(buf, g, where + " first call")
                buf.zero_()
                t_est = bc.time_iters(lambda: dist.all_reduce(buf, group=g), self.args.warmup,
                                      lambda: None)
                points.append((be, g, where, self.iters_for(t_est), []))
            for rnd in range(self.args.rounds):
                for be, g, where, iters, rounds in self.order(rnd, points):
                    rounds.append(self.measure(
                        lambda: [dist.all_reduce(buf, group=g) for _ in range(iters)]))
            for be, g, where, iters, rounds in points:
                self.checked_allreduce(buf, g, where + f" after {iters * len(rounds)} timed calls")
                out.append(dict(summarize(rounds, iters, count * 4, self.n, self.others(be)),
                                mode="oversubscribed",
                                backend=be.label, bytes=count * 4, iters=iters))
            self.progress(f"oversubscribed {bc.fmt_size(nbytes)}")
        return out

    def checked_allreduce(self, buf, group, where, c=0):
        status, msg = 0, ""
        try:
            fill_input(buf, self.r, c)
            dist.all_reduce(buf, group=group)
            check_sum(buf, self.n, c, f"{where} (rank {self.r})")
        except WrongResult as e:
            status, msg = 2, str(e)
        except Exception as e:
            status, msg = 1, short(e)
        st, msg = bc.agree(status, msg)
        if st:
            raise bc.BenchFailure(f"{'WRONG RESULT' if st == 2 else 'FAILED'}: {where}: {msg}")

    # -- groups ------------------------------------------------------------------------------------
    def groups_mode(self):
        kmax = self.args.groups
        self.create_groups(kmax)
        ks = sorted({1, kmax})
        out = []
        for si, nbytes in enumerate(self.args.sizes["groups"]):
            count = max(nbytes // 4, 1)
            bufs = [torch.empty(count, dtype=torch.float32) for _ in range(kmax)]
            points = []
            for be in self.order(si, self.backends):
                gs = self.groups[be.label]
                for k in ks:
                    where = f"groups backend={be.label} K={k} size={nbytes} B"
                    self.checked_groups(gs[:k], bufs, where + " first call")
                    for b in bufs:
                        b.zero_()
                    wall, errs = run_in_threads(self.group_loops(gs[:k], bufs, self.args.warmup),
                                                self.join_timeout, where + " warm-up")
                    agree_errors(errs, where + " warm-up")
                    points.append((be, k, gs[:k], where,
                                   self.iters_for(wall / self.args.warmup), []))
            for rnd in range(self.args.rounds):
                for be, k, gs, where, iters, rounds in self.order(rnd, points):
                    errs = []

                    def block():
                        errs.extend(run_in_threads(self.group_loops(gs, bufs, iters),
                                                   self.join_timeout, where)[1])

                    rounds.append(self.measure(block))
                    agree_errors(errs, where)
            for be, k, gs, where, iters, rounds in points:
                self.checked_groups(gs, bufs, where + f" after {iters * len(rounds)} timed calls")
                out.append(dict(summarize(rounds, k * iters, count * 4, self.n, self.others(be)),
                                mode="groups",
                                backend=be.label, bytes=count * 4, groups=k, iters=iters))
            self.progress(f"groups {bc.fmt_size(nbytes)}")
        return out

    def group_loops(self, gs, bufs, iters):
        def loop(g, b):
            for _ in range(iters):
                dist.all_reduce(b, group=g)
        return [lambda g=g, b=b: loop(g, b) for g, b in zip(gs, bufs)]

    def checked_groups(self, gs, bufs, where):
        """One call on each group at once, each from its own thread, group k with c = 3k + 1."""
        def one(k):
            fill_input(bufs[k], self.r, 3 * k + 1)
            dist.all_reduce(bufs[k], group=gs[k])
            check_sum(bufs[k], self.n, 3 * k + 1, f"{where} group {k} (rank {self.r})")

        _, errs = run_in_threads([lambda k=k: one(k) for k in range(len(gs))],
                                 self.join_timeout, where)
        agree_errors(errs, where)

    # -- threads -----------------------------------------------------------------------------------
    def threads_mode(self):
        tmax = self.args.threads_per_rank
        self.create_groups(1)
        ts = sorted({1, tmax})
        out = []
        for si, nbytes in enumerate(self.args.sizes["threads"]):
            count = max(nbytes // 4, 1)
            m_check = max(2 * tmax, min(self.args.check_ops, max(1, (64 << 20) // (count * 4))))
            points = []
            for be in self.order(si, self.backends):
                g = self.groups[be.label][0]
                for t in ts:
                    where = f"threads backend={be.label} T={t} size={nbytes} B"
                    self.agreed_block(g, t, count, m_check, True, where + " checked block")
                    m0 = max(2 * t, self.args.warmup)
                    wall = self.agreed_block(g, t, count, m0, False, where + " warm-up")
                    points.append((be, t, g, where, self.iters_for(wall / m0), []))
            for rnd in range(self.args.rounds):
                for be, t, g, where, m, rounds in self.order(rnd, points):
                    bufs, errs = [torch.zeros(count) for _ in range(m)], []
                    rounds.append(self.measure(lambda: errs.extend(
                        self.threaded_block(g, t, count, m, False, where, bufs)[1])))
                    agree_errors(errs, where)
            for be, t, g, where, m, rounds in points:
                self.agreed_block(g, t, count, m_check, True,
                                  where + f" checked block after {m * len(rounds)} timed ops")
                out.append(dict(summarize(rounds, m, count * 4, self.n, self.others(be)),
                                mode="threads",
                                backend=be.label, bytes=count * 4, threads=t, ops_per_block=m,
                                checked_ops=2 * m_check))
            self.progress(f"threads {bc.fmt_size(nbytes)}")
        return out

    def agreed_block(self, group, nthreads, count, m, check, where):
        wall, errs = self.threaded_block(group, nthreads, count, m, check, where)
        agree_errors(errs, where)
        return wall

    def threaded_block(self, group, nthreads, count, m, check, where, bufs=None):
        """m async allreduces on one group: op j issued by thread j % T in global order j,
        waited for (and checked) by thread (j + 1) % T. Returns (wall time, thread errors)."""
        if bufs is None:
            bufs = [torch.empty(count) if check else torch.zeros(count) for _ in range(m)]
        consts = [j % 11 - 5 for j in range(m)]
        if check:
            for j, b in enumerate(bufs):
                fill_input(b, self.r, consts[j])
        works = [None] * m
        cond = threading.Condition()
        state = {"next": 0, "abort": False}
        tmo = self.join_timeout

        def finish(j, me):
            with cond:  # the last op may not be issued yet when its waiter gets here
                if not cond.wait_for(lambda: state["next"] > j or state["abort"], tmo):
                    raise RuntimeError(f"{where}: op {j} was never issued (rank {self.r})")
                if state["abort"]:
                    return
            w = works[j]
            if j % 2 == 0:
                if w.wait() is not True:
                    raise RuntimeError(f"{where}: op {j}: Work.wait() did not return True")
                if not w.is_completed():
                    raise RuntimeError(f"{where}: op {j}: not completed after wait (rank "
                                       f"{self.r})")
            else:  # gloo completes the future before the Work: no is_completed() check here
                value = w.get_future().wait()
                if not (isinstance(value, list) and len(value) == 1
                        and value[0].data_ptr() == bufs[j].data_ptr()):
                    raise WrongResult(f"{where}: op {j}: the future's value is not [the op's "
                                      f"tensor] (rank {self.r}): {type(value).__name__}")
            if check:
                check_sum(bufs[j], self.n, consts[j],
                          f"{where} op {j} issued by thread {j % nthreads}, waited by thread "
                          f"{me} (rank {self.r})")

        def body(me):
            try:
                for j in range(me, m, nthreads):
                    with cond:
                        if not cond.wait_for(lambda: state["next"] == j or state["abort"], tmo):
                            raise RuntimeError(f"{where}: thread {me} never got its turn for op "
                                               f"{j} (rank {self.r})")
                        if state["abort"]:
                            return
                        works[j] = dist.all_reduce(bufs[j], group=group, async_op=True)
                        state["next"] += 1
                        cond.notify_all()
                    if j >= 1:
                        finish(j - 1, me)  # issued by thread (j - 1) % T
                if m % nthreads == me:
                    finish(m - 1, me)
            except BaseException:
                with cond:
                    state["abort"] = True
                    cond.notify_all()
                raise

        return run_in_threads([lambda me=me: body(me) for me in range(nthreads)], tmo, where)

    def progress(self, what):
        if self.r == 0 and not self.args.no_progress:
            print(f"progress: {what} done", file=sys.stderr, flush=True)


# ---- output --------------------------------------------------------------------------------------
def _flags(a, b):
    flags = []
    if a["time_us"] > 2 * b["time_us"]:
        flags.append("SLOW")
    if a["cpu_us_per_op"] > 2 * b["cpu_us_per_op"]:
        flags.append("SPIN")
    return ",".join(flags) or "ok"


def format_tables(results, labels, n, cores, env):
    env_s = " ".join(f"{k}={v}" for k, v in env.items())
    pair = labels[:2] if len(labels) >= 2 else None
    out = []
    for mode in MODES:
        rs = [x for x in results if x["mode"] == mode]
        if not rs:
            continue
        extra = {"oversubscribed": None, "groups": "groups", "threads": "threads"}[mode]
        keys = sorted({(x["bytes"], x.get(extra, 0) if extra else 0) for x in rs})
        if mode == "oversubscribed":
            per = ["time(us)", "cpu/op", "cores", "runq/op", "vcs", "ivcs", "own thr"]
        elif mode == "groups":
            per = ["ops/s", "busbw", "time(us)", "cpu/op", "cores"]
        else:
            per = ["time(us)", "cpu/op", "cores", "ivcs"]
        head = [("", ["size", {"oversubscribed": "n", "groups": "K", "threads": "T"}[mode]])]
        head += [(lb, per) for lb in labels]
        if pair:
            head.append((f"{pair[0]}/{pair[1]}", ["time", "cpu", "flag"]))
        rows = []
        for size, k in keys:
            cells = {x["backend"]: x for x in rs if x["bytes"] == size
                     and (not extra or x[extra] == k)}
            row = [bc.fmt_size(size), str(k if extra else n)]
            for lb in labels:
                x = cells.get(lb)
                if x is None:
                    row += ["-"] * len(per)
                    continue
                own = x["cpu_us_per_op_by_class"].get(lb, 0.0) / max(x["cpu_us_per_op"], 1e-9)
                vals = {"time(us)": f"{x['time_us']:.1f}", "cpu/op": f"{x['cpu_us_per_op']:.1f}",
                        "cores": f"{x['cores_busy']:.2f}",
                        "runq/op": f"{x['runq_wait_us_per_op']:.1f}",
                        "vcs": f"{x['vcsw_per_op']:.1f}", "ivcs": f"{x['ivcsw_per_op']:.2f}",
                        "own thr": f"{100 * own:.0f}%",
                        "ops/s": f"{x['ops_per_s']:.0f}", "busbw": f"{x['busbw_GBps']:.3f}"}
                row += [vals[c] for c in per]
            if pair:
                a, b = cells.get(pair[0]), cells.get(pair[1])
                if a and b:
                    row += [f"{a['time_us'] / b['time_us']:.2f}",
                            f"{a['cpu_us_per_op'] / b['cpu_us_per_op']:.2f}", _flags(a, b)]
                else:
                    row += ["-", "-", "-"]
            rows.append(row)
        notes = {
            "oversubscribed": [
                "time: per op (median over rounds of the mean over ranks); cpu/op: CPU of all "
                "ranks per op, us (all threads but the other backends'); cores = cpu/op / time",
                "runq/op: us per op the job's threads spent runnable but not running; vcs/ivcs: "
                "voluntary/involuntary context switches per op, all ranks",
                "own thr: share of the CPU spent in the threads the backend's group started"],
            "groups": ["K groups per backend driven by K threads per rank at once; ops/s, busbw "
                       "and time are aggregate over all K groups (time = wall / all ops)"],
            "threads": ["T threads per rank issue async ops on one group in turn; each op is "
                        "waited for by another thread (T > 1); time = wall per op"]}[mode]
        notes = notes + [f"flags (Note [What collapse looks like]): SLOW = time > 2x "
                         f"{pair[1]}, SPIN = cpu/op > 2x {pair[1]}'s"
                         if pair else ""]
        title = (f"\n# {mode}: allreduce fp32, n={n} ranks on {cores} cores {env_s}").rstrip()
        out.append(bc.render_table(title, head, rows, [x for x in notes if x]))
    return "\n".join(out)


# ---- entry points --------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--nprocs", type=int, default=4, help="spawn this many ranks (0: torchrun)")
    p.add_argument("--store", choices=("file", "tcp"), default="file")
    p.add_argument("--backends", default="braid,gloo", help="comma list; ratios are 1st / 2nd")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--sizes", default=None,
                   help="sizes for every mode (default: oversubscribed 4,4K,1M,16M; groups "
                        "4K,1M,16M; threads 4K,1M)")
    p.add_argument("--groups", type=int, default=2, help="K: groups per backend (groups mode)")
    p.add_argument("--threads-per-rank", type=int, default=3, help="T (threads mode)")
    p.add_argument("--check-ops", type=int, default=24,
                   help="ops in each checked block of threads mode (fewer above 64 MiB in all)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-iters", type=int, default=6, help="timed calls per point, all rounds")
    p.add_argument("--max-iters", type=int, default=100000)
    p.add_argument("--time-per-point", type=float, default=1.0,
                   help="seconds of timed calls per point and backend, over all rounds")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=120, help="group timeout, seconds")
    p.add_argument("--env", action="append", default=[], metavar="KEY=V1,V2",
                   help="repeat everything in fresh ranks for each value (all combinations)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run everything this many times in fresh ranks (interleaved with the "
                        "--env values) and print medians and ranges")
    p.add_argument("--quick", action="store_true",
                   help="short points and fewer sizes (about a minute with 4 ranks on 2 cores)")
    p.add_argument("--json", default=None)
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in args.modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; choose from {','.join(MODES)}")
    if args.quick:
        args.time_per_point, args.rounds, args.min_iters, args.warmup = 0.12, 2, 2, 2
        args.check_ops = min(args.check_ops, 8)
    if args.groups < 1 or args.threads_per_rank < 1:
        p.error("--groups and --threads-per-rank must be >= 1")
    try:
        table = QUICK_SIZES if args.quick else DEFAULT_SIZES
        args.sizes = {m: [bc.parse_size(s) for s in (args.sizes or table[m]).split(",")]
                      for m in MODES}
        args.env_combos = bc.env_combos(args.env)
    except ValueError as e:
        p.error(str(e))
    if (args.env or args.repeat > 1) and not args.nprocs:
        p.error("--env and --repeat need --nprocs (the ranks must start with the setting in "
                "place)")
    return args


def worker(args):
    global torch, dist
    import torch
    import torch.distributed as dist

    info = bc.init_worker(timeout_s=args.timeout, threads=1)
    try:
        backends = bc.resolve_backends(args.backends, devices=("cpu",))
        runner = Runner(args, info, backends)
        env = {k: v for k, v in os.environ.items() if k.startswith("BRAID_")}
        cores = len(os.sched_getaffinity(0))
        meta = dict(bc.machine_meta(), world_size=info.world_size, cores_available=cores,
                    backends=[b.label for b in backends], modes=args.modes,
                    args={k: v for k, v in vars(args).items() if k != "env_combos"})
        if any(b.name == "braid" for b in backends):
            import torch_braid

            meta["braid_settings"] = {s["name"]: s["value"] for s in torch_braid.settings()}
        if info.rank == 0:
            spins = " ".join(f"{k}={v}" for k, v in meta.get("braid_settings", {}).items()
                             if "SPIN" in k)
            print(f"# concurrency: n={info.world_size} ranks, {cores} cores, torch "
                  f"{meta['torch']}, backends {','.join(meta['backends'])}, load average "
                  f"{os.getloadavg()[0]:.1f} {spins}".rstrip(), flush=True)
        results = []
        for mode in args.modes:
            results += {"oversubscribed": runner.oversubscribed, "groups": runner.groups_mode,
                        "threads": runner.threads_mode}[mode]()
        runner.destroy_groups()
        meta["load_average_end"] = os.getloadavg()
        if info.rank == 0:
            print(format_tables(results, meta["backends"], info.world_size, cores, env),
                  flush=True)
            run = {"env": env, "results": results}
            part = os.environ.get(PART_ENV)
            if part:
                with open(part, "w") as f:
                    json.dump({"meta": meta, "run": run}, f)
            elif args.json:
                save(args.json, {"schema": "braid-bench-concurrency/1", "meta": meta,
                                 "runs": [run]})
        return 0
    except bc.BenchFailure as e:
        if info.rank == 0 or not e.agreed:
            print(f"\nbench: {e}", file=sys.stderr, flush=True)
        return 3


def save(path, report):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def main(argv=None):
    args = parse_args(argv)
    if bc.is_worker() or not args.nprocs:
        if not bc.is_worker():
            os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                              MASTER_PORT=str(bc.free_port()))
        bc.end_rank(bc.run_rank(worker, args))  # Note [Bounded teardown]
    meta, runs = None, []
    with tempfile.TemporaryDirectory(prefix="braid-conc-") as tmp:
        for rep in range(args.repeat):  # interleaved: a slow spell of the machine hits all
            for i, env in enumerate(args.env_combos):
                part = os.path.join(tmp, f"part{rep}.{i}.json")
                if args.repeat > 1 or len(args.env_combos) > 1:
                    print(f"\n## run {rep + 1}/{args.repeat} "
                          f"{' '.join(f'{k}={v}' for k, v in env.items())}".rstrip(), flush=True)
                with bc.applied_env(dict(env, **{PART_ENV: part})):
                    rc = bc.launch_if_requested(args.nprocs, args.store)
                if rc:
                    return rc
                with open(part) as f:
                    got = json.load(f)
                meta = meta or got["meta"]
                runs.append(dict(got["run"], repeat=rep, env_sweep=env))
    if args.repeat > 1 or len(args.env_combos) > 1:
        print(format_summary(runs, meta["backends"]), flush=True)
    if args.json:
        save(args.json, {"schema": "braid-bench-concurrency/1", "meta": meta, "runs": runs})
    return 0


def format_summary(runs, labels):
    """Medians and ranges over the repeated runs, per setting and point."""
    pts = {}
    for run in runs:
        env_s = " ".join(f"{k}={v}" for k, v in run["env_sweep"].items()) or "-"
        for x in run["results"]:
            key = (env_s, x["mode"], x["bytes"], x.get("groups", x.get("threads", 0)))
            pts.setdefault(key, {}).setdefault(run["repeat"], {})[x["backend"]] = x
    a, b = labels[0], labels[1] if len(labels) > 1 else None

    def rng(v, fmt="{:.1f}"):
        return f"{fmt.format(statistics.median(v))} [{fmt.format(min(v))}-{fmt.format(max(v))}]"

    rows = []
    for (env_s, mode, size, k), reps in pts.items():
        row = [env_s, mode, bc.fmt_size(size), str(k or "-"), str(len(reps))]
        for lb in labels:
            ts = [r[lb]["time_us"] for r in reps.values() if lb in r]
            cs = [r[lb]["cpu_us_per_op"] for r in reps.values() if lb in r]
            row += [rng(ts) if ts else "-", rng(cs) if cs else "-"]
        if b:
            both = [r for r in reps.values() if a in r and b in r]
            tr = [r[a]["time_us"] / r[b]["time_us"] for r in both]
            cr = [r[a]["cpu_us_per_op"] / r[b]["cpu_us_per_op"] for r in both]
            fl = [_flags(r[a], r[b]) for r in both]
            row += [rng(tr, "{:.2f}") if tr else "-", rng(cr, "{:.2f}") if cr else "-",
                    f"{sum(f != 'ok' for f in fl)}/{len(fl)}"]
        rows.append(row)
    head = [("", ["setting", "mode", "size", "K/T", "runs"])]
    head += [(lb, ["time(us)", "cpu/op(us)"]) for lb in labels]
    if b:
        head.append((f"{a}/{b}", ["time", "cpu", "flagged"]))
    return bc.render_table("\n# summary over runs: median [min-max]", head, rows,
                           ["time: per op (groups: wall / all ops of all K groups); cpu/op: all "
                            "ranks, all threads; flagged: runs with SLOW or SPIN"])

if __name__ == "__main__":
    sys.exit(main())

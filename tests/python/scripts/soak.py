"""Soak test: many random ops over 4 ranks, each checked against a closed form,
with the ranks' resources flat between the start and the end of the run.

  /usr/bin/python3 tests/python/scripts/soak.py --ops 10000    # the long run, on demand
  (tests/python/test_soak.py runs a short one in the fast tier, the long one in the slow tier)

Every rank draws the same op sequence from one seeded RNG: op (allreduce,
broadcast, reduce, all_gather[_into_tensor], reduce_scatter[_tensor],
all_to_all[_single], gather, scatter, barrier, send/recv), group (the world or
one of several overlapping subgroups, all created by every rank in the same
order), dtype, element count (0, 1, odd, up to 1 MiB), reduce op, root, and
whether the op is async. Ranks outside the op's group skip it. Async ops stay
in flight in a window of up to WINDOW ops and are waited for (and checked)
oldest first.

Note [Soak closed forms]
Inputs are pure functions of (rank, op index) (harness.make_input for
reductions, harness.pattern for data movement), so each rank computes the
exact expected result without communicating. make_input draws small integers
whose sums and products are exact in every dtype, bf16 and fp16 included, so
every result is compared exactly; only AVG (torch 2.x) may differ by one ulp
(n * (1/n) against a division), which Checker.reduced allows.

Note [Soak resource figures]
Each rank samples its RSS (/proc/self/statm and the RssAnon/RssFile/RssShmem
split of /proc/self/status), open fds (/proc/self/fd), threads
(/proc/self/task), mappings (/proc/self/maps, and the bytes of braid's
segments among them) and malloc's bytes in use (mallinfo2), after draining
the window and a gc pass: at the end of the warm-up (the first 1000 ops in the
long run, which let lazily started threads and allocator pools settle), at the
end of the run, and every `--every` ops between them for the trend. From the
first sample to the last, these must grow by less than 1%: RSS without shared
memory ("private": RssAnon + RssFile), malloc's bytes in use, fds, threads and
mappings; braid's mapped segment bytes must not change at all.
Two measured effects decide this split, neither of them a leak:
  - RssShmem grows through the run (8 -> 20 MiB on rank 0 over 10,000 ops) as
    ops of new sizes touch more pages of the groups' windows, which are mapped
    once, at group creation (33.6 MiB on rank 0): it is bounded by them.
  - With glibc's default settings, RSS swings by several MiB from sample to
    sample with no trend (heap fragmentation after glibc raises its mmap
    threshold), and mallinfo's bytes in use creep up ~16 bytes per op as
    per-thread caches (tcache) fill with freed chunks of the soak's varied
    sizes. The ranks therefore run with MALLOC_TUNABLES (below); with them,
    malloc's bytes in use stay equal to the byte. --default-malloc runs without
    them, to see the difference.
"""

import argparse
import collections
import ctypes
import gc
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

import harness as H  # noqa: E402

# Subgroups (global ranks), every rank creates each in this order; None is the world.
GROUPS = [None, (0, 1), (1, 2, 3), (0, 2, 3), (1, 3), (0, 1, 2), (2, 3)]
WORLD = 4
KINDS = {  # op -> weight
    "all_reduce": 20, "broadcast": 8, "reduce": 8, "all_gather": 6,
    "all_gather_into_tensor": 6, "reduce_scatter": 6, "reduce_scatter_tensor": 6,
    "all_to_all": 5, "all_to_all_single": 5, "gather": 5, "scatter": 5, "barrier": 4,
    "send_recv": 8,
}
WINDOW = 8  # async ops in flight per rank, at most
MAX_BYTES = 1 << 20
REPORTED_FAILURES = 40


def draw_count(rng, itemsize):
    """0, 1, odd, a few thousand, or up to 1 MiB per rank (rarely: they dominate the time)."""
    u = rng.random()
    if u < 0.08:
        return 0
    if u < 0.16:
        return 1
    if u < 0.56:
        return rng.randrange(3, 1000, 2)
    if u < 0.95:
        return rng.randrange(1000, 16384)
    return rng.randrange(16384, MAX_BYTES // itemsize + 1)


def draw_op(rng, i, torch2):
    """Op i of the sequence: the same on every rank (every rank calls this for every i)."""
    kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
    g = rng.randrange(len(GROUPS))
    members = list(range(WORLD)) if GROUPS[g] is None else sorted(GROUPS[g])
    dtype = rng.choice(H.DTYPES)
    itemsize = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2,
                "bfloat16": 2, "int16": 2}.get(dtype, 1)
    if kind in ("all_to_all", "all_to_all_single", "all_gather", "all_gather_into_tensor",
                "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter"):
        itemsize *= len(members)  # these move n blocks per rank: keep each rank's total <= 1 MiB
    count = draw_count(rng, itemsize)
    spec = dict(i=i, kind=kind, g=g, members=members, dtype=dtype, count=count,
                redop=rng.choice(H.ops_for(dtype, torch2)), root=rng.choice(members),
                async_op=rng.random() < 0.5)
    if kind == "all_to_all_single":  # uneven splits, zeros included
        spec["splits"] = {(s, d): rng.randrange(0, count + 1) for s in members for d in members}
    if kind == "send_recv":
        spec["src"], spec["dst"] = rng.sample(members, 2)
        spec["tag"] = rng.randrange(4)
    spec["drain"] = rng.random() < 0.02  # now and then, wait for the whole window
    return spec


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_in_use():
    """Bytes malloc has handed out and not got back (glibc's mallinfo2), or -1."""
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return -1
    fn.restype = _MallInfo2
    mi = fn()
    return mi.uordblks + mi.hblkhd


def resources():
    """RSS bytes, open fds, threads and mappings of this process (and malloc's bytes in use)."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    kinds = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:", "RssShmem:")):
                key, kb = line.split()[:2]
                kinds[key[3:-1].lower()] = int(kb) << 10
    maps = shm = 0
    with open("/proc/self/maps") as f:
        for line in f:
            maps += 1
            if "/dev/shm/braid" in line:
                lo, hi = line.split()[0].split("-")
                shm += int(hi, 16) - int(lo, 16)
    return dict(rss=rss, fds=len(os.listdir("/proc/self/fd")),
                threads=len(os.listdir("/proc/self/task")), maps=maps, shm_mapped=shm,
                heap=malloc_in_use(), **kinds)


def start_p2p(ctx, group, members):
    """A ring of sends: starts the group's P2P thread (braid starts it on first use),
    so that every thread the run needs exists before the first resource sample."""
    if ctx.rank not in members:
        return
    k = members.index(ctx.rank)
    nxt, prev = members[(k + 1) % len(members)], members[k - 1]
    works = [ctx.dist.isend(ctx.torch.zeros(1), nxt, group=group),
             ctx.dist.irecv(ctx.torch.zeros(1), prev, group=group)]
    for w in works:
        w.wait()


class Soak:
    """One rank's run; see the module doc."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.torch, self.dist = ctx.torch, ctx.dist
        self.ch = H.Checker(ctx)
        self.rank = ctx.rank
        self.groups = [None if m is None else self.dist.new_group(list(m), timeout=ctx.timeout)
                       for m in GROUPS]
        for g, m in zip(self.groups, GROUPS):
            start_p2p(ctx, g, list(range(WORLD)) if m is None else sorted(m))
        self.window = collections.deque()  # (work, check) of async ops, oldest first
        self.store = ctx.store("soak-barriers")  # op_barrier's count of members entered
        self.kinds = collections.Counter()
        self.asyncs = 0

    def close(self):
        self.drain()
        for g in self.groups:
            if g is not None and g != self.dist.GroupMember.NON_GROUP_MEMBER:
                self.dist.destroy_process_group(g)
        self.groups = []

    # -- the window ------------------------------------------------------------

    def drain(self):
        while self.window:
            self._retire()

    def _retire(self):
        work, check = self.window.popleft()
        work.wait()
        check()

    def issue(self, spec, fn, check):
        """Runs fn(async_op) and checks its result now, or when it leaves the window."""
        if spec["async_op"]:
            self.asyncs += 1
            works = fn(True)
            for w in works[:-1]:
                self.window.append((w, lambda: None))
            self.window.append((works[-1], check))
            while len(self.window) > WINDOW:
                self._retire()
        else:
            fn(False)
            check()

    # -- ops ----------------------------------------------------------------------

    def run_op(self, spec):
        if self.rank not in spec["members"]:
            return
        self.kinds[spec["kind"]] += 1
        getattr(self, "op_" + spec["kind"])(spec, self.torch, self.dist,
                                            self.groups[spec["g"]], spec["members"])
        if spec["drain"]:
            self.drain()

    def _what(self, s):
        return (f"op {s['i']} {s['kind']} {s['dtype']} count={s['count']} redop={s['redop']} "
                f"group={s['members']} root={s['root']} async={s['async_op']}")

    def _dtype(self, s):
        return getattr(self.torch, s["dtype"])

    def _reduction(self, s, members, salt_of):
        """Input of this rank and the closed form, for one reduced block."""
        dtype, count, op = self._dtype(s), s["count"], s["redop"]
        inputs = [H.make_input(m, count, dtype, op, salt=salt_of) for m in members]
        return inputs[members.index(self.rank)], H.closed_form(inputs, op, len(members))

    def op_all_reduce(self, s, torch, dist, group, members):
        mine, expected = self._reduction(s, members, s["i"])
        t = mine.clone()
        self.issue(s, lambda a: [dist.all_reduce(t, H.reduce_op(s["redop"]), group=group,
                                                 async_op=a)],
                   lambda: self.ch.reduced(self._what(s), t, expected, s["redop"]))

    def op_reduce(self, s, torch, dist, group, members):
        mine, expected = self._reduction(s, members, s["i"])
        t = mine.clone()
        root = s["root"]
        self.issue(s, lambda a: [dist.reduce(t, root, H.reduce_op(s["redop"]), group=group,
                                             async_op=a)],
                   lambda: self.ch.reduced(self._what(s), t, expected, s["redop"])
                   if self.rank == root else None)

    def op_broadcast(self, s, torch, dist, group, members):
        dtype, n, root, i = self._dtype(s), s["count"], s["root"], s["i"]
        expected = H.pattern(root, i, n, dtype)
        t = expected.clone() if self.rank == root else torch.zeros(n, dtype=dtype)
        self.issue(s, lambda a: [dist.broadcast(t, root, group=group, async_op=a)],
                   lambda: self.ch.equal(self._what(s), t, expected))

    def op_all_gather(self, s, torch, dist, group, members):
        dtype, n, i = self._dtype(s), s["count"], s["i"]
        outs = [torch.zeros(n, dtype=dtype) for _ in members]
        inp = H.pattern(self.rank, i, n, dtype)

        def check():
            for m, o in zip(members, outs):
                self.ch.equal(f"{self._what(s)} from {m}", o, H.pattern(m, i, n, dtype))
        self.issue(s, lambda a: [dist.all_gather(outs, inp, group=group, async_op=a)], check)

    def op_all_gather_into_tensor(self, s, torch, dist, group, members):
        dtype, n, i = self._dtype(s), s["count"], s["i"]
        out = torch.zeros(n * len(members), dtype=dtype)
        inp = H.pattern(self.rank, i, n, dtype)
        fn = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
        self.issue(s, lambda a: [fn(out, inp, group=group, async_op=a)],
                   lambda: self.ch.equal(self._what(s), out, torch.cat(
                       [H.pattern(m, i, n, dtype) for m in members])))

    def _scattered_reduction(self, s, members):
        """This rank's n input blocks, and the closed form of its own block."""
        k, i, me = len(members), s["i"], members.index(self.rank)
        blocks = [H.make_input(self.rank, s["count"], self._dtype(s), s["redop"],
                               salt=i * 16 + j) for j in range(k)]
        inputs = [H.make_input(m, s["count"], self._dtype(s), s["redop"], salt=i * 16 + me)
                  for m in members]
        return blocks, H.closed_form(inputs, s["redop"], k)

    def op_reduce_scatter(self, s, torch, dist, group, members):
        blocks, expected = self._scattered_reduction(s, members)
        out = torch.zeros(s["count"], dtype=self._dtype(s))
        self.issue(s, lambda a: [dist.reduce_scatter(out, blocks, H.reduce_op(s["redop"]),
                                                     group=group, async_op=a)],
                   lambda: self.ch.reduced(self._what(s), out, expected, s["redop"]))

    def op_reduce_scatter_tensor(self, s, torch, dist, group, members):
        blocks, expected = self._scattered_reduction(s, members)
        inp = torch.cat(blocks)
        out = torch.zeros(s["count"], dtype=self._dtype(s))
        fn = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
        self.issue(s, lambda a: [fn(out, inp, H.reduce_op(s["redop"]), group=group,
                                    async_op=a)],
                   lambda: self.ch.reduced(self._what(s), out, expected, s["redop"]))

    @staticmethod
    def _block(src, dst, i, n, dtype):
        """What src sends dst in op i (movement ops): names both ends and the op."""
        return H.pattern(src * 8 + dst, i, n, dtype)

    def op_all_to_all(self, s, torch, dist, group, members):
        dtype, n, i, me = self._dtype(s), s["count"], s["i"], self.rank
        inp = [self._block(me, d, i, n, dtype) for d in members]
        outs = [torch.zeros(n, dtype=dtype) for _ in members]

        def check():
            for m, o in zip(members, outs):
                self.ch.equal(f"{self._what(s)} from {m}", o, self._block(m, me, i, n, dtype))
        self.issue(s, lambda a: [dist.all_to_all(outs, inp, group=group, async_op=a)], check)

    def op_all_to_all_single(self, s, torch, dist, group, members):
        dtype, i, me, sp = self._dtype(s), s["i"], self.rank, s["splits"]
        send = [sp[(me, d)] for d in members]
        recv = [sp[(m, me)] for m in members]
        inp = torch.cat([self._block(me, d, i, sp[(me, d)], dtype) for d in members])
        out = torch.zeros(sum(recv), dtype=dtype)
        expected = torch.cat([self._block(m, me, i, sp[(m, me)], dtype) for m in members])
        self.issue(s, lambda a: [dist.all_to_all_single(
            out, inp, output_split_sizes=recv, input_split_sizes=send, group=group,
            async_op=a)], lambda: self.ch.equal(self._what(s), out, expected))

    def op_gather(self, s, torch, dist, group, members):
        dtype, n, i, root = self._dtype(s), s["count"], s["i"], s["root"]
        inp = self._block(self.rank, root, i, n, dtype)
        outs = [torch.zeros(n, dtype=dtype) for _ in members] if self.rank == root else None

        def check():
            if outs is None:
                return
            for m, o in zip(members, outs):
                self.ch.equal(f"{self._what(s)} from {m}", o, self._block(m, root, i, n, dtype))
        self.issue(s, lambda a: [dist.gather(inp, outs, dst=root, group=group, async_op=a)],
                   check)

    def op_scatter(self, s, torch, dist, group, members):
        dtype, n, i, root = self._dtype(s), s["count"], s["i"], s["root"]
        ins = [self._block(root, m, i, n, dtype) for m in members] if self.rank == root \
            else None
        out = torch.zeros(n, dtype=dtype)
        self.issue(s, lambda a: [dist.scatter(out, ins, src=root, group=group, async_op=a)],
                   lambda: self.ch.equal(self._what(s), out,
                                         self._block(root, self.rank, i, n, dtype)))

    def op_barrier(self, s, torch, dist, group, members):
        # What a barrier promises: no member is through it before every member has entered.
        # Each member counts itself in (the parent's store) before entering; once through,
        # the count must be the group's size.
        key = f"op{s['i']}"
        self.store.add(key, 1)

        def check():
            entered = self.store.add(key, 0)
            self.ch.true(self._what(s) + ": every member entered before any got through",
                         entered == len(members), f"{entered} of {len(members)} had entered")
        self.issue(s, lambda a: [dist.barrier(group=group, async_op=a)], check)

    def op_send_recv(self, s, torch, dist, group, members):
        dtype, n, i, src, dst, tag = (self._dtype(s), s["count"], s["i"], s["src"], s["dst"],
                                      s["tag"])
        if self.rank == src:
            t = self._block(src, dst, i, n, dtype)
            self.issue(s, lambda a: [dist.isend(t, dst, group=group, tag=tag) if a
                                     else dist.send(t, dst, group=group, tag=tag)],
                       lambda: self.ch.equal(self._what(s) + " (sent data untouched)", t,
                                             self._block(src, dst, i, n, dtype)))
        elif self.rank == dst:
            t = torch.zeros(n, dtype=dtype)
            self.issue(s, lambda a: [dist.irecv(t, src, group=group, tag=tag) if a
                                     else dist.recv(t, src, group=group, tag=tag)],
                       lambda: self.ch.equal(self._what(s), t, self._block(src, dst, i, n, dtype)))


# glibc's caches of freed memory, which move RSS and malloc's bytes in use
# without a leak (Note [Soak resource figures]):
#  - mmap_threshold: by default glibc raises it each time a large block is
#    freed, after which 1 MiB tensors come from the heap, and RSS keeps
#    whatever the heap's fragmentation holds. Pinned, blocks of 64 KiB and
#    more are mapped and unmapped with each tensor.
#  - tcache_count: each thread keeps up to 7 freed chunks per size class
#    (up to 1 KiB) for reuse, which mallinfo counts as in use; the soak's
#    varied sizes fill these caches slowly (~16 bytes per op per rank, still
#    rising after 30,000 ops). With the cache off, the bytes in use are the
#    live ones. Measured without comms too: make_input with random sizes
#    "grows" 17 bytes per call with the cache, 0 without.
MALLOC_TUNABLES = ("glibc.malloc.mmap_threshold=65536:glibc.malloc.trim_threshold=131072:"
                   "glibc.malloc.tcache_count=0")


def soak_worker(ctx, ops, seed, warmup, every=1000):
    """Runs the soak on one rank; returns its checks, resource samples and op mix."""
    torch2 = ctx.torch2
    rng = random.Random(seed)
    # Threads of the world group (its P2P thread starts on first use, in
    # Soak()): the subgroups' must all be gone after close().
    start_p2p(ctx, None, list(range(WORLD)))
    braid_before = H.braid_threads()
    shm_before = resources()["shm_mapped"]
    soak = Soak(ctx)
    samples = []

    def sample(done):
        soak.drain()
        gc.collect()
        samples.append(dict(ops=done, **resources()))

    t0 = time.monotonic()
    for i in range(ops):
        soak.run_op(draw_op(rng, i, torch2))
        done = i + 1
        if done == warmup or done == ops or (done > warmup and done % every == 0):
            sample(done)
        if len(soak.ch.failures) > REPORTED_FAILURES:
            break
    seconds = time.monotonic() - t0
    soak.close()
    report = soak.ch.report()
    left = collections.Counter(H.braid_threads()) - collections.Counter(braid_before)
    report.update(samples=samples, seconds=seconds, kinds=dict(soak.kinds), asyncs=soak.asyncs,
                  braid_threads_left=sorted(left.elements()), shm_before=shm_before,
                  shm_after=resources()["shm_mapped"])
    return report


# What must stay flat: Note [Soak resource figures].
FLAT = ("private", "fds", "threads", "maps", "heap")


def value(sample, key):
    return sample["anon"] + sample["file"] if key == "private" else sample[key]


def growth(report, key):
    """Relative growth of `key` from the first sample (end of warm-up) to the last."""
    first, last = value(report["samples"][0], key), value(report["samples"][-1], key)
    return (last - first) / first if first else float(last != first)


def violations(reports, max_growth=0.01):
    bad = []
    for r, rep in enumerate(reports):
        bad += [f"rank {r}: {k} {100 * growth(rep, k):+.2f}%" for k in FLAT
                if growth(rep, k) >= max_growth]
        first, last = rep["samples"][0], rep["samples"][-1]
        if last["shm_mapped"] != first["shm_mapped"]:
            bad.append(f"rank {r}: braid's shared memory mapped went from "
                       f"{first['shm_mapped']} to {last['shm_mapped']} bytes")
        if rep["shm_after"] != rep["shm_before"]:
            bad.append(f"rank {r}: braid's shared memory mapped was {rep['shm_before']} bytes "
                       f"before the subgroups, {rep['shm_after']} after destroying them")
        if rep["braid_threads_left"]:
            bad.append(f"rank {r}: braid threads left after the subgroups were destroyed: "
                       f"{rep['braid_threads_left']}")
    return bad


def summarize(reports):
    mib = 2.0 ** 20
    lines = []
    for r, rep in enumerate(reports):
        a, b = rep["samples"][0], rep["samples"][-1]

        def fig(key, scale=1.0, fmt="{:.0f}"):
            return (f"{key} {fmt.format(value(a, key) / scale)} -> "
                    f"{fmt.format(value(b, key) / scale)} ({100 * growth(rep, key):+.2f}%)")
        lines.append(
            f"rank {r}: {rep['count']} checks, {rep['asyncs']} async ops, "
            f"{rep['seconds']:.1f} s; ops {a['ops']} -> {b['ops']}: "
            + ", ".join([fig("rss", mib, "{:.1f} MiB"), fig("private", mib, "{:.1f} MiB"),
                         fig("heap", mib, "{:.2f} MiB"), fig("fds"), fig("threads"),
                         fig("maps")])
            + f", RssShmem {a['shmem'] / mib:.1f} -> {b['shmem'] / mib:.1f} MiB of "
              f"{b['shm_mapped'] / mib:.1f} MiB mapped")
        trend = " ".join(f"{s['ops']}:{value(s, 'private') / mib:.1f}/{s['heap'] / mib:.2f}/"
                         f"{s['shmem'] / mib:.1f}" for s in rep["samples"])
        lines.append(f"    trend (ops:private RSS/malloc in use/RssShmem, MiB) {trend}")
    return "\n".join(lines)


def run(ops, seed=1234, warmup=1000, every=1000, timeout=None, name="soak", pin_malloc=True):
    """Starts a 4-rank world, soaks it, closes it; returns (reports, world leaks, exit codes)."""
    import soak as this  # workers unpickle soak_worker by module name (HERE is on sys.path)

    saved = os.environ.get("GLIBC_TUNABLES")
    if pin_malloc:  # read by glibc at process start: the ranks inherit it
        os.environ["GLIBC_TUNABLES"] = MALLOC_TUNABLES
    try:
        world = H.World(WORLD, name=name)
    finally:
        if saved is None:
            os.environ.pop("GLIBC_TUNABLES", None)
        else:
            os.environ["GLIBC_TUNABLES"] = saved
    try:
        reports = world.run(this.soak_worker, ops, seed, warmup, every,
                            timeout=timeout or max(120.0, ops * 0.1))
    finally:
        codes = world.close(timeout=60)
    return reports, world.leaks, codes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--warmup", type=int, default=1000,
                    help="ops before the first resource sample")
    ap.add_argument("--every", type=int, default=1000, help="ops between trend samples")
    ap.add_argument("--max-growth", type=float, default=0.01,
                    help="largest allowed relative growth of private RSS, malloc's bytes in "
                    "use, fds, threads and mappings")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc's malloc thresholds as they are (RSS then swings with "
                    "heap fragmentation; see Note [Soak resource figures])")
    args = ap.parse_args()
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    t0 = time.monotonic()
    reports, leaks, codes = run(args.ops, args.seed, args.warmup, args.every,
                                pin_malloc=not args.default_malloc)
    wall = time.monotonic() - t0
    print(summarize(reports))
    print(f"{args.ops} ops in {wall:.1f} s wall (world start and close included); "
          f"op mix on rank 0: {reports[0]['kinds']}")
    H.check_reports(reports)
    bad = violations(reports, args.max_growth)
    assert not bad, f"resources grew by {args.max_growth:.0%} or more: {bad}"
    assert not leaks, f"/dev/shm entries left behind: {leaks}"
    assert set(codes.values()) == {0}, f"exit codes {codes}"
    print("soak: OK")


if __name__ == "__main__":
    main()

"""One rank of test_hosts_collectives.py: braid against gloo across simulated hosts.

    hosts_matrix_rank.py RANK WORLD STORE_ADDR PORT
    (BRAID_MATRIX_ONLY=family,family... runs only those families, to reproduce by hand)

Rank 0 hosts a TCPStore on STORE_ADDR (host 0's address). Every rank makes the default group
with gloo and a braid group over the same ranks, then runs the whole matrix on both and
compares braid's outputs with gloo's: all_reduce (every dtype, reduce op and count; either
side of 64 KiB; non-contiguous), PREMUL_SUM, broadcast/reduce/gather/scatter from every root,
all_gather (into a tensor too, in place), reduce_scatter (list and tensor, in place),
all_to_all (list and single, even and uneven splits), barrier, send/recv between every pair
of ranks, isend/irecv, a send in flight across collectives, ops in flight at once, a 3-d
tensor, subgroups (across hosts, uneven, one host, an even hierarchy with other local
ranks), and a second braid group with BRAID_HIER_MIN_BYTES=0,
BRAID_NET_ALLREDUCE_RING_MIN=0 and BRAID_HIER_PIPELINE_BYTES=16 (tiny counts through the
three stages, in several pieces, and the rings), and a third braid group in which the last rank
alone runs with BRAID_ALLREDUCE_ONESHOT_MAX=0 (a shared-memory setting that host mates must share
where the hierarchy has host groups: every rank must fail at once, naming it). Where
the layout has the hierarchy, it checks from eth0's counters that the large allreduce sends
what the three stages send, not what a flat ring would. Errors that must come (a count,
dtype, root or op that differs across hosts; BAND on floats; a receive from any source) are
checked to come at once on every rank, to be clear, and to leave the group usable.

Note [Exact references across hosts]
The reduction inputs are small integers (harness.make_input), so every sum, product, min and
max is exact in every dtype (float16 and bfloat16 included) in any order of reduction: braid
must equal gloo bit for bit. Only AVG (a division) is compared within two ulps of the dtype.
Where gloo lacks a case (AVG, PREMUL_SUM, bfloat16 on torch 1.13, reduce_scatter, all_to_all,
all_gather into a tensor; an all_gather of empty tensors, where torch 1.13's gloo dies of
SIGFPE) braid is compared with a closed form instead: the inputs are pure functions of (rank,
count, dtype, op) (harness.make_input, harness.pattern), so every rank can rebuild every
other rank's input.

Prints one JSON line: {"rank", "host", "hosts", "cases", "compared", "closed_form" (the cases
gloo lacked), "failures" (one entry per failing case: the case's name, this rank, the first
differing index and both values, or the error braid raised), "seconds" per family, "traffic",
"errors" (the expected errors and how long each took)}. Writes the name of each case to stderr
before running it, so a job that hangs shows where.
"""

import datetime
import json
import os
import re
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness as H  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_braid  # noqa: E402,F401

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]
FLOAT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
# 300007 float32 elements (1.2 MB) take the hierarchical allreduce (>= 64 KiB) and are
# divisible by neither 2 nor 3 ranks per host, so the last section is short.
LARGE = 300007
COUNTS = [0, 1, 1001, LARGE]
GLOO_LACKS = ("AVG", "PREMUL_SUM")  # gloo rejects these on every torch we run
TIMEOUT_S = 60  # the groups' timeout


class Matrix:
    def __init__(self, rank, n, gloo, braid, store):
        self.rank, self.n, self.gloo, self.braid, self.store = rank, n, gloo, braid, store
        self.cases = self.compared = 0
        self.closed = []  # cases compared with a closed form because gloo lacks them
        self.failures = []
        self.gloo_notes = []  # gloo differing from the closed form (not braid's failure)
        self.seconds = {}
        self.traffic = {}  # what hier_traffic measured, for the report
        self.errors = {}  # the errors expect_error saw, for the report
        self.case = ""

    # ---- bookkeeping ---------------------------------------------------------------------
    def start(self, name):
        self.case = name
        self.cases += 1
        print(f"case {self.cases}: {name}", file=sys.stderr, flush=True)

    def fail(self, what, **detail):
        self.failures.append(dict(case=self.case, rank=self.rank, what=what, **detail))

    def compare(self, what, got, want, tol=False):
        """braid's `got` against the reference `want`; records the first difference."""
        self.compared += 1
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            return self.fail(what, got=f"{got.dtype} {tuple(got.shape)}",
                             want=f"{want.dtype} {tuple(want.shape)}")
        g, w = got.reshape(-1), want.reshape(-1)
        if tol:
            eps = torch.finfo(got.dtype).eps
            bad = ~torch.isclose(g.double(), w.double(), rtol=2 * eps, atol=0)
        else:
            bad = g != w
        if bad.any():
            i = int(bad.nonzero()[0])
            self.fail(what, index=i, got=g[i].item(), want=w[i].item(),
                      differing=int(bad.sum()), of=g.numel())

    def braid_call(self, fn):
        """Runs braid's side of a case; an error is the case's failure (returns False)."""
        try:
            fn()
            return True
        except Exception as e:  # noqa: BLE001  recorded, the matrix goes on
            self.fail("braid raised", error=f"{type(e).__name__}: {str(e)[:1500]}")
            return False

    def reference(self, gloo_fn, closed_fn, lacks=False):
        """gloo's result, or the closed form where gloo lacks the case (same on every rank:
        gloo checks its arguments before it communicates)."""
        if not lacks:
            try:
                return gloo_fn()
            except (RuntimeError, ValueError) as e:
                if not (H.lacks_support(e) or re.search(r"[Cc]annot use|no support", str(e))):
                    raise
        self.closed.append(self.case)
        return closed_fn()

    def timed(self, family, fn):
        t0 = time.monotonic()
        fn()
        self.seconds[family] = round(self.seconds.get(family, 0) + time.monotonic() - t0, 3)

    # ---- inputs ----------------------------------------------------------------------------
    def inputs(self, count, dtype, op, salt=0):
        return [H.make_input(r, count, dtype, op if op != "PREMUL_SUM" else "SUM", salt)
                for r in range(self.n)]

    @staticmethod
    def dt(name):
        return getattr(torch, name)

    # ---- all_reduce ------------------------------------------------------------------------
    def all_reduce(self):
        for name in DTYPES:
            dtype = self.dt(name)
            for op in (FLOAT_OPS if dtype.is_floating_point else INT_OPS):
                for count in COUNTS:
                    self.start(f"all_reduce dtype={name} redop={op} count={count}")
                    self.one_all_reduce(dtype, op, count)
        # Either side of 64 KiB (BRAID_HIER_MIN_BYTES and BRAID_NET_ALLREDUCE_RING_MIN):
        # the direct exchange, then the three stages or the ring with blocks of unequal size.
        for count in (16383, 16384, 16385):
            for name, op in (("float32", "SUM"), ("float32", "AVG"), ("int32", "BAND")):
                self.start(f"all_reduce dtype={name} redop={op} count={count} (64 KiB edge)")
                self.one_all_reduce(self.dt(name), op, count)
        for name, op in (("float32", "SUM"), ("int64", "MAX"), ("bfloat16", "SUM")):
            for count in (1001, LARGE):
                self.start(f"all_reduce dtype={name} redop={op} count={count} non-contiguous")
                self.one_all_reduce(self.dt(name), op, count, strided=True)

    def one_all_reduce(self, dtype, op, count, strided=False, group=None, tag=""):
        group = group or self.braid
        ins = self.inputs(count, dtype, op)
        mine = ins[self.rank]
        redop = H.reduce_op(op)

        def gloo():
            t = mine.clone()
            dist.all_reduce(t, op=redop, group=self.gloo)
            return t

        want = self.reference(gloo, lambda: H.closed_form(ins, op, self.n),
                              lacks=op in GLOO_LACKS)
        if strided:
            # Every other element of a buffer whose gaps hold a sentinel braid must not touch.
            base = torch.full((2 * count,), 77, dtype=dtype)
            t = base[::2]
            t.copy_(mine)
            assert not t.is_contiguous() or count <= 1
        else:
            t = mine.clone()
        if self.braid_call(lambda: dist.all_reduce(t, op=redop, group=group)):
            self.compare(f"all_reduce{tag}", t, want, tol=op == "AVG")
            if strided:
                self.compare("untouched gaps", base[1::2], torch.full((count,), 77, dtype=dtype))

    def premul_sum(self):
        if not hasattr(dist, "_make_nccl_premul_sum"):
            print("PREMUL_SUM: this torch has no _make_nccl_premul_sum", file=sys.stderr)
            return
        for name in ("float32", "float64", "float16", "bfloat16"):
            for count in (1, 1001, LARGE):
                self.start(f"all_reduce dtype={name} redop=PREMUL_SUM count={count}")
                # PREMUL_FACTOR 0.5 times a sum of small integers: exact.
                self.one_all_reduce(self.dt(name), "PREMUL_SUM", count)

    # ---- rooted and gathering collectives ------------------------------------------------------
    def broadcast(self):
        for root in range(self.n):
            # int32 x 7 rides in the root's header (Note [Eager data], Note [Small broadcast
            # across hosts]); float64 x 64 is 512 bytes: on the relay where hosts have groups,
            # past the header's inline area elsewhere. 4 MiB + 12 B of float32 pass along a
            # chain at 3 hosts and more (Note [Broadcast across hosts]).
            for name, count in (("int32", 7), ("float64", 64), ("float32", 1001), ("int64", 0),
                                ("float16", 70001), ("uint8", LARGE), ("float32", (1 << 20) + 3)):
                self.start(f"broadcast dtype={name} count={count} root={root}")
                dtype = self.dt(name)
                mine = H.pattern(root, 1, count, dtype) if self.rank == root else \
                    torch.zeros(count, dtype=dtype)

                def gloo():
                    t = mine.clone()
                    dist.broadcast(t, root, group=self.gloo)
                    return t

                want = self.reference(gloo, lambda: H.pattern(root, 1, count, dtype))
                t = mine.clone()
                if self.braid_call(lambda: dist.broadcast(t, root, group=self.braid)):
                    self.compare("broadcast", t, want)

    def reduce(self):
        for root in range(self.n):
            for name, op, count in (("float32", "SUM", 1001), ("int32", "MAX", 1),
                                    ("float64", "PRODUCT", LARGE), ("bfloat16", "MIN", 1001),
                                    ("int64", "BXOR", LARGE)):
                self.start(f"reduce dtype={name} redop={op} count={count} root={root}")
                dtype = self.dt(name)
                ins = self.inputs(count, dtype, op)
                redop = H.reduce_op(op)

                def gloo():
                    t = ins[self.rank].clone()
                    dist.reduce(t, root, op=redop, group=self.gloo)
                    return t

                want = self.reference(gloo, lambda: H.closed_form(ins, op, self.n))
                t = ins[self.rank].clone()
                if self.braid_call(lambda: dist.reduce(t, root, op=redop, group=self.braid)):
                    if self.rank == root:  # elsewhere the buffer's contents are unspecified
                        self.compare("reduce (root)", t, want)

    def all_gather(self):
        for name, count in (("float32", 0), ("int64", 1), ("float16", 1001),
                            ("float32", 70001)):
            self.start(f"all_gather dtype={name} count={count}")
            dtype = self.dt(name)
            mine = H.pattern(self.rank, 2, count, dtype)
            closed = [H.pattern(r, 2, count, dtype) for r in range(self.n)]

            def gloo():
                outs = [torch.zeros(count, dtype=dtype) for _ in range(self.n)]
                dist.all_gather(outs, mine, group=self.gloo)
                return outs

            # gloo (torch 1.13) dies of SIGFPE in an all_gather of empty tensors.
            want = self.reference(gloo, lambda: closed, lacks=count == 0)
            outs = [torch.full((count,), 3, dtype=dtype) for _ in range(self.n)]
            if self.braid_call(lambda: dist.all_gather(outs, mine, group=self.braid)):
                for r in range(self.n):
                    self.compare(f"all_gather[{r}]", outs[r], want[r])
        # The flat form's name: all_gather_single (torch 2.14), all_gather_into_tensor (its
        # deprecated name since), _all_gather_base (1.13).
        into = (getattr(dist, "all_gather_single", None)
                or getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base)
        for name, count, inplace in (("float32", 1001, False), ("int32", 70001, True),
                                     ("bfloat16", 1, True)):
            self.start(f"all_gather_into_tensor dtype={name} count={count}"
                       f"{' in-place' if inplace else ''}")
            dtype = self.dt(name)
            closed = torch.cat([H.pattern(r, 3, count, dtype) for r in range(self.n)])

            def gloo():
                out = torch.zeros(self.n * count, dtype=dtype)
                into(out, H.pattern(self.rank, 3, count, dtype), group=self.gloo)
                return out

            want = self.reference(gloo, lambda: closed)
            out = torch.full((self.n * count,), 5, dtype=dtype)
            if inplace:  # the input is this rank's own chunk of the output
                inp = out.chunk(self.n)[self.rank]
                inp.copy_(H.pattern(self.rank, 3, count, dtype))
            else:
                inp = H.pattern(self.rank, 3, count, dtype)
            if self.braid_call(lambda: into(out, inp, group=self.braid)):
                self.compare("all_gather_into_tensor", out, want)

    def gather_scatter(self):
        for root in range(self.n):
            for name, count in (("float64", 1001), ("int32", 0), ("float32", 70001)):
                dtype = self.dt(name)
                self.start(f"gather dtype={name} count={count} root={root}")
                mine = H.pattern(self.rank, 4 + root, count, dtype)

                def gather(group, fill):
                    outs = [torch.full((count,), fill, dtype=dtype) for _ in range(self.n)]
                    dist.gather(mine, outs if self.rank == root else None, dst=root,
                                group=group)
                    return outs

                want = self.reference(lambda: gather(self.gloo, 0), lambda: [
                    H.pattern(r, 4 + root, count, dtype) for r in range(self.n)])
                got = []
                if self.braid_call(lambda: got.append(gather(self.braid, 9))) and \
                        self.rank == root:
                    for r in range(self.n):
                        self.compare(f"gather[{r}]", got[0][r], want[r])

                self.start(f"scatter dtype={name} count={count} root={root}")
                parts = [H.pattern(root, 40 + r, count, dtype) for r in range(self.n)]

                def scatter(group, fill):
                    out = torch.full((count,), fill, dtype=dtype)
                    dist.scatter(out, parts if self.rank == root else None, src=root,
                                 group=group)
                    return out

                want = self.reference(lambda: scatter(self.gloo, 0), lambda: parts[self.rank])
                got = []
                if self.braid_call(lambda: got.append(scatter(self.braid, 9))):
                    self.compare("scatter", got[0], want)

    def reduce_scatter(self):
        for name, op, count in (("float32", "SUM", 0), ("float32", "SUM", 1001),
                                ("int64", "PRODUCT", 1), ("bfloat16", "MAX", 1001),
                                ("int32", "BOR", 70001), ("float64", "MIN", 70001),
                                ("float32", "AVG", 1001)):
            self.start(f"reduce_scatter dtype={name} redop={op} count={count}")
            dtype = self.dt(name)
            redop = H.reduce_op(op)
            # Rank r's j-th input is block j of a (n * count) input; j goes to rank j.
            full = self.inputs(self.n * count, dtype, op)
            closed = H.closed_form(full, op, self.n).chunk(self.n) if count else \
                [torch.zeros(0, dtype=dtype)] * self.n
            mine = list(full[self.rank].chunk(self.n)) if count else \
                [torch.zeros(0, dtype=dtype) for _ in range(self.n)]

            def gloo():
                out = torch.zeros(count, dtype=dtype)
                dist.reduce_scatter(out, [m.clone() for m in mine], op=redop, group=self.gloo)
                return out

            want = self.reference(gloo, lambda: closed[self.rank].clone(),
                                  lacks=op in GLOO_LACKS)
            out = torch.full((count,), 7, dtype=dtype)
            if self.braid_call(lambda: dist.reduce_scatter(out, [m.clone() for m in mine],
                                                           op=redop, group=self.braid)):
                self.compare("reduce_scatter", out, want, tol=op == "AVG")
        rs = (getattr(dist, "reduce_scatter_single", None)
              or getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base)
        for name, op, count, inplace in (("float32", "SUM", 1001, False),
                                         ("int64", "MIN", 70001, True),
                                         ("float16", "SUM", 3, True)):
            self.start(f"reduce_scatter_tensor dtype={name} redop={op} count={count}"
                       f"{' in-place' if inplace else ''}")
            dtype = self.dt(name)
            redop = H.reduce_op(op)
            full = self.inputs(self.n * count, dtype, op, salt=1)
            closed = H.closed_form(full, op, self.n).chunk(self.n)[self.rank].clone()

            def gloo():
                out = torch.zeros(count, dtype=dtype)
                rs(out, full[self.rank].clone(), op=redop, group=self.gloo)
                return out

            want = self.reference(gloo, lambda: closed)
            if not torch.equal(want, closed):
                # torch 2.6's gloo gets reduce_scatter_tensor MIN wrong (int64, checked here
                # against the closed form on one host too): the closed form is the reference.
                want = closed
            inp = full[self.rank].clone()
            # In place: the output is this rank's own block of the input.
            out = inp.chunk(self.n)[self.rank] if inplace else torch.full((count,), 7,
                                                                          dtype=dtype)
            if self.braid_call(lambda: rs(out, inp, op=redop, group=self.braid)):
                self.compare("reduce_scatter_tensor", out, want)

    # ---- all_to_all ---------------------------------------------------------------------------
    def split(self, src, dst, even):
        return 5 if even else (src * 3 + dst * 5 + 1) % 4  # uneven: zeros included

    def all_to_all(self):
        n, me = self.n, self.rank
        for even in (True, False):
            for name in ("float32", "int64"):
                dtype = self.dt(name)
                kind = "even" if even else "uneven"
                # all_to_all_single over rows of 3: the splits are in rows.
                self.start(f"all_to_all_single dtype={name} splits={kind}")
                send = [self.split(me, j, even) for j in range(n)]
                recv = [self.split(j, me, even) for j in range(n)]
                inp = torch.cat([H.pattern(me, j, 3 * send[j], dtype) for j in range(n)]
                                ).view(-1, 3)
                closed = torch.cat([H.pattern(j, me, 3 * recv[j], dtype) for j in range(n)]
                                   ).view(-1, 3)
                splits = {} if even else dict(output_split_sizes=recv, input_split_sizes=send)

                def single(group, fill):
                    out = torch.full((sum(recv), 3), fill, dtype=dtype)
                    dist.all_to_all_single(out, inp.clone(), group=group, **splits)
                    return out

                want = self.reference(lambda: single(self.gloo, 0), lambda: closed)
                got = []
                if self.braid_call(lambda: got.append(single(self.braid, 9))):
                    self.compare("all_to_all_single", got[0], want)

                self.start(f"all_to_all dtype={name} splits={kind}")
                ins = [H.pattern(me, 10 + j, send[j], dtype) for j in range(n)]
                closed = [H.pattern(j, 10 + me, recv[j], dtype) for j in range(n)]

                def lists(group, fill):
                    outs = [torch.full((recv[j],), fill, dtype=dtype) for j in range(n)]
                    dist.all_to_all(outs, [t.clone() for t in ins], group=group)
                    return outs

                # gloo's list form (torch 2.x; 1.13 has none) takes equal sizes only.
                want = self.reference(lambda: lists(self.gloo, 0), lambda: closed,
                                      lacks=not even)
                got = []
                if self.braid_call(lambda: got.append(lists(self.braid, 9))):
                    for j in range(n):
                        self.compare(f"all_to_all[{j}]", got[0][j], want[j])

    # ---- barrier and point-to-point -------------------------------------------------------------
    def barrier(self):
        for k in range(3):
            self.start(f"barrier {k}")
            # Every rank counts itself in before the barrier; after it, all must have.
            key = f"matrix/barrier{k}"
            self.store.add(key, 1)
            if self.braid_call(lambda: dist.barrier(group=self.braid)):
                self.compared += 1
                arrived = self.store.add(key, 0)
                if arrived != self.n:
                    self.fail("barrier returned before every rank reached it",
                              arrived=arrived, of=self.n)

    def host_of(self, r):
        return HOST_OF[r]

    def send_recv(self):
        me, n = self.rank, self.n
        pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
        for a, b in pairs:
            where = "same host" if self.host_of(a) == self.host_of(b) else "across hosts"
            for name, count in (("float32", 1001), ("int64", 0), ("float64", LARGE)):
                dtype = self.dt(name)
                self.start(f"send/recv {a}->{b} ({where}) dtype={name} count={count}")
                if me not in (a, b):
                    continue
                data = H.pattern(a, 100 + b, count, dtype)
                for group, label in ((self.gloo, "gloo"), (self.braid, "braid")):
                    if me == a:
                        ok = True
                        if label == "gloo":
                            dist.send(data.clone(), b, group=group, tag=7)
                        else:
                            ok = self.braid_call(lambda: dist.send(data.clone(), b,
                                                                   group=group, tag=7))
                        if not ok:
                            break
                    else:
                        t = torch.full((count,), 3, dtype=dtype)
                        if label == "gloo":
                            dist.recv(t, a, group=group, tag=7)
                            self.compared += 1
                            if not torch.equal(t, data):  # gloo's own result as a note
                                self.gloo_notes.append(f"{self.case}: gloo recv differs")
                        elif self.braid_call(lambda: dist.recv(t, a, group=group, tag=7)):
                            self.compare("recv", t, data)

    def p2p_edges(self):
        me, n = self.rank, self.n
        a, b = 0, n - 1  # on different hosts in every layout
        self.start(f"isend {a}->{b} in flight across an all_reduce, then irecv")
        data = H.pattern(a, 400, LARGE, torch.float32)
        t = torch.zeros(LARGE)

        def run():
            w = dist.isend(data, b, group=self.braid, tag=11) if me == a else None
            self.one_all_reduce(torch.float32, "SUM", LARGE)
            self.one_all_reduce(torch.int32, "MAX", 1001)
            if me == b:
                w = dist.irecv(t, a, group=self.braid, tag=11)
            if w is not None:
                w.wait()

        if self.braid_call(run) and me == b:
            self.compare("irecv after the all_reduces", t, data)
        # Across hosts the transport matches receives per source (Note [Point-to-point
        # across hosts]): a receive from any source must be refused, not hang.
        self.start(f"recv from any source on rank {b}")
        if me == b:
            t = torch.zeros(3)
            t0 = time.monotonic()
            try:
                dist.recv(t, group=self.braid)
                self.fail("recv from any source did not raise")
            except RuntimeError as e:
                self.compared += 1
                self.errors[self.case] = f"{time.monotonic() - t0:.3f} s: {str(e)[:600]}"
                if not re.search(r"any source", str(e)):
                    self.fail("unclear error", error=str(e)[:1500])
        self.start("all_reduce after the refused recv")
        self.one_all_reduce(torch.float32, "SUM", 1001)

    def isend_irecv(self):
        me, n = self.rank, self.n
        for name, count in (("float32", 1001), ("int32", 70001)):
            dtype = self.dt(name)
            self.start(f"isend/irecv every pair, two messages each, dtype={name} count={count}")
            # Two messages per ordered pair with the same tag: they must arrive in order.
            outs = {(j, k): torch.full((count,), 3, dtype=dtype)
                    for j in range(n) if j != me for k in range(2)}
            reqs = []

            def post():
                for j in range(n):
                    if j == me:
                        continue
                    for k in range(2):
                        reqs.append(dist.irecv(outs[(j, k)], j, group=self.braid, tag=3))
                for s in range(1, n):
                    j = (me + s) % n
                    for k in range(2):
                        reqs.append(dist.isend(H.pattern(me, 200 + 10 * j + k, count, dtype), j,
                                               group=self.braid, tag=3))
                for r in reqs:
                    r.wait()

            if self.braid_call(post):
                for (j, k), t in sorted(outs.items()):
                    self.compare(f"irecv from {j} #{k}", t,
                                 H.pattern(j, 200 + 10 * me + k, count, dtype))
        self.start("batch_isend_irecv ring, both directions")
        left, right = (me - 1) % n, (me + 1) % n
        fr_left, fr_right = torch.zeros(501, dtype=torch.int64), torch.zeros(501, dtype=torch.int64)
        ops = [dist.P2POp(dist.isend, H.pattern(me, 300 + right, 501, torch.int64), right,
                          self.braid),
               dist.P2POp(dist.isend, H.pattern(me, 300 + left, 501, torch.int64), left,
                          self.braid),
               dist.P2POp(dist.irecv, fr_left, left, self.braid),
               dist.P2POp(dist.irecv, fr_right, right, self.braid)]
        if n == 2:  # left == right: two messages from the one peer, in posting order
            want_left = H.pattern(left, 300 + me, 501, torch.int64)
            want_right = want_left
        else:
            want_left = H.pattern(left, 300 + me, 501, torch.int64)
            want_right = H.pattern(right, 300 + me, 501, torch.int64)
        if self.braid_call(lambda: [w.wait() for w in dist.batch_isend_irecv(ops)]):
            self.compare("batch irecv from left", fr_left, want_left)
            self.compare("batch irecv from right", fr_right, want_right)

    def hier_traffic(self):
        """The large allreduce takes the three stages: each host sends 2(H-1)/H of the buffer
        (once per host), where a flat ring over all n ranks sends 2(n-1)/n of it from each rank
        at a host boundary. The large all_gather takes two: each host sends its L blocks to the
        H-1 others, (H-1)L blocks, where a flat ring sends n-1 blocks from each rank at a host
        boundary. Counted on eth0 (each host's only link) between two barriers."""
        hosts = sorted(set(HOST_OF))
        per = [HOST_OF.count(x) for x in hosts]
        H_, L = len(hosts), per[0]
        if L < 2 or any(m != L for m in per):
            return  # no hierarchy here: every op runs over TCP among all ranks
        for name in ("float32", "uint8"):
            dtype = self.dt(name)
            nbytes = LARGE * torch.empty(0, dtype=dtype).element_size()
            self.start(f"all_reduce dtype={name} count={LARGE}: bytes each host sends")
            t = torch.ones(LARGE, dtype=dtype)
            sent = self.sent_by(lambda: dist.all_reduce(t, group=self.braid))
            self.compare("all_reduce (traffic probe)", t, torch.full((LARGE,), self.n, dtype=dtype))
            self.check_traffic(name, sent, 2 * (H_ - 1) / H_ * nbytes,
                               2 * (self.n - 1) / self.n * nbytes)
        count = LARGE // self.n
        self.start(f"all_gather dtype=float32 count={count}: bytes each host sends")
        outs = [torch.zeros(count) for _ in range(self.n)]
        mine = H.pattern(self.rank, 4, count, torch.float32)
        sent = self.sent_by(lambda: dist.all_gather(outs, mine, group=self.braid))
        for j in range(self.n):
            self.compare(f"all_gather[{j}] (traffic probe)", outs[j],
                         H.pattern(j, 4, count, torch.float32))
        self.check_traffic("all_gather float32", sent, (H_ - 1) * L * count * 4,
                           (self.n - 1) * count * 4)

    def sent_by(self, fn):
        """Bytes this host sent on eth0 while every rank ran fn, between two barriers."""
        dist.barrier(group=self.braid)
        before = eth0_tx_bytes()
        fn()
        dist.barrier(group=self.braid)
        return eth0_tx_bytes() - before

    def check_traffic(self, name, sent, hier, flat):
        self.compared += 1
        self.traffic[name] = dict(sent=sent, hierarchical=int(hier), flat_ring=int(flat))
        # Headers and ACKs add a few per cent; the flat ring would send at least `flat`.
        if not (0.9 * hier <= sent <= min(1.25 * hier, 0.95 * flat)):
            self.fail(f"{name}: host traffic is not the hierarchy's", sent=sent,
                      hierarchical=int(hier), flat_ring=int(flat))

    # ---- errors -------------------------------------------------------------------------------
    def expect_error(self, fn, *patterns):
        """braid must raise, well before the group's timeout (no hang: Note [Timing bounds in
        tests] in tests/cpp/timing.h), with a message matching every pattern; then the group
        must still work (a small and a large allreduce against gloo)."""
        t0 = time.monotonic()
        try:
            fn()
            self.fail("did not raise")
        except RuntimeError as e:
            msg, took = str(e), time.monotonic() - t0
            self.compared += 1
            self.errors[self.case] = f"{took:.3f} s: {msg[:600]}"
            missing = [p for p in patterns if not re.search(p, msg)]
            if missing:
                self.fail("unclear error", missing=missing, error=msg[:1500])
            if took >= H.early_bound(TIMEOUT_S):
                self.fail("the error took long", seconds=round(took, 1))
        case = self.case
        self.start(f"all_reduce after: {case}")
        self.one_all_reduce(torch.float32, "SUM", 1001)
        self.one_all_reduce(torch.float32, "SUM", LARGE)

    def mismatch(self):
        """Ranks on the last host pass a different count, dtype or root: every rank must fail,
        at once and clearly, and the group must work for the next op."""
        odd = HOST_OF[self.rank] == HOST_OF[self.n - 1]
        for base in (1001, LARGE):
            for theirs in (base + 1, 7):
                self.start(f"mismatch all_reduce: count {base} on host 0, {theirs} on the "
                           f"last host")
                t = torch.ones(theirs if odd else base)
                self.expect_error(lambda: dist.all_reduce(t, group=self.braid),
                                  r"all_?reduce", "shape", rf"\b{base}\b", rf"\b{theirs}\b")
        self.start("mismatch all_reduce: float32 on host 0, float64 on the last host")
        t = torch.ones(LARGE, dtype=torch.float64 if odd else torch.float32)
        self.expect_error(lambda: dist.all_reduce(t, group=self.braid), r"all_?reduce",
                          "float32", "float64")
        for count in (7, 1001):  # riding with the headers, and not
            self.start(f"mismatch broadcast: root 0 on host 0, root n-1 on the last host, "
                       f"count={count}")
            t = torch.ones(count)
            self.expect_error(lambda: dist.broadcast(t, self.n - 1 if odd else 0, group=self.braid),
                              "broadcast", "root")
        self.start("mismatch: all_reduce on host 0, broadcast on the last host")
        t = torch.ones(1001)
        self.expect_error(lambda: dist.broadcast(t, 0, group=self.braid) if odd else
                          dist.all_reduce(t, group=self.braid), "broadcast", r"all_?reduce")
        for count in (1001, LARGE):
            # gloo refuses it too; braid must refuse it on every rank alike.
            self.start(f"all_reduce float32 BAND (unsupported) count={count}")
            t = torch.ones(count)
            self.expect_error(lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND,
                                                      group=self.braid), "BAND", "float32")

    # ---- more than one op in flight, subgroups ------------------------------------------------
    def async_ops(self):
        self.start("async: 6 all_reduces and a broadcast in flight, then wait")
        specs = [(torch.float32, "SUM", 1001), (torch.int64, "MAX", LARGE),
                 (torch.float32, "SUM", LARGE), (torch.bfloat16, "MIN", 7),
                 (torch.float64, "PRODUCT", 70001), (torch.uint8, "BXOR", LARGE)]
        ts, wants = [], []
        for dtype, op, count in specs:
            ins = self.inputs(count, dtype, op, salt=5)
            ts.append(ins[self.rank].clone())
            wants.append(H.closed_form(ins, op, self.n))
        b = H.pattern(self.n - 1, 77, 5003, torch.int32) if self.rank == self.n - 1 else \
            torch.zeros(5003, dtype=torch.int32)

        def run():
            works = [dist.all_reduce(t, op=H.reduce_op(op), group=self.braid, async_op=True)
                     for t, (_, op, _) in zip(ts, specs)]
            works.append(dist.broadcast(b, self.n - 1, group=self.braid, async_op=True))
            for w in works:
                w.wait()

        if self.braid_call(run):
            for t, w, (dtype, op, count) in zip(ts, wants, specs):
                self.compare(f"async all_reduce {dtype} {op} {count}", t, w)
            self.compare("async broadcast", b, H.pattern(self.n - 1, 77, 5003, torch.int32))
        self.start("all_reduce of a (7, 11, 13) int64 tensor")
        self.one_all_reduce_shaped((7, 11, 13))

    def one_all_reduce_shaped(self, shape):
        count = 7 * 11 * 13
        ins = [x.view(shape) for x in self.inputs(count, torch.int64, "SUM", salt=6)]
        t, g = ins[self.rank].clone(), ins[self.rank].clone()
        dist.all_reduce(g, group=self.gloo)
        if self.braid_call(lambda: dist.all_reduce(t, group=self.braid)):
            self.compare("all_reduce (3-d)", t, g)

    def subgroups(self, groups):
        """Groups over some of the ranks (made by every rank, like torch's new_group): across
        hosts with other rank numbers than the world's, uneven across hosts, one host alone
        (shared memory), and where each host keeps L - 1 ranks an even hierarchy whose local
        ranks are not the world's."""
        for ranks, (gg, bg) in groups.items():
            if self.rank not in ranks:
                continue
            k, me = len(ranks), ranks.index(self.rank)
            where = sorted({HOST_OF[r] for r in ranks})
            for name, op, count in (("float32", "SUM", 1001), ("float32", "SUM", LARGE),
                                    ("int32", "MIN", LARGE), ("float16", "PRODUCT", 7)):
                self.start(f"subgroup {list(ranks)} on {where}: all_reduce dtype={name} "
                           f"redop={op} count={count}")
                dtype = self.dt(name)
                ins = [H.make_input(r, count, dtype, op, 9) for r in ranks]
                closed = H.closed_form(ins, op, k)

                def gloo():
                    g = ins[me].clone()
                    dist.all_reduce(g, op=H.reduce_op(op), group=gg)
                    return g

                want = self.reference(gloo, lambda: closed)
                t = ins[me].clone()
                if self.braid_call(lambda: dist.all_reduce(t, op=H.reduce_op(op), group=bg)):
                    self.compare("subgroup all_reduce", t, want)
                    self.compare("subgroup all_reduce (closed form)", t, closed)
            root = ranks[-1]  # a global rank, as torch's API takes
            self.start(f"subgroup {list(ranks)} on {where}: broadcast from {root}, all_gather")
            t = H.pattern(root, 55, 70001, torch.float32) if self.rank == root else \
                torch.zeros(70001)
            if self.braid_call(lambda: dist.broadcast(t, root, group=bg)):
                self.compare("subgroup broadcast", t, H.pattern(root, 55, 70001, torch.float32))
            outs = [torch.zeros(1001, dtype=torch.int64) for _ in ranks]
            if self.braid_call(lambda: dist.all_gather(
                    outs, H.pattern(self.rank, 56, 1001, torch.int64), group=bg)):
                for j, r in enumerate(ranks):
                    self.compare(f"subgroup all_gather[{j}]", outs[j],
                                 H.pattern(r, 56, 1001, torch.int64))

    def local_settings(self, group):
        """`group`: the last rank alone runs with BRAID_ALLREDUCE_ONESHOT_MAX=0. Where the
        hierarchy has host groups, the world's headers carry their shared-memory settings
        (NetConfig::local), so a small and a staged all_reduce fail every rank at once, naming
        the setting and both values, before any stage runs. Without host groups the setting
        shapes nothing and both work."""
        per = [HOST_OF.count(x) for x in dict.fromkeys(HOST_OF)]
        hier = per[0] > 1 and all(m == per[0] for m in per)
        for count in (1001, LARGE):
            self.start(f"all_reduce count={count}, BRAID_ALLREDUCE_ONESHOT_MAX=0 on the last "
                       f"rank alone ({'host groups' if hier else 'no host groups'})")
            if hier:
                t = torch.ones(count)
                self.expect_error(lambda: dist.all_reduce(t, group=group),
                                  "BRAID_ALLREDUCE_ONESHOT_MAX=0", "BRAID_ALLREDUCE_ONESHOT_MAX=65536")
            else:
                self.one_all_reduce(torch.float32, "SUM", count, group=group, tag=" (odd setting)")

    def small_hier(self, group):
        """A second braid group with BRAID_HIER_MIN_BYTES=0, BRAID_NET_ALLREDUCE_RING_MIN=0
        and BRAID_HIER_PIPELINE_BYTES=16: tiny counts take the three stages (empty and short
        sections, several pipelined pieces) and the rings, and broadcast, reduce, all_gather
        and reduce_scatter their two stages (from every root)."""
        for count in range(1, 8):
            for name, op in (("float32", "SUM"), ("int32", "BXOR"), ("float16", "MAX"),
                             ("float64", "AVG")):
                self.start(f"all_reduce (hier and ring from 0 bytes) dtype={name} redop={op} "
                           f"count={count}")
                self.one_all_reduce(self.dt(name), op, count, group=group, tag=" (hier0)")
            root = count % self.n
            self.start(f"broadcast (staged from 0 bytes) count={count} root={root}")
            t = H.pattern(root, 1, count, torch.int64) if self.rank == root else \
                torch.zeros(count, dtype=torch.int64)
            if self.braid_call(lambda: dist.broadcast(t, root, group=group)):
                self.compare("broadcast (hier0)", t, H.pattern(root, 1, count, torch.int64))
            self.start(f"reduce (staged from 0 bytes) redop=MAX count={count} root={root}")
            ins = self.inputs(count, torch.int32, "MAX")
            t = ins[self.rank].clone()
            if self.braid_call(lambda: dist.reduce(t, root, op=H.reduce_op("MAX"), group=group)) \
                    and self.rank == root:
                self.compare("reduce (hier0)", t, H.closed_form(ins, "MAX", self.n))
            self.start(f"all_gather (staged from 0 bytes) count={count}")
            outs = [torch.zeros(count, dtype=torch.float32) for _ in range(self.n)]
            if self.braid_call(lambda: dist.all_gather(
                    outs, H.pattern(self.rank, 3, count, torch.float32), group=group)):
                for j in range(self.n):
                    self.compare(f"all_gather[{j}] (hier0)", outs[j],
                                 H.pattern(j, 3, count, torch.float32))
            self.start(f"reduce_scatter (staged from 0 bytes) count={count}")
            full = self.inputs(self.n * count, torch.int64, "SUM", salt=2)
            closed = H.closed_form(full, "SUM", self.n).chunk(self.n)[self.rank].clone()
            out = torch.zeros(count, dtype=torch.int64)
            if self.braid_call(lambda: dist.reduce_scatter(
                    out, [c.clone() for c in full[self.rank].chunk(self.n)], group=group)):
                self.compare("reduce_scatter (hier0)", out, closed)


def eth0_tx_bytes():
    """Bytes this host has sent (/proc/net/dev follows the reader's network namespace)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "eth0":
                return int(rest.split()[8])
    raise RuntimeError("no eth0 in /proc/net/dev")


HOST_OF = []


def subgroup_ranks(hosts):
    """Subgroups for a layout (hosts[r] is rank r's host): see Matrix.subgroups."""
    names = sorted(set(hosts))
    on = [[r for r in range(len(hosts)) if hosts[r] == x] for x in names]
    out = []
    if len(names) > 1:
        out.append(tuple(sorted(rs[-1] for rs in on)))  # the last rank of every host
        out.append(tuple(range(1, len(hosts))))  # all but rank 0
    if len(on[0]) > 1:
        out.append(tuple(on[0]))  # host 0 alone
    if min(len(rs) for rs in on) >= 3:
        out.append(tuple(sorted(r for rs in on for r in rs[1:])))  # L - 1 on every host
    return list(dict.fromkeys(g for g in out if len(g) > 1))


def main():
    rank, n, addr, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    store = H.tcp_store(addr, port, n, rank == 0, timeout)
    dist.init_process_group("gloo", store=dist.PrefixStore("default", store), rank=rank,
                            world_size=n, timeout=timeout)
    braid = dist.new_group(backend="braid", timeout=timeout)
    hosts = [None] * n
    dist.all_gather_object(hosts, socket.gethostname())
    HOST_OF.extend(hosts)
    saved = {k: os.environ.get(k) for k in ("BRAID_HIER_MIN_BYTES",
                                            "BRAID_NET_ALLREDUCE_RING_MIN",
                                            "BRAID_HIER_PIPELINE_BYTES")}
    os.environ.update(BRAID_HIER_MIN_BYTES="0", BRAID_NET_ALLREDUCE_RING_MIN="0",
                      BRAID_HIER_PIPELINE_BYTES="16")
    braid0 = dist.new_group(backend="braid", timeout=timeout)
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    # Read when the group is made (Note [Settings that shape an op]).
    os.environ.pop("BRAID_ALLREDUCE_ONESHOT_MAX", None)
    if rank == n - 1:
        os.environ["BRAID_ALLREDUCE_ONESHOT_MAX"] = "0"
    odd = dist.new_group(backend="braid", timeout=timeout)
    os.environ.pop("BRAID_ALLREDUCE_ONESHOT_MAX", None)

    subgroups = {}
    for ranks in subgroup_ranks(hosts):
        # new_group is collective over the whole world, in the same order on every rank.
        subgroups[ranks] = (dist.new_group(list(ranks), timeout=timeout, backend="gloo"),
                            dist.new_group(list(ranks), timeout=timeout, backend="braid"))

    m = Matrix(rank, n, dist.group.WORLD, braid, store)
    t0 = time.monotonic()
    families = [("all_reduce", m.all_reduce), ("premul_sum", m.premul_sum),
                ("broadcast", m.broadcast), ("reduce", m.reduce), ("all_gather", m.all_gather),
                ("gather_scatter", m.gather_scatter), ("reduce_scatter", m.reduce_scatter),
                ("all_to_all", m.all_to_all), ("barrier", m.barrier),
                ("send_recv", m.send_recv), ("isend_irecv", m.isend_irecv),
                ("p2p_edges", m.p2p_edges), ("hier_traffic", m.hier_traffic),
                ("mismatch", m.mismatch), ("async_ops", m.async_ops),
                ("subgroups", lambda: m.subgroups(subgroups)),
                ("small_hier", lambda: m.small_hier(braid0)),
                ("local_settings", lambda: m.local_settings(odd))]
    only = os.environ.get("BRAID_MATRIX_ONLY")  # for reproducing one family by hand
    for family, fn in families:
        if only and family not in only.split(","):
            continue
        m.timed(family, fn)
    m.start("final gloo barrier")
    dist.barrier()
    report = {"rank": rank, "host": socket.gethostname(), "hosts": hosts, "cases": m.cases,
              "compared": m.compared, "closed_form": m.closed, "failures": m.failures,
              "gloo_notes": m.gloo_notes, "seconds": m.seconds, "traffic": m.traffic,
              "errors": m.errors,
              "total_seconds": round(time.monotonic() - t0, 2)}
    # The braid groups close here (their sockets, shared memory and threads); the parent
    # checks each host's /dev/shm is empty once the ranks have exited.
    for _, bg in subgroups.values():
        dist.destroy_process_group(bg)
    dist.destroy_process_group(braid0)
    dist.destroy_process_group(odd)
    dist.destroy_process_group(braid)
    dist.barrier()  # rank 0's store must outlive every rank's last use of it
    print(json.dumps(report), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()

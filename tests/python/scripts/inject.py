"""One rank of a failure-injection case (test_fault_injection.py, issue 12).

    python inject.py RANK SIZE FAMILY FAULT VICTIM INJECT_AT TIMEOUT_S PORT DIR

Every rank inits a braid group over the parent's TCPStore (group timeout
TIMEOUT_S), runs the op FAMILY in a loop, and checks each result against its
closed form. At iteration INJECT_AT the VICTIM injects FAULT; every other rank
(a survivor) must get an exception from its current or next op. A survivor
writes DIR/report.RANK.json (what it caught, when, whether its results were
right until then, the braid threads left after destroying the group) and
exits 0. The victim writes DIR/t0 (time.monotonic(), which is CLOCK_MONOTONIC
and so comparable between processes) just before the fault takes effect.

Note [Injection points]
Where each fault lands:
- exit0, exit1, hang: on the main thread, just before the victim's op call;
  for ddp inside backward (a hook on the weight's gradient), so the victim
  leaves in the middle of the reducer's work.
- abort, sigkill, sigterm: from a thread, released at the same point, while
  the main thread goes on into the op, so the signal lands in the op.
- cbhang: the victim issues the op asynchronously and chains a callback on
  its future that sleeps; the callback runs on braid's worker (p2p thread for
  send/recv, the reducer's comm hook for ddp) when the op completes, so the
  victim's next op never starts. The survivors wait for DIR/registered before
  their op of that iteration, so that the callback is chained before the op
  can complete (a callback chained on a completed future would run inline, on
  the main thread: a plain hang).
"""
import datetime
import gc
import json
import os
import signal
import sys
import threading
import time

(RANK, SIZE, FAMILY, FAULT, VICTIM, INJECT_AT, TIMEOUT_S, PORT,
 DIR) = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]),
         int(sys.argv[6]), float(sys.argv[7]), int(sys.argv[8]), sys.argv[9])
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import harness as H  # noqa: E402
import torch_braid  # noqa: E402,F401

IS_VICTIM = RANK == VICTIM
HANG_S = 600.0  # a hung victim is killed by the test long before this


def write_json(name, obj):
    tmp = os.path.join(DIR, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(DIR, name))


def mark_t0(**extra):
    write_json("t0", dict(t0=time.monotonic(), pid=os.getpid(), **extra))


# -- faults ----------------------------------------------------------------------------------

_fire = threading.Event()


def _signal_thread():
    _fire.wait()
    mark_t0(thread="injector")
    if FAULT == "abort":
        os.abort()
    os.kill(os.getpid(), signal.SIGKILL if FAULT == "sigkill" else signal.SIGTERM)
    time.sleep(HANG_S)


def fire_point():
    """The victim's injection point (see Note [Injection points])."""
    if FAULT in ("abort", "sigkill", "sigterm"):
        _fire.set()  # the injector thread fires while this thread goes on into the op
        return
    mark_t0(thread="main")
    if FAULT == "exit0":
        sys.exit(0)
    if FAULT == "exit1":
        sys.exit(1)
    if FAULT == "hang":
        time.sleep(HANG_S)
        return
    raise AssertionError(f"fault {FAULT} has no injection point here")


def hanging_callback(value):
    """Chained on the victim's future in cbhang: sleeps on whichever thread completes it."""
    mark_t0(thread="main" if threading.current_thread() is threading.main_thread()
            else "callback")
    time.sleep(HANG_S)
    return value


def registered():
    write_json("registered", dict(t=time.monotonic()))


def wait_registered():
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(DIR, "registered")):
        if time.monotonic() > deadline:
            raise RuntimeError("the victim never chained its callback")
        time.sleep(0.005)


# -- op families: step(it, async_victim) runs one iteration and checks its result ----------


def count(it):
    """Elements per op: small on even iterations, 4 MiB of float32 on odd ones (INJECT_AT is
    odd), so the fault meets the chunked pipelines, direct reads of a peer's memory (allgather,
    alltoall) and a p2p message larger than its ring, as well as one-step ops."""
    return 64 if it % 2 == 0 else 1 << 20


class Family:
    def __init__(self):
        self.n, self.r = SIZE, RANK
        self.bad = []  # wrong results (there must be none before the fault)

    def check(self, what, got, want):
        if not torch.equal(got, want):
            self.bad.append(f"iteration {what}: got {got.flatten()[:8].tolist()}, "
                            f"want {want.flatten()[:8].tolist()}")


class AllReduce(Family):
    def step(self, it, cb=False):
        t = torch.full((count(it),), float(self.r + 1 + it))
        want = torch.full((count(it),), float(self.n * (self.n + 1) // 2 + self.n * it))
        if cb:
            return dist.all_reduce(t, async_op=True).get_future().then(hanging_callback)
        dist.all_reduce(t)
        self.check(it, t, want)


class Broadcast(Family):
    def step(self, it, cb=False):
        root = it % self.n
        t = torch.full((count(it),), float(self.r * 100 + it))
        want = torch.full((count(it),), float(root * 100 + it))
        if cb:
            return dist.broadcast(t, root, async_op=True).get_future().then(hanging_callback)
        dist.broadcast(t, root)
        self.check(it, t, want)


class AllGather(Family):
    def step(self, it, cb=False):
        m = count(it) // self.n
        t = torch.full((m,), float(self.r * 100 + it))
        out = [torch.empty(m) for _ in range(self.n)]
        if cb:
            return dist.all_gather(out, t, async_op=True).get_future().then(hanging_callback)
        dist.all_gather(out, t)
        self.check(it, torch.stack(out), torch.stack(
            [torch.full((m,), float(q * 100 + it)) for q in range(self.n)]))


class AllToAll(Family):
    def step(self, it, cb=False):
        # Row q goes to rank q: it holds (sender, receiver, iteration).
        m = count(it) // self.n
        inp = torch.tensor([self.r * 100 + q * 10 + it for q in range(self.n)],
                           dtype=torch.float32)[:, None].repeat(1, m)
        out = torch.empty_like(inp)
        if cb:
            return dist.all_to_all_single(out, inp, async_op=True).get_future().then(
                hanging_callback)
        dist.all_to_all_single(out, inp)
        self.check(it, out, torch.tensor([q * 100 + self.r * 10 + it for q in range(self.n)],
                                         dtype=torch.float32)[:, None].repeat(1, m))


class SendRecv(Family):
    """A ring: rank r sends to r+1 and receives from r-1 (isend/irecv, then wait)."""

    def step(self, it, cb=False):
        nxt, prv = (self.r + 1) % self.n, (self.r - 1) % self.n
        out = torch.full((count(it),), float(self.r * 100 + it))
        got = torch.empty(count(it))
        works = [dist.isend(out, nxt), dist.irecv(got, prv)]
        if cb:
            return works[1].get_future().then(hanging_callback)
        for w in works:
            w.wait()
        self.check(it, got, torch.full((count(it),), float(prv * 100 + it)))


def _sum_hook(state, bucket):
    """A comm hook that sums; the victim chains its hanging callback at INJECT_AT.

    A plain function over a plain dict: a hook that referred back to the model
    would make a cycle through the C++ reducer that no gc can break, and keep
    the group (and its threads) alive after destroy_process_group on torch 1.x.
    """
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    if IS_VICTIM and state["it"] == INJECT_AT:
        fut = fut.then(lambda f: hanging_callback(f.value()[0]))
        registered()
        return fut
    return fut.then(lambda f: f.value()[0])


class DDP(Family):
    """torch's DistributedDataParallel over the braid group; the victim faults in backward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        # 4 MiB of weight gradients: one bucket, allreduced in chunks.
        self.model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024))
        self.state = {"it": -1}
        if FAULT == "cbhang":
            self.model.register_comm_hook(self.state, _sum_hook)
        if IS_VICTIM and FAULT != "cbhang":
            state = self.state

            def grad_hook(grad):
                if state["it"] == INJECT_AT:
                    fire_point()
                return grad

            self.model.module.weight.register_hook(grad_hook)

    def step(self, it, cb=False):
        self.state["it"] = it
        self.model.zero_grad()
        x = torch.full((8, 1024), float(self.r + 1))
        self.model(x).sum().backward()
        # d(sum)/d(weight) = 8 * x-row for every output: the mean over ranks of 8 * (r + 1).
        want = torch.full((1024, 1024), 8.0 * (self.n + 1) / 2)
        if FAULT == "cbhang":  # the hook sums, DDP's own allreduce averages
            want = want * self.n
        self.check(it, self.model.module.weight.grad, want)


FAMILIES = {"allreduce": AllReduce, "broadcast": Broadcast, "allgather": AllGather,
            "alltoall": AllToAll, "sendrecv": SendRecv, "ddp": DDP}


def backend_object():
    pg = dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):
        return pg._get_backend(torch.device("cpu"))
    return pg


def main():
    store = H.tcp_store("127.0.0.1", PORT, SIZE, False, datetime.timedelta(seconds=60))
    # Init (and DDP's construction) with a long timeout: the ranks arrive as
    # their imports end, seconds apart on a loaded machine. The short one
    # applies from the first iteration on, when the ranks are in step.
    dist.init_process_group("braid", store=store, rank=RANK, world_size=SIZE,
                            timeout=datetime.timedelta(seconds=60))
    fam = FAMILIES[FAMILY]()
    backend_object().set_timeout(datetime.timedelta(seconds=TIMEOUT_S))
    if IS_VICTIM and FAULT in ("abort", "sigkill", "sigterm"):
        threading.Thread(target=_signal_thread, daemon=True).start()
    report = dict(rank=RANK, pid=os.getpid(), outcome="no error", iterations=0)
    stop = time.monotonic() + 3 * TIMEOUT_S + 30  # a survivor never loops forever
    it = 0
    try:
        while time.monotonic() < stop:
            if it == INJECT_AT and FAULT == "cbhang":
                if IS_VICTIM:
                    if FAMILY != "ddp":
                        fam.step(it, cb=True)
                        registered()
                        it += 1
                        continue
                else:
                    wait_registered()
            if IS_VICTIM and it == INJECT_AT and FAMILY != "ddp" and FAULT != "cbhang":
                fire_point()
            fam.step(it)
            it += 1
            report["iterations"] = it
    except Exception as e:  # noqa: BLE001 - what a survivor caught is the point
        report.update(outcome="raised", t_raise=time.monotonic(), type=type(e).__name__,
                      message=str(e), iteration=it)
        write_json(f"caught.{RANK}.json", report)  # before destroy, which a victim may not pass
    report["bad_results"] = fam.bad[:5]
    t = time.monotonic()
    del fam
    # torch 1.x's destroy_process_group only drops the group; DDP's reducer can
    # hold it in a reference cycle, and the group's threads end with the group.
    gc.collect()
    dist.destroy_process_group()
    report["destroy_s"] = time.monotonic() - t
    report["braid_threads"] = H.braid_threads()
    write_json(f"report.{RANK}.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

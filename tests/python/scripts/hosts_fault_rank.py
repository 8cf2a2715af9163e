"""One rank of test_hosts_faults.py's jobs across simulated hosts (tools/hosts.py).

    hosts_fault_rank.py RANK WORLD PER_HOST STORE_ADDR PORT TIMEOUT_S MODE [KEY=VALUE...]

Rank 0 hosts a TCPStore on STORE_ADDR (host 0's address). Every rank first meets the others
at the store (imports end seconds apart on a loaded machine), then creates the braid default
group with the group timeout TIMEOUT_S, so the short timeout applies to what the test
examines, not to the ranks' arrival.

MODE init: creates the group and runs a few allreduces (small and hierarchical), checked
against their closed form; prints one JSON line, {"outcome": "ok" | "init_error" | "error",
"message", "t_init", "t_fail", ...} and exits 0 (a refused group is a result here, not a
crash).

MODE loop: runs allreduces of BYTES (KEY bytes=, default 16 MiB: the hierarchical path; with
op=broadcast, broadcasts from each rank in turn, staged too; with op=alltoall,
all_to_all_single among all ranks) in a loop, each checked against
its closed form, until one raises or max_s seconds pass (or, with
stop_file=PATH, until rank 0 sees PATH: a 1-element allreduce after each iteration tells the
others, so that every rank stops after the same iteration). After
`ready` iterations it prints {"event": "looping"}, the test's cue to inject its fault. Then
destroys the group and reports (one JSON line): what it caught and when (time.monotonic(),
which is CLOCK_MONOTONIC and so comparable across processes: the hosts share the machine's
clock), whether every result until then was right, and the braid threads and sockets left
after destroy. With reinit=1, the ranks of host 0 then create a new braid group among
themselves (a fresh store prefix), run allreduces, check them, destroy it, and report the
threads and sockets left again.

Sockets are counted from /proc/self/fd, less those of the TCPStore (its port at either end):
what remains after destroy is braid's. (Not from /proc/net/tcp, which does not list a socket
that a reset has closed while its process still holds it.)
"""

import datetime
import gc
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_braid  # noqa: E402,F401

RANK, WORLD, PER_HOST = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ADDR, PORT, TIMEOUT_S, MODE = sys.argv[4], int(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
KW = dict(a.split("=", 1) for a in sys.argv[8:])
MEET_S = 120  # the ranks' imports, on a loaded machine


def emit(obj):
    print(json.dumps(obj), flush=True)


def sockets(exclude_port):
    """This process's sockets other than the store's, as 'LOCAL -> REMOTE' (family, type)."""
    out = []
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:["):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))  # family and type read from the fd
        except OSError:
            continue  # closed meanwhile
        with s:
            local = s.getsockname()
            try:
                remote = s.getpeername()
            except OSError:  # listening, or closed by a reset (then unlisted in /proc/net/tcp)
                remote = None
        ports = [a[1] for a in (local, remote) if isinstance(a, tuple) and len(a) >= 2]
        if exclude_port in ports:
            continue  # the TCPStore's (rank 0 serves it; the clients' connections)
        out.append(f"fd {fd}: {local} -> {remote} ({s.family.name}, {s.type.name})")
    return out


def base(count):
    # Index-dependent values, so a section landing at the wrong offset shows; exact in float32.
    return (torch.arange(count) % 1013).to(torch.float32)


def allreduce_checked(b, it, n, rank, group=None):
    """One allreduce of base + rank + it % 7: the sum is n * base + n(n-1)/2 + n * (it % 7)."""
    t = b + float(rank + it % 7)
    dist.all_reduce(t, group=group)
    return mismatch(t, b * n + float(n * (n - 1) // 2 + n * (it % 7)), f"iteration {it}")


def mismatch(t, want, what):
    """None when t equals want, else where and how it differs."""
    if torch.equal(t, want):
        return None
    bad = (t != want).nonzero()
    i = int(bad[0])
    return f"{what}: {bad.shape[0]} of {t.numel()} wrong; first at {i}: " \
           f"{t[i].item()} != {want[i].item()}"


def broadcast_checked(b, it, n, rank, group=None):
    """One broadcast of base + root + it % 7 from root it % n (each local rank in turn)."""
    root = it % n
    want = b + float(root + it % 7)
    t = want.clone() if rank == root else torch.zeros_like(b)
    dist.broadcast(t, root, group=group)
    return mismatch(t, want, f"iteration {it} (root {root})")


def alltoall_checked(b, it, n, rank, group=None):
    """One all_to_all_single: block d of rank s's input is base + 16 s + d + it % 7, so block s
    of the output is base + 16 s + rank + it % 7. Between the ranks of a host the blocks go
    through shared memory (Note [Routing by host]), large ones read in place."""
    blocks = b.chunk(n)
    inp = torch.cat([blk + float(16 * rank + d + it % 7) for d, blk in enumerate(blocks)])
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp, group=group)
    want = torch.cat([blocks[rank] + float(16 * s + rank + it % 7) for s in range(n)])
    return mismatch(out, want, f"iteration {it}")


LOOP_OPS = {"allreduce": allreduce_checked, "broadcast": broadcast_checked,
            "alltoall": alltoall_checked}


def meet(store, tag, ranks):
    store.set(f"{tag}/{RANK}", "1")
    store.wait([f"{tag}/{r}" for r in ranks], datetime.timedelta(seconds=MEET_S))


def leave(store, ranks):
    """Rank 0 serves the store: it stays until `ranks` are done with it; the others go."""
    store.set(f"done/{RANK}", "1")
    if RANK == 0:
        store.wait([f"done/{r}" for r in ranks], datetime.timedelta(seconds=MEET_S))


def run_init(store):
    rep = dict(rank=RANK, host=socket.gethostname(), pid=os.getpid())
    rep["t_init"] = time.monotonic()
    try:
        dist.init_process_group("braid", store=dist.PrefixStore("job", store), rank=RANK,
                                world_size=WORLD, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    except Exception as e:  # noqa: BLE001  the refusal is the result
        rep.update(outcome="init_error", t_fail=time.monotonic(), type=type(e).__name__,
                   message=str(e), braid_threads=harness.braid_threads(),
                   sockets=sockets(PORT))
        emit(rep)
        return
    rep["t_ready"] = time.monotonic()
    bad = []
    try:
        for it, count in enumerate((1000, 1 << 20, 7, 1 << 18)):  # 4 KB, 4 MiB, ...
            err = allreduce_checked(base(count), it, WORLD, RANK)
            if err:
                bad.append(err)
        rep["outcome"] = "ok"
    except Exception as e:  # noqa: BLE001
        rep.update(outcome="error", t_fail=time.monotonic(), type=type(e).__name__,
                   message=str(e))
    rep["bad_results"] = bad
    dist.destroy_process_group()
    rep["braid_threads"] = harness.braid_threads()
    rep["sockets"] = sockets(PORT)
    emit(rep)


def run_loop(store):
    count = int(KW.get("bytes", 16 << 20)) // 4
    ready, max_s = int(KW.get("ready", 3)), float(KW.get("max_s", 60))
    stop_file = KW.get("stop_file")
    rep = dict(rank=RANK, host=socket.gethostname(), pid=os.getpid(), outcome="no error")
    rep["sockets_before"] = sockets(PORT)
    dist.init_process_group("braid", store=dist.PrefixStore("job", store), rank=RANK,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=TIMEOUT_S))
    b = base(count)
    bad = []
    it = 0
    stop = time.monotonic() + max_s
    try:
        while time.monotonic() < stop:
            err = LOOP_OPS[KW.get("op", "allreduce")](b, it, WORLD, RANK)
            if err:
                bad.append(err)
            it += 1
            if it == ready:
                emit({"event": "looping", "t": time.monotonic()})
            if stop_file:  # the ranks stop together: rank 0 sees the file, tells the others
                flag = torch.tensor([float(RANK == 0 and os.path.exists(stop_file))])
                dist.all_reduce(flag)
                if flag.item():
                    break
    except Exception as e:  # noqa: BLE001  what a survivor caught is the point
        rep.update(outcome="raised", t_raise=time.monotonic(), type=type(e).__name__,
                   message=str(e))
    rep.update(iterations=it, bad_results=bad[:5])
    t = time.monotonic()
    gc.collect()
    dist.destroy_process_group()
    rep["destroy_s"] = time.monotonic() - t
    rep["braid_threads"] = harness.braid_threads()
    rep["sockets"] = sockets(PORT)
    if KW.get("reinit") == "1" and RANK < PER_HOST:
        rep["reinit"] = reinit(store, b)
    if RANK < PER_HOST:
        leave(store, range(PER_HOST))
    emit(rep)


def reinit(store, b):
    """A new braid group of host 0's ranks, after the old one failed."""
    out = {}
    dist.init_process_group("braid", store=dist.PrefixStore("reinit", store), rank=RANK,
                            world_size=PER_HOST, timeout=datetime.timedelta(seconds=30))
    out["backend"] = dist.get_backend()
    bad = []
    for it, count in enumerate((1000, b.numel())):
        err = allreduce_checked(b[:count], it, PER_HOST, RANK)
        if err:
            bad.append(err)
    out["bad_results"] = bad
    out["iterations"] = 2
    dist.destroy_process_group()
    out["braid_threads"] = harness.braid_threads()
    out["sockets"] = sockets(PORT)
    return out


def main():
    torch.set_num_threads(1)
    store = harness.tcp_store(ADDR, PORT, WORLD, RANK == 0, datetime.timedelta(seconds=MEET_S))
    meet(store, "arrived", range(WORLD))
    if MODE == "init":
        run_init(store)
        leave(store, range(WORLD))
    elif MODE == "loop":
        run_loop(store)
    else:
        raise SystemExit(f"unknown mode {MODE}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's slow teardown with torch loaded; groups are destroyed


if __name__ == "__main__":
    main()

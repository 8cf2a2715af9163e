"""Pieces shared by the braid benchmarks (collectives.py, ddp.py).

Reuse from another benchmark script:

    from _bench_common import (launch_if_requested, init_worker, ...)

    def main():
        args = parse_args()
        rc = launch_if_requested(args.nprocs, args.store)  # parent: spawns N copies of this script
        if rc is not None:
            sys.exit(rc)
        info = init_worker(timeout_s=args.timeout, threads=args.threads)  # child or torchrun rank
        ...

What is here:
  - launching: `launch_if_requested` re-runs the current script N times with RANK/WORLD_SIZE set
    (FileStore in a temp dir, or a TCPStore on a free port), so the children take exactly the
    path they take under torchrun; children die with the parent (PR_SET_PDEATHSIG) and a failing
    rank stops the others.
  - `init_worker`: default process group = gloo, used only as the control group (agreeing on
    statuses and iteration counts, gathering times), so the groups under test stay free of
    benchmark bookkeeping and can be re-created per environment setting.
  - backends under test: `resolve_backends` ('braid,gloo', 'auto', NAME@cuda, repeated names),
    `ensure_backend` (a clear error when torch_braid is missing), `braid_info`.
  - timing: `time_iters`, `agree_iters`, `agree` (statuses + messages), `gather_floats`,
    `BenchFailure` (ends the run; says whether every rank raised it).
  - `memcpy_bandwidth` / `measure_memcpy`, sizes (`parse_size`, `fmt_size`, `size_range`), env
    sweeps (`env_combos`, `applied_env`), `Progress`, `machine_meta`.
  - closed-form checks on periodic data (`fill_periodic`, `first_mismatch`), `render_table`,
    `plot_sweep` (busbw and time against size, one row per op).
"""

import contextlib
import ctypes
import faulthandler
import itertools
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import json
import time
import traceback

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}

# Set in the children that launch_if_requested starts (torchrun sets RANK/WORLD_SIZE itself).
INIT_METHOD_ENV = "BENCH_INIT_METHOD"


# ---- sizes ---------------------------------------------------------------------------------------
def parse_size(text):
    """'4' -> 4, '4K' -> 4096, '256M', '1G' (binary multiples; a trailing 'B'/'iB' is allowed)."""
    t = text.strip().upper().replace("IB", "").rstrip("B")
    unit = t[-1:] if t[-1:] in _UNITS and not t[-1:].isdigit() else ""
    value = t[: len(t) - len(unit)]
    try:
        n = int(float(value) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"bad size {text!r}: expected e.g. 4, 4K, 1M, 256M") from None
    if n < 0:
        raise ValueError(f"bad size {text!r}: negative")
    return n


def fmt_size(n):
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def size_range(min_bytes, max_bytes, factor):
    if factor < 2:
        raise ValueError("--factor must be >= 2")
    sizes, s = [], max(min_bytes, 1)
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


# ---- environment sweeps --------------------------------------------------------------------------
def env_combos(specs):
    """['A=1,2', 'B=x'] -> [{'A': '1', 'B': 'x'}, {'A': '2', 'B': 'x'}]; [] -> [{}]."""
    keys, values = [], []
    for spec in specs or []:
        key, sep, vals = spec.partition("=")
        if not sep or not key:
            raise ValueError(f"bad --env {spec!r}: expected KEY=V1,V2,...")
        keys.append(key)
        values.append(vals.split(","))
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


@contextlib.contextmanager
def applied_env(env):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---- launching -----------------------------------------------------------------------------------
def is_worker():
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _die_with_parent():
    # A child whose launcher was killed (test timeout, Ctrl-C) must not linger in a collective.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_if_requested(nprocs, store="file", grace_s=10.0, hosts=0, link_gbit=None):
    """In the parent: run this script `nprocs` times as ranks and return the exit code.

    Returns None when this process is itself a rank (torchrun, or a child of ours) or nprocs is
    not set, so the caller goes on to `init_worker`.

    hosts=N places the ranks on N simulated hosts (tools/hosts.py, Note [Simulated hosts]):
    rank r on host r * N // nprocs, a TCP store on host 0's address, each link capped at
    link_gbit Gbit/s if given. The hosts are torn down when the run ends, however it ends.
    """
    if is_worker() or not nprocs:
        return None
    tmp = tempfile.mkdtemp(prefix="braid-bench-")
    base = dict(os.environ, WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs))
    base.setdefault("OMP_NUM_THREADS", "1")
    sim = None
    if hosts:
        sim = simulated_hosts(hosts, nprocs, link_gbit)
        # The run's own namespaces: nothing else listens there, so any port is free.
        base.update(MASTER_ADDR=sim.addr(0), MASTER_PORT="29500")
        base[INIT_METHOD_ENV] = "env://"
    elif store == "tcp":
        base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        base[INIT_METHOD_ENV] = "env://"
    else:
        base[INIT_METHOD_ENV] = "file://" + os.path.join(tmp, "store")
    argv = [sys.executable, os.path.abspath(sys.argv[0])] + sys.argv[1:]
    procs = []
    try:
        for r in range(nprocs):
            env = dict(base, RANK=str(r), LOCAL_RANK=str(r))
            cmd = argv
            if sim:
                k = r * hosts // nprocs
                first = next(q for q in range(nprocs) if q * hosts // nprocs == k)
                size = sum(1 for q in range(nprocs) if q * hosts // nprocs == k)
                env.update(LOCAL_RANK=str(r - first), LOCAL_WORLD_SIZE=str(size))
                cmd = sim.cmd(k, argv)
            procs.append(subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent))
        return _wait_all(procs, grace_s)
    except KeyboardInterrupt:
        return 130
    finally:
        _stop(procs)
        shutil.rmtree(tmp, ignore_errors=True)
        if sim:
            sim.teardown()


def simulated_hosts(n, nprocs, link_gbit=None):
    """tools/hosts.py's Hosts(n); exits with the reason where they cannot be made."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), "tools"))
    import hosts as hosts_mod

    why = hosts_mod.unavailable()
    if why or n > nprocs:
        sys.exit(f"bench: cannot place {nprocs} ranks on {n} simulated hosts: "
                 f"{why or 'fewer ranks than hosts'}")
    return hosts_mod.Hosts(n, link_gbit=link_gbit)


def _wait_all(procs, grace_s):
    failed_at, rc = None, 0
    while True:
        codes = [p.poll() for p in procs]
        for r, c in enumerate(codes):
            if c not in (None, 0) and rc == 0:
                rc = c if c > 0 else 128 - c
                failed_at = time.monotonic()
                if c < 0:
                    print(f"bench: rank {r} died from signal {-c}", file=sys.stderr)
        if all(c is not None for c in codes):
            return rc
        # A rank that failed alone leaves the others blocked in a collective: give them time to
        # see the agreed failure and exit by themselves, then stop them.
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            print("bench: a rank failed; stopping the others", file=sys.stderr)
            return rc
        time.sleep(0.05)


def _stop(procs):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_rank_counts(worker, args, part_env, prefix):
    """A benchmark's main: a worker runs `worker`; the parent runs one job per
    entry of args.ranks (each rank writes its part to the file named by
    $part_env) and returns (exit code, the parts in order)."""
    if is_worker():  # torchrun, or a child of ours
        end_rank(run_rank(worker, args))  # Note [Bounded teardown]
    parts = []
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for n in args.ranks:
            out = os.path.join(tmp, f"part{n}.json")
            os.environ[part_env] = out
            if not args.quiet:
                print(f"# {n} rank(s)", file=sys.stderr, flush=True)
            rc = launch_if_requested(n, args.store)
            if rc:
                print(f"bench: the {n}-rank run failed (exit code {rc})", file=sys.stderr)
                return rc, parts
            with open(out) as f:
                parts.append(json.load(f))
        os.environ.pop(part_env, None)
    return 0, parts


def run_rank(worker, args):
    """worker(args)'s exit code; 1, after printing the traceback, if it raised."""
    try:
        return worker(args)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # KeyboardInterrupt too: end_rank exits next
        traceback.print_exc()
        return 1


def end_rank(rc, grace_s=30.0, destroy=None):
    """Ends a rank's process: destroys its process groups, then exits with `rc` at once.

    Note [Bounded teardown]
    A rank's work is done (results printed and saved) before it tears down, yet tearing down
    has hung: in CI, both ranks of a 2-rank gloo run on torch 2.6 reported a wrong result and
    then stayed alive until the test's 240 s limit, and torch 1.13 can deadlock in interpreter
    finalization when a gloo thread frees a Python-owned tensor (pytorch #75097 and #190489
    report hangs in both places). So a rank skips finalization (os._exit), and a watchdog bounds
    destroy_process_group: after `grace_s` it prints every thread's stack, so the hang can be
    diagnosed, and exits with the run's own code, so a failed run still reads as failed.
    """
    def watchdog():
        time.sleep(grace_s)
        print(f"bench: tearing down the process groups took over {grace_s:.0f} s; exiting "
              f"with {rc}. Stacks:", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(rc)

    threading.Thread(target=watchdog, name="bench-teardown", daemon=True).start()
    try:
        if destroy is None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        else:
            destroy()  # tests stand in a teardown that hangs
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


class BenchFailure(Exception):
    """Ends the run. `agreed`: every rank raises it (statuses go through the control group), so
    rank 0 alone reports it; otherwise the rank that saw it does."""

    def __init__(self, msg, agreed=True):
        super().__init__(msg)
        self.agreed = agreed


# ---- backends under test -------------------------------------------------------------------------
BUILTIN_BACKENDS = ("gloo", "nccl", "mpi", "ucc")


class Backend:
    """One group under test. spec: NAME or NAME@DEVICE (nccl defaults to cuda, others to cpu)."""

    def __init__(self, spec, label):
        self.name, _, device = spec.partition("@")
        self.device = device or ("cuda" if self.name == "nccl" else "cpu")
        self.label, self.group = label, None


def ensure_backend(name):
    import torch
    import torch.distributed as dist

    if name in BUILTIN_BACKENDS:
        if name == "nccl" and not torch.cuda.is_available():
            raise BenchFailure("backend 'nccl' needs CUDA, which is not available here")
        return
    if "braid" in name:
        try:
            import torch_braid  # noqa: F401  registers the "braid" backend
        except Exception as e:
            raise BenchFailure(
                f"backend '{name}' needs the torch_braid package, which failed to import: {e!r}. "
                "Build it (setup.py build_ext --inplace) or install it; the in-tree python/ "
                "directory is searched automatically.") from None
    if name.upper() not in getattr(dist.Backend, "_plugins", {}):
        raise BenchFailure(f"backend '{name}' is not registered with torch.distributed "
                           "(import its module with --import MODULE)")


def resolve_backends(spec, imports=(), devices=("cpu", "cuda")):
    """'braid,gloo,gloo' -> [Backend] labelled braid, gloo, gloo#2; 'auto' = braid if it
    imports, gloo, and nccl when CUDA is present and the benchmark's tensors may live
    there (`devices`). Call after init_worker, on every rank."""
    import importlib

    import torch
    import torch.distributed as dist

    for mod in imports:
        importlib.import_module(mod)
    if spec == "auto":
        names = ["gloo"]
        try:
            import torch_braid  # noqa: F401
            names.insert(0, "braid")
        except Exception as e:
            if dist.get_rank() == 0:
                print(f"# braid not measured: torch_braid did not import: {e!r}", file=sys.stderr)
        if torch.cuda.is_available() and "cuda" in devices:
            names.append("nccl")
    else:
        names = [s.strip() for s in spec.split(",") if s.strip()]
    backends, seen = [], {}
    for s in names:
        b = Backend(s, s)
        if b.device.split(":")[0] not in devices:
            raise BenchFailure(f"backend {s!r} works on {b.device} tensors; this benchmark "
                               f"uses {', '.join(devices)} tensors")
        ensure_backend(b.name)
        seen[s] = seen.get(s, 0) + 1
        b.label = s if seen[s] == 1 else f"{s}#{seen[s]}"
        backends.append(b)
    return backends


def braid_info():
    """The output of `python -m torch_braid.info` (build and every BRAID_ setting)."""
    try:
        import torch_braid
        # The benchmarks find torch_braid through sys.path (python/ beside them); the child
        # interpreter needs the same directory on PYTHONPATH.
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_braid.__file__)))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pkg_root, env.get("PYTHONPATH")]))
        p = subprocess.run([sys.executable, "-m", "torch_braid.info"], capture_output=True,
                           text=True, timeout=120, env=env)
        return p.stdout.strip() if p.returncode == 0 else f"(torch_braid.info failed: {p.stderr})"
    except Exception as e:
        return f"(torch_braid.info unavailable: {e!r})"


# ---- worker side ---------------------------------------------------------------------------------
class WorkerInfo:
    def __init__(self, rank, world_size, local_rank, hosts):
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.hosts = hosts  # hostname of each rank
        self.single_host = len(set(hosts)) == 1


def init_worker(timeout_s=300, threads=1):
    """Join the job as a rank; the default group (gloo) is the control group."""
    import datetime

    import torch
    import torch.distributed as dist

    if threads:
        torch.set_num_threads(threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=os.environ.get(INIT_METHOD_ENV, "env://"),
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    hosts = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    return WorkerInfo(rank, world, int(os.environ.get("LOCAL_RANK", rank)), hosts)


def agree_status(status):
    """Max of an int over ranks, through the control group."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([status], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather_floats(value):
    import torch
    import torch.distributed as dist

    out = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(out, torch.tensor([float(value)], dtype=torch.float64))
    return [float(t.item()) for t in out]


def gather_objects(obj):
    import torch.distributed as dist

    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def agree(status, msg):
    """Max of a status over ranks (0 = ok) and, if not 0, every rank's message."""
    st = agree_status(status)
    if st == 0:
        return 0, ""
    msgs = gather_objects(msg if status else "")
    return st, "; ".join(f"rank {i}: {m}" for i, m in enumerate(msgs) if m)


def control_barrier():
    import torch.distributed as dist

    dist.barrier()


def time_iters(fn, iters, sync):
    """Average seconds per call of `fn` over `iters` back-to-back calls."""
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / max(iters, 1)


def agree_iters(t_est, time_per_point, min_iters, max_iters):
    """Iterations filling the time budget, the same on every rank (from the slowest estimate)."""
    t = max(gather_floats(t_est))
    n = math.ceil(time_per_point / max(t, 1e-9))
    return int(min(max(n, min_iters), max_iters))


def memcpy_bandwidth(nbytes, reps=5):
    """GB/s (1e9 B/s, bytes counted once) of a torch copy_ of `nbytes`, single thread.

    Returns (best, median, best per CPU-second). The best is the ceiling busbw is compared with;
    on a shared machine the median mostly measures the neighbours, and best / per-CPU-second
    tells how much of a core this rank got. float32, as torch's uint8 copy is slower."""
    import torch

    src = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in before timing
    walls, cpus = [], []
    for _ in range(reps):
        c0, t0 = time.thread_time(), time.perf_counter()
        dst.copy_(src)
        walls.append(time.perf_counter() - t0)
        cpus.append(max(time.thread_time() - c0, 1e-9))
    nb = src.numel() * 4
    return nb / min(walls) / 1e9, nb / statistics.median(walls) / 1e9, nb / min(cpus) / 1e9


def measure_memcpy(nbytes):
    """memcpy_bandwidth on rank 0 alone (the others wait), then on all ranks at once."""
    import torch.distributed as dist

    control_barrier()
    single = memcpy_bandwidth(nbytes) if dist.get_rank() == 0 else (0.0, 0.0, 0.0)
    single = [gather_floats(x)[0] for x in single]
    control_barrier()
    conc = gather_floats(memcpy_bandwidth(nbytes)[0])
    return {"bytes": nbytes, "single_rank_GBps": single[0], "single_rank_median_GBps": single[1],
            "single_rank_per_cpu_second_GBps": single[2], "concurrent_per_rank_GBps": conc}


# ---- reporting -----------------------------------------------------------------------------------
class Progress:
    """A one-line progress bar on a terminal; on a pipe, a line at every 10%."""

    def __init__(self, total, enabled=True, stream=None):
        self.total, self.done, self.enabled = max(total, 1), 0, enabled
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.monotonic()
        self.last_decile = -1

    def update(self, label):
        self.done += 1
        if not self.enabled:
            return
        frac = self.done / self.total
        elapsed = time.monotonic() - self.t0
        eta = elapsed / frac - elapsed if frac > 0 else 0
        if self.tty:
            bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
            line = f"[{bar}] {self.done}/{self.total} {elapsed:5.0f}s eta {eta:4.0f}s  {label}"
            self.stream.write("\r" + line[:118].ljust(118))
            self.stream.flush()
        elif int(frac * 10) > self.last_decile:
            self.last_decile = int(frac * 10)
            print(f"progress {self.done}/{self.total} ({elapsed:.0f}s) {label}", file=self.stream,
                  flush=True)

    def clear(self):
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * 118 + "\r")
            self.stream.flush()


def machine_meta():
    import torch

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ---- closed-form checks --------------------------------------------------------------------------
# Inputs and expected outputs that repeat with a short period let a check cover every element of
# a 256 MiB buffer without building a second buffer of that size.
def fill_periodic(buf, tile):
    """buf[j] = tile[j % len(tile)] for a 1-D buf (tile: float64 values, cast to buf's dtype)."""
    p, m = tile.numel(), buf.numel()
    full = m // p * p
    tile = tile.to(buf.dtype).to(buf.device)
    if full:
        buf[:full].view(-1, p).copy_(tile.expand(full // p, p))
    if m > full:
        buf[full:].copy_(tile[: m - full])


def first_mismatch(buf, tile, atol, chunk_rows=1 << 20):
    """(index, got, expected) of the first element off buf[j] == tile[j % len(tile)], or None.

    atol == 0 compares exactly in buf's dtype (the tile cast the same way as the inputs were);
    otherwise |buf - tile| <= atol in float64, NaN counting as a mismatch.
    """
    p, m = tile.numel(), buf.numel()
    full = m // p * p
    exact = tile.to(buf.dtype).to(buf.device)
    tile64 = tile.to(buf.device)
    rows = buf[:full].view(-1, p)
    parts = [(rows[s:s + chunk_rows], p * s) for s in range(0, rows.shape[0], chunk_rows)]
    if m > full:
        parts.append((buf[full:].view(1, -1), full))
    for block, offset in parts:
        w = block.shape[1]
        if atol == 0:
            bad = block != exact[:w]
        else:
            bad = ~((block.double() - tile64[:w]).abs() <= atol)
        if bool(bad.any()):
            i = int(bad.flatten().nonzero()[0])
            return offset + i, block.flatten()[i].item(), tile64[i % p].item()
    return None


# ---- tables and plots ----------------------------------------------------------------------------
def render_table(title, head, rows, notes=()):
    """head: [(group title, [column names])]; rows: lists of strings, one per column."""
    cols = [c for _, cs in head for c in cs]
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
    groups, i = [], 0
    for name, cs in head:
        w = sum(widths[i:i + len(cs)]) + 2 * (len(cs) - 1)
        groups.append(name.center(w, "-") if name else " " * w)
        i += len(cs)
    lines = [title, "  ".join(groups), "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines + [f"  * {n}" for n in notes])


def plot_sweep(path, title, panels, hline=None):
    """One row per panel: busbw and time against size (log2 x), or a bar chart of times.

    panels: [{"title", "curves": {label: [(bytes, busbw_GBps, time_us)]}}
             or {"title", "bars": {label: time_us}}]; hline: (label, GB/s) on every busbw plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(len(panels), 2, figsize=(13, 3.3 * len(panels)), squeeze=False)
    colors = {}
    for (ax_bw, ax_t), panel in zip(axes, panels):
        if "bars" in panel:
            ax_bw.axis("off")
            labels = list(panel["bars"])
            ax_t.bar(range(len(labels)), [panel["bars"][k] for k in labels], tick_label=labels)
            ax_t.set_ylabel("time (us)")
            ax_t.set_title(panel["title"])
            continue
        for label, pts in panel["curves"].items():
            pts = sorted(pts)
            x = [p[0] for p in pts]
            (line,) = ax_bw.plot(x, [p[1] for p in pts], marker=".", label=label,
                                 color=colors.get(label))
            colors[label] = line.get_color()
            ax_t.plot(x, [p[2] for p in pts], marker=".", label=label, color=colors[label])
        if hline:
            ax_bw.axhline(hline[1], ls=":", color="gray", label=hline[0])
        for ax in (ax_bw, ax_t):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_size(int(v))))
            ax.set_xlabel("size (bytes)")
            ax.grid(True, which="both", alpha=0.3)
        ax_t.set_yscale("log")
        ax_bw.set_ylabel("busbw (GB/s)")
        ax_t.set_ylabel("time (us)")
        ax_bw.set_title(f"{panel['title']}: bus bandwidth")
        ax_t.set_title(f"{panel['title']}: time per op")
        ax_bw.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=90)
    plt.close(fig)

"""Multi-process harness for braid's Python tests.

A World(n) spawns n worker processes once; each initializes the default group
with the backend under test (BRAID_TEST_BACKEND, default "braid") and a gloo
group over the same ranks as reference, then serves calls: the test sends a
module-level function plus arguments to every rank and gets back each rank's
return value, or its exception (type, message, traceback). Every call has a
hard deadline; a world that misses it is killed and the test fails with the
per-rank state and the stacks of the ranks that did not answer.

Note [Why worlds are pooled]
`import torch, torch.distributed` costs ~2.3 s of CPU per process and the test
machine has 2 cores, so a spawn per case would dominate the run. Worlds are
cached per (size, tag) by WorldPool (conftest.py) and conftest orders the tests
so that each world is spawned once per session. A world in which a call failed
unexpectedly is discarded, because its ranks may no longer be in step.

Worker-side functions take a Ctx as their first argument (rank, size, the
group under test, the gloo reference group, a per-world cache). Results travel
as plain pickles over pipes (no shared-memory tensor passing, which would
leave /dev/shm entries behind).
"""

import datetime
import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

BACKEND = os.environ.get("BRAID_TEST_BACKEND", "braid")
CALL_TIMEOUT = float(os.environ.get("BRAID_TEST_CALL_TIMEOUT", "60"))
# The group timeout is shorter than the call deadline, so a rank stuck in a
# collective normally reports an error before the harness has to kill it.
PG_TIMEOUT = float(os.environ.get("BRAID_TEST_PG_TIMEOUT", "30"))
# "spawn" by default; "forkserver" starts worlds far faster (see World.__init__).
START_METHOD = os.environ.get("BRAID_TEST_START_METHOD", "spawn")
START_TIMEOUT = float(os.environ.get("BRAID_TEST_START_TIMEOUT", "180"))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON_DIR = os.path.join(REPO, "python")
# The test-only braid_sim package (the simulated CUDA device; built by tools/setup.sh).
SIM_DIR = os.path.join(REPO, "tests", "sim", "python")


# Functions returning lines for the session summary (conftest.py prints them).
SUMMARIES = []


def tcp_store(*args, **kwargs):
    """dist.TCPStore without libuv where torch has the option: Debian's torch
    2.x is built without libuv but defaults use_libuv=True (USE_LIBUV=0 only
    reaches init_process_group's rendezvous)."""
    import torch.distributed as dist
    try:
        return dist.TCPStore(*args, use_libuv=False, **kwargs)
    except TypeError:  # torch 1.x has no use_libuv
        return dist.TCPStore(*args, **kwargs)


def torch_lacks_libuv():
    """Whether this torch has a use_libuv option but cannot start a libuv TCPStore server
    (Debian's torch 2.6 and 2.14). The tests' own probe, apart from tools/torchrun.py's."""
    import torch.distributed as dist
    try:
        dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
    except TypeError:
        return False  # torch 1.x: no libuv option
    except RuntimeError as e:
        if "libuv" in str(e):
            return True
        raise
    return False


def torchrun_env(**extra):
    """The environment of a torchrun launch in a test: this one's, with python/ on
    PYTHONPATH, `extra` added, and USE_LIBUV removed, as on a machine where nobody set it:
    tools/torchrun.py must set it where this torch needs it (Note [torchrun without libuv]
    in tools/torchrun.py), for itself and for the workers. tools/torch2_root.sh sets it in
    the torch 2.x roots, which would hide a launcher that does not."""
    env = {k: v for k, v in os.environ.items() if k != "USE_LIBUV"}
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", "")
    env.update(extra)
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command():
    """argv that starts torchrun through tools/torchrun.py (which fixes what it can of
    torchrun on Debian's torches: read it)."""
    import torch

    args = [sys.executable, os.path.join(REPO, "tools", "torchrun.py")]
    # torch 1.13's torchrun under Python 3.11 crashes parsing its default
    # `--redirects 0` (see tools/torchrun); redirect-and-tee avoids that path.
    if torch.__version__.startswith("1.") and sys.version_info >= (3, 11):
        args += ["--redirects", "1", "--tee", "1"]
    return args


def run_session(cmd, timeout, what, **popen_kwargs):
    """Runs cmd in a session of its own and returns (exit code, stdout and stderr). When it
    outlives `timeout` seconds, the whole session (a launcher and its workers, ours alone) is
    killed and the test fails with the end of its output."""
    import pytest

    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **popen_kwargs)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{what} did not finish within {timeout:.0f} s:\n{out[-6000:]}")
    return proc.returncode, out


def torch_major():
    import torch

    return int(torch.__version__.split(".")[0])


# ----------------------------------------------------------------------------
# Leak probes (usable in the parent and in workers)


def shm_entries(prefix="braid"):
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}
    except FileNotFoundError:
        return set()


_SEGMENT_RE = re.compile(r"^braid\.([^.]+)\.(\d+)\.")


def leaked_segments(before, after, pids):
    """Entries that appeared between two listings and belong to `pids`.

    braid names segments braid.<pidns>.<pid>.<random> (csrc/transport/shm/
    segment.h, Note [Segment lifetime]); other engineers' tests run on the same
    machine, so a name with another pid is not ours. A name that does not
    follow the pattern is counted, to stay on the safe side.
    """
    new = sorted(set(after) - set(before))
    ours = []
    for name in new:
        m = _SEGMENT_RE.match(name)
        if m is None or int(m.group(2)) in pids:
            ours.append(name)
    return ours


def orphaned_segments(before):
    """New braid entries whose creator has exited (for runs whose pids we do not know)."""
    orphans = []
    for name in sorted(shm_entries() - set(before)):
        m = _SEGMENT_RE.match(name)
        if m is None or not os.path.exists(f"/proc/{m.group(2)}"):
            orphans.append(name)
    return orphans


def timeout_bound(timeout):
    """The latest (seconds) an op with a timeout of `timeout` seconds may end when it must end
    by timing out: timeout + max(2 s, 2 x timeout), room for a loaded 2-core machine (Note
    [Timing bounds in tests] in tests/cpp/timing.h)."""
    return timeout + max(2.0, 2.0 * timeout)


def early_bound(timeout):
    """The latest (seconds) an op with a timeout of `timeout` seconds may end when it must end
    early (an abort, a dead peer), not at its deadline: half the timeout (Note [Timing bounds
    in tests] in tests/cpp/timing.h)."""
    return timeout / 2


def timed_allreduce(ctx, t=None, group=None):
    """(error message or "no error", seconds) of one allreduce of `t` (default: 4 ones) on
    `group` (default: the default group), on a worker; a CUDA tensor is read back, so that an
    error of the op's stream counts too."""
    t0 = time.monotonic()
    try:
        t = ctx.torch.ones(4) if t is None else t
        ctx.dist.all_reduce(t, group=group)
        if t.device.type != "cpu":
            t.cpu()
        return ("no error", time.monotonic() - t0)
    except RuntimeError as e:
        return (str(e), time.monotonic() - t0)


def braid_threads():
    """Names of this process's threads that braid started (common/thread_name.h).

    Counting only these keeps leak checks exact: torch starts threads of its
    own lazily (newer releases more of them), which are not braid's to join.
    """
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue  # the thread ended while we looked
        if name.startswith("braid-"):
            names.append(name)
    return sorted(names)


def torch_scratch(name):
    """Whether a file in TMPDIR is torch's own scratch, not a braid leftover.

    torch 2.x's inductor keeps a compile cache in TMPDIR/torchinductor_<user>.
    """
    return name.startswith("torchinductor_")


# ----------------------------------------------------------------------------
# Worker side


class Ctx:
    """What a worker-side function gets as its first argument."""

    def __init__(self, rank, size, cfg, ref, pids):
        import torch
        import torch.distributed as dist

        self.rank = rank
        self.size = size
        self.backend = cfg["backend"]
        self.ref = ref  # gloo group over all ranks (None when the world has no group)
        self.cache = {}  # survives between calls; e.g. subgroups
        self.pids = pids  # every rank's pid
        self.timeout = datetime.timedelta(seconds=cfg["pg_timeout"])  # for groups made in tests
        self.port = cfg["port"]  # the parent's TCPStore
        self.torch = torch
        self.dist = dist
        self.torch2 = int(torch.__version__.split(".")[0]) >= 2

    @property
    def is_braid(self):
        return self.backend == "braid"

    def store(self, prefix):
        """A client of the parent's store, under `prefix` (fresh keys for each init)."""
        client = tcp_store("127.0.0.1", self.port, self.size, False,
                                    datetime.timedelta(seconds=START_TIMEOUT))
        return self.dist.PrefixStore(prefix, client)

    def init_default_group(self, prefix):
        """init_process_group on this world's backend, through a fresh store under `prefix`."""
        self.dist.init_process_group(self.backend, store=self.store(prefix), rank=self.rank,
                                     world_size=self.size, timeout=self.timeout)

    def backend_object(self, group=None):
        """The backend itself: on torch 2.x the ProcessGroup is a dispatcher."""
        from torch.distributed import distributed_c10d as c10d

        pg = group if group is not None else c10d._get_default_group()
        if self.torch2 and hasattr(pg, "_get_backend"):
            return pg._get_backend(self.torch.device("cpu"))
        return pg


def import_backend(backend):
    if backend == "braid":
        import torch_braid  # noqa: F401  registers the "braid" backend


def _send(conn, obj):
    try:
        data = pickle.dumps(obj)
    except Exception as e:  # an unpicklable return value must not kill the worker
        data = pickle.dumps(("err", "PicklingError", f"result not picklable: {e!r}", ""))
    conn.send_bytes(data)


def _worker(rank, n, cfg, conn):
    os.environ.update(cfg["env"])
    os.environ.update(cfg["rank_env"].get(rank, {}))
    for d in (SIM_DIR, PYTHON_DIR):  # the in-tree builds of torch_braid and braid_sim
        if d not in sys.path:
            sys.path.insert(0, d)
    trace = open(os.path.join(cfg["dir"], f"stack.{rank}"), "w")
    faulthandler.register(signal.SIGUSR1, file=trace, all_threads=True)
    faulthandler.enable(file=trace, all_threads=True)  # fatal signals leave a stack too
    ref = None
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        import_backend(cfg["backend"])
        if cfg["init"]:
            timeout = datetime.timedelta(seconds=cfg["pg_timeout"])
            store = tcp_store("127.0.0.1", cfg["port"], n, False,
                                  datetime.timedelta(seconds=START_TIMEOUT))
            # Ranks start seconds apart on a loaded machine; meet before init so
            # that a short group timeout (test_errors) only applies to the test.
            store.set(f"harness/arrived/{rank}", "1")
            store.wait([f"harness/arrived/{r}" for r in range(n)],
                       datetime.timedelta(seconds=START_TIMEOUT))
            dist.init_process_group(
                cfg["backend"], store=dist.PrefixStore("world", store), rank=rank,
                world_size=n, timeout=timeout)
            ref = dist.new_group(backend="gloo", timeout=timeout)
            del store
        if cfg["backend"] == "gloo" and os.environ.get("BRAID_TEST_EMULATE") == "1":
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "scripts"))
            import gloo_emulation

            gloo_emulation.install()
    except BaseException as e:
        _send(conn, ("init_error", type(e).__name__, str(e), traceback.format_exc()))
        return
    _send(conn, ("ready", os.getpid()))
    pids = conn.recv()
    ctx = Ctx(rank, n, cfg, ref, pids)
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):  # the parent is gone
            os._exit(3)
        t0 = time.monotonic()
        try:
            msg = pickle.loads(data)  # imports the test module on first use: may raise
            if msg[0] == "exit":
                break
            _, fn, args, kwargs = msg
            value = fn(ctx, *args, **kwargs)
            _send(conn, ("ok", value, time.monotonic() - t0))
        except BaseException as e:
            if ctx.backend != "braid" and lacks_support(e):
                # Developing against gloo: a case gloo lacks is skipped, not failed.
                _send(conn, ("skip", f"{ctx.backend} lacks this case: {e}"))
                continue
            _send(conn, ("err", type(e).__name__, str(e), traceback.format_exc(),
                         time.monotonic() - t0))
    try:
        ctx.cache.clear()
        del ref, ctx
        if dist.is_initialized():
            dist.destroy_process_group()
        _send(conn, ("bye",))
    except BaseException as e:
        _send(conn, ("exit_error", type(e).__name__, str(e), traceback.format_exc()))
        os._exit(4)
    if cfg["fast_exit"]:
        # A spawned child finalizes the interpreter on exit, which takes seconds
        # with torch loaded; pooled worlds skip that (their groups are destroyed).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


# ----------------------------------------------------------------------------
# Parent side


@dataclass
class Outcome:
    rank: int
    ok: bool = False
    value: Any = None
    exc_type: str = ""
    message: str = ""
    traceback: str = ""
    elapsed: float = 0.0
    exitcode: Optional[int] = None  # set when the worker exited during the call
    skipped: str = ""  # the backend under test lacks the case (gloo only)

    def describe(self):
        if self.exitcode is not None:
            return f"rank {self.rank}: exited with code {self.exitcode}"
        if self.ok:
            return f"rank {self.rank}: ok ({self.elapsed:.3f} s) -> {short(self.value)}"
        return f"rank {self.rank}: {self.exc_type}: {self.message}\n{indent(self.traceback)}"


class WorldError(AssertionError):
    """The world timed out, crashed or could not start; it has been killed."""


class RankFailure(AssertionError):
    """At least one rank raised; carries every rank's outcome."""

    def __init__(self, what, outcomes):
        self.outcomes = outcomes
        super().__init__(f"{what} failed:\n" + "\n".join(o.describe() for o in outcomes))


def short(v, limit=300):
    s = repr(v)
    return s if len(s) <= limit else s[:limit] + "..."


def indent(text, prefix="    "):
    return "".join(prefix + line for line in text.splitlines(True))


class World:
    """n worker processes with the backend under test initialized (see module doc)."""

    def __init__(self, n, backend=None, init=True, pg_timeout=PG_TIMEOUT, env=None,
                 rank_env=None, name="", fast_exit=False):
        import torch.distributed as dist

        self.n = n
        self.name = name or f"world{n}"
        self.backend = backend or BACKEND
        self.broken = False
        self.closed = False
        self.leaks: List[str] = []
        self.exit_errors: List[str] = []
        self.exitcodes: Dict[int, Optional[int]] = {}
        self._dir = tempfile.mkdtemp(prefix="braid-test-")
        self._shm_before = shm_entries()
        # The parent hosts the store: no port race, and it outlives any rank.
        self._store = tcp_store("127.0.0.1", 0, None, True,
                                    datetime.timedelta(seconds=START_TIMEOUT),
                                    wait_for_workers=False)
        port = self._store.port
        env = dict(env or {})
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONPATH", os.pathsep.join([PYTHON_DIR, SIM_DIR,
                                                     os.environ.get("PYTHONPATH", "")]))
        cfg = dict(backend=self.backend, init=init, port=port, pg_timeout=pg_timeout, env=env,
                   rank_env=rank_env or {}, dir=self._dir, fast_exit=fast_exit)
        mp = multiprocessing.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            # Children fork from a server that imported torch once (~0.05 s per rank
            # instead of ~2.3 s); the backend itself is imported in each child.
            mp.set_forkserver_preload(["torch", "torch.distributed"])
        self._conns = []
        self._procs = []
        for r in range(n):
            parent, child = mp.Pipe()
            p = mp.Process(target=_worker, args=(r, n, cfg, child), daemon=True,
                           name=f"{self.name}-rank{r}")
            p.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(p)
        self.pids = [p.pid for p in self._procs]
        replies = self._collect("start", START_TIMEOUT)
        bad = [o for o in replies if not o.ok]
        if bad:
            self.kill()
            raise WorldError(f"{self.name} ({self.backend}) failed to start:\n"
                             + "\n".join(o.describe() for o in replies))
        for c in self._conns:
            c.send(self.pids)

    # -- calls ---------------------------------------------------------------

    def run_outcomes(self, fn, *args, timeout=None, expect_errors=False, expect_exit=False,
                     **kwargs) -> List[Outcome]:
        """Runs fn(ctx, *args, **kwargs) on every rank; returns each rank's Outcome.

        A rank that raises marks the world broken (it is replaced before the
        next test) unless expect_errors. A rank that exits fails the call
        unless expect_exit; either way the world is then unusable.
        """
        assert not self.closed and not self.broken, f"{self.name} is no longer usable"
        data = pickle.dumps(("call", fn, args, kwargs))
        for c in self._conns:
            c.send_bytes(data)
        outcomes = self._collect(getattr(fn, "__name__", str(fn)), timeout or CALL_TIMEOUT,
                                 expect_exit=expect_exit)
        if any(o.exitcode is not None for o in outcomes):
            self.broken = True
        elif any(o.skipped for o in outcomes) and all(o.ok or o.skipped for o in outcomes):
            import pytest

            pytest.skip(next(o.skipped for o in outcomes if o.skipped))
        elif not expect_errors and not all(o.ok for o in outcomes):
            self.broken = True
        return outcomes

    def run(self, fn, *args, timeout=None, **kwargs) -> List[Any]:
        """Runs fn on every rank and returns the list of values, rank by rank."""
        outcomes = self.run_outcomes(fn, *args, timeout=timeout, **kwargs)
        if not all(o.ok for o in outcomes):
            raise RankFailure(f"{self.name}: {fn.__name__}", outcomes)
        return [o.value for o in outcomes]

    def _collect(self, what, timeout, expect_exit=False, ranks=None):
        deadline = time.monotonic() + timeout
        outcomes = [Outcome(rank=r) for r in range(self.n)]
        pending = set(range(self.n) if ranks is None else ranks)
        by_conn = {id(c): r for r, c in enumerate(self._conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self._procs)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail_timeout(what, timeout, outcomes, pending)
            waitables = [self._conns[r] for r in pending]
            waitables += [self._procs[r].sentinel for r in pending]
            for obj in multiprocessing.connection.wait(waitables, timeout=left):
                r = by_sentinel[obj] if isinstance(obj, int) else by_conn[id(obj)]
                if r not in pending:
                    continue
                reply = None
                if self._conns[r].poll():  # a rank may answer and then exit
                    try:
                        reply = pickle.loads(self._conns[r].recv_bytes())
                    except (EOFError, OSError):
                        reply = None
                if reply is None:
                    self._procs[r].join(5)
                    outcomes[r].exitcode = self._procs[r].exitcode
                    pending.discard(r)
                    continue
                pending.discard(r)
                o = outcomes[r]
                if reply[0] == "skip":
                    o.skipped = reply[1]
                elif reply[0] in ("ok", "ready", "bye"):
                    o.ok = True
                    o.value = reply[1] if len(reply) > 1 else None
                    o.elapsed = reply[2] if len(reply) > 2 else 0.0
                else:
                    o.exc_type, o.message, o.traceback = reply[1], reply[2], reply[3]
                    o.elapsed = reply[4] if len(reply) > 4 else 0.0
        exited = [o for o in outcomes if o.exitcode is not None]
        if exited and not expect_exit:
            stacks = self._read_stacks([o.rank for o in exited])
            self.kill()
            raise WorldError(f"{self.name}: rank(s) {[o.rank for o in exited]} exited during "
                             f"{what}:\n" + "\n".join(
                                 o.describe() + ("\n" + indent(stacks[o.rank])
                                                 if stacks.get(o.rank) else "")
                                 for o in outcomes))
        return outcomes

    def _fail_timeout(self, what, timeout, outcomes, pending):
        stacks = self._dump_stacks(sorted(pending))
        states = []
        for o in outcomes:
            if o.rank in pending:
                states.append(f"rank {o.rank} (pid {self.pids[o.rank]}): no answer\n"
                              + indent(stacks.get(o.rank, "(no stack)")))
            else:
                states.append(o.describe())
        self.kill()
        raise WorldError(f"{self.name}: {what} did not finish within {timeout:.0f} s; world "
                         f"killed. Per-rank state:\n" + "\n".join(states))

    def _dump_stacks(self, ranks):
        for r in ranks:
            try:
                os.kill(self.pids[r], signal.SIGUSR1)
            except OSError:
                pass
        time.sleep(1.0)
        stacks = self._read_stacks(ranks)
        if os.environ.get("BRAID_TEST_NATIVE_STACKS") == "1" and shutil.which("gdb"):
            for r in ranks:  # C++ frames too (a deadlock in the backend shows there)
                try:
                    out = subprocess.run(
                        ["gdb", "-p", str(self.pids[r]), "-batch", "-ex", "thread apply all bt 30"],
                        capture_output=True, text=True, timeout=90).stdout
                except (OSError, subprocess.SubprocessError) as e:
                    out = f"gdb failed: {e}"
                frames = [ln for ln in out.splitlines() if ln.startswith(("Thread ", "#"))]
                stacks[r] = stacks.get(r, "") + "\nnative:\n" + "\n".join(frames)[-8000:]
        return stacks

    def _read_stacks(self, ranks):
        stacks = {}
        for r in ranks:
            try:
                with open(os.path.join(self._dir, f"stack.{r}")) as f:
                    stacks[r] = f.read()[-6000:]
            except OSError:
                pass
        return stacks

    # -- teardown ------------------------------------------------------------

    def close(self, timeout=30.0, graceful=None):
        """Asks the live ranks to destroy their groups and exit; kills the stragglers.

        graceful (default: unless the world is broken) runs that exit protocol;
        otherwise the ranks are killed at once. Returns {rank: exitcode}. Ranks
        whose teardown raised or hung are in self.exit_errors; braid shm entries
        left by our workers in self.leaks.
        """
        if self.closed:
            return self.exitcodes
        if graceful if graceful is not None else not self.broken:
            live = [r for r, p in enumerate(self._procs) if p.is_alive()]
            for r in live:
                try:
                    self._conns[r].send_bytes(pickle.dumps(("exit",)))
                except OSError:
                    pass
            try:
                for o in self._collect("close", timeout, expect_exit=True, ranks=live):
                    if o.rank in live and not o.ok and o.exitcode is None:
                        self.exit_errors.append(o.describe())
            except WorldError as e:  # _collect killed the world
                self.exit_errors.append(str(e))
            deadline = time.monotonic() + timeout
            for p in self._procs:
                p.join(max(0.1, deadline - time.monotonic()))
        self.kill()
        return self.exitcodes

    def kill(self):
        for p in self._procs:
            if p.is_alive():
                p.terminate()
        for p in self._procs:
            p.join(3)
            if p.is_alive():
                p.kill()
                p.join(3)
        self.exitcodes = {r: p.exitcode for r, p in enumerate(self._procs)}
        for c in self._conns:
            c.close()
        self.broken = True
        if not self.closed:
            self.closed = True
            self._store = None
            self.leaks = leaked_segments(self._shm_before, shm_entries(), set(self.pids))
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class WorldPool:
    """Caches live worlds by (size, tag); see Note [Why worlds are pooled]."""

    def __init__(self, max_alive=int(os.environ.get("BRAID_TEST_MAX_WORLDS", "2"))):
        self.max_alive = max_alive
        self.worlds: Dict[Any, World] = {}
        self.leaks: Dict[str, List[str]] = {}
        self.teardown_errors: Dict[str, List[str]] = {}  # destroy/exit failures
        self.spawns: List[str] = []  # "name (why)", for the session summary
        self.start_seconds = 0.0
        self.retired: Dict[Any, str] = {}  # key -> why its last world went

    def get(self, n, tag="", **kwargs) -> World:
        key = (n, tag)
        w = self.worlds.get(key)
        why = "first use"
        if w is not None and (w.broken or w.closed):
            self._retire(key)
            w, why = None, "replaces a broken one"
        elif key in self.retired:
            why = self.retired[key]
        if w is None:
            while len(self.worlds) >= self.max_alive:
                self._retire(next(iter(self.worlds)))
            kwargs.setdefault("fast_exit", True)
            t0 = time.monotonic()
            w = World(n, name=f"world{n}{('-' + tag) if tag else ''}", **kwargs)
            self.start_seconds += time.monotonic() - t0
            self.spawns.append(f"{w.name} ({why})")
            self.worlds[key] = w
        else:  # most recently used last
            self.worlds[key] = self.worlds.pop(key)
        return w

    def _retire(self, key):
        w = self.worlds.pop(key)
        self.retired[key] = "after a failure" if w.broken else "was evicted"
        graceful = not w.broken
        codes = w.close()
        if w.leaks:
            self.leaks[w.name] = w.leaks
        if graceful and (w.exit_errors or any(c != 0 for c in codes.values())):
            self.teardown_errors[w.name] = w.exit_errors or [f"exit codes {codes}"]

    def close_all(self):
        for key in list(self.worlds):
            self._retire(key)


# ----------------------------------------------------------------------------
# Checks made inside workers


class Checker:
    """Collects mismatches inside a worker; the parent asserts on the reports.

    Counting the checks lets the parent reject a test that compared nothing.
    """

    def __init__(self, ctx):
        self.rank = ctx.rank
        self.count = 0
        self.failures: List[str] = []

    def equal(self, what, got, expected):
        import torch

        self.count += 1
        if got.dtype != expected.dtype or got.shape != expected.shape:
            self.failures.append(f"rank {self.rank} {what}: got {got.dtype}{list(got.shape)}, "
                                 f"expected {expected.dtype}{list(expected.shape)}")
        elif not torch.equal(got, expected):
            diff = (got != expected).nonzero()
            i = tuple(diff[0].tolist())
            self.failures.append(f"rank {self.rank} {what}: {diff.shape[0]} of {got.numel()} "
                                 f"differ; first at {list(i)}: got {got[i].item()!r}, "
                                 f"expected {expected[i].item()!r}")

    def reduced(self, what, got, expected, op):
        """equal(), except that AVG may differ by an ulp (n * (1/n) vs division)."""
        import torch

        if op != "AVG" or not got.dtype.is_floating_point:
            return self.equal(what, got, expected)
        self.count += 1
        eps = torch.finfo(got.dtype).eps
        err = (got.double() - expected.double()).abs()
        bad = err > expected.double().abs() * eps + 1e-300
        if got.shape != expected.shape or bad.any():
            self.failures.append(f"rank {self.rank} {what}: {int(bad.sum())} elements beyond "
                                 f"1 ulp; max error {err.max().item() if err.numel() else 0}")

    def true(self, what, cond, detail=""):
        self.count += 1
        if not cond:
            self.failures.append(f"rank {self.rank} {what}: {detail}")

    def report(self):
        return {"count": self.count, "failures": self.failures}


def check_reports(reports):
    """Parent side: every rank's Checker.report() must be clean and non-empty."""
    failures = [f for rep in reports for f in rep["failures"]]
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:40])
    assert sum(rep["count"] for rep in reports) > 0, "the test compared nothing"


def lacks_support(exc):
    """gloo's errors for a dtype, op or collective it does not implement."""
    return isinstance(exc, (RuntimeError, ValueError)) and re.search(
        r"Invalid scalar type|does not support|no support|non-integral|not supported|"
        r"[Uu]nsupported", str(exc)) is not None


def gloo(fn):
    """Runs a reference call on the gloo group; False when gloo lacks the case.

    gloo rejects unsupported dtypes/ops before communicating, identically on
    every rank, so skipping here keeps the ranks in step.
    """
    try:
        fn()
        return True
    except (RuntimeError, ValueError) as e:
        if lacks_support(e):
            return False
        raise


# ----------------------------------------------------------------------------
# Inputs and closed forms (pure functions of (rank, count, dtype, op, salt), so
# every rank can rebuild every other rank's input and the expected result)

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32",
          "int64", "bool"]
FLOATS = ("float32", "float64", "float16", "bfloat16")
BASE_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
BITWISE = ("BAND", "BOR", "BXOR")


def ops_for(dtype_name, torch2=None):
    """The reduce ops that make sense for a dtype.

    AVG and PREMUL_SUM: floats, torch 2.x, braid only (gloo lacks both; they
    are checked against closed forms alone).
    """
    if dtype_name in FLOATS:
        ops = ["SUM", "PRODUCT", "MIN", "MAX"]
        if (torch2 if torch2 is not None else torch_major() >= 2) and BACKEND == "braid":
            ops += ["AVG", "PREMUL_SUM"]
        return ops
    return list(BASE_OPS)


def gloo_reference_ok(dtype, op="SUM"):
    """Whether gloo can serve as reference: it lacks AVG/PREMUL_SUM, and its bool
    semantics (where it has bool at all) need not be torch's logical ones."""
    import torch

    return dtype != torch.bool and op not in ("AVG", "PREMUL_SUM")


PREMUL_FACTOR = 0.5


def reduce_op(name):
    import torch.distributed as dist

    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(PREMUL_FACTOR)
    return getattr(dist.ReduceOp, name)


def _gen(*key):
    import torch

    g = torch.Generator()
    g.manual_seed(zlib.crc32(repr(key).encode()))  # hash() of str differs per process
    return g


# Random values are drawn for at most this many elements and then tiled: a
# prime period never lines up with power-of-two chunk and slot sizes, so a
# chunk landing at the wrong offset still shows.
PERIOD = 4099


def make_input(rank, count, dtype, op="SUM", salt=0):
    """Rank-dependent input whose reduction is exact in every dtype (small integers)."""
    v = _draw(rank, min(count, PERIOD), dtype, op, salt, count)
    return v.repeat(-(-count // PERIOD))[:count] if count > PERIOD else v


def _draw(rank, m, dtype, op, salt, count):
    import torch

    name = str(dtype).replace("torch.", "")
    g = _gen(salt, rank, count, DTYPES.index(name), BASE_OPS.index(op) if op in BASE_OPS else 7)

    def ints(lo, hi):
        return torch.randint(lo, hi, (m,), generator=g, dtype=torch.int64)

    if name == "bool":
        # AND-like ops get mostly-true inputs, OR-like mostly-false, so the result is not constant.
        if op in ("PRODUCT", "MIN", "BAND"):
            return ints(0, 8) != 0
        if op == "BXOR":
            return ints(0, 2) != 0
        return ints(0, 8) == 0
    unsigned = name == "uint8"
    if op in BITWISE:
        bits = ints(-2**62, 2**62) * 2 + ints(0, 2)
        sparse = bits & (ints(-2**62, 2**62) * 2) & (ints(-2**62, 2**62) * 2)  # ~1/8 of bits
        v = {"BAND": ~sparse, "BOR": sparse, "BXOR": bits}[op]
        return v.to(dtype)  # int64 -> narrower keeps the low bits
    if op == "PRODUCT":
        v = ints(1, 4) if unsigned else torch.tensor([-2, -1, 1, 2])[ints(0, 4)]
    elif op in ("MIN", "MAX"):
        v = ints(0, 101) if unsigned else ints(-50, 51)
    else:  # SUM, AVG, PREMUL_SUM
        v = ints(0, 13) if unsigned else ints(-6, 7)
    return v.to(dtype)


def closed_form(inputs, op, n=None):
    """The reduction of `inputs` (one tensor per rank) under `op`, in their dtype."""
    import torch

    n = n or len(inputs)
    dtype = inputs[0].dtype
    if dtype == torch.bool:
        fn = {"SUM": torch.logical_or, "MAX": torch.logical_or, "BOR": torch.logical_or,
              "PRODUCT": torch.logical_and, "MIN": torch.logical_and,
              "BAND": torch.logical_and, "BXOR": torch.logical_xor}[op]
    elif dtype.is_floating_point:
        acc = [x.double() for x in inputs]
        if op in ("SUM", "AVG", "PREMUL_SUM"):
            out = torch.stack(acc).sum(0) if acc[0].numel() else acc[0].clone()
            if op == "AVG":
                out = out / n
            if op == "PREMUL_SUM":
                out = out * PREMUL_FACTOR
            return out.to(dtype)
        fn = {"PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum}[op]
        out = acc[0]
        for x in acc[1:]:
            out = fn(out, x)
        return out.to(dtype)
    else:
        # Integer arithmetic wraps identically whatever the order of the ranks.
        fn = {"SUM": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
              "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
              "BXOR": torch.bitwise_xor}[op]
    out = inputs[0].clone()
    for x in inputs[1:]:
        out = fn(out, x)
    return out


def pattern(a, b, count, dtype, offset=0):
    """Data for movement collectives: identifies (a, b) and the index, exact in dtype."""
    import torch

    name = str(dtype).replace("torch.", "")
    modulus = {"bool": 2, "int8": 127, "uint8": 251, "bfloat16": 251, "float16": 2039}.get(
        name, 1000003)
    i = torch.arange(offset, offset + count, dtype=torch.int64)
    v = (a * 7919 + b * 104729 + i * 31 + 1) % modulus
    return (v % 2 == 1) if name == "bool" else v.to(dtype)


# ----------------------------------------------------------------------------
# pytest helpers


def sizes(fast=(1, 2, 3, 4, 5), slow=(6, 7, 8)):
    """World sizes as pytest params: `fast` in the default tier, `slow` marked slow."""
    import pytest

    return ([pytest.param(n, id=f"n{n}") for n in fast]
            + [pytest.param(n, id=f"n{n}", marks=pytest.mark.slow) for n in slow])


def machine_skip(why):
    """Skips a test that this machine cannot run, saying why; under CI (CI=true or
    BRAID_STRICT_SKIPS=1) fails it instead: CI's machine runs as root, with network
    namespaces and direct reads, so there the skip would hide a regression (Note [Expected
    skips] in tests/python/skips.py)."""
    import pytest
    import skips

    if skips.strict():
        pytest.fail(f"{why} (a skip that depends on the machine fails under CI=true or "
                    f"BRAID_STRICT_SKIPS=1)", pytrace=False)
    pytest.skip(why)


def simulated_cuda_only():
    """Skips a module or test where torch has CUDA: braid's simulated device stands in only
    where there is none (it refuses a CUDA build)."""
    import pytest
    import torch

    return pytest.mark.skipif(torch.version.cuda is not None,
                              reason="torch has CUDA: nothing to simulate")


def dtypes(fast=DTYPES, slow=()):
    import pytest

    return ([pytest.param(d, id=d) for d in fast]
            + [pytest.param(d, id=d, marks=pytest.mark.slow) for d in slow if d not in fast])

"""Simulated hosts (tools/hosts.py, Note [Simulated hosts]) and jobs that span them.

    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python/test_hosts.py

The helper itself: hostnames, /dev/shm per host, reachability, the tbf cap, teardown. Then
jobs across hosts: gloo and braid (2 hosts x 2 ranks, 3 hosts x 1 rank) through a TCPStore on
host 0, checked against closed forms and DDP's losses compared, and torchrun --nnodes=2 with the
c10d rendezvous, with gloo and with braid; ranks that finish first leave without failing the
others' last ops. Needs root; skipped with the reason where namespaces
cannot be made (a failure under CI: harness.machine_skip). The full matrix of braid's collectives against gloo's across hosts is
test_hosts_collectives.py.
"""

import json
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

import harness as H

sys.path.insert(0, os.path.join(H.REPO, "tools"))
import hosts as hosts_mod  # noqa: E402

# Under CI a machine without namespaces fails these (harness.machine_skip).
pytestmark = pytest.mark.machine(hosts_mod.unavailable())

RANK_SCRIPT = os.path.join(H.REPO, "tests", "python", "scripts", "hosts_rank.py")
LEAVE_SCRIPT = os.path.join(H.REPO, "tests", "python", "scripts", "hosts_leave_rank.py")
TORCHRUN_SCRIPT = os.path.join(H.REPO, "tests", "python", "scripts", "torchrun_allreduce.py")
JOB_TIMEOUT_S = 120
PORT = 29500  # free: nothing else listens in a run's own namespaces


def on(hosts, k, script, **kw):
    """Runs a Python snippet on host k; its stdout."""
    p = subprocess.run(hosts.cmd(k, [sys.executable, "-c", script]), capture_output=True,
                       text=True, timeout=60, **kw)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


# ---- the helper -----------------------------------------------------------------------------
def test_hostnames_and_shm_are_per_host(hosts2):
    put = "import socket; open('/dev/shm/braid-probe', 'w').write(socket.gethostname())"
    look = ("import os, socket; print(socket.gethostname(), "
            "sorted(n for n in os.listdir('/dev/shm') if n.startswith('braid-probe')))")
    on(hosts2, 0, put)
    assert on(hosts2, 0, look) == "braid-h0 ['braid-probe']"  # another process, same host
    assert on(hosts2, 1, look) == "braid-h1 []"
    assert "braid-probe" not in os.listdir("/dev/shm")  # nor the machine's own
    assert os.listdir(hosts2.shm(0)) == ["braid-probe"] and os.listdir(hosts2.shm(1)) == []
    # No host can reach another's tmpfs through the run's state directory either.
    assert on(hosts2, 1, f"import os; print(os.listdir({hosts2.state!r}))") == "[]"


def test_hosts_reach_each_other_and_nothing_else(hosts2):
    import socket

    listener = subprocess.Popen(hosts2.cmd(0, [sys.executable, "-c", (
        "import socket; s = socket.create_server(('0.0.0.0', 7000)); print('up', flush=True);"
        "c, a = s.accept(); print(a[0], c.recv(5).decode(), flush=True)")]),
        stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "up"
        outside = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True,
                                 text=True).stdout
        ours = [w.split("/")[0] for w in outside.split() if "/" in w and w[0].isdigit()]
        root = socket.create_server(("127.0.0.1", 0))  # the machine's loopback, not the host's
        targets = [(a, 7000) for a in ours if not a.startswith("127.")]
        targets.append(("127.0.0.1", root.getsockname()[1]))
        out = on(hosts2, 1, (
            "import socket, subprocess\n"
            f"socket.create_connection(({hosts2.addr(0)!r}, 7000), 5).sendall(b'hello')\n"
            f"for t in {targets!r}:\n"
            "    try:\n"
            "        socket.create_connection(tuple(t), 2); print('reached', t)\n"
            "    except OSError as e:\n"
            "        print('no', e.errno)\n"
            "print(subprocess.run(['ip', 'route'], capture_output=True, text=True).stdout)"))
        root.close()
        assert listener.wait(30) == 0
        assert listener.stdout.read().strip() == f"{hosts2.addr(1)} hello"
        hosts2.set_link(0, up=False)  # host 0 vanishes from the network
        gone = on(hosts2, 1, "import socket\ntry:\n    socket.create_connection("
                             f"({hosts2.addr(0)!r}, 7000), 1)\nexcept OSError as e:\n"
                             "    print(type(e).__name__)")
        assert gone in ("timeout", "TimeoutError", "OSError"), gone
    finally:
        listener.kill()
        listener.wait()
    assert "reached" not in out, out
    assert out.count("no ") == len(targets)
    assert "default" not in out and f"{hosts_mod.SUBNET}.0/24 dev eth0" in out


def test_link_cap_is_installed_and_holds():
    """The tbf qdisc is on both ends of each link, and a 4 MB transfer over a 0.1 Gbit/s
    link takes at least about the time the cap allows (a generous bound: 2x the cap; the link
    moves 11 to 14 Gbit/s uncapped). Only an upper bound on the rate: a busy machine is
    slower, never faster."""
    cap, nbytes = 0.1, 4 << 20
    h = hosts_mod.Hosts(2, link_gbit=cap)
    try:
        for ns, dev in ((h.ns(0), "eth0"), (h.bridge_ns, "port0"), (h.bridge_ns, "port1")):
            q = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev],
                               capture_output=True, text=True).stdout
            assert "tbf" in q and "rate 100Mbit" in q, (ns, dev, q)
        recv = subprocess.Popen(h.cmd(0, [sys.executable, "-c", (
            "import socket, time; s = socket.create_server(('0.0.0.0', 7001));"
            "print('up', flush=True); c, _ = s.accept(); n = len(c.recv(65536)); "
            "t0 = time.monotonic()\n"
            "while True:\n"
            "    b = c.recv(1 << 20)\n"
            "    if not b: break\n"
            "    n += len(b)\n"
            "print(n, time.monotonic() - t0)")]), stdout=subprocess.PIPE, text=True)
        assert recv.stdout.readline().strip() == "up"
        on(h, 1, f"import socket; c = socket.create_connection(({h.addr(0)!r}, 7001), 5); "
                 f"c.sendall(bytes({nbytes})); c.close()")
        n, seconds = recv.communicate(timeout=60)[0].split()
        assert int(n) == nbytes
        gbit = nbytes * 8 / float(seconds) / 1e9
        assert gbit < 2 * cap, f"{gbit:.3f} Gbit/s through a {cap} Gbit/s cap"
    finally:
        h.teardown()
    assert hosts_mod.leftovers(h.prefix) == []


def test_teardown_kills_and_removes_everything_and_is_idempotent():
    a, b = hosts_mod.Hosts(2), hosts_mod.Hosts(1)  # two runs at once: names do not collide
    assert a.prefix != b.prefix and a.addr(0) == b.addr(0)
    sleeper = subprocess.Popen(a.cmd(1, ["sleep", "300"]))
    deadline = time.monotonic() + 10
    while sleeper.pid not in a.pids(1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sleeper.pid in a.pids(1) and sleeper.pid not in a.pids(0) and sleeper.poll() is None
    a.teardown()
    a.teardown()
    assert sleeper.wait(10) == -signal.SIGKILL
    assert hosts_mod.leftovers(a.prefix) == []
    assert on(b, 0, "import socket; print(socket.gethostname())") == "braid-h0"  # unharmed
    b.teardown()
    assert hosts_mod.leftovers(b.prefix) == []
    p = subprocess.run([os.path.join(H.REPO, "tools", "hosts.sh"), "teardown", a.prefix],
                       capture_output=True, text=True, env=dict(os.environ,
                                                                BRAID_PYTHON=sys.executable))
    assert p.returncode == 0, p.stderr


# ---- jobs across hosts ----------------------------------------------------------------------
def run_ranks(hosts, world, args, script=RANK_SCRIPT, env=None, stderrs=None, store_addr=None):
    """`script` RANK WORLD STORE_ADDR PORT *args, rank r on host r * N // world (as
    benchmarks/collectives.py --hosts), with `env` added to ours; their JSON lines. Their
    stderr goes to the list `stderrs` when one is given."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}),
               PYTHONPATH=H.PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen(hosts.cmd(r * hosts.n // world, [
        sys.executable, script, str(r), str(world), store_addr or hosts.addr(0), str(PORT),
        *args]),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for r in range(world)]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            assert p.returncode == 0, f"rank exited with {p.returncode}:\n{err[-4000:]}"
            outs.append(json.loads(out.strip().splitlines()[-1]))
            if stderrs is not None:
                stderrs.append(err)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ranks did not finish within {JOB_TIMEOUT_S} s")
    finally:
        hosts.teardown()  # kills any rank still running
    return outs


def assert_same_losses(o):
    """DDP trains the same on both: five losses, equal to float32 rounding of the sums."""
    assert len(o["losses"]["braid"]) == len(o["losses"]["gloo"]) == 5, o["losses"]
    for got, want in zip(o["losses"]["braid"], o["losses"]["gloo"]):
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), o["losses"]


@pytest.mark.parametrize("nhosts,per_host", [(2, 2), (3, 1)], ids=["2x2", "3x1"])
def test_gloo_and_braid_across_hosts(nhosts, per_host):
    world = nhosts * per_host
    backends = ["gloo", "braid"] if H.BACKEND == "braid" else ["gloo"]
    h = hosts_mod.Hosts(nhosts)
    outs = run_ranks(h, world, [",".join(backends)])
    assert hosts_mod.leftovers(h.prefix) == []
    assert [o["host"] for o in outs] == [f"braid-h{r * nhosts // world}" for r in range(world)]
    for o in outs:
        assert o["results"]["gloo"] == "ok", o
        if "braid" not in backends:
            continue
        assert o["results"]["braid"] == "ok", o
        assert_same_losses(o)


@pytest.mark.braid_only
def test_init_method_tcp_across_hosts():
    """init_method="tcp://host0:port", as multi-node tutorials write it: braid's addresses go
    through the rendezvous's own store (the default group is braid's; a gloo group beside it
    trains the same model for comparison). USE_LIBUV=0: Debian's torch 2.x has no libuv."""
    h = hosts_mod.Hosts(2)
    outs = run_ranks(h, 4, ["braid,gloo"], env={"HOSTS_INIT": "tcp", "USE_LIBUV": "0"})
    assert hosts_mod.leftovers(h.prefix) == []
    for o in outs:
        assert o["results"] == {"braid": "ok", "gloo": "ok"}, o
        assert_same_losses(o)


@pytest.mark.braid_only
@pytest.mark.parametrize("setting,value", [
    ("BRAID_SOCKET_IFNAME", "eth"), ("BRAID_SOCKET_IFNAME", "=eth0"),
    ("BRAID_SOCKET_IFNAME", "wlan,eth0"), ("BRAID_SOCKET_IFNAME", "^lo,docker"),
    ("GLOO_SOCKET_IFNAME", "eth0")], ids=["prefix", "exact", "list", "exclusions", "gloos"])
def test_the_interface_setting_picks_each_hosts_own_address(setting, value):
    """Note [Choosing the interface]: NCCL's syntax for braid's setting, gloo's names when only
    gloo's is set. Each rank logs the address it listens on and the setting that chose it."""
    h = hosts_mod.Hosts(2)
    errs = []
    outs = run_ranks(h, 2, ["braid"], env={setting: value, "BRAID_LOG_LEVEL": "info"},
                     stderrs=errs)
    for r, (o, err) in enumerate(zip(outs, errs)):
        assert o["results"]["braid"] == "ok", o
        assert f"listening on {h.addr(r)}:" in err and f"({setting}='{value}')" in err, err[-2000:]


@pytest.mark.braid_only
@pytest.mark.parametrize("nhosts,per_host", [(2, 1), (2, 2)], ids=["2x1", "2x2"])
def test_a_store_named_by_a_hostname_that_is_loopback_at_home_still_connects(nhosts, per_host):
    """Note [A store on this host]: as Debian and Ubuntu write /etc/hosts, host 0's own name
    is 127.0.1.1 there, and the store is named by it (as torchrun's c10d rendezvous does). The
    ranks on host 0 listen on its outward address, not on loopback."""
    h = hosts_mod.Hosts(nhosts, own_name_loopback=True)
    errs = []
    world = nhosts * per_host
    outs = run_ranks(h, world, ["braid"], env={"BRAID_LOG_LEVEL": "info"}, stderrs=errs,
                     store_addr=h.hostname(0))
    for r, (o, err) in enumerate(zip(outs, errs)):
        assert o["results"]["braid"] == "ok", o
        assert f"listening on {h.addr(r * nhosts // world)}:" in err, err[-2000:]
        if r < per_host:
            assert "the store's host 'braid-h0' is this host (through 127.0.0.1)" in err, err


@pytest.mark.braid_only
def test_a_job_whose_store_has_an_ipv6_address_connects_over_ipv6():
    """Each rank listens on the address that routes to the store: IPv6 here, written
    [host]:port in the store and in the log."""
    h = hosts_mod.Hosts(2)
    errs = []
    outs = run_ranks(h, 2, ["braid"], env={"BRAID_LOG_LEVEL": "info"}, stderrs=errs,
                     store_addr=h.addr6(0))
    for r, (o, err) in enumerate(zip(outs, errs)):
        assert o["results"]["braid"] == "ok", o
        assert f"listening on [{h.addr6(r)}]:" in err, err[-2000:]


@pytest.mark.braid_only
def test_an_interface_that_matches_nothing_fails_init_naming_it():
    h = hosts_mod.Hosts(2)
    outs = run_ranks(h, 2, ["gloo,braid"], env={"BRAID_SOCKET_IFNAME": "wlan"})
    for r, o in enumerate(outs):
        assert o["results"]["gloo"] == "ok", o
        err = o["results"]["braid"]
        assert "BRAID_SOCKET_IFNAME='wlan' matches no interface" in err, err
        assert f"(rank {r})" in err and "lo, eth0" in err, err


@pytest.mark.braid_only
@pytest.mark.parametrize("nhosts,per_host", [(2, 1), (2, 2)], ids=["2x1", "2x2"])
def test_ranks_that_finish_first_leave_without_failing_the_others(nhosts, per_host):
    """Note [Leaving quietly] and Note [Messages that outlive their sender]: 12 rounds of a
    group that runs 30 small collectives and is destroyed at once. A rank that finished must
    not take its last messages with it: before, a slower rank's last op failed ("closed the
    connection", "it left: the group was shut down") in 5 of this test's 6 cases over 3 runs."""
    world = nhosts * per_host
    h = hosts_mod.Hosts(nhosts)
    outs = run_ranks(h, world, ["12", "30"], script=LEAVE_SCRIPT)
    assert hosts_mod.leftovers(h.prefix) == []
    for o in outs:
        assert o["error"] is None and o["rounds"] == 12, o


@pytest.mark.parametrize("backend,own_name_loopback", [
    ("gloo", False), pytest.param("braid", False, marks=pytest.mark.braid_only),
    pytest.param("braid", True, marks=pytest.mark.braid_only)],
    ids=["gloo", "braid", "braid-debian-hosts"])
def test_torchrun_two_nodes_with_c10d_rendezvous(tmp_path, backend, own_name_loopback):
    """torchrun --nnodes=2 --nproc_per_node=2: env:// init of `backend` over the rendezvous,
    then allreduce, broadcast and allgather checked against closed forms on every rank
    (scripts/torchrun_allreduce.py). braid-debian-hosts: each host's own name is 127.0.1.1
    there, as Debian and Ubuntu write /etc/hosts, and the workers get the master's hostname
    (Note [A store on this host]; gloo fails in that setup)."""
    import torch

    if backend == "gloo" and torch.__version__.startswith("2.6"):
        # Known and open: in a whole fast-tier run in a freshly made trixie root, the gloo
        # run's agents hung in the rendezvous (agent 1 in TCPStore::get) in 2 runs of 2;
        # the test alone, its file alone, and the torchrun files before it with it, pass.
        # braid's variants ran and passed in those same runs.
        pytest.skip("torch 2.6: the gloo anchor's two-node torchrun hangs in whole-suite runs "
                    "in a fresh trixie root (open)")
    h = hosts_mod.Hosts(2, own_name_loopback=own_name_loopback)
    cmd = [sys.executable, os.path.join(H.REPO, "tools", "torchrun.py")]
    if torch.__version__.startswith("1.") and sys.version_info >= (3, 11):
        cmd += ["--redirects", "1", "--tee", "1"]  # see tools/torchrun
    cmd += ["--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={h.hostname(0)}:29400", "--rdzv_id=hosts-test",
            "--monitor_interval=0.5", TORCHRUN_SCRIPT]
    env = H.torchrun_env(BRAID_TEST_BACKEND=backend, BRAID_TORCHRUN_OUT=str(tmp_path),
                         OMP_NUM_THREADS="1", BRAID_SECRET=secrets.token_hex(16))
    agents = [subprocess.Popen(h.cmd(k, cmd), env=env, cwd=H.REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for k in range(2)]
    outs = []
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        for a in agents:
            outs.append(a.communicate(timeout=max(1, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun did not finish within {JOB_TIMEOUT_S} s\n" + _agent_tails(agents))
    finally:
        h.teardown()
    for a, out in zip(agents, outs):
        assert a.returncode == 0, out[-6000:]
    got = {f: (tmp_path / f).read_text() for f in sorted(os.listdir(tmp_path))}
    libuv = "0" if H.torch_lacks_libuv() else "-"  # set by tools/torchrun.py where needed
    assert got == {f"rank{r}": f"ok {r} of 4, USE_LIBUV={libuv}" for r in range(4)}, (
        got, outs[0][-3000:])
    assert hosts_mod.leftovers(h.prefix) == []


def _agent_tails(agents):
    """What each agent printed, for a failure message: a run that timed out says where it was."""
    tails = []
    for k, a in enumerate(agents):
        a.kill()
        try:
            out = a.communicate(timeout=10)[0] or ""
        except subprocess.TimeoutExpired:  # a child still holds the pipe
            out = "(its output could not be read)"
        tails.append(f"--- agent {k} ---\n{out[-2500:]}")
    return "\n".join(tails)


# ---- benchmarks/collectives.py --hosts ------------------------------------------------------
def test_benchmark_places_ranks_on_hosts_and_reports_each_backend(tmp_path):
    """A tiny --hosts 2 sweep: both backends are timed, ranks on their hosts."""
    backends = ["braid", "gloo"] if H.BACKEND == "braid" else ["gloo"]
    js = tmp_path / "hosts.json"
    cmd = [sys.executable, os.path.join(H.REPO, "benchmarks", "collectives.py"), "--nprocs", "2",
           "--hosts", "2", "--link-gbit", "5", "--backends", ",".join(backends), "--ops",
           "allreduce", "--sizes", "4,64K", "--warmup", "1", "--min-iters", "2", "--rounds", "2",
           "--time-per-point", "0.01", "--settle-ms", "1", "--memcpy-bytes", "1M",
           "--no-progress", "--no-accuracy", "--timeout", "60", "--json", str(js)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        p.stdout, p.stderr = p.communicate(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        pytest.fail(f"the benchmark did not finish within {JOB_TIMEOUT_S} s")
    finally:
        # The launcher tears its hosts (prefix bh<its pid>) down itself: nothing may be left.
        left = hosts_mod._our_namespaces(f"bh{p.pid}") + [
            d for d in (os.listdir(hosts_mod.STATE_ROOT) if os.path.isdir(hosts_mod.STATE_ROOT)
                        else []) if d.startswith(f"bh{p.pid}-")]
        hosts_mod.teardown_stale()
    assert not left, left
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert "# hosts: braid-h0 x1, braid-h1 x1, links capped at 5.0 Gbit/s" in p.stdout
    report = json.loads(js.read_text())
    assert report["meta"]["hosts"] == ["braid-h0", "braid-h1"]
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:  # namespaces inherit it
        system = f.read().strip()
    assert report["meta"]["tcp_congestion"] == system
    assert f"; TCP congestion control {system}\n" in p.stdout
    res = {(r["backend"], r["bytes"]): r for r in report["runs"][0]["results"]}
    for size in (4, 65536):
        assert res[("gloo", size)]["status"] == "ok" and res[("gloo", size)]["time_us"] > 0
        if "braid" in backends:
            assert res[("braid", size)]["status"] == "ok", res[("braid", size)]
            assert res[("braid", size)]["time_us"] > 0


def test_a_terminated_owner_tears_down_and_a_killed_ones_leftovers_are_found():
    # SIGINT as in a terminal (KeyboardInterrupt), even when this run inherited it ignored
    # (a CI started in the background, or under nohup), which Python's children keep.
    code = (f"import signal, sys, time; sys.path.insert(0, {os.path.join(H.REPO, 'tools')!r}); "
            "signal.signal(signal.SIGINT, signal.default_int_handler); "
            "import hosts; h = hosts.Hosts(2); print(h.prefix, flush=True); time.sleep(60)")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        prefix = owner.stdout.readline().strip()
        assert hosts_mod.leftovers(prefix), "the hosts exist while their owner runs"
        owner.send_signal(sig)
        owner.wait(30)
        if sig == signal.SIGKILL:  # no chance to clean up: the next run's sweep does
            assert hosts_mod.leftovers(prefix)
            assert prefix in hosts_mod.teardown_stale()
        assert hosts_mod.leftovers(prefix) == [], sig

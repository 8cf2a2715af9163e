"""pytest configuration for braid's Python suites.

  fast tier:  /usr/bin/python3 -m pytest tests/python -m "not slow" -x -q
  slow tier:  /usr/bin/python3 -m pytest tests/python -m slow -q
(the slow tier adds world sizes 6-8, large element counts and the full dtype x
op product). Environment:
  BRAID_TEST_BACKEND=gloo     run the suites against gloo (default: braid; also --backend)
  BRAID_TEST_EMULATE=1        with gloo: emulate what gloo lacks (scripts/gloo_emulation.py),
                              to check the suites' closed forms without braid
  BRAID_TEST_START_METHOD     spawn (default) or forkserver (worlds start ~50x faster)
  BRAID_TEST_CALL_TIMEOUT     seconds per call before a world is killed (60)
  BRAID_TEST_NATIVE_STACKS=1  on such a timeout, add gdb's C++ stacks of the stuck ranks
  BRAID_TEST_PG_TIMEOUT       group timeout in pooled worlds (30)
  BRAID_TEST_MAX_WORLDS       pooled worlds alive at once (2; also --max-worlds)
  CI=true, BRAID_STRICT_SKIPS, BRAID_SKIPS_*: the skips against tests/skips/<leg>.txt
                              (skips.py; Note [Expected skips] in tests/python/skips.py)
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import skips  # noqa: E402

for _d in (harness.SIM_DIR, harness.PYTHON_DIR):
    if _d not in sys.path:
        sys.path.insert(0, _d)


def pytest_addoption(parser):
    group = parser.getgroup("braid")
    group.addoption("--backend", default=None,
                    help="backend under test (default: $BRAID_TEST_BACKEND or 'braid')")
    group.addoption("--max-worlds", type=int, default=None,
                    help="worlds kept alive at once (default: $BRAID_TEST_MAX_WORLDS or 2)")
    group.addoption("--slow-shard", default=os.environ.get("BRAID_TEST_SLOW_SHARD"),
                    help="K/N: of the slow tier, run only shard K of N (0 <= K < N; default: "
                         "$BRAID_TEST_SLOW_SHARD); see Note [Slow-tier shards]")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: slow tier (world sizes 6-8, large counts)")
    config.addinivalue_line("markers", "braid_only: checks braid's own behaviour or messages")
    config.addinivalue_line("markers", "machine(why): the machine cannot run the test when why "
                            "is not None: a skip, a failure under CI (harness.machine_skip)")
    backend = config.getoption("--backend")
    if backend:
        harness.BACKEND = backend
        os.environ["BRAID_TEST_BACKEND"] = backend
    if harness.BACKEND == "braid":
        try:
            import torch_braid  # noqa: F401
        except ImportError as e:
            raise pytest.UsageError(
                f"cannot import torch_braid ({e}). Build it with `/usr/bin/python3 setup.py "
                f"build_ext --inplace`, or run the suites against gloo with "
                f"BRAID_TEST_BACKEND=gloo.")
    config.pluginmanager.register(skips.SkipAccounting(config, harness.BACKEND), "braid-skips")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for m in item.iter_markers("machine"):
        if m.args and m.args[0]:
            harness.machine_skip(m.args[0])


def pytest_report_header(config):
    import torch

    return f"braid tests: backend under test = {harness.BACKEND}, torch {torch.__version__}"


def pytest_collection_modifyitems(config, items):
    """Groups the tests that use pooled worlds by world, so each is spawned once.

    See Note [Why worlds are pooled] in harness.py. Tests without a pooled world
    (lifecycle tests) keep their order and run first.
    """
    def key(item):
        cs = getattr(item, "callspec", None)
        if cs is None or "world" not in cs.params:
            return (0, 0, "")
        n, tag = _world_key(cs.params["world"])
        return (1, n, tag)

    items.sort(key=key)  # stable: file and definition order within a world

    shard = config.getoption("--slow-shard")
    if shard:
        k, n = _parse_shard(shard)
        keep, drop = [], []
        for item in items:
            (drop if "slow" in item.keywords and slow_shard_of(item.nodeid, n) != k
             else keep).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    for item in items:
        if "braid_only" in item.keywords and harness.BACKEND != "braid":
            item.add_marker(pytest.mark.skip(reason="checks braid-specific behaviour"))


# Note [Slow-tier shards]
# CI cannot afford the slow tier (about 1,350 cases) in every run, so it runs one
# shard of it: the slow cases whose shard_of(nodeid) is the number of commits on main
# modulo N (tests/run_all.sh prints which). A case's shard comes from a hash of its
# node id alone, so adding or removing other cases never moves it: every slow case
# runs within N landings. Shards hold about equal numbers of cases, each module's
# parametrizations spread over all of them, so their times come out about equal too
# (the note of issue 43 gives them).
def slow_shard_of(nodeid, n):
    import zlib

    return zlib.crc32(nodeid.encode()) % n


def _parse_shard(text):
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--slow-shard {text!r}: expected K/N, e.g. 2/6")
    if not (n > 0 and 0 <= k < n):
        raise pytest.UsageError(f"--slow-shard {text!r}: need 0 <= K < N")
    return k, n


def _world_key(param):
    if isinstance(param, tuple):
        return param[0], param[1]
    return param, ""


_POOLS = []


@pytest.fixture(scope="session")
def pool(request):
    max_worlds = request.config.getoption("--max-worlds")
    p = harness.WorldPool(**({"max_alive": max_worlds} if max_worlds else {}))
    _POOLS.append(p)
    yield p
    p.close_all()
    assert not p.leaks, f"/dev/shm entries left behind by braid workers: {p.leaks}"
    assert not p.teardown_errors, f"worlds that did not exit cleanly: {p.teardown_errors}"


def pytest_terminal_summary(terminalreporter):
    for lines in harness.SUMMARIES:
        for line in lines():
            terminalreporter.write_line(line)
    for p in _POOLS:
        terminalreporter.write_line(
            f"braid tests: {len(p.spawns)} pooled worlds started "
            f"({harness.START_METHOD}, {p.start_seconds:.1f} s): {', '.join(p.spawns)}")


@pytest.fixture
def world(request, pool):
    """A pooled World; parametrize indirectly with n or (n, tag)."""
    n, tag = _world_key(request.param)
    w = pool.get(n, tag)
    yield w
    if w.broken:  # the failing test is reported; retire the world now, not later
        pool._retire((n, tag))


@pytest.fixture
def torch2():
    return harness.torch_major() >= 2


@pytest.fixture
def require_torch2():
    if harness.torch_major() < 2:
        pytest.skip("needs torch 2.x")


@pytest.fixture
def hosts2():
    """Two simulated hosts (tools/hosts.py), torn down after the test, nothing left."""
    sys.path.insert(0, os.path.join(harness.REPO, "tools"))
    import hosts as hosts_mod

    h = hosts_mod.Hosts(2)
    yield h
    h.teardown()
    assert hosts_mod.leftovers(h.prefix) == []

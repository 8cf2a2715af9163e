"""`python -m torch_braid.info` prints the versions and every BRAID_ setting."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

import harness as H


def test_info_runs_and_lists_settings():
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([H.PYTHON_DIR, os.environ.get("PYTHONPATH", "")]))
    if H.BACKEND != "braid" and importlib.util.find_spec("torch_braid") is None:
        pytest.skip("torch_braid is not importable (backend under test is not braid)")
    proc = subprocess.run([sys.executable, "-m", "torch_braid.info"], env=env,
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, f"exit code {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert re.search(r"\bBRAID_[A-Z0-9_]+", out), f"no BRAID_ setting listed:\n{out}"
    assert "torch" in out and torch.__version__ in out, f"torch version missing:\n{out}"


@pytest.mark.parametrize("env,expect", [
    ({"BRAID_SOCKET_IFNAME": "lo"}, "  would listen on 127.0.0.1 (BRAID_SOCKET_IFNAME='lo')\n"),
    ({"GLOO_SOCKET_IFNAME": "lo"}, "  would listen on 127.0.0.1 (GLOO_SOCKET_IFNAME='lo')\n"),
    ({"BRAID_SOCKET_IFNAME": "no-such-if0"}, "  would listen on nothing: braid tcp init (rank 0): "
                                             "BRAID_SOCKET_IFNAME='no-such-if0' matches no"),
    ({"BRAID_TCP_CONGESTION": "reno"}, "  TCP congestion  reno (BRAID_TCP_CONGESTION); allowed: "),
], ids=["braid-ifname", "gloo-ifname", "no-such-interface", "congestion"])
def test_info_shows_what_a_group_across_hosts_would_use(env, expect):
    """The network section (Notes [Choosing the interface] and [Congestion control])."""
    if H.BACKEND != "braid" and importlib.util.find_spec("torch_braid") is None:
        pytest.skip("torch_braid is not importable (backend under test is not braid)")
    base = {k: v for k, v in os.environ.items()
            if k not in ("BRAID_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "BRAID_TCP_CONGESTION")}
    env = dict(base, **env,
               PYTHONPATH=os.pathsep.join([H.PYTHON_DIR, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "torch_braid.info"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit code {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert "Network (groups across hosts):\n  interfaces      lo 127.0.0.1 (loopback)" in proc.stdout
    assert expect in proc.stdout, proc.stdout[:2000]


def _header_version(include_dir):
    text = open(os.path.join(include_dir, "pybind11", "detail", "common.h")).read()
    parts = [re.search(rf"#define PYBIND11_VERSION_{p} (\S+)", text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def test_info_names_torchs_pybind11():
    """The module was built with the pybind11 torch ships, when it ships one
    (Note [One pybind11 per process]); either way info says which."""
    if importlib.util.find_spec("torch_braid") is None and H.BACKEND != "braid":
        pytest.skip("torch_braid is not importable")
    sys.path.insert(0, H.PYTHON_DIR)
    import torch_braid

    info = torch_braid.build_info()
    assert re.fullmatch(r"\d+\.\d+\.\S+", info["pybind11"]), info
    bundled = os.path.join(os.path.dirname(torch.__file__), "include")
    if os.path.exists(os.path.join(bundled, "pybind11", "detail", "common.h")):
        assert info["pybind11"] == _header_version(bundled), (info, bundled)
        assert os.path.realpath(info["pybind11_include"]) == os.path.realpath(bundled), info


def test_info_shows_the_cores_and_the_spin_policy():
    """The cores ranks here may count on (affinity, then the cgroup quota) and the automatic
    spin policy at one rank per core and at one rank more (Note [How long to spin])."""
    if H.BACKEND != "braid" and importlib.util.find_spec("torch_braid") is None:
        pytest.skip("torch_braid is not importable (backend under test is not braid)")
    env = dict(os.environ,
               PYTHONPATH=os.pathsep.join([H.PYTHON_DIR, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "torch_braid.info"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit code {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    m = re.search(r"^  cores           (\d+) \(affinity (\d+), ", proc.stdout, re.M)
    assert m, proc.stdout[:2000]
    cores, affinity = int(m.group(1)), int(m.group(2))
    assert 1 <= cores <= affinity == len(os.sched_getaffinity(0)), proc.stdout[:2000]
    assert f"{cores} rank(s) here on {cores} core(s)" in proc.stdout
    assert "every rank has a core; waits spin 1000 us" in proc.stdout, proc.stdout[:2000]
    assert "ranks outnumber the cores; waits spin 20 us" in proc.stdout, proc.stdout[:2000]


def test_settings_markdown_is_docs_settings_md():
    """docs/settings.md is the output of `python -m torch_braid.info --settings-markdown`, so the
    settings' documentation cannot drift from the registry the code declares them in."""
    if H.BACKEND != "braid" and importlib.util.find_spec("torch_braid") is None:
        pytest.skip("torch_braid is not importable (backend under test is not braid)")
    # Set values must not leak into the file: it lists defaults only.
    env = dict(os.environ, BRAID_LOG_LEVEL="debug",
               PYTHONPATH=os.pathsep.join([H.PYTHON_DIR, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "torch_braid.info", "--settings-markdown"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"exit code {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    with open(os.path.join(H.REPO, "docs", "settings.md")) as f:
        expected = f.read()
    assert proc.stdout == expected, (
        "docs/settings.md differs from the settings registry; regenerate it from the repository "
        "root with: PYTHONPATH=python /usr/bin/python3 -m torch_braid.info --settings-markdown "
        "> docs/settings.md")

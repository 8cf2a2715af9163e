"""Runs every examples/ddp_*.py under torchrun with two ranks on the backend
under test (BRAID_TEST_BACKEND) and checks its exit code and its "<name>: OK"
line. Each example asserts its own outcome (disjoint sampler shares, restored
weights, replicas in step, loss going down); a hang fails after TIMEOUT_S
and the whole torchrun process group is killed.
"""

import os
import signal
import socket
import subprocess
import sys

import pytest

import harness as H

EXAMPLES = ["ddp_sampler", "ddp_checkpoint", "ddp_submodules", "ddp_hook"]
TIMEOUT_S = float(os.environ.get("BRAID_EXAMPLE_TIMEOUT", "180"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REPO_TOOLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools")


def _torchrun_args():
    import torch

    args = [sys.executable, os.path.join(REPO_TOOLS, "torchrun.py")]  # see tools/torchrun.py
    # torch 1.13's torchrun under Python 3.11 crashes parsing its default
    # `--redirects 0` (see tools/torchrun); redirect-and-tee avoids that path.
    if torch.__version__.startswith("1.") and sys.version_info >= (3, 11):
        args += ["--redirects", "1", "--tee", "1"]
    return args


def _hooks_importable():
    try:
        import torch_braid.hooks  # noqa: F401
        return True
    except Exception:
        return False


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.skipif(bool(H.torchrun_unusable()), reason=str(H.torchrun_unusable()))
def test_example(name, tmp_path):
    if name == "ddp_hook" and not _hooks_importable():
        pytest.skip("torch_braid._C is not built")
    script = os.path.join(H.REPO, "examples", name + ".py")
    env = dict(os.environ)
    env["BRAID_EXAMPLE_BACKEND"] = H.BACKEND
    env["PYTHONPATH"] = H.PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    scratch = tmp_path / "tmp"  # the checkpoint example writes there, and must clean up
    scratch.mkdir()
    env["TMPDIR"] = str(scratch)
    cmd = _torchrun_args() + ["--log_dir", str(tmp_path / "logs"), "--nproc_per_node=2",
                              f"--master_port={_free_port()}", script]
    proc = subprocess.Popen(cmd, env=env, cwd=H.REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: our session only
        out, _ = proc.communicate()
        pytest.fail(f"{name} did not finish within {TIMEOUT_S:.0f} s:\n{out[-6000:]}")
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{out[-6000:]}"
    assert f"{name}: OK" in out, out[-6000:]
    left = [f for f in os.listdir(scratch) if not H.torch_scratch(f)]
    assert not left, f"the example left files behind: {left}"

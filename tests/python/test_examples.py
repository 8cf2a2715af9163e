"""Runs every examples/ddp_*.py under torchrun with two ranks on the backend
under test (BRAID_TEST_BACKEND) and checks its exit code and its "<name>: OK"
line. Each example asserts its own outcome (disjoint sampler shares, restored
weights, replicas in step, loss going down); a hang fails after TIMEOUT_S
and the whole torchrun process group is killed.
"""

import os

import pytest

import harness as H

EXAMPLES = ["ddp_sampler", "ddp_checkpoint", "ddp_submodules", "ddp_hook"]
TIMEOUT_S = float(os.environ.get("BRAID_EXAMPLE_TIMEOUT", "180"))


@pytest.mark.parametrize("name", EXAMPLES)
def test_example(name, tmp_path):
    script = os.path.join(H.REPO, "examples", name + ".py")
    env = H.torchrun_env(BRAID_EXAMPLE_BACKEND=H.BACKEND)  # without USE_LIBUV
    scratch = tmp_path / "tmp"  # the checkpoint example writes there, and must clean up
    scratch.mkdir()
    env["TMPDIR"] = str(scratch)
    cmd = H.torchrun_command() + ["--log_dir", str(tmp_path / "logs"), "--nproc_per_node=2",
                                  f"--master_port={H.free_port()}", script]
    rc, out = H.run_session(cmd, TIMEOUT_S, name, env=env, cwd=H.REPO)
    assert rc == 0, f"{name} exited with {rc}:\n{out[-6000:]}"
    assert f"{name}: OK" in out, out[-6000:]
    left = [f for f in os.listdir(scratch) if not H.torch_scratch(f)]
    assert not left, f"the example left files behind: {left}"

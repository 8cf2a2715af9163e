"""Injected device failures from Python (braid_sim.faults_install, Note [Injected device
failures] in tests/sim/device/faulty_device.h) and what they must not do: after a
sticky device error every free fails, and destroying the group or dropping a pinned
tensor must not terminate the process (Note [No exception out of teardown] in
csrc/cuda/teardown.h). Each case runs in a fresh interpreter: a terminate would end
pytest's too.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import harness as H

pytestmark = [pytest.mark.braid_only, H.simulated_cuda_only()]


def _run(body):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([H.SIM_DIR, H.PYTHON_DIR, env.get("PYTHONPATH", "")])
    script = textwrap.dedent("""
        import gc
        import torch
        import torch.distributed as dist
        import torch_braid  # noqa: F401
        import braid_sim

        braid_sim.install(2)
        braid_sim.faults_install()
        dist.init_process_group("braid", store=dist.HashStore(), rank=0, world_size=1)
        t = braid_sim.empty([1000], torch.float32, 0)
        braid_sim.write(t, torch.full([1000], 2.0))
        dist.all_reduce(t)
        assert torch.equal(braid_sim.read(t), torch.full([1000], 2.0))
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)


def test_injected_failure_names_the_call():
    p = _run("""
        braid_sim.inject_device_fault("memcpyAsync", every=True, code=2,
                                      name="cudaErrorMemoryAllocation", message="out of memory")
        try:
            dist.all_reduce(t)
        except Exception as e:
            print("ERROR:", e)
        print("failures", braid_sim.device_failures())
        braid_sim.clear_device_faults()
        dist.all_reduce(t)  # works again
        print("after clear", braid_sim.read(t)[0].item())
    """)
    assert p.returncode == 0, p.stderr
    assert "ERROR:" in p.stdout and "cudaErrorMemoryAllocation" in p.stdout, p.stdout
    assert "after clear 2.0" in p.stdout, p.stdout


def test_teardown_after_a_sticky_error_does_not_terminate():
    p = _run("""
        # The op's pinned blocks are back in the group's pool, freed with it.
        braid_sim.inject_device_fault("hostFree", sticky=True)
        dist.destroy_process_group()
        gc.collect()
        print("failures", braid_sim.device_failures())
    """)
    assert p.returncode == 0, f"rc={p.returncode}\n{p.stderr}"
    assert "terminate called" not in p.stderr, p.stderr
    failures = int(p.stdout.split("failures")[-1])
    assert failures > 0, (p.stdout, p.stderr)  # the teardown did reach a failing free

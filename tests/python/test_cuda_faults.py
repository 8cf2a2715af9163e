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


# Two ranks as threads of one process (the simulated NCCL meets its communicators
# in-process), on devices 0 and 1 so that NCCL serves the group (Note [Injected NCCL
# failures] in tests/sim/nccl/faulty_nccl.h), after one checked allreduce.
_NCCL_RANKS = """
    import datetime
    import os
    import threading
    import time

    import torch
    import torch_braid  # noqa: F401
    from torch_braid import _C
    import braid_sim

    os.environ["BRAID_CUDA_EXECUTOR"] = "nccl"
    braid_sim.install(2)
    braid_sim.nccl_faults_install()
    store = torch.distributed.HashStore()
    pgs = [None, None]
    errors = [None, None]
    took = [None, None]


    def ranks(body):
        def main(r):
            try:
                body(r)
            except BaseException as e:  # noqa: BLE001 - printed by the case
                errors[r] = e
        threads = [threading.Thread(target=main, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a rank hangs"


    def make(r):
        pgs[r] = _C.ProcessGroupBraid(store, r, 2, datetime.timedelta(seconds=2))


    def allreduce(r):
        t = braid_sim.empty([16], torch.float32, r)
        braid_sim.write(t, torch.full([16], float(r + 1)))
        pgs[r].allreduce([t]).wait()
        assert torch.equal(braid_sim.read(t), torch.full([16], 3.0))


    def shutdown(r):
        t0 = time.monotonic()
        pgs[r].shutdown()
        took[r] = time.monotonic() - t0


    ranks(make)
    ranks(allreduce)
    assert errors == [None, None], errors
    assert pgs[0]._cuda_executor().startswith("nccl"), pgs[0]._cuda_executor()
"""


def test_injected_nccl_failure_fails_the_op():
    p = _run_nccl("""
        braid_sim.inject_nccl_fault("allReduce", every=True)
        ranks(allreduce)
        print("ERRORS:", [str(e) for e in errors])
        ranks(shutdown)
    """)
    assert p.returncode == 0, p.stderr
    assert "ncclSystemError" in p.stdout and "injected: a NIC went away" in p.stdout, p.stdout


def test_communicators_are_finalized_then_destroyed():
    p = _run_nccl("""
        ranks(shutdown)
        print("TEARDOWN:", braid_sim.nccl_teardown())
    """)
    assert p.returncode == 0, p.stderr
    calls = eval(p.stdout.split("TEARDOWN:")[1])
    assert sorted(calls) == ["commDestroy"] * 2 + ["commFinalize"] * 2, calls
    assert calls.index("commFinalize") < calls.index("commDestroy"), calls


def test_a_finalize_that_never_completes_is_aborted_at_the_bound():
    p = _run_nccl("""
        braid_sim.nccl_hang_finalize()
        ranks(shutdown)
        print("TEARDOWN:", braid_sim.nccl_teardown())
        print("TOOK:", took)
    """)
    assert p.returncode == 0, p.stderr
    calls = eval(p.stdout.split("TEARDOWN:")[1].split("TOOK:")[0])
    took = eval(p.stdout.split("TOOK:")[1])
    assert sorted(calls) == ["commAbort"] * 2 + ["commFinalize"] * 2, calls
    # The group's timeout (2 s) bounds the finalize (H.timeout_bound: Note [Timing
    # bounds in tests] in tests/cpp/timing.h).
    for t in took:
        assert 2.0 <= t <= H.timeout_bound(2.0), took


def _run_nccl(body):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([H.SIM_DIR, H.PYTHON_DIR, env.get("PYTHONPATH", "")])
    script = textwrap.dedent(_NCCL_RANKS) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)


def test_wait_with_a_timeout_on_the_nccl_path_raises_after_it():
    # Note [wait(timeout) on the NCCL path] in csrc/c10d/work.cc: rank 1 joins the
    # allreduce 1 s late; rank 0's wait(timeout=200 ms) raises after 200 ms naming the
    # op, the rank and the timeout, and a plain wait() afterwards sees the op complete.
    p = _run_nccl("""
        def late(r):
            t = braid_sim.empty([16], torch.float32, r)
            braid_sim.write(t, torch.full([16], float(r + 1)))
            if r == 1:
                time.sleep(1.0)
            w = pgs[r].allreduce([t])
            if r == 0:
                t0 = time.monotonic()
                try:
                    w.wait(datetime.timedelta(milliseconds=200))
                    print("NO ERROR")
                except Exception as e:
                    print("WAITED:", time.monotonic() - t0)
                    print("ERROR:", type(e).__name__, e)
            assert w.wait(datetime.timedelta(seconds=10))  # completes on the host now
            assert w.is_completed()
            assert torch.equal(braid_sim.read(t), torch.full([16], 3.0))
        ranks(late)
        print("ERRORS:", [str(e) for e in errors])
        ranks(shutdown)
    """)
    assert p.returncode == 0, p.stderr
    assert "NO ERROR" not in p.stdout, p.stdout
    err = p.stdout.split("ERROR:")[1].splitlines()[0]
    assert "allreduce" in err and "rank 0" in err and "timeout=200 ms" in err, p.stdout
    waited = float(p.stdout.split("WAITED:")[1].splitlines()[0])
    assert 0.2 <= waited <= H.timeout_bound(0.2), p.stdout
    assert "ERRORS: ['None', 'None']" in p.stdout, p.stdout


def test_nccl_path_future_callbacks_run_on_the_callers_thread():
    # Note [The NCCL path's Future] in csrc/c10d/work.cc: rank 1 joins 0.5 s late, so the op
    # is still on the device when rank 0 adds its callback; the callback runs on rank 0's
    # own thread (the Future completed at launch), never on the NCCL watchdog, and its
    # value is the op's result once read on the caller's stream.
    p = _run_nccl("""
        seen = {}

        def late(r):
            t = braid_sim.empty([16], torch.float32, r)
            braid_sim.write(t, torch.full([16], float(r + 1)))
            if r == 1:
                time.sleep(0.5)
            w = pgs[r].allreduce([t])
            if r == 0:
                fut = w.get_future()
                seen["caller"] = threading.get_ident()
                def cb(f):
                    seen["callback"] = threading.get_ident()
                    return f.value()
                fut.then(cb).wait()
            assert w.wait(datetime.timedelta(seconds=10))
            assert torch.equal(braid_sim.read(t), torch.full([16], 3.0))
        ranks(late)
        print("ERRORS:", [str(e) for e in errors])
        print("SAME THREAD:", seen.get("callback") == seen["caller"])
        ranks(shutdown)
    """)
    assert p.returncode == 0, p.stderr
    assert "ERRORS: ['None', 'None']" in p.stdout, p.stdout
    assert "SAME THREAD: True" in p.stdout, p.stdout

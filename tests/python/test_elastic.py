"""Elastic restart: torchrun --max_restarts=2 with a worker killed mid-training.

scripts/elastic_train.py trains a small DDP model on braid (2 ranks) for 30
steps, checkpointing every 5. The test runs it twice through tools/torchrun:
once as is, once with rank 1 killing itself (SIGKILL) at step 17 of the first
attempt. The second run must restart once, resume from the step-15
checkpoint, and end with the same losses as the first: data and weights are
the same after resume and braid's reductions are deterministic, so every
step's loss must agree to float rounding (they are in fact bit-identical; the
tolerance, 1e-6 relative, only absorbs an accumulation order change should
DDP's bucketing ever differ between attempts).
"""

import json
import os

import pytest

import harness as H

SCRIPT = os.path.join(H.REPO, "tests", "python", "scripts", "elastic_train.py")
TIMEOUT_S = 180
STEPS, CKPT_EVERY, KILL_STEP = 30, 5, 17


def _train(tmp_path, name, kill_step):
    """Runs the script under torchrun; returns (result.json, torchrun's output, run dir)."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    cmd = H.torchrun_command()
    # torch 1.13 spells the options with underscores only; 2.x accepts both.
    cmd += ["--standalone", "--nproc_per_node=2", "--max_restarts=2", "--monitor_interval=0.5",
            "--log_dir", str(tmp_path / f"logs-{name}"), f"--master_port={H.free_port()}",
            SCRIPT, "--dir", str(run_dir), "--steps", str(STEPS),
            "--ckpt-every", str(CKPT_EVERY), "--kill-step", str(kill_step)]
    env = H.torchrun_env(BRAID_TEST_BACKEND=H.BACKEND)  # without USE_LIBUV
    rc, out = H.run_session(cmd, TIMEOUT_S, f"{name}: torchrun", env=env, cwd=H.REPO)
    assert rc == 0, f"{name}: torchrun exited with {rc}:\n{out[-6000:]}"
    with open(run_dir / "result.json") as f:
        return json.load(f), out, run_dir


def test_killed_worker_resumes_from_checkpoint(tmp_path):
    shm_before = H.shm_entries()
    clean, clean_out, _ = _train(tmp_path, "clean", kill_step=-1)
    faulty, faulty_out, faulty_dir = _train(tmp_path, "faulty", kill_step=KILL_STEP)

    assert clean["attempt"] == 0 and clean["started_at"] == 0, clean
    assert "attempt 1" not in clean_out, clean_out[-3000:]

    # The fault happened, torchrun restarted the workers once, and they resumed
    # from the last checkpoint before the kill.
    assert (faulty_dir / "killed").exists(), faulty_out[-3000:]
    resumed = KILL_STEP // CKPT_EVERY * CKPT_EVERY
    assert faulty["attempt"] == 1, faulty_out[-3000:]
    assert faulty["started_at"] == resumed, (faulty, faulty_out[-3000:])
    for r in (0, 1):
        assert f"rank {r}: attempt 1 starts at step {resumed}" in faulty_out, faulty_out[-3000:]

    assert len(clean["losses"]) == len(faulty["losses"]) == STEPS
    worst = max(abs(a - b) / max(abs(a), 1e-12)
                for a, b in zip(clean["losses"], faulty["losses"]))
    assert worst <= 1e-6, (f"losses differ by up to {worst:.3g} relative:\n"
                           f"clean  {clean['losses']}\nfaulty {faulty['losses']}")
    first, last = clean["losses"][:5], clean["losses"][-5:]
    assert sum(last) < 0.5 * sum(first), f"training did not learn: {clean['losses']}"
    print(f"final loss: clean {clean['losses'][-1]!r}, with a kill at step {KILL_STEP} "
          f"{faulty['losses'][-1]!r} (max relative difference over all steps {worst:.3g})")

    left = sorted(os.listdir(faulty_dir))
    assert left == ["checkpoint.pt", "killed", "result.json"], left  # no half-written files
    assert not H.orphaned_segments(shm_before), H.orphaned_segments(shm_before)

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

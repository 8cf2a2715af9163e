"""Soak: random ops over 4 ranks, results against closed forms, resources flat.

scripts/soak.py does the work (see its Notes); here a short run in the fast
tier and the long one (10,000 ops, growth measured from op 1000) in the slow
tier. On demand: /usr/bin/python3 tests/python/scripts/soak.py --ops 10000.
"""

import os
import sys

import pytest

import harness as H

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts"))
import soak  # noqa: E402


def _soak(ops, warmup, every, seed):
    reports, leaks, codes = soak.run(ops, seed=seed, warmup=warmup, every=every,
                                     name=f"soak{ops}")
    print("\n" + soak.summarize(reports))
    H.check_reports(reports)
    assert all(rep["count"] > ops // 4 for rep in reports), "a rank checked too little"
    bad = soak.violations(reports, max_growth=0.01)
    assert not bad, "resources grew:\n" + "\n".join(bad) + "\n" + soak.summarize(reports)
    assert not leaks, f"/dev/shm entries left behind: {leaks}"
    assert set(codes.values()) == {0}, f"exit codes {codes}"


@pytest.mark.braid_only
def test_soak_short():
    _soak(ops=1500, warmup=500, every=500, seed=2024)


@pytest.mark.slow
@pytest.mark.braid_only
def test_soak_long():
    _soak(ops=10000, warmup=1000, every=1000, seed=1234)

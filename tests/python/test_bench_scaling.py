"""benchmarks/scaling.py: the job order, the targets' arithmetic, and one tiny 2-rank sweep.

    /usr/bin/python3 -m pytest -q tests/python/test_bench_scaling.py
"""

import json
import os
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "scaling.py")
sys.path.insert(0, os.path.dirname(BENCH))

import scaling as sc  # noqa: E402
from test_bench_collectives import braid_available  # noqa: E402


def test_jobs_alternate_backends_and_repeat_as_the_outer_loop():
    args = sc.parse_args(["--nprocs", "2,4", "--repeats", "2", "--coresident-at", "4"])
    assert sc.plan_jobs(args) == [
        (0, 2, "alone", "braid"), (0, 2, "alone", "gloo"),
        (0, 4, "alone", "gloo"), (0, 4, "alone", "braid"), (0, 4, "coresident", "braid,gloo"),
        (1, 2, "alone", "gloo"), (1, 2, "alone", "braid"),
        (1, 4, "alone", "braid"), (1, 4, "alone", "gloo"), (1, 4, "coresident", "braid,gloo")]
    with pytest.raises(SystemExit):
        sc.parse_args(["--nprocs", "2", "--coresident-at", "8"])
    with pytest.raises(SystemExit):
        sc.parse_args(["--ops", "alltoall"])


def test_budget_expects_the_last_time_at_n_else_scales_by_ranks():
    done = [dict(index=0, n=2, status="ok", wall_s=3.0), dict(index=1, n=4, status="budget",
                                                             wall_s=0.0)]
    assert sc.expected_s(done, 2) == 3.0
    assert sc.expected_s(done, 8) == 12.0
    assert sc.expected_s([], 16) == 0.0


def cell(t, nbytes, op, n, roof):
    factor = sc.coll.busbw_factor(op, n)
    bw = nbytes / (t * 1e-6) / 1e9 * factor
    return dict(status="ok", time_us=t, times_us=[t], bytes=nbytes, busbw_GBps=bw,
                frac_roofline=bw / roof)


def test_targets_read_met_not_met_and_n_a():
    args = sc.parse_args(["--nprocs", "2,16", "--ops", "allreduce,allgather",
                          "--sizes", "4,64K,16M,64M", "--coresident-at", "16"])
    roof = 10.0
    worlds = {n: dict(roofline_GBps=roof, oversubscribed=n > 8) for n in (2, 16)}
    cells = {(2, "allreduce", 4, "braid"): cell(10.0, 4, "allreduce", 2, roof),
             (16, "allreduce", 4, "braid"): cell(15.0, 4, "allreduce", 16, roof),
             (16, "allreduce", 4, "gloo"): cell(300.0, 4, "allreduce", 16, roof),
             (16, "allreduce", 4, "braid (co)"): cell(30.0, 4, "allreduce", 16, roof)}
    # allreduce busbw = 2 * 15/16 * S / t: 100% of the roofline at t = 1.875 S / 10 GB/s
    for s, frac in ((16 << 20, 1.1), (64 << 20, 0.9)):
        cells[(16, "allreduce", s, "braid")] = cell(1.875 * s / (roof * frac) / 1e3, s,
                                                    "allreduce", 16, roof)
    targets = sc.evaluate_targets(args, worlds, cells)

    def find(start, point=None):
        return [t for t in targets if t["target"].startswith(start)
                and (point is None or t["point"] == point)]

    (t,) = find("4 B allreduce at 16 ranks: braid time / braid's 2-rank")  # 15 / 10 <= 2
    assert t["met"] is True and t["value"] == pytest.approx(1.5) and t["oversubscribed"]
    (t,) = find("4 B allreduce at 16 ranks: gloo time / braid time")  # 300 / 15 < 25
    assert t["met"] is False and t["value"] == pytest.approx(20.0)
    (t,) = find("allreduce busbw", "allreduce 16MB")
    assert t["met"] is True and t["value"] == pytest.approx(1.1)
    (t,) = find("allreduce busbw", "allreduce 64MB")
    assert t["met"] is False and t["value"] == pytest.approx(0.9)
    ag = find("allgather busbw")  # 64K, 16M and 64M: not measured at 16 ranks
    assert len(ag) == 3 and all(t["met"] is None and "not measured" in t["why"] for t in ag)
    (t,) = find("broadcast busbw")
    assert t["met"] is None and t["why"] == "not in --ops"
    co = {t["ranks"]: t for t in find("co-resident")}
    assert co[16]["met"] is False and co[16]["value"] == pytest.approx(2.0)
    assert co[8]["met"] is None
    text = sc.format_targets(targets, 8)
    assert "NOT met" in text and ": met (oversubscribed)" in text and "n/a (" in text


@pytest.mark.skipif(not braid_available(), reason="torch_braid is not importable")
def test_a_two_rank_sweep_writes_table_json_and_plot(tmp_path):
    js, png, txt = tmp_path / "s.json", tmp_path / "s.png", tmp_path / "s.txt"
    cmd = [sys.executable, BENCH, "--nprocs", "2", "--ops", "allreduce", "--sizes", "4K",
           "--repeats", "1", "--coresident-at", "2", "--rounds", "2", "--time-per-point", "0.01",
           "--settle-ms", "1", "--memcpy-bytes", "1M", "--pg-timeout", "60", "--job-timeout",
           "120", "--json", str(js), "--plot", str(png), "--table", str(txt), "--pin"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"scaling.py timed out\n{out}\n{err}")
    assert p.returncode == 0, f"{out}\n{err}"
    assert "ranks pinned to CPUs: yes" in out and "# Targets (issue 30" in out
    assert "3 of 3 jobs measured" in out and txt.read_text().startswith("# world sizes")
    rep = json.loads(js.read_text())
    assert rep["schema"] == sc.SCHEMA and rep["meta"]["pinned"] is True
    assert [(j["n"], j["mode"], j["backends"], j["status"]) for j in rep["jobs"]] == [
        (2, "alone", "braid", "ok"), (2, "alone", "gloo", "ok"),
        (2, "coresident", "braid,gloo", "ok")]
    assert all(len(j["pinned_cpus"]) == 2 for j in rep["jobs"])
    (w,) = rep["worlds"]
    assert w["ranks"] == 2 and w["roofline_GBps"] > 0 and w["jobs_ok"] == 3
    pts = {p["backend"]: p for p in rep["points"]}
    assert set(pts) == {"braid", "gloo", "braid (co)", "gloo (co)"}
    for p in pts.values():
        assert p["status"] == "ok" and p["bytes"] == 4096 and p["repeats"] == 1
        assert p["busbw_GBps"] == pytest.approx(4096 / p["time_us"] / 1e3)  # 2(n-1)/n = 1
        assert p["frac_roofline"] == pytest.approx(p["busbw_GBps"] / w["roofline_GBps"])
    assert {t["met"] for t in rep["targets"]} == {None}  # no 16 ranks, no co-resident 8
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

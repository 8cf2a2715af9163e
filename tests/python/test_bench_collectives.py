"""benchmarks/collectives.py: its closed-form checks, and two short 2-rank runs.

    /usr/bin/python3 -m pytest -q tests/python/test_bench_collectives.py

The in-process tests check the expected values against an independent reference (the
collectives computed with plain torch ops); the spawned runs use gloo (and braid when torch_braid
is importable) and are bounded by a timeout that kills the whole process group.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "collectives.py")
sys.path.insert(0, os.path.dirname(BENCH))

import _bench_common as bc  # noqa: E402
import collectives as coll  # noqa: E402

coll.import_torch()
RUN_TIMEOUT_S = 240


def braid_available():
    """Whether the benchmarks can run braid. When braid is the backend under test it must
    (conftest.py made sure torch_braid imports): its import failing, or braid missing from
    torch's backends after it, fails the test instead of leaving braid out of the run."""
    import harness

    if harness.BACKEND == "braid":
        import torch_braid  # noqa: F401

        assert "BRAID" in getattr(dist.Backend, "_plugins", {}), \
            f"torch_braid imported but registered no backend: {dist.Backend._plugins}"
        return True
    try:
        import torch_braid  # noqa: F401,F811
    except ImportError:
        return False
    return "BRAID" in getattr(dist.Backend, "_plugins", {})


def run_bench(args, timeout=RUN_TIMEOUT_S):
    p = subprocess.Popen([sys.executable, BENCH] + args, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # the launcher and its ranks
        out, err = p.communicate()
        pytest.fail(f"benchmark timed out after {timeout}s\n{out}\n{err}")
    return p.returncode, out, err


# ---- in-process ----------------------------------------------------------------------------------
def test_sizes_and_env_parsing():
    assert [bc.parse_size(s) for s in ("4", "4K", "1M", "256M", "1G", "64KiB")] == \
        [4, 4096, 1 << 20, 256 << 20, 1 << 30, 64 << 10]
    assert bc.size_range(4, 256, 4) == [4, 16, 64, 256]
    assert bc.size_range(4, 100, 2) == [4, 8, 16, 32, 64]
    assert [bc.fmt_size(n) for n in (4, 4096, 3 << 20, 1000)] == ["4", "4K", "3M", "1000"]
    with pytest.raises(ValueError):
        bc.parse_size("12Q")
    assert bc.env_combos([]) == [{}]
    assert bc.env_combos(["A=1,2", "B=x"]) == [{"A": "1", "B": "x"}, {"A": "2", "B": "x"}]
    with bc.applied_env({"BENCH_TEST_ENV": "7"}):
        assert os.environ["BENCH_TEST_ENV"] == "7"
    assert "BENCH_TEST_ENV" not in os.environ


def test_geometry_rounds_to_whole_elements_per_rank():
    assert coll.geometry("allreduce", 4096, 4, 3) == (1024, 0, 4096)
    assert coll.geometry("allgather", 4096, 4, 3) == (341, 1023, 4092)
    assert coll.geometry("reduce_scatter", 4096, 2, 3) == (2046, 682, 4092)
    assert coll.geometry("alltoall", 16, 4, 4) == (4, 4, 16)
    assert coll.geometry("allgather", 4, 4, 2) is None
    assert coll.busbw_factor("allreduce", 4) == 1.5
    assert coll.busbw_factor("alltoall", 4) == 0.75
    assert coll.busbw_factor("broadcast", 4) == 1.0
    assert coll.busbw_factor("barrier", 4) is None


def test_sum_tolerance_is_zero_exactly_while_sums_are_representable():
    # Partial sums are bounded by 4n: exact up to 256 in bf16 and 2048 in fp16.
    assert coll.sum_atol(64, torch.bfloat16) == 0
    assert 0 < coll.sum_atol(65, torch.bfloat16) < 200
    assert coll.sum_atol(512, torch.float16) == 0
    assert coll.sum_atol(513, torch.float16) > 0
    assert coll.sum_atol(1000, torch.int32) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32])
def test_mismatch_finds_any_single_wrong_element(dtype):
    tile = coll.f_tile(2, 5)
    buf = torch.empty(7 * 1000 + 3, dtype=dtype)
    bc.fill_periodic(buf, tile)
    assert bc.first_mismatch(buf, tile, 0, chunk_rows=64) is None
    for i in (0, 6, 4567, buf.numel() - 1):  # first row, a later chunk, the tail
        bad = buf.clone()
        bad[i] += 1
        assert bc.first_mismatch(bad, tile, 0, chunk_rows=64)[0] == i
    if dtype.is_floating_point:
        bad = buf.clone()
        bad[10] = float("nan")
        assert bc.first_mismatch(bad, tile, 0.5, chunk_rows=64)[0] == 10
        assert bc.first_mismatch(buf + 0.25, tile, 0.5) is None


def reference(op, inps, n):
    """What each rank's checked buffer must hold, computed without the closed forms."""
    total = torch.stack([x.double() for x in inps]).sum(0)
    if op in ("allreduce", "reduce"):
        return [total for _ in range(n)]
    if op == "broadcast":
        return [inps[coll.ROOT].double() for _ in range(n)]
    if op == "allgather":
        return [torch.cat([x.double() for x in inps]) for _ in range(n)]
    if op == "reduce_scatter":
        return list(total.chunk(n))
    return [torch.cat([inps[q].double().chunk(n)[r] for q in range(n)]) for r in range(n)]


CLOSED_FORM_CASES = [(n, dt) for n in (1, 2, 3, 5) for dt in (torch.float32, torch.int32)]
CLOSED_FORM_CASES += [(5, torch.bfloat16), (64, torch.bfloat16), (70, torch.bfloat16),
                      (9, torch.float16)]


@pytest.mark.parametrize("n,dtype", CLOSED_FORM_CASES)
@pytest.mark.parametrize("op", ["allreduce", "reduce", "broadcast", "allgather",
                                "reduce_scatter", "alltoall"])
def test_closed_forms_match_a_reference_computation(op, n, dtype):
    esize = torch.tensor([], dtype=dtype).element_size()
    geo = coll.geometry(op, esize * coll.PERIOD * 5 * n, esize, n)
    bufs = [(torch.empty(geo[0], dtype=dtype),
             torch.empty(geo[1], dtype=dtype) if geo[1] else None) for _ in range(n)]
    expects = [coll.prepare_check(op, inp, out, r, n) for r, (inp, out) in enumerate(bufs)]
    inputs = [inp.clone() for inp, _ in bufs]
    for r, ref in enumerate(reference(op, inputs, n)):
        target = bufs[r][1] if bufs[r][1] is not None else bufs[r][0]
        target.copy_(ref)  # one rounding, as an implementation accumulating in fp32 would
    checked = 0
    for r in range(n):
        for what, view, tile, atol in expects[r]:
            assert (atol > 0) == (op in coll.REDUCTIONS and n > 64)
            assert bc.first_mismatch(view, tile, atol) is None, (op, n, r, what)
            view[len(view) // 2] += 1 + int(2 * atol)  # and a wrong answer is caught
            assert bc.first_mismatch(view, tile, atol) is not None, (op, n, r, what)
            checked += 1
    assert checked >= (1 if op == "reduce" else n)


def test_unregistered_backend_is_a_clear_error():
    with pytest.raises(bc.BenchFailure, match="not registered"):
        bc.ensure_backend("nosuchbackend")


# ---- spawned runs --------------------------------------------------------------------------------
def test_two_ranks_run_writes_json_and_plot(tmp_path):
    backends = ["gloo"] + (["braid"] if braid_available() else [])
    sizes = [4096, 65536]
    js, png = tmp_path / "out.json", tmp_path / "out.png"
    rc, out, err = run_bench([
        "--nprocs", "2", "--backends", ",".join(backends), "--sizes", "4K,64K",
        "--dtypes", "fp32", "--warmup", "1", "--min-iters", "2", "--rounds", "2",
        "--time-per-point", "0.01",
        "--memcpy-bytes", "4M", "--env", "BENCH_TEST_KNOB=a,b", "--json", str(js),
        "--plot", str(png), "--no-progress", "--timeout", "60"])
    assert rc == 0, f"{out}\n{err}"
    assert "# allreduce fp32" in out and "busbw" in out
    report = json.loads(js.read_text())
    meta = report["meta"]
    assert meta["world_size"] == 2 and meta["sizes"] == sizes
    assert [b["label"] for b in meta["backends"]] == backends
    assert [run["env"] for run in report["runs"]] == [{"BENCH_TEST_KNOB": "a"},
                                                      {"BENCH_TEST_KNOB": "b"}]
    for run in report["runs"]:
        assert run["memcpy_before"]["single_rank_GBps"] > 0
        assert len(run["memcpy_after"]["concurrent_per_rank_GBps"]) == 2
        res = {(r["op"], r["backend"], r["requested_bytes"]): r for r in run["results"]}
        assert len(res) == len(run["results"]) == len(backends) * (9 * len(sizes) + 1)
        for be in backends:
            for size in sizes:
                r = res[("allreduce", be, size)]
                assert r["status"] == "ok" and r["bytes"] == size and r["count"] == size // 4
                assert r["rounds"] == len(r["round_time_us"]) == 2 and r["iters"] >= 1
                assert r["time_us_min"] <= r["time_us"] <= r["time_us_max"]
                assert r["algbw_GBps"] == pytest.approx(size / r["time_us"] / 1e3)
                assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2(n-1)/n = 1
                r = res[("allgather", be, size)]
                assert r["status"] == "ok"
                assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] / 2)
                for op in ("gather", "scatter"):  # S: the root's n blocks
                    r = res[(op, be, size)]
                    assert r["status"] == "ok" and r["bytes"] == size
                    assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] / 2)
                r = res[("sendrecv", be, size)]  # a ring shift: each rank sends S
                assert r["status"] == "ok" and r["bytes"] == size
                assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])
            assert res[("barrier", be, 0)]["status"] == "ok"
        gloo_rs = res[("reduce_scatter", "gloo", 4096)]
        assert gloo_rs["status"] == "ok" and isinstance(gloo_rs["emulated"], bool)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_wrong_result_fails_the_run_loudly():
    rc, out, err = run_bench([
        "--nprocs", "2", "--backends", "gloo", "--sizes", "4K", "--ops", "allreduce,alltoall",
        "--warmup", "1", "--min-iters", "1", "--time-per-point", "0.01", "--memcpy-bytes", "1M",
        "--no-progress", "--inject-wrong-result", "alltoall", "--timeout", "60"])
    assert rc == 3, f"{out}\n{err}"
    assert "WRONG RESULT: op=alltoall dtype=fp32 size=4096 B backend=gloo" in err
    assert "# allreduce fp32" in out  # the points before the wrong one were reported


@pytest.mark.parametrize("op,what", [("sendrecv", "buffer from rank 0"),
                                     ("scatter", "block from the root"),
                                     ("gather", "block from rank 0")])
def test_a_wrong_block_fails_the_run(op, what):
    rc, out, err = run_bench([
        "--nprocs", "2", "--backends", "gloo", "--sizes", "4K", "--ops", op,
        "--warmup", "1", "--min-iters", "1", "--time-per-point", "0.01", "--memcpy-bytes", "1M",
        "--no-progress", "--inject-wrong-result", op, "--timeout", "60"])
    assert rc == 3, f"{out}\n{err}"
    assert f"WRONG RESULT: op={op} dtype=fp32 size=4096 B backend=gloo" in err
    assert f"{what}: element 0" in err


def test_a_hung_teardown_ends_the_rank_with_its_code():
    """Note [Bounded teardown]: a rank whose destroy_process_group hangs still exits, with the
    run's own code, and prints the stacks that show where it hung."""
    code = ("import sys, time; sys.path.insert(0, %r); import _bench_common as bc; "
            "bc.end_rank(3, grace_s=0.5, destroy=lambda: time.sleep(120))" % os.path.dirname(BENCH))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    assert "tearing down the process groups took over 0 s" in p.stderr
    assert "time.sleep(120)" in p.stderr or "<lambda>" in p.stderr, p.stderr

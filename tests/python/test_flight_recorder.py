"""The flight recorder (issue 12; Note [Flight recorder], Note [Flight-recorder
dumps]): dumps in torch's pickle layout, on demand and on a timeout, on every
rank of the group, and the diagnosis of `python -m torch_braid.fr`.

Each case runs fresh processes (scripts/flight_recorder.py) because the
recorder's settings are read once per process: 3 ranks for the timeout, 2 for
the on-demand dump (rank 1 with a 4-entry buffer, for the wrap-around), 1 with
the recorder off.
"""
import importlib
import os
import pickle
import subprocess
import sys

import pytest

import harness as H

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "flight_recorder.py")
TIMEOUT_S = 90

# The keys torch's flight recorder writes (FlightRecorderDetail.hpp, version
# 2.10) and its tools read (torch/distributed/flight_recorder/components).
TOP_KEYS = {"version", "pg_config", "pg_status", "entries"}
ENTRY_KEYS = {"record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id",
              "profiling_name", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes",
              "output_dtypes", "state", "time_discovered_started_ns",
              "time_discovered_completed_ns", "retired", "timeout_ms", "is_p2p", "thread_id",
              "thread_name"}

pytestmark = pytest.mark.braid_only


def _fr():
    sys.path.insert(0, H.PYTHON_DIR)
    return importlib.import_module("torch_braid.fr")


def _run(case, world, tmp_path, env_of_rank=lambda r: {}):
    out = tmp_path / "dumps"
    out.mkdir()
    store = str(tmp_path / "store")
    procs = []
    for r in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1",
                   BRAID_FR_DUMP_FILE=str(out / "fr_"), **env_of_rank(r))
        procs.append(subprocess.Popen([sys.executable, SCRIPT, case, str(r), str(world), store,
                                       str(out)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{case}: a rank hung for {TIMEOUT_S} s:\n{p.communicate()[0][-4000:]}")
    for r, (p, o) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and "DONE" in o, f"{case}: rank {r} exit {p.returncode}:\n{o}"
    return out, outs


def _load(path):
    with open(path, "rb") as f:
        return pickle.load(f)  # plain pickle: no torch needed to read a dump


@pytest.fixture(scope="module")
def timeout_dumps(tmp_path_factory):
    return _run("timeout", 3, tmp_path_factory.mktemp("timeout"))


def test_timeout_every_rank_dumps(timeout_dumps):
    out, outs = timeout_dumps
    for r in (0, 2):
        assert "Timed out after 1000 ms waiting for rank(s) [1]" in outs[r], outs[r]
    dumps = {r: _load(out / f"fr_{r}") for r in range(3)}  # rank 1 dumped on the store's request
    assert "rank 0 asked for it" in outs[1] or "rank 2 asked for it" in outs[1], outs[1]
    for r, d in dumps.items():
        assert TOP_KEYS <= set(d), sorted(d)
        assert d["pg_config"]["0"]["ranks"] == "[0, 1, 2]"
        es = [e for e in d["entries"] if not e["is_p2p"]]
        assert [e["collective_seq_id"] for e in es] == ([1, 2, 3] if r == 1 else [1, 2, 3, 4])
        for e in es:
            assert ENTRY_KEYS <= set(e), sorted(ENTRY_KEYS - set(e))
            assert e["profiling_name"] == "braid:all_reduce"
            assert e["input_sizes"] == [[4]] and e["input_dtypes"] == ["Float"]
            assert e["timeout_ms"] == 1000
        assert [e["state"] for e in es[:3]] == ["completed"] * 3
        if r != 1:
            # timed out: started, never completed, retired
            assert es[3]["state"] == "started" and es[3]["retired"]
            assert es[3]["time_discovered_completed_ns"] is None
            assert d["pg_status"]["0"] == {"last_enqueued_collective": 4,
                                          "last_started_collective": 4,
                                          "last_completed_collective": 3}


def test_diagnosis_names_the_missing_rank(timeout_dumps):
    out, _ = timeout_dumps
    fr = _fr()
    dumps = fr.load(str(out))
    assert sorted(dumps) == [0, 1, 2]
    (g,) = fr.diagnose(dumps)
    assert (g["stuck"], g["op"], g["missing"], g["arrived"], g["behind"]) == (
        4, "braid:all_reduce", [1], [0, 2], [1])
    text = fr.format_diagnosis(dumps)
    assert "STUCK at collective #4 braid:all_reduce" in text, text
    assert "rank 1 never arrived" in text and "BEHIND: rank 1" in text, text
    # Without rank 1's dump, the others' still name it.
    del dumps[1]
    (g,) = fr.diagnose(dumps)
    assert g["stuck"] == 4 and g["no_dump"] == [1]
    assert "rank 1: no dump" in fr.format_diagnosis(dumps)


def test_cli_prints_the_diagnosis(timeout_dumps, capsys, tmp_path):
    out, _ = timeout_dumps
    fr = _fr()
    assert fr.main([str(out), "--export-torch", str(tmp_path / "torch")]) == 0
    text = capsys.readouterr().out
    assert "rank 1 never arrived" in text, text
    copies = sorted(os.listdir(tmp_path / "torch"))
    assert copies == ["braid_fr_rank_0", "braid_fr_rank_1", "braid_fr_rank_2"]
    e = _load(tmp_path / "torch" / "braid_fr_rank_0")["entries"][0]
    assert e["profiling_name"] == "gloo:all_reduce"


def test_torch_tools_read_the_dump(timeout_dumps, tmp_path):
    """torch's own reader and matcher (torch >= 2.8 ships them in
    torch.distributed.flight_recorder; `torchfrtrace`) read braid's dumps, and
    find the same missing rank in the exported copies."""
    try:
        from torch.distributed.flight_recorder.components import builder, loader
        from torch.distributed.flight_recorder.components.config_manager import JobConfig
    except ImportError:
        pytest.skip("this torch has no torch.distributed.flight_recorder")
    out, _ = timeout_dumps
    fr = _fr()
    fr.export_torch(fr.load(str(out)), str(tmp_path / "torch"))
    args = JobConfig().parse_args([str(tmp_path / "torch")])
    details, version = loader.read_dir(args)
    assert version == "2.10" and len(details) == 3
    db = builder.build_db(details, args, version)
    # "Not all ranks joining collective, sequence number: 4 ... missing ranks: {1}"
    stuck = [c for c in db.collectives if c.missing_ranks]
    assert [(c.collective_seq_id, c.missing_ranks, c.collective_name) for c in stuck] == [
        (4, {1}, "gloo:all_reduce")], db.collectives


def test_on_demand_dump_matches_the_ops(tmp_path):
    out, _ = _run("ops", 2, tmp_path, lambda r: {"BRAID_FR_BUFFER_SIZE": "4"} if r == 1 else
                  {"BRAID_FR_STACKS": "1"})
    d0 = _load(out / "fr_0")
    rows = [(e["profiling_name"], e["collective_seq_id"], e["p2p_seq_id"], e["is_p2p"],
             e["input_sizes"], e["input_dtypes"], e["output_sizes"], e["output_dtypes"],
             e["state"]) for e in d0["entries"]]
    assert rows == [
        ("braid:all_reduce", 1, 0, False, [[4]], ["Float"], [[4]], ["Float"], "completed"),
        ("braid:broadcast", 2, 0, False, [[2, 3]], ["Long"], [[2, 3]], ["Long"], "completed"),
        ("braid:all_gather", 3, 0, False, [[5]], ["Double"], [[5], [5]], ["Double", "Double"],
         "completed"),
        ("braid:send 0->1", 3, 1, True, [[7]], ["BFloat16"], [[7]], ["BFloat16"], "completed"),
        ("braid:barrier", 4, 1, False, [], [], [], [], "completed"),
        # rank 0's BAND on float32 failed its checks on the caller's thread: no tensors
        ("braid:all_reduce", 5, 1, False, [], [], [], [], "completed"),
        ("braid:barrier", 6, 1, False, [], [], [], [], "completed"),
    ]
    assert [e["record_id"] for e in d0["entries"]] == [0, 1, 2, 3, 4, 5, 6]
    for e in d0["entries"]:
        assert e["time_created_ns"] <= e["time_discovered_started_ns"] <= \
            e["time_discovered_completed_ns"]
    # BRAID_FR_STACKS=1 on rank 0: each entry has the Python stack, innermost first.
    for e in d0["entries"][:5] + d0["entries"][6:]:
        names = [f["name"] for f in e["frames"]]
        assert "ops" in names and "<module>" in names, e["frames"]
        assert all(f["filename"] and f["line"] > 0 for f in e["frames"]), e["frames"]
    first = [f["name"] for f in d0["entries"][0]["frames"][:3]]
    assert "all_reduce" in first, first
    # Rank 1 keeps its last 4 ops only: the ring wrapped, and has no stacks.
    assert all("frames" not in e for e in _load(out / "fr_1")["entries"])
    d1 = _load(out / "fr_1")
    assert [e["record_id"] for e in d1["entries"]] == [3, 4, 5, 6]
    assert [(e["profiling_name"], e["collective_seq_id"]) for e in d1["entries"]] == [
        ("braid:recv 1<-0", 3), ("braid:barrier", 4), ("braid:all_reduce", 5),
        ("braid:barrier", 6)]
    assert d1["entries"][2]["input_sizes"] == [[3]]  # rank 1's own op, failed by the poison


def test_buffer_size_zero_records_nothing(tmp_path):
    out, _ = _run("off", 1, tmp_path, lambda r: {"BRAID_FR_BUFFER_SIZE": "0"})
    d = _load(out / "fr_0")
    assert d["entries"] == [] and TOP_KEYS <= set(d)

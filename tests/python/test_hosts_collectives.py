"""braid's collectives across simulated hosts (tools/hosts.py) against gloo's.

    /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python/test_hosts_collectives.py

One job per layout (spawning ranks is the slow part): every rank makes a gloo group and a
braid group over the same ranks and runs the whole matrix of scripts/hosts_matrix_rank.py on
both (all_reduce with every reduce op, dtype and count, the large one on the hierarchical
path, the large broadcast, reduce, all_gather and reduce_scatter on theirs; in-place and
non-contiguous tensors; every root of broadcast, reduce, gather and scatter; all_gather,
reduce_scatter, all_to_all with even and uneven splits, barrier; send/recv between every pair
of ranks, on one host and across hosts; isend/irecv; PREMUL_SUM; subgroups; ops in flight at
once; a count, dtype, root or op that differs across hosts, which must fail every rank at once
and leave the group usable; the large allreduce's and all_gather's traffic per host, which
must be the hierarchy's). braid must equal gloo bit for bit (AVG: within two ulps); where gloo
lacks a case, braid is compared with a closed form (Note [Exact references across hosts] in
the script). A failing case names itself: op, dtype, reduce op, count, rank, the first
differing index and both values. After each job: no process, no namespace, nothing in any
host's /dev/shm. Run with -s for each job's timings, traffic and expected errors.

Fast tier: 2 hosts x 2 ranks, 3 hosts x 1 rank. Slow tier: 2 hosts x 3 ranks, 3 hosts x 2
ranks, and 3 ranks on 2 hosts (2 + 1 and 1 + 2), where the hosts differ in size and every op
runs over TCP among all ranks; and the matrix again over 0.2 Gbit/s links, with one socket per
peer, with 8 sockets and 64 KiB frames, and with lazy connections.
Also: a send across hosts whose receive comes after a collective (send/recv have sockets of
their own, Note [Point-to-point across hosts]).
"""

import json
import os
import secrets
import subprocess
import sys
import time

import pytest

import harness as H

sys.path.insert(0, os.path.join(H.REPO, "tools"))
import hosts as hosts_mod  # noqa: E402

pytestmark = [
    pytest.mark.machine(hosts_mod.unavailable()),  # under CI a failure (harness.machine_skip)
    pytest.mark.skipif(H.BACKEND != "braid", reason="compares braid with gloo"),
]

RANK_SCRIPT = os.path.join(H.REPO, "tests", "python", "scripts", "hosts_matrix_rank.py")
PORT = 29500  # free: nothing else listens in a job's own namespaces


def run_job(per_host, tmp_path, timeout, env=None, link_gbit=None):
    """Ranks per_host[0] on host 0, then per_host[1] on host 1, ...; their JSON reports.
    Each rank's stderr (the case it is running) goes to a file, so a job that hangs names
    where every rank stopped."""
    place = [k for k, m in enumerate(per_host) for _ in range(m)]
    world = len(place)
    h = hosts_mod.Hosts(len(per_host), link_gbit=link_gbit)
    env = dict(os.environ, OMP_NUM_THREADS="1", BRAID_SECRET=secrets.token_hex(16),
               PYTHONPATH=H.PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **(env or {}))
    errs = [tmp_path / f"rank{r}.err" for r in range(world)]
    procs = []
    try:
        for r in range(world):
            with open(errs[r], "w") as err:
                procs.append(subprocess.Popen(h.cmd(place[r], [
                    sys.executable, RANK_SCRIPT, str(r), str(world), h.addr(0), str(PORT)]),
                    env=env, stdout=subprocess.PIPE, stderr=err, text=True))
        deadline = time.monotonic() + timeout
        outs = []
        for r, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                where = "\n".join(f"  rank {q} (host {place[q]}): {last_case(errs[q])}"
                                  for q in range(world))
                pytest.fail(f"the job did not finish within {timeout} s; where each rank "
                            f"was:\n{where}\nrank {r}'s stderr:\n{tail(errs[r])}")
            assert p.returncode == 0, f"rank {r} exited with {p.returncode}:\n{tail(errs[r])}"
            outs.append(json.loads(out.strip().splitlines()[-1]))
        # Every rank has exited: braid must have left nothing in any host's /dev/shm.
        left = {k: os.listdir(h.shm(k)) for k in range(len(per_host)) if os.listdir(h.shm(k))}
        assert not left, f"left in the hosts' /dev/shm: {left}"
    finally:
        h.teardown()  # kills any rank still running
    assert hosts_mod.leftovers(h.prefix) == []
    return place, outs


def tail(path, n=6000):
    return path.read_text()[-n:]


def last_case(path):
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("case ")]
    return lines[-1] if lines else "(no case started)"


def check(place, outs):
    world = len(place)
    assert [o["rank"] for o in outs] == list(range(world))
    assert outs[0]["hosts"] == [f"braid-h{k}" for k in place], outs[0]["hosts"]
    failures = [f for o in outs for f in o["failures"]]
    gloo_notes = [x for o in outs for x in o["gloo_notes"]]
    cases, compared = outs[0]["cases"], sum(o["compared"] for o in outs)
    closed = sorted({c.split(" count=")[0] for c in outs[0]["closed_form"]})
    print(f"\n{world} ranks on hosts {place}: {cases} cases per rank, {compared} comparisons, "
          f"{len(failures)} failures; {outs[0]['total_seconds']} s on rank 0: "
          f"{outs[0]['seconds']}\nbytes each host sent in the large allreduce and all_gather (rank 0's host): "
          f"{outs[0]['traffic']}\nclosed forms where gloo lacks the case: {closed}\n"
          f"errors the last rank saw, as expected:\n  " +
          "\n  ".join(f"{k} => {v}" for k, v in outs[-1]["errors"].items()))
    if failures:
        lines = [json.dumps(f) for f in failures[:40]]
        pytest.fail(f"{len(failures)} failing comparisons (first 40):\n" + "\n".join(lines))
    assert not gloo_notes, gloo_notes
    # (ranks outside a subgroup or a send/recv pair run fewer cases)
    assert all(o["compared"] > 200 for o in outs), [o["compared"] for o in outs]


@pytest.mark.parametrize("per_host", [
    pytest.param([2, 2], id="2x2"),
    pytest.param([1, 1, 1], id="3x1"),
    pytest.param([3, 3], id="2x3", marks=pytest.mark.slow),
    pytest.param([2, 1], id="2+1", marks=pytest.mark.slow),
    pytest.param([1, 2], id="1+2", marks=pytest.mark.slow),  # the store's host is the small one
    pytest.param([2, 2, 2], id="3x2", marks=pytest.mark.slow),  # cross groups of three
])
def test_braid_matches_gloo_across_hosts(per_host, tmp_path):
    place, outs = run_job(per_host, tmp_path, timeout=300)
    check(place, outs)


@pytest.mark.slow
@pytest.mark.parametrize("per_host,env,link_gbit", [
    pytest.param([2, 2], {}, 0.2, id="2x2-link0.2gbit"),  # every transfer slow: other timings
    pytest.param([2, 2], {"BRAID_TCP_SOCKETS_PER_PEER": "1"}, None, id="2x2-1socket"),
    pytest.param([3, 3], {"BRAID_TCP_SOCKETS_PER_PEER": "8", "BRAID_TCP_CHUNK_BYTES": "65536"},
                 None, id="2x3-8sockets-64k-chunks"),  # large messages striped in many frames
    pytest.param([2, 2, 2], {"BRAID_TCP_CONNECT": "lazy"}, None, id="3x2-lazy-connect"),
    # every message between ranks of a host read in place (Note [Messages read in place])
    pytest.param([2, 1], {"BRAID_SHM_MSG_DIRECT_MIN": "1"}, None, id="2+1-read-in-place"),
])
def test_braid_matches_gloo_across_hosts_with_other_settings(per_host, env, link_gbit,
                                                             tmp_path):
    place, outs = run_job(per_host, tmp_path, timeout=300, env=env, link_gbit=link_gbit)
    check(place, outs)


def test_an_unreceived_send_does_not_block_the_collectives_after_it(tmp_path):
    """rank 0 (host 0) isends 1.2 MB to rank 1 (host 1), both allreduce, then rank 1 posts
    the receive: gloo completes at once; braid must too. A 1 MiB budget makes the case small
    (with the default budget, an 80 MB send does the same)."""
    script = os.path.join(H.REPO, "tests", "python", "scripts", "hosts_unreceived_send.py")
    h = hosts_mod.Hosts(2)
    env = dict(os.environ, OMP_NUM_THREADS="1", BRAID_SECRET=secrets.token_hex(16),
               BRAID_TCP_UNEXPECTED_BYTES=str(1 << 20),
               PYTHONPATH=H.PYTHON_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen(h.cmd(r, [sys.executable, script, str(r), h.addr(0), str(PORT),
                                        "300007"]), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    outs = []
    try:
        deadline = time.monotonic() + 90
        for p in procs:
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            assert p.returncode == 0, err[-4000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    except subprocess.TimeoutExpired:
        pytest.fail("the ranks did not finish within 90 s (braid's group timeout is 10 s)")
    finally:
        h.teardown()
    assert hosts_mod.leftovers(h.prefix) == []
    assert [o["gloo"] for o in outs] == ["ok", "ok"], outs
    assert [o["braid"] for o in outs] == ["ok", "ok"], outs

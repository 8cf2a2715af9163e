"""Failure injection (issue 12, item 3): one rank fails, every other rank raises in time.

For 2, 3 and 4 ranks, during each op family, one rank (the victim) injects a
fault: sys.exit(0), sys.exit(1), os.abort(), SIGKILL, SIGTERM, a hang
(time.sleep), or a hang inside a callback chained on a collective's future
(scripts/inject.py, Note [Injection points], says where each lands). Each case
runs in fresh processes, each in a session of its own. Asserted, per case:

- every survivor raised (its op or its next one), within the group timeout T
  + max(2 s, 2 T) of the moment the victim injected (the victim's DIR/t0; Note
  [Timing bounds in tests] in tests/cpp/timing.h: the summary gives the times);
- its message names the op family ("braid allreduce (rank R)", "braid send"/
  "braid recv", ...), its own rank, and a peer it lost: "rank P (pid X) exited",
  "rank P left the group" or "rank P left op #N" (a survivor that gave up an op
  whose memory this one was reading) when the victim died (then never a timeout: a dead
  peer is seen by its pid, not at the deadline), "Timed out after T ms waiting
  for rank(s) [P]" / "waiting for rank P" when it hangs; at least one survivor
  names the victim itself (the others may name a survivor that failed first);
- every result before the fault was right (closed forms in inject.py);
- cbhang: the victim's own next collective raises a timeout in the same bound
  (only a callback hangs, not the rank);
- every survivor exits 0, after destroying its group, with no braid thread left;
- the victim ends as its fault says: exit code 0 or 1, SIGABRT, SIGKILL,
  SIGTERM; a hung victim is still alive when the survivors are done (the test
  then kills it, as expected);
- no process of the case's sessions is left (no orphans), and no /dev/shm entry
  of its processes (harness.leaked_segments).

Cases: the fast tier runs FAST (every fault twice, every family at least twice,
2 and 3 ranks); the slow tier the rest of 3 sizes x 6 families x 7 faults.
The session summary prints "N injected, H hangs, L leaks" and the detection
times per fault (conftest.py prints harness.SUMMARIES).
"""
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import harness as H

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "inject.py")
FAMILIES = ["allreduce", "broadcast", "allgather", "alltoall", "sendrecv", "ddp"]
FAULTS = ["exit0", "exit1", "abort", "sigkill", "sigterm", "hang", "cbhang"]
DEATHS = {"exit0", "exit1", "abort", "sigkill", "sigterm"}
HANGS = {"hang", "cbhang"}
PG_TIMEOUT_S = float(os.environ.get("BRAID_TEST_FAULT_TIMEOUT", "3"))
# The bound on detection, after the group timeout: room for a loaded 2-core machine (Note
# [Timing bounds in tests] in tests/cpp/timing.h); the measured times are in the summary.
SLACK_S = H.timeout_bound(PG_TIMEOUT_S) - PG_TIMEOUT_S
INJECT_AT = 5  # iterations 0-4 run (and are checked) before the fault
CASE_DEADLINE_S = 120.0  # start (imports) + init + fault + exit, for every process
OPS = {"allreduce": "allreduce", "broadcast": "broadcast", "allgather": "allgather",
       "alltoall": "alltoall", "sendrecv": "(?:send|recv)", "ddp": "allreduce"}
# cbhang: families whose victim must raise too, from its next op (ddp's victim
# waits in backward for its own hook's future, which the hung callback holds).
VICTIM_RAISES = {"allreduce", "broadcast", "allgather", "alltoall", "sendrecv"}
VICTIM_CODE = {"exit0": 0, "exit1": 1, "abort": -signal.SIGABRT, "sigkill": -signal.SIGKILL,
               "sigterm": -signal.SIGTERM}

# Every fault twice, every family at least twice, 2 and 3 ranks.
FAST = [(2, "allreduce", "sigkill"), (3, "broadcast", "exit0"), (2, "allgather", "exit1"),
        (3, "alltoall", "abort"), (2, "sendrecv", "sigterm"), (3, "ddp", "hang"),
        (2, "allreduce", "cbhang"), (3, "sendrecv", "sigkill"), (2, "ddp", "exit0"),
        (3, "allgather", "sigterm"), (2, "broadcast", "abort"), (3, "allreduce", "exit1"),
        (2, "alltoall", "hang"), (3, "sendrecv", "cbhang")]


def victim_of(n, family, fault):
    """Rank 0 and the others in turn (rank 0 is broadcast's first root and DDP's source)."""
    return (FAMILIES.index(family) + FAULTS.index(fault)) % n


def _cases():
    out = []
    for n in (2, 3, 4):
        for family in FAMILIES:
            for fault in FAULTS:
                marks = () if (n, family, fault) in FAST else (pytest.mark.slow,)
                out.append(pytest.param(n, family, fault, id=f"n{n}-{family}-{fault}",
                                        marks=marks))
    return out


class Stats:
    """What the session summary prints (conftest.py calls harness.SUMMARIES)."""

    def __init__(self):
        self.injected = 0
        self.hangs = []     # cases where a process had to be killed that should have exited
        self.leaks = []     # shm entries, orphan processes, braid threads
        self.failed = []    # other broken promises (late, wrong message, wrong exit code)
        self.detect = {}    # fault -> [seconds from injection to a survivor's raise]

    def lines(self):
        if not self.injected:
            return []
        out = [f"fault injection: {self.injected} injected, {len(self.hangs)} hangs, "
               f"{len(self.leaks)} leaks, {len(self.failed)} other failures"]
        for fault in FAULTS + ["cbhang victim"]:
            ts = sorted(self.detect.get(fault, []))
            if ts:
                who = "raised" if " " in fault else "survivors raised"
                out.append(f"  {fault:7s} {who} {len(ts)}x after {ts[0]:.3f} s min, "
                           f"{ts[len(ts) // 2]:.3f} s median, {ts[-1]:.3f} s max "
                           f"(group timeout {PG_TIMEOUT_S:g} s)")
        for what, items in (("hang", self.hangs), ("leak", self.leaks), ("fail", self.failed)):
            out += [f"  {what}: {i}" for i in items[:20]]
        return out


STATS = Stats()
H.SUMMARIES.append(STATS.lines)


def _session_members(sids):
    """Live processes (not zombies we still have to reap) in the given sessions."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) in sids and fields[0] not in "ZX":
            found.append((int(d), fields[0]))
    return found


def _describe(code):
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_case(n, family, fault, tmp_path):
    """Runs one case; returns a dict of everything observed (asserted by the caller)."""
    victim = victim_of(n, family, fault)
    store = H.tcp_store("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60),
                        wait_for_workers=False)
    env = dict(os.environ, PYTHONFAULTHANDLER="0", OMP_NUM_THREADS="1")
    before = H.shm_entries()
    logs = [open(tmp_path / f"rank{r}.log", "w+") for r in range(n)]
    procs = [subprocess.Popen(
        [sys.executable, SCRIPT, str(r), str(n), family, fault, str(victim), str(INJECT_AT),
         str(PG_TIMEOUT_S), str(store.port), str(tmp_path)],
        env=env, stdout=logs[r], stderr=subprocess.STDOUT, start_new_session=True)
        for r in range(n)]
    pids = [p.pid for p in procs]
    deadline = time.monotonic() + CASE_DEADLINE_S
    survivors = [r for r in range(n) if r != victim]
    killed = []  # (rank, why) of processes the test had to kill

    def wait_for(ranks):
        for r in ranks:
            try:
                procs[r].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    wait_for(survivors)
    victim_alive_after = procs[victim].poll() is None
    if fault in HANGS and victim_alive_after:
        os.killpg(pids[victim], signal.SIGKILL)  # expected: nothing else ends a hung rank
    wait_for([victim])
    for r, p in enumerate(procs):
        if p.poll() is None:
            killed.append((r, "did not exit by the case deadline"))
            os.killpg(pids[r], signal.SIGKILL)
            p.wait(10)
    orphans = _session_members(set(pids))
    for pid, _ in orphans:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    leaks = H.leaked_segments(before, H.shm_entries(), set(pids))
    outs = []
    for f in logs:
        f.seek(0)
        outs.append(f.read()[-3000:])
        f.close()
    del store
    return dict(victim=victim, survivors=survivors, procs=procs, pids=pids, killed=killed,
                victim_alive_after=victim_alive_after, orphans=orphans, leaks=leaks, outs=outs,
                t0=_read_json(tmp_path / "t0"),
                reports={r: _read_json(tmp_path / f"report.{r}.json") for r in range(n)},
                caught={r: _read_json(tmp_path / f"caught.{r}.json") for r in range(n)})


# A lost peer: exited (by pid), left the group, or left the op while this rank
# read its memory (Note [A peer that leaves during a direct read]).
NAMED = re.compile(r"rank (\d+) \(pid \d+\) exited|rank (\d+) left (?:the group|op #)|"
                   r"waiting for rank\(s\) \[([\d, ]+)\]|waiting for rank (\d+)")
DEAD = re.compile(r"rank \d+ \(pid \d+\) exited|rank \d+ left (?:the group|op #)")
TIMEOUT = re.compile(rf"Timed out after {int(PG_TIMEOUT_S * 1000)} ms waiting for rank")


def named_ranks(message):
    ranks = set()
    for m in NAMED.finditer(message):
        for g in m.groups():
            if g:
                ranks.update(int(x) for x in g.split(","))
    return ranks


def check_case(n, family, fault, res):
    """The list of broken promises of one case (empty when it passed)."""
    problems = []
    victim = res["victim"]
    procs = res["procs"]
    t0 = res["t0"]
    if t0 is None:
        problems.append(f"victim rank {victim} never injected "
                        f"({_describe(procs[victim].returncode)}):\n{res['outs'][victim]}")
        return problems
    if fault == "cbhang" and t0.get("thread") != "callback":
        problems.append(f"the victim's callback ran on the {t0.get('thread')} thread, not braid's")
    if fault == "cbhang" and family in VICTIM_RAISES:
        # Only a callback hangs: the victim's next op must not wait for ever
        # (Note [A job that cannot start] in csrc/engine/engine.h).
        got = res["caught"][victim]
        if got is None:
            problems.append(f"victim rank {victim}: its op after the hung callback never raised")
        else:
            late = got["t_raise"] - t0["t0"]
            STATS.detect.setdefault("cbhang victim", []).append(late)
            if late > PG_TIMEOUT_S + SLACK_S or not re.search(
                    rf"braid {OPS[family]} \(rank {victim}\): Timed out after "
                    rf"{int(PG_TIMEOUT_S * 1000)} ms", got["message"]):
                problems.append(f"victim rank {victim} raised after {late:.2f} s: "
                                f"{got['message']}")
    if fault in HANGS and not res["victim_alive_after"]:
        problems.append(f"hung victim rank {victim} exited before the survivors were done: "
                        f"{_describe(procs[victim].returncode)}")
    if fault in DEATHS and procs[victim].returncode != VICTIM_CODE[fault]:
        problems.append(f"victim rank {victim}: {_describe(procs[victim].returncode)}, expected "
                        f"{_describe(VICTIM_CODE[fault])}:\n{res['outs'][victim]}")
    if fault in DEATHS and res["reports"][victim] is not None:
        problems.append(f"victim rank {victim} did not die by {fault}: {res['reports'][victim]}")
    op = OPS[family]
    named = set()
    for r in res["survivors"]:
        rep = res["reports"][r]
        code = procs[r].returncode
        if code != 0:
            problems.append(f"survivor rank {r}: {_describe(code)}:\n{res['outs'][r]}")
        if rep is None:
            problems.append(f"survivor rank {r} wrote no report:\n{res['outs'][r]}")
            continue
        if rep["outcome"] != "raised":
            problems.append(f"survivor rank {r} raised nothing in {rep['iterations']} iterations")
            continue
        elapsed = rep["t_raise"] - t0["t0"]
        STATS.detect.setdefault(fault, []).append(elapsed)
        msg = rep["message"]
        if elapsed > PG_TIMEOUT_S + SLACK_S:
            problems.append(f"survivor rank {r} raised {elapsed:.2f} s after the injection "
                            f"(bound {PG_TIMEOUT_S + SLACK_S:g} s): {msg}")
        if not re.search(rf"braid {op} \(rank {r}\)", msg):
            problems.append(f"survivor rank {r}: message does not name braid {op} and rank {r}: "
                            f"{msg}")
        peers = named_ranks(msg) - {r}
        if not peers:
            problems.append(f"survivor rank {r}: message names no peer rank: {msg}")
        named |= peers
        if fault in DEATHS and not DEAD.search(msg):
            problems.append(f"survivor rank {r}: a dead peer must be reported as such, not as "
                            f"a timeout: {msg}")
        if fault in HANGS and not (TIMEOUT.search(msg) or DEAD.search(msg)):
            problems.append(f"survivor rank {r}: not a timeout: {msg}")
        if rep["iteration"] < INJECT_AT:
            problems.append(f"survivor rank {r} raised at iteration {rep['iteration']}, before "
                            f"the fault: {msg}")
        if rep["bad_results"]:
            problems.append(f"survivor rank {r}: wrong results: {rep['bad_results']}")
        if rep["braid_threads"]:
            problems.append(f"survivor rank {r}: braid threads after destroy: "
                            f"{rep['braid_threads']}")
    if victim not in named and not any("wrote no report" in p or "raised nothing" in p
                                       for p in problems):
        problems.append(f"no survivor names the victim rank {victim}")
    return problems


@pytest.mark.braid_only
@pytest.mark.parametrize("n,family,fault", _cases())
def test_survivors_raise_in_time(n, family, fault, tmp_path):
    res = run_case(n, family, fault, tmp_path)
    STATS.injected += 1
    case = f"n{n}-{family}-{fault}"
    problems = check_case(n, family, fault, res)
    if res["killed"]:
        STATS.hangs.append(f"{case}: {res['killed']}")
        problems.append(f"killed by the test: {res['killed']}")
    leaks = ([f"shm {res['leaks']}"] if res["leaks"] else []) + (
        [f"orphans {res['orphans']}"] if res["orphans"] else [])
    problems += leaks
    leaks += [p for p in problems if "braid threads" in p]
    if leaks:
        STATS.leaks.append(f"{case}: {leaks}")
    others = [p for p in problems if p not in leaks and not p.startswith("killed by")]
    if others:
        STATS.failed.append(f"{case}: {others[0][:300]}")
    assert not problems, f"{case} (victim rank {res['victim']}):\n" + "\n".join(problems)

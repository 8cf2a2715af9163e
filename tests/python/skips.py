"""Every skip accounted for: the skips a run saw against the list its torch leg expects.

    pytest (conftest.py registers SkipAccounting): prints, at the end of every run, the
        skips per list entry and the skips that match none; with CI=true or
        BRAID_STRICT_SKIPS=1 a mismatch fails the run (exit status 1).
    python3 tests/python/skips.py ctest --output FILE --build DIR
        the same for ctest's "The following tests did not run" (tests/run_suite.sh).

Environment:
  CI=true / BRAID_STRICT_SKIPS=1  strict: mismatches fail (BRAID_STRICT_SKIPS=0: never)
  BRAID_SKIPS_LEG=NAME            the list's name (default torch-MAJOR.MINOR, plus -BACKEND
                                  when the backend under test is not braid)
  BRAID_SKIPS_LIST=FILE           another list file than tests/skips/<leg>.txt (ctest:
                                  BRAID_SKIPS_CPP_LIST, for tests/skips/cpp-<leg>.txt)
  BRAID_SKIPS_WRITE=FILE|DIR      write the skips seen, in the list's format, to FILE; or,
                                  given a directory, to DIR/<leg>.txt (pytest) and
                                  DIR/cpp-<leg>.txt (ctest). BRAID_SKIPS_WRITE=tests/skips
                                  with tests/run_suite.sh (BRAID_TEST_TIER=all) rewrites a
                                  leg's lists in place.

Note [Expected skips]
A skip says that a test did not run; a run that is green with skips nobody expected hides
whatever those tests would have found (an import bug skipping a hundred tests with a false
reason, a machine without root skipping the cross-host tests). So each torch leg has a list
of the skips it expects, tests/skips/<leg>.txt for pytest and tests/skips/cpp-<leg>.txt for
ctest, one entry a line:

    fast | slow | reason | test ids | why          (pytest)
    count | reason | test names | why             (ctest)

`reason` is a Python regular expression searched in the skip's reason (for ctest, in
GTEST_SKIP's message, or in ctest's own word, Disabled, when there is none); `test ids` a
glob (fnmatch) on the pytest node id relative to tests/python (test_x.py::test_y[n2]) or on
the ctest name; `why` one line saying why the skip is right on that leg. A skip belongs to
the first entry whose reason and glob both match. `fast` and `slow` count the skipped tests
of each tier (a test is slow when it carries the slow marker): N is exactly N, <=N at most
N, * any number, ? not measured yet (any number). A skip that matches no entry, more skips
than an entry allows, and an entry whose `why` is still the writer's TODO are mismatches in
every run. Fewer skips than an exact N are a mismatch only where the run covered the
entry's tests whole in that tier: every test file the glob can match was collected whole
(the run was given tests/python, or the file, or the test function the glob names) and no
test of that tier matching the glob was deselected (-m, -k), and the run did not stop early
(-x). A partial run (one file, -m slow shards) thus checks what it ran, and the full run
checks the counts. (A selection that drops tests must report them through the
pytest_deselected hook, as -m and -k do, or the run counts as whole.) Outside CI mismatches are printed, not fatal: a developer's machine
may lack what CI has.

Skips that depend on the machine are not listed: under CI they are failures (CI runs as
root, with namespaces and direct reads), see harness.machine_skip and
tests/cpp/machine_skip.h. What a list holds is what the leg's torch lacks (FSDP2 before
2.6, torch.compile on 1.13, ...) and what no machine here has (a GPU).

The writer (BRAID_SKIPS_WRITE) keeps the list's entries, their patterns and whys, and sets
each count it measured (an entry's tier covered whole) to what it saw; entries that a whole
run saw in neither tier are dropped, and skips that no entry matched get new entries,
one per reason and test file (or test function, where the run did not cover the file; for
ctest, one per reason and gtest suite),
with an exact reason and a TODO for the why, which a person must write before CI accepts
the list.
"""

import fnmatch
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LISTS = os.path.join(REPO, "tests", "skips")
TODO = "TODO: why is this skip expected on this leg?"


def strict():
    """Whether mismatches fail the run: BRAID_STRICT_SKIPS=1, or CI=true unless
    BRAID_STRICT_SKIPS=0."""
    v = os.environ.get("BRAID_STRICT_SKIPS", "")
    if v in ("0", "1"):
        return v == "1"
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def leg_name(backend="braid"):
    if os.environ.get("BRAID_SKIPS_LEG"):
        return os.environ["BRAID_SKIPS_LEG"]
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"torch-{major}.{minor}" + ("" if backend == "braid" else f"-{backend}")


# ---- the list -------------------------------------------------------------------------------


class Count:
    """One count column: 'N' (exact), '<=N' (at most), '*' (any), '?' (not measured)."""

    def __init__(self, text):
        text = text.strip()
        self.text = text
        m = re.fullmatch(r"(<=)?(\d+)", text)
        if m:
            self.kind, self.n = ("max" if m.group(1) else "exact"), int(m.group(2))
        elif text in ("*", "?"):
            self.kind, self.n = text, None
        else:
            raise ValueError(f"a count is N, <=N, * or ?, not {text!r}")

    def problem(self, seen, whole):
        """Why `seen` skips break this count, or None."""
        if self.kind in ("exact", "max") and seen > self.n:
            return f"{seen} seen, at most {self.n} listed"
        if self.kind == "exact" and whole and seen < self.n:
            return f"{seen} seen, {self.n} listed (the run covered these tests whole)"
        return None


class Entry:
    def __init__(self, tiers, counts, reason, glob, why, line=0):
        self.tiers = tiers
        self.counts = dict(zip(tiers, counts))
        self.reason, self.glob, self.why, self.line = reason, glob, why, line
        self.regex = re.compile(reason)
        self.seen = {t: [] for t in tiers}  # tier -> [(test id, reason)]

    def matches(self, test_id, reason):
        return self.regex.search(reason) is not None and fnmatch.fnmatchcase(test_id, self.glob)

    def format(self):
        counts = " | ".join(f"{self.counts[t].text:>4}" for t in self.tiers)
        return f"{counts} | {self.reason} | {self.glob} | {self.why}"


def parse(path, tiers):
    """The entries of the list at `path` ([] when there is none). Fields are separated by
    ' | '; the reason, a regular expression, may itself hold ' | '."""
    entries = []
    if not os.path.exists(path):
        return entries
    with open(path) as f:
        for no, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            fields = line.split(" | ")
            if len(fields) < len(tiers) + 3:
                raise ValueError(f"{path}:{no}: expected {' | '.join(tiers)} | reason | "
                                 f"test ids | why, got {line!r}")
            counts = [Count(c) for c in fields[:len(tiers)]]
            reason = " | ".join(fields[len(tiers):-2]).strip()
            try:
                entries.append(Entry(tiers, counts, reason, fields[-2].strip(),
                                     fields[-1].strip(), no))
            except re.error as e:
                raise ValueError(f"{path}:{no}: reason {reason!r} is no regular expression: {e}")
    return entries


def escape(text):
    """text as a regular expression that matches it alone: re.escape without escaping the
    spaces and other harmless characters, so that the list stays readable."""
    return re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text)


def literal_prefix(glob):
    m = re.search(r"[*?\[]", glob)
    return glob if m is None else glob[:m.start()]


class Accounting:
    """Skips seen in one run, matched against a list."""

    def __init__(self, path, tiers, header):
        self.path, self.tiers, self.header = path, tiers, header
        self.entries = parse(path, tiers)
        self.unexpected = []  # (tier, test id, reason)

    def add(self, tier, test_id, reason):
        for e in self.entries:
            if e.matches(test_id, reason):
                e.seen[tier].append((test_id, reason))
                return
        self.unexpected.append((tier, test_id, reason))

    def problems(self, whole):
        """Mismatches; whole(entry, tier) says whether the run covered the entry's tests."""
        out = []
        for tier, test_id, reason in self.unexpected:
            out.append(f"unexpected skip ({tier}): {test_id}: {reason}")
        for e in self.entries:
            if e.why.startswith("TODO"):
                out.append(f"{self._where(e)}: the entry says no why ({e.why})")
            for t in self.tiers:
                p = e.counts[t].problem(len(e.seen[t]), whole(e, t))
                if p:
                    out.append(f"{self._where(e)} ({t}): {p}: {e.why}")
        return out

    def _where(self, e):
        return f"{os.path.relpath(self.path, REPO)}:{e.line}"

    def summary(self, whole):
        """Lines for the end of the run: the list's counts, then each mismatch."""
        name = os.path.relpath(self.path, REPO)
        total = sum(len(e.seen[t]) for e in self.entries for t in self.tiers)
        total += len(self.unexpected)
        exists = "" if os.path.exists(self.path) else " (no such list: every skip is unexpected)"
        lines = [f"braid skips: {total} skipped; expected per {name}{exists}:"]
        for e in self.entries:
            cells = ", ".join(f"{t} {len(e.seen[t])} of {e.counts[t].text}" for t in self.tiers)
            lines.append(f"  {cells:<28} {e.why}")
        problems = self.problems(whole)
        for p in problems:
            lines.append(f"  MISMATCH {p}")
        return lines, problems

    def write(self, path, whole, new_glob):
        """The list as this run saw it (Note [Expected skips]): see the module doc."""
        out = []
        for e in self.entries:
            measured = [t for t in self.tiers if whole(e, t)]
            for t in measured:  # a person's bound (<=N, *) stays as written
                if e.counts[t].kind in ("exact", "?"):
                    e.counts[t] = Count(str(len(e.seen[t])))
            if (measured == list(self.tiers) and not any(e.seen[t] for t in self.tiers)):
                continue  # a whole run saw none: the skip is gone
            out.append(e)
        groups = {}
        for tier, test_id, reason in self.unexpected:
            groups.setdefault((new_glob(test_id), reason), {t: 0 for t in self.tiers})[tier] += 1
        for (glob, reason), seen in sorted(groups.items()):
            e = Entry(self.tiers, [Count("?")] * len(self.tiers), "^" + escape(reason) + "$",
                      glob, TODO)
            for t in self.tiers:
                if whole(e, t):
                    e.counts[t] = Count(str(seen[t]))
            out.append(e)
        header = self.header
        if os.path.exists(path):  # keep the list's own comment lines
            with open(path) as f:
                lines = f.read().splitlines(True)
            own = [x for x in lines[:next((i for i, x in enumerate(lines)
                                           if not x.lstrip().startswith("#")), len(lines))]]
            header = "".join(own) or header
        with open(path, "w") as f:
            f.write(header)
            for e in out:
                f.write(e.format() + "\n")
        return path


def target(kind, leg):
    """Where BRAID_SKIPS_WRITE sends this kind's list ('pytest' or 'ctest'), or None."""
    w = os.environ.get("BRAID_SKIPS_WRITE")
    if not w:
        return None
    # Relative to the repository, wherever the run's working directory is (the GPU
    # check collects from another one).
    w = os.path.join(REPO, w)
    if os.path.isdir(w):
        return os.path.join(w, (leg if kind == "pytest" else f"cpp-{leg}") + ".txt")
    return w if kind == "pytest" else None


PYTEST_HEADER = """\
# Skips expected on the {leg} leg (pytest, braid backend): Note [Expected skips] in
# tests/python/skips.py. Regenerate the counts with BRAID_SKIPS_WRITE=tests/skips and a full
# run (tests/run_suite.sh with BRAID_TEST_TIER=all); write each new entry's why by hand.
# fast | slow | reason (regular expression) | test ids (glob) | why
"""

CTEST_HEADER = """\
# C++ tests (ctest) expected not to run on the {leg} leg: Note [Expected skips] in
# tests/python/skips.py. Regenerate with BRAID_SKIPS_WRITE=tests/skips tests/run_suite.sh.
# count | reason (regular expression) | test names (glob) | why
"""


# ---- pytest ---------------------------------------------------------------------------------


class SkipAccounting:
    """The pytest plugin (registered by conftest.py)."""

    def __init__(self, config, backend):
        self.config = config
        self.leg = leg_name(backend)
        path = os.environ.get("BRAID_SKIPS_LIST") or os.path.join(LISTS, self.leg + ".txt")
        self.acc = Accounting(path, ("fast", "slow"), PYTEST_HEADER.format(leg=self.leg))
        self.tier_of = {}  # nodeid -> (test id, tier)
        self.deselected = []  # (test id, tier)
        self.recorded = set()
        self.covered = self._covered(config)
        self.stopped = False
        self.problems = []
        self.lines = []
        self.written = None

    # The prefixes of test ids that the command line covers whole: "" for the directory.
    @staticmethod
    def _covered(config):
        out = []
        base = config.invocation_params.dir
        for arg in config.args:
            path, sep, rest = str(arg).partition("::")
            path = os.path.abspath(os.path.join(base, path))
            rel = os.path.relpath(path, HERE)
            if rel == "." or not rel.startswith(".."):
                rel = "" if rel == "." else rel.replace(os.sep, "/")
                if os.path.isdir(path):
                    out.append(rel + "/" if rel else "")
                else:
                    out.append(rel + "::" + rest if sep else rel + "::")
            elif HERE.startswith(path.rstrip(os.sep) + os.sep):
                out.append("")  # an ancestor of tests/python
        return out

    def _test_id(self, nodeid, fspath=None):
        if nodeid in self.tier_of:
            return self.tier_of[nodeid][0]
        path, sep, rest = nodeid.partition("::")
        full = os.path.abspath(os.path.join(str(self.config.rootpath), path))
        rel = os.path.relpath(full, HERE).replace(os.sep, "/")
        return rel + sep + rest

    def whole(self, entry, tier):
        opt = self.config.option
        if self.stopped or opt.collectonly or getattr(opt, "setuponly", False) or \
                getattr(opt, "setupplan", False):
            return False  # stopped early, or ran no test
        lit = literal_prefix(entry.glob)
        if not any(lit.startswith(p) for p in self.covered):
            return False
        return not any(t == tier and fnmatch.fnmatchcase(i, entry.glob)
                       for i, t in self.deselected)

    def new_glob(self, test_id):
        file_, _, rest = test_id.partition("::")
        if any((file_ + "::").startswith(p) for p in self.covered):
            return file_ + "::*"
        func = rest.split("[")[0]
        return f"{file_}::{func}" + ("[*" if "[" in rest else "")

    def _tier(self, item):
        return "slow" if item.get_closest_marker("slow") is not None else "fast"

    def pytest_collection_modifyitems(self, items):
        for item in items:
            self.tier_of[item.nodeid] = (self._test_id(item.nodeid), self._tier(item))

    def pytest_deselected(self, items):
        for item in items:
            self.deselected.append((self._test_id(item.nodeid), self._tier(item)))

    @staticmethod
    def _reason(longrepr):
        text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        return text[len("Skipped: "):] if text.startswith("Skipped: ") else text

    def _record(self, nodeid, tier, longrepr):
        if nodeid in self.recorded:
            return
        self.recorded.add(nodeid)
        self.acc.add(tier, self._test_id(nodeid), self._reason(longrepr))

    def pytest_runtest_logreport(self, report):
        if report.skipped and not hasattr(report, "wasxfail"):
            tier = self.tier_of.get(report.nodeid, (None, "fast"))[1]
            self._record(report.nodeid, tier, report.longrepr)

    def pytest_collectreport(self, report):
        if report.skipped:  # a whole module skipped at import (importorskip)
            self._record(report.nodeid, "fast", report.longrepr)

    def pytest_sessionfinish(self, session, exitstatus):
        import pytest

        self.stopped = bool(session.shouldstop or session.shouldfail) or \
            exitstatus == pytest.ExitCode.INTERRUPTED
        self.lines, self.problems = self.acc.summary(self.whole)  # against the list as it was
        path = target("pytest", self.leg)
        if path:
            self.written = self.acc.write(path, self.whole, self.new_glob)
        if self.problems and strict() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        for line in self.lines:
            tr.write_line(line, red=line.startswith("  MISMATCH"))
        if self.written:
            tr.write_line(f"braid skips: wrote the skips seen to {self.written}")
        if self.problems:
            if strict():
                tr.write_line(f"braid skips: {len(self.problems)} mismatches with the list fail "
                              f"the run (CI=true or BRAID_STRICT_SKIPS=1)", red=True, bold=True)
            else:
                tr.write_line(f"braid skips: {len(self.problems)} mismatches with the list (not "
                              f"fatal outside CI; BRAID_STRICT_SKIPS=1 makes them fail)")


# ---- ctest ----------------------------------------------------------------------------------


def ctest_skips(output, last_test_log=None):
    """(name, reason) of each test ctest lists under "The following tests did not run",
    the reason from GTEST_SKIP's message in LastTest.log where there is one."""
    names, on = [], False
    for line in output.splitlines():
        if line.startswith("The following tests did not run"):
            on = True
            continue
        if on:
            m = re.match(r"\s*\d+ - (.+) \(([^()]*)\)\s*$", line)
            if not m:
                if line.strip():
                    on = False
                continue
            names.append((m.group(1), m.group(2)))
    messages = {}
    if last_test_log and os.path.exists(last_test_log):
        text = open(last_test_log, errors="replace").read()
        for block in re.split(r"\n(?=\d+/\d+ Testing: )", text):
            m = re.search(r"^\d+/\d+ Test: (.+)$", block, re.M)
            if not m:
                continue
            out = block.split("Output:", 1)[-1].split("<end of output>", 1)[0]
            s = re.search(r": Skipped\n(.*?)\n(?:\n|\[  SKIPPED \])", out, re.S)
            if s and s.group(1).strip():
                messages[m.group(1).strip()] = " ".join(s.group(1).split())
    return [(name, messages.get(name, word)) for name, word in names]


def ctest_main(argv):
    import argparse

    ap = argparse.ArgumentParser(prog="skips.py ctest")
    ap.add_argument("--output", required=True, help="ctest's output")
    ap.add_argument("--build", required=True, help="the build directory ctest ran in")
    ap.add_argument("--leg", help="the list's leg (default: from /usr/bin/python3's torch)")
    ap.add_argument("--partial", action="store_true", help="ctest ran a selection (-R/-E)")
    args = ap.parse_args(argv)
    leg = args.leg or leg_name()
    path = os.environ.get("BRAID_SKIPS_CPP_LIST") or os.path.join(LISTS, f"cpp-{leg}.txt")
    acc = Accounting(path, ("count",), CTEST_HEADER.format(leg=leg))
    with open(args.output, errors="replace") as f:
        output = f.read()
    log = os.path.join(args.build, "Testing", "Temporary", "LastTest.log")
    for name, reason in ctest_skips(output, log):
        acc.add("count", name, reason)

    def whole(entry, tier):
        return not args.partial

    lines, problems = acc.summary(whole)
    out = target("ctest", leg)
    if out:
        acc.write(out, whole, lambda name: name.split(".")[0] + ".*")  # one entry a suite
    print("\n".join(lines))
    if out:
        print(f"braid skips: wrote the C++ skips seen to {out}")
    if problems and strict():
        print(f"braid skips: {len(problems)} mismatches with the list fail the run "
              f"(CI=true or BRAID_STRICT_SKIPS=1)")
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "ctest":
        sys.exit("usage: skips.py ctest --output FILE --build DIR [--leg NAME] [--partial]")
    sys.exit(ctest_main(sys.argv[2:]))

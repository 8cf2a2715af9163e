#!/usr/bin/env python3
"""Checks that braid's Notes resolve, in the spirit of GHC's lint-notes.

    python3 tools/check_notes.py              # the tree this file sits in
    python3 tools/check_notes.py --root DIR   # another checkout
    python3 tools/check_notes.py --self-test  # the checker on samples in memory

Long reasoning is written once, as a block: a comment line that holds only the
Note's name, and the Note's text on the comment lines right below it:

    // Note [Choosing a CUDA executor]
    // Every rank of a group ...

(`#` in Python, shell and CMake files; in a Python docstring or a Markdown
file, a line of its own followed by text). Anywhere else the Note is cited by
name, `Note [Choosing a CUDA executor]`, often with where it is: `... in
cuda/nccl/executor_choice.h`, `(cuda/nccl/executor_choice.h)` or `executor_choice.h's
Note [...]` (not after a comma: `Note [X], path` often names the evidence or
the code, not where the Note is). A citation may wrap: its name may go on
over the next comment line (or the next piece of a string literal, or the next
line of a docstring), and `Note` may end a line whose next one starts with `[`.
A line holding only `Note [X]` above code (not above comment text) is a
citation too: it points the reader at the Note from the code it explains.

Reported, each as file:line:
  - a citation of a Note that no block defines;
  - a citation whose path does not name the file that defines the Note. The
    path may be relative to the repository's root, to csrc/, or to the citing
    file's directory or one above it; a bare file name must be the defining
    file's own name;
  - a Note defined more than once;
  - a Note written inline, `Note [X]: text` or `Note [X] -- text` on the line
    that would define it, when no block defines it (the same form citing a
    Note that a block defines is an ordinary citation).

Scanned: csrc/, tests/, python/, tools/, benchmarks/, examples/, cmake/, docs/,
CMakeLists.txt, README.md and setup.py; not benchmarks/results/ (records of
past runs, which cite the Notes as they were then) nor this file (its samples).
Exit status 0 with a one-line summary when everything resolves, 1 with each
finding and their count otherwise, 2 on a usage error. Standard library only,
so that any python3 runs it.
"""

import argparse
import difflib
import os
import re
import sys

ROOTS = ["csrc", "tests", "python", "tools", "benchmarks", "examples", "cmake", "docs",
         "CMakeLists.txt", "README.md", "setup.py"]
SKIP = {"benchmarks/results", "tools/check_notes.py"}
SKIP_DIR_NAMES = {"__pycache__", "build", "node_modules"}
EXTENSIONS = {".h", ".hpp", ".hh", ".c", ".cc", ".cpp", ".cu", ".cuh", ".py", ".sh",
              ".cmake", ".md", ".supp", ".in"}

WORD = "Note"  # spelled once, so that this file's own text stays out of the way
# A Note's name: starts with a letter or digit; no brackets, quotes or backticks.
TITLE_RE = re.compile(r"[A-Za-z0-9][^\[\]\"`]*\Z")
NOTE_RE = re.compile(r"(?<![A-Za-z0-9_])" + WORD + r"(?:\s*\[|\s*$)")
PATH = (r"[A-Za-z0-9_.+/-]*[A-Za-z0-9_]"
        r"\.(?:h|hpp|hh|c|cc|cpp|cu|cuh|py|sh|cmake|md|txt|supp)(?![A-Za-z0-9_])")
# Where a citation says the Note is, right after its closing bracket.
# Not `Note [X], path`: the path after a comma is as often the evidence (a
# results file) or the code that does what the Note says.
PATH_AFTER_RE = re.compile(r"\s*(?:in\s+`?(?P<a>" + PATH + r")"
                           r"|\(\s*`?(?P<b>" + PATH + r")`?\s*\))")
# ... or right before the word: `collectives.py's Note [Rounds]`.
PATH_BEFORE_RE = re.compile(r"`?(?P<p>" + PATH + r")`?'s\s+$")
# A comment's or a string piece's opening on a continuation line.
LEAD_RE = re.compile(r"\s*(?:///?|#+|\*(?!/)|/\*+|[fFrRbBuU]{0,2}\"{1,3}(?!\"))?\s?")
# What makes a line a comment line, for the definition rule.
MARK_RE = re.compile(r"\s*(///?|#+|\*(?!/)|/\*+)")
DEF_RE = re.compile(r"\s*(?:///?|#+|\*|/\*+)?\s*" + WORD + r" \[(?P<t>[^\[\]]+)\]\s*(?:\*/)?\s*\Z")
INLINE_RE = re.compile(r"\s*(?:///?|#+|\*|/\*+)?\s*(?:\"\"\")?\s*" + WORD
                       + r" \[(?P<t>[^\[\]]+)\]\s*(?::|--|\u2014)\s*\S")
CONTINUATION_LINES = 2  # lines a wrapped citation may run on over


def squash(s):
    return " ".join(s.split())


def lead_stripped(line):
    """A continuation line without its comment marker or string quote."""
    return line[LEAD_RE.match(line).end():].rstrip()


def tail_stripped(s):
    """A line's end without a string literal's closing quote (C++ and Python
    join adjacent literals: `"(... [Choosing a CUDA "` + `"executor])"`)."""
    s = s.rstrip()
    if s.endswith('"') and not s.endswith('"""'):
        s = s[:-1]
    return s


class Tree:
    """Definitions and citations of a set of files, {path: [lines]}."""

    def __init__(self, files):
        self.files = files
        self.defs = {}       # title -> [(path, line)]
        self.inline = {}     # title -> [(path, line)]
        self.cites = []      # (path, line, title, cited path or None)
        self.unreadable = []  # (path, line)
        for path in sorted(files):
            self._scan(path, files[path])

    def _scan(self, path, lines):
        for i, line in enumerate(lines):
            m = DEF_RE.match(line)
            if m and self._opens_block(lines, i):
                self.defs.setdefault(squash(m.group("t")), []).append((path, i + 1))
                continue
            m = INLINE_RE.match(line)
            if m:
                self.inline.setdefault(squash(m.group("t")), []).append((path, i + 1))
            for n in NOTE_RE.finditer(line):
                self._cite(path, lines, i, n)

    @staticmethod
    def _opens_block(lines, i):
        """Whether the line holding only `Note [X]` opens the Note's text: in
        a comment, the next line is a comment line with text; in a docstring
        or Markdown (no comment marker), the next line has text."""
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        mark = MARK_RE.match(lines[i])
        if not mark:
            return bool(nxt.strip())
        m = MARK_RE.match(nxt)
        return bool(m) and m.group(1)[0] == mark.group(1)[0] and bool(nxt[m.end():].strip())

    def _cite(self, path, lines, i, n):
        # The text from the bracket on, with the next lines joined to it.
        if n.group(0).rstrip().endswith("["):
            text = line_rest = lines[i][n.end() - 1:]
        else:  # `Note` ends the line; the next one must start with `[`.
            if i + 1 >= len(lines) or not lead_stripped(lines[i + 1]).startswith("["):
                return
            line_rest = ""
            text = lead_stripped(lines[i + 1])
            i += 1
        start = i
        for j in range(i + 1, min(i + 1 + CONTINUATION_LINES, len(lines))):
            text = tail_stripped(text) + " " + lead_stripped(lines[j])
        close = text.find("]")
        title = squash(text[1:close]) if close > 0 else ""
        if close < 0 or not TITLE_RE.match(title):
            head = squash(text[1:40])
            if close < 0 and head[:1].isalpha():
                self.unreadable.append((path, start + 1))
            return  # not a Note's name (code that happens to say Note [...)
        cited = None
        m = PATH_AFTER_RE.match(text[close + 1:])
        if m:
            cited = m.group("a") or m.group("b")
        elif line_rest:
            m = PATH_BEFORE_RE.search(lines[start][:n.start()])
            if m:
                cited = m.group("p")
        self.cites.append((path, start + 1, title, cited))

    def names(self, cited, citing, defining):
        """Whether `cited`, written in file `citing`, names file `defining`."""
        cited = cited.strip("`")
        if "/" not in cited:
            return os.path.basename(defining) == cited
        if cited.startswith("./"):
            cited = cited[2:]
        bases = ["", "csrc/"]
        d = os.path.dirname(citing)
        while d:
            bases.append(d + "/")
            d = os.path.dirname(d)
        return any(os.path.normpath(b + cited) == defining for b in bases)

    def findings(self):
        out = []
        for title, where in self.defs.items():
            for path, line in where[1:]:
                out.append((path, line, "Note [%s] is defined more than once: first at %s:%d"
                            % (title, where[0][0], where[0][1])))
        inline_defs = {}
        for title, where in self.inline.items():
            if title in self.defs:
                continue
            path, line = where[0]
            inline_defs[title] = where[0]
            out.append((path, line, "Note [%s] is written inline; write it as a block (a line "
                        "holding only the Note's name, its text on the lines below)" % title))
        for path, line, title, cited in self.cites:
            where = self.defs.get(title)
            if not where and title in inline_defs:
                where = [inline_defs[title]]
            if not where:
                hint = difflib.get_close_matches(title, list(self.defs), 1, 0.75)
                out.append((path, line, "Note [%s] is cited but never defined%s" % (
                    title, "; did you mean Note [%s] (%s:%d)?" % (
                        hint[0], *self.defs[hint[0]][0]) if hint else "")))
                continue
            if cited and not any(self.names(cited, path, d) for d, _ in where):
                missing = "" if self._exists(cited, path) else " (no such file)"
                out.append((path, line, "Note [%s] is cited in %s%s but defined in %s" % (
                    title, cited, missing, ", ".join(d for d, _ in where))))
        for path, line in self.unreadable:
            out.append((path, line, "a Note's name that does not close with ] within %d lines"
                        % (CONTINUATION_LINES + 1)))
        out.sort(key=lambda f: (f[0], f[1], f[2]))
        # One finding per line and message (a line may cite a Note twice).
        return [f for k, f in enumerate(out) if k == 0 or f != out[k - 1]]

    def _exists(self, cited, citing):
        if "/" not in cited:
            return any(os.path.basename(p) == cited for p in self.files)
        return any(self.names(cited, citing, p) for p in self.files)


def read_tree(root):
    files = {}
    for top in ROOTS:
        full = os.path.join(root, top)
        if os.path.isfile(full):
            paths = [top]
        elif os.path.isdir(full):
            paths = []
            for d, dirs, names in os.walk(full):
                rel = os.path.relpath(d, root).replace(os.sep, "/")
                dirs[:] = sorted(x for x in dirs if not x.startswith(".")
                                 and x not in SKIP_DIR_NAMES and rel + "/" + x not in SKIP)
                paths += [rel + "/" + x for x in sorted(names)]
        else:
            continue
        for p in paths:
            if p in SKIP or not wanted(os.path.join(root, p)):
                continue
            with open(os.path.join(root, p), encoding="utf-8", errors="replace") as f:
                files[p] = f.read().split("\n")
    return files


def wanted(path):
    name = os.path.basename(path)
    if name == "CMakeLists.txt" or os.path.splitext(name)[1] in EXTENSIONS:
        return True
    if "." in name:
        return False
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def run(files, out=sys.stdout):
    tree = Tree(files)
    found = tree.findings()
    for path, line, what in found:
        print("%s:%d: %s" % (path, line, what), file=out)
    if found:
        print("check_notes: %d problem%s" % (len(found), "" if len(found) == 1 else "s"),
              file=out)
        return 1
    print("check_notes: %d notes, %d citations, all resolve" % (len(tree.defs), len(tree.cites)),
          file=out)
    return 0


# ---- self-test -----------------------------------------------------------------------------

def _samples():
    n = WORD
    files = {
        # Blocks, and citations that resolve in every form.
        "csrc/cuda/nccl/executor_choice.h": [
            "// Header.",
            "// %s [Choosing a CUDA executor]" % n,
            "// The executor is chosen once per group.",
            "int x;",
        ],
        "csrc/transport/shm/futex.h": [
            "  // %s [Spin, then sleep]" % n,
            "  // Spin first.",
        ],
        "csrc/cuda/device_api.h": [
            "// Root-relative (%s [Choosing a CUDA executor] in csrc/cuda/nccl/executor_choice.h)," % n,
            "// csrc-relative (%s [Choosing a CUDA executor] in cuda/nccl/executor_choice.h)," % n,
            "// bare (%s [Choosing a CUDA executor] in executor_choice.h), from this" % n,
            "// directory (%s [Choosing a CUDA executor] (executor_choice.h)), a title" % n,
            "// that wraps (%s [Choosing a" % n,
            "// CUDA executor] in",
            "// cuda/nccl/executor_choice.h), a line ending in %s" % n,
            "// [Spin, then sleep], a string piece \"(%s [Choosing a CUDA \"" % n,
            "        \"executor])\", and one above code:",
            "  // %s [Spin, then sleep]" % n,
            "  spin();",
            "// %s [Spin, then sleep]: a citation may start a comment." % n,
            "// futex.h's %s [Spin, then sleep]; a path after a comma is no citation's: (%s "
            "[Spin, then sleep], `benchmarks/results/spin.txt`)." % (n, n),
        ],
        "tests/python/test_x.py": [
            '"""Docstring (%s [Why worlds are' % n,
            'pooled] in harness.py)."""',
            "# %s [Spin, then sleep] in csrc/transport/shm/futex.h" % n,
            'x = s.split("\\n%s [")[0]  # code, not a citation' % n,
        ],
        "tests/python/harness.py": [
            '"""Worlds.',
            "",
            "%s [Why worlds are pooled]" % n,
            "Making a world costs seconds.",
            '"""',
        ],
        "docs/x.md": ["See %s [Spin, then sleep] in `csrc/transport/shm/futex.h`." % n],
        "csrc/zz/dup.cc": [
            "// %s [Spin, then sleep]" % n,                                       # defined twice
            "// Spinning again.",
        ],
        # Findings, one kind each.
        "csrc/cuda/bad.cc": [
            "// %s [Choosing a CUDA executor] in backend/cuda_executor.h." % n,   # 1 wrong path
            "// %s [Spin, then sleep] in p2p.cc." % n,                            # 2 wrong file
            "// (%s [Never written])" % n,                                        # 3 undefined
            "// %s [Choosing a CUDA" % n,                                         # 4 wrapped,
            "// executor] (cuda/shared_gpu/same_gpu.h)",                                     #   wrong path
            "// %s [Spin, then sleep]" % n,                                       # 6 a pointer
            "spin();",
            "// %s [Written inline]: the text on the same line." % n,             # 8 inline
            "// (%s [Written inline])" % n,                                       #   resolves
            "# %s [Dashed] -- also inline" % n,                                   # 10 inline
            "// %s [Choosing a CUDA executer]" % n,                               # 11 typo
            "int y;",
            "// %s [Spin, then sleep] in device_api.h: a file that is there." % n,  # 13 wrong
        ],
    }
    expected = [
        ("csrc/cuda/bad.cc", 1, "cited in backend/cuda_executor.h (no such file) but defined in "
         "csrc/cuda/nccl/executor_choice.h"),
        ("csrc/cuda/bad.cc", 2, "cited in p2p.cc (no such file) but defined in "
         "csrc/transport/shm/futex.h"),
        ("csrc/cuda/bad.cc", 3, "Note [Never written] is cited but never defined"),
        ("csrc/cuda/bad.cc", 4, "cited in cuda/shared_gpu/same_gpu.h (no such file)"),
        ("csrc/zz/dup.cc", 1, "Note [Spin, then sleep] is defined more than once: first at "
         "csrc/transport/shm/futex.h:1"),
        ("csrc/cuda/bad.cc", 8, "Note [Written inline] is written inline"),
        ("csrc/cuda/bad.cc", 10, "Note [Dashed] is written inline"),
        ("csrc/cuda/bad.cc", 11, "did you mean Note [Choosing a CUDA executor]"),
        ("csrc/cuda/bad.cc", 13, "cited in device_api.h but defined in csrc/transport/shm/futex.h"),
    ]
    return files, expected


def self_test():
    files, expected = _samples()
    tree = Tree(files)
    found = tree.findings()
    failures = []
    for path, line, text in expected:
        if not any(f[0] == path and f[1] == line and text in f[2] for f in found):
            failures.append("missing: %s:%d: ...%s..." % (path, line, text))
    for f in found:
        if not any(f[0] == p and f[1] == line and t in f[2] for p, line, t in expected):
            failures.append("unexpected: %s:%d: %s" % f)
    # Every citation in the good files was read, with its path where it has one.
    want_cites = {
        ("csrc/cuda/device_api.h", 1, "csrc/cuda/nccl/executor_choice.h"),
        ("csrc/cuda/device_api.h", 2, "cuda/nccl/executor_choice.h"),
        ("csrc/cuda/device_api.h", 3, "executor_choice.h"),
        ("csrc/cuda/device_api.h", 4, "executor_choice.h"),
        ("csrc/cuda/device_api.h", 5, "cuda/nccl/executor_choice.h"),
        ("csrc/cuda/device_api.h", 8, None),
        ("csrc/cuda/device_api.h", 8, None),
        ("csrc/cuda/device_api.h", 10, None),
        ("csrc/cuda/device_api.h", 12, None),
        ("csrc/cuda/device_api.h", 13, "futex.h"),
        ("csrc/cuda/device_api.h", 13, None),
        ("tests/python/test_x.py", 1, "harness.py"),
        ("tests/python/test_x.py", 3, "csrc/transport/shm/futex.h"),
        ("docs/x.md", 1, "csrc/transport/shm/futex.h"),
    }
    got = {(p, line, c) for p, line, _, c in tree.cites if not p.endswith("bad.cc")}
    for c in sorted(want_cites - got, key=str):
        failures.append("citation not read: %s:%d (path %s)" % c)
    for c in sorted(got - want_cites, key=str):
        failures.append("citation read that is none: %s:%d (path %s)" % c)
    if sorted(tree.defs) != ["Choosing a CUDA executor", "Spin, then sleep",
                             "Why worlds are pooled"]:
        failures.append("definitions: %s" % sorted(tree.defs))
    if failures:
        for f in failures:
            print("check_notes self-test: " + f)
        print("check_notes self-test: FAILED (%d)" % len(failures))
        return 1
    print("check_notes self-test: %d findings as expected, %d citations read, passed"
          % (len(found), len(tree.cites)))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the checkout to check (default: the one this file is in)")
    ap.add_argument("--self-test", action="store_true",
                    help="run the checker on samples in memory, not on the tree")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test()
    return run(read_tree(args.root))


if __name__ == "__main__":
    sys.exit(main())

"""braid's flight recorder: dumps, and a diagnosis across ranks.

Every braid op is recorded in a per-process ring buffer (BRAID_FR_BUFFER_SIZE
entries, default 2000; 0 turns it off) in the layout of PyTorch's flight
recorder. Dumps are pickles, one file per rank (``<prefix><rank>``):

    torch_braid.fr.dump()                 # now; prefix: BRAID_FR_DUMP_FILE or /tmp/braid_fr_rank_
    torch_braid.fr.install_signal_handler()   # kill -USR1 <pid> dumps too
    BRAID_FR_DUMP_FILE=/tmp/fr_ ...       # dumps on timeout / lost peer (all ranks of the group)
    BRAID_FR_DUMP_ON_EXIT=1               # and at exit

Then, from any machine with the files:

    python -m torch_braid.fr DIR          # which rank is behind, on which op, who never arrived
    python -m torch_braid.fr DIR --export-torch OUT   # copies torch's `torchfrtrace` accepts

See docs/flight_recorder.md.
"""
import argparse
import ast
import os
import pickle
import re
import signal
import sys
import tempfile

__all__ = ["dump", "dump_bytes", "entries", "enabled", "install_signal_handler", "load",
           "diagnose", "format_diagnosis", "main"]

DEFAULT_PREFIX = os.path.join(tempfile.gettempdir(), "braid_fr_rank_")


def _C():
    from . import _C as c
    return c


def enabled():
    """Whether this process records ops (BRAID_FR_BUFFER_SIZE > 0)."""
    return _C().fr_enabled()


def dump_bytes():
    """This process's dump, as the bytes of a pickle."""
    return _C().fr_dump_bytes()


def entries():
    """This process's dump as a dict (version, pg_config, pg_status, entries)."""
    return pickle.loads(dump_bytes())


def dump(prefix=None):
    """Writes this process's dump to ``<prefix><rank>`` and returns the path.

    prefix defaults to BRAID_FR_DUMP_FILE, else /tmp/braid_fr_rank_."""
    prefix = prefix or os.environ.get("BRAID_FR_DUMP_FILE") or DEFAULT_PREFIX
    return _C().fr_dump(prefix)


def install_signal_handler(signum=signal.SIGUSR1, prefix=None):
    """Dumps when the process receives `signum` (main thread only, as every
    Python signal handler; it runs once the main thread is back in Python)."""
    previous = signal.getsignal(signum)

    def handler(sig, frame):
        path = dump(prefix)
        print(f"braid: flight recorder dumped to {path}", file=sys.stderr)
        if callable(previous):
            previous(sig, frame)

    signal.signal(signum, handler)


def _dump_at_exit():
    # BRAID_FR_DUMP_ON_EXIT (registered by torch_braid's import)
    if not enabled() or not os.environ.get("BRAID_FR_DUMP_FILE"):
        return
    try:
        dump()
    except Exception as e:  # exit must go on
        print(f"braid: flight recorder dump at exit failed: {e}", file=sys.stderr)


# ---------------------------------------------------------------------------
# Reading dumps and the diagnosis (plain Python over the pickles).

_RANK_SUFFIX = re.compile(r"(\d+)$")


def load(directory):
    """{rank: dump} for every flight-recorder pickle in `directory` (files
    whose names end in the rank, as torch's and braid's dumps are named)."""
    dumps = {}
    for name in sorted(os.listdir(directory)):
        m = _RANK_SUFFIX.search(name)
        path = os.path.join(directory, name)
        if not m or not os.path.isfile(path):
            continue
        try:
            with open(path, "rb") as f:
                d = pickle.load(f)
        except Exception:
            continue
        if not isinstance(d, dict) or "entries" not in d or "pg_config" not in d:
            continue
        rank = d.get("rank", int(m.group(1)))
        dumps[int(rank)] = d
    return dumps


def _ranks_of(cfg):
    r = cfg.get("ranks", "[]")
    return list(ast.literal_eval(r) if isinstance(r, str) else r)


def _op_text(e):
    if e is None:
        return "-"
    sizes = e.get("input_sizes") or []
    dtypes = e.get("input_dtypes") or []
    shape = ", ".join(f"{list(s)} {d}" for s, d in zip(sizes, dtypes))
    return f"{e['profiling_name']}({shape})"


def _seq(e):
    return e["p2p_seq_id"] if e.get("is_p2p") else e["collective_seq_id"]


def diagnose(dumps):
    """Per group, from {rank: dump}: each rank's progress and what is wrong.

    Returns a list of dicts, one per group:
      name, desc, ranks, dumped (ranks with a dump), progress
      ({rank: {scheduled, started, completed, last}}), stuck (the first
      collective sequence number not completed everywhere, or None), op
      (its profiling name), arrived / missing (ranks that have / have no entry
      for it), behind (ranks whose last scheduled collective is below the
      others'), mismatch ({rank: op text} where ranks disagree on the op at a
      sequence number), p2p (unfinished send/recv entries)."""
    groups = {}
    for rank, d in dumps.items():
        for name, cfg in d.get("pg_config", {}).items():
            g = groups.setdefault(name, {"name": name, "desc": cfg.get("desc", "undefined"),
                                         "ranks": _ranks_of(cfg)})
            if not g["ranks"]:
                g["ranks"] = _ranks_of(cfg)
    out = []
    for name, g in groups.items():
        members = g["ranks"] or sorted(dumps)
        dumped = [r for r in members if r in dumps]
        coll = {r: [e for e in dumps[r]["entries"]
                    if e["process_group"][0] == name and not e.get("is_p2p")] for r in dumped}
        p2p = {r: [e for e in dumps[r]["entries"]
                   if e["process_group"][0] == name and e.get("is_p2p")] for r in dumped}
        progress = {}
        for r in dumped:
            es = coll[r]
            last = es[-1] if es else None
            progress[r] = {
                "scheduled": max((e["collective_seq_id"] for e in es), default=0),
                "started": max((e["collective_seq_id"] for e in es
                                if e["state"] in ("started", "completed")), default=0),
                "completed": max((e["collective_seq_id"] for e in es
                                  if e["state"] == "completed"), default=0),
                "first": min((e["collective_seq_id"] for e in es), default=0),
                "last": last,
            }
        by_seq = {r: {e["collective_seq_id"]: e for e in coll[r]} for r in dumped}
        top = max((p["scheduled"] for p in progress.values()), default=0)
        done = min((p["completed"] for p in progress.values()), default=0)
        stuck, op, arrived, missing, mismatch = None, None, [], [], {}
        for seq in range(done + 1, top + 1):
            here = {r: by_seq[r][seq] for r in dumped if seq in by_seq[r]}
            # a rank whose buffer starts after seq says nothing about it
            absent = [r for r in dumped if seq not in by_seq[r] and progress[r]["first"] <= seq]
            names = {e["profiling_name"] for e in here.values()}
            shapes = {repr(e.get("input_sizes")) for e in here.values()}
            if len(names) > 1 or len(shapes) > 1:
                mismatch = {r: _op_text(e) for r, e in here.items()}
            if absent or any(e["state"] != "completed" for e in here.values()) or mismatch:
                stuck, arrived, missing = seq, sorted(here), sorted(absent)
                op = next(iter(here.values()))["profiling_name"] if here else None
                break
        behind = sorted(r for r in dumped if progress[r]["scheduled"] < top)
        pending = [(r, e) for r in dumped for e in p2p[r] if e["state"] != "completed"]
        out.append(dict(g, members=members, dumped=dumped,
                        no_dump=[r for r in members if r not in dumps], progress=progress,
                        top=top, stuck=stuck, op=op, arrived=arrived, missing=missing,
                        behind=behind, mismatch=mismatch,
                        stuck_entries={r: by_seq[r].get(stuck) for r in dumped} if stuck else {},
                        p2p=pending))
    return out


def _ranks_text(rs):
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def format_diagnosis(dumps, directory=""):
    lines = [f"braid flight recorder: {len(dumps)} dump(s)"
             + (f" in {directory}" if directory else "")
             + f" (ranks {', '.join(str(r) for r in sorted(dumps))})"]
    for g in diagnose(dumps):
        desc = f" ({g['desc']})" if g["desc"] not in ("", "undefined") else ""
        lines.append("")
        lines.append(f"group {g['name']}{desc}, ranks {g['members']}")
        lines.append("  rank  scheduled  started  completed  last collective")
        for r in g["dumped"]:
            p = g["progress"][r]
            last = p["last"]
            lt = f"#{last['collective_seq_id']} {_op_text(last)} {last['state']}" if last else "-"
            lines.append(f"  {r:<4}  {p['scheduled']:<9}  {p['started']:<7}  "
                         f"{p['completed']:<9}  {lt}")
        for r in g["no_dump"]:
            lines.append(f"  {r:<4}  (no dump)")
        if g["stuck"] is None:
            lines.append(f"  OK: every rank completed collective #{g['top']}"
                         if g["top"] else "  no collectives recorded")
        else:
            seq = g["stuck"]
            e0 = next((e for e in g["stuck_entries"].values() if e), None)
            timeout = f", timeout {e0['timeout_ms']} ms" if e0 else ""
            lines.append(f"  STUCK at collective #{seq} {g['op'] or '?'}{timeout}:")
            if g["mismatch"]:
                lines.append("    ranks disagree on the op:")
                for r, t in sorted(g["mismatch"].items()):
                    lines.append(f"      rank {r}: {t}")
            states = {}
            for r in g["arrived"]:
                states.setdefault(g["stuck_entries"][r]["state"], []).append(r)
            for st, rs in sorted(states.items()):
                what = {"started": "started it and never completed it (waited for the others)",
                        "scheduled": "issued it but never started it (an earlier op held them)",
                        "completed": "completed it"}.get(st, st)
                lines.append(f"    {_ranks_text(rs)} {what}")
            if g["missing"]:
                lines.append(f"    {_ranks_text(g['missing'])} never arrived:")
                for r in g["missing"]:
                    last = g["progress"][r]["last"]
                    where = (f"last collective #{last['collective_seq_id']} {_op_text(last)} "
                             f"{last['state']}") if last else "no collective recorded"
                    lines.append(f"      rank {r}: {where}")
            if g["no_dump"]:
                lines.append(f"    {_ranks_text(g['no_dump'])}: no dump (dead, hung, or no "
                             f"BRAID_FR_DUMP_FILE there); others waited for it at #{seq}")
        if g["behind"]:
            lines.append(f"  BEHIND: {_ranks_text(g['behind'])} (last scheduled "
                         + ", ".join(f"#{g['progress'][r]['scheduled']}" for r in g["behind"])
                         + f"; the others reached #{g['top']})")
        for r, e in g["p2p"]:
            lines.append(f"  unfinished p2p on rank {r}: p2p #{e['p2p_seq_id']} "
                         f"{_op_text(e)} {e['state']}")
    return "\n".join(lines)


def export_torch(dumps, out_dir, backend="gloo"):
    """Copies of the dumps whose profiling names read `<backend>:` instead of
    `braid:`: torch's `torchfrtrace` matches ops only for the backends it
    knows (nccl, gloo, ...)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for rank, d in dumps.items():
        d = dict(d)
        d["entries"] = [dict(e, profiling_name=re.sub(r"^braid:", backend + ":",
                                                      e["profiling_name"]))
                        for e in d["entries"]]
        path = os.path.join(out_dir, f"braid_fr_rank_{rank}")
        with open(path, "wb") as f:
            pickle.dump(d, f)
        paths.append(path)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m torch_braid.fr",
        description="Reads every rank's braid flight-recorder dump in DIR and says which rank "
                    "is behind, on which op and sequence number, and which ranks never arrived.")
    ap.add_argument("dir", help="folder with the dumps (<prefix><rank>)")
    ap.add_argument("--export-torch", metavar="OUT",
                    help="also write copies that torch's torchfrtrace analyses (names gloo:...)")
    args = ap.parse_args(argv)
    dumps = load(args.dir)
    if not dumps:
        print(f"no flight-recorder dumps in {args.dir}", file=sys.stderr)
        return 1
    print(format_diagnosis(dumps, args.dir))
    if args.export_torch:
        export_torch(dumps, args.export_torch)
        print(f"\ntorch-readable copies in {args.export_torch}: torchfrtrace {args.export_torch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

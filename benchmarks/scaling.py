#!/usr/bin/env python3
r"""Scaling benchmark: braid and gloo collectives against the number of ranks on one host.

    /usr/bin/python3 benchmarks/scaling.py --nprocs 2,4,8 --sizes 4,64K,16M --ops allreduce \
        --repeats 2 --json results/scaling.json --plot results/scaling.png
    ... --nprocs 2,4,8,12,16,32 --ops allreduce,broadcast,allgather,reduce_scatter \
        --sizes 4,64K,16M,64M --coresident-at 8 --budget-s 220     # tools/scaling_check.sh
    ... --pin                # rank r on CPU r % ncpus (collectives.py --pin); the output says so
    ... --child-args "--env BRAID_X=1"   # more options for every collectives.py job

Each world size n is measured by benchmarks/collectives.py jobs, run one after another as
children: `--nprocs n --backends braid` and `--nprocs n --backends gloo`, so each backend runs
alone in its own set of processes (no idle group of the other backend, no threads of the other
backend's, in the ranks); --coresident-at n adds a job `--backends braid,gloo` at n, in which
both groups live in the same processes and take turns (collectives.py's own mode), labelled
"co" (Note [Co-residence]). The jobs alternate in time (Note [Alternation]) and the sweep is
repeated --repeats times, so each figure has a spread.

Definitions (those of collectives.py, i.e. nccl-tests'): S = message size in bytes (the total
size for allgather and reduce_scatter); algbw = S / t; busbw = algbw * 2(n-1)/n for allreduce,
(n-1)/n for allgather and reduce_scatter, 1 for broadcast; 1 GB = 1e9 B. A job's t at a point is
collectives.py's: the median over --rounds timed blocks of the mean over ranks of each rank's
average time per call. Here t is the median of that over the repeats; spread = (max - min) /
median over the repeats, in percent (blank with one repeat). roofline(n) = the concurrent
per-rank memcpy rate: every one of the n ranks copies --memcpy-bytes (torch copy_, 1 thread,
best of 5) at the same moment, and the rate is the mean over ranks; collectives.py measures it
at the start and the end of every job, and roofline(n) is the median of these over the n-rank
jobs of this run. %roof = busbw / roofline(n). gloo/braid = gloo's t / braid's t (> 1: braid is
faster); co/alone = braid's t in the co-resident job / braid's t alone. A time with * is gloo's
reduce_scatter emulated by all_reduce + copy (torch 1.13's gloo has none).

Note [Alternation]
On a shared machine the speed available drifts within seconds; a backend measured only after the
other would take the drift for a difference. Within each repeat the world sizes run in order, and
at the i-th world size of repeat k braid goes first when i + k is even, gloo otherwise; the
repeats are the outer loop, so the repeats of one point are spread over the whole run rather than
taken back to back.

Note [Co-residence]
A job running both backends in the same ranks measures what a program that keeps a gloo group
beside braid's pays: gloo's threads and its idle group share the cores with braid's. The target
asks braid there to stay within 1.5x of braid alone (co/alone). Points of that job are timed with
collectives.py's alternating rounds (its Note [Rounds]).

Note [Oversubscription]
World sizes above the number of CPUs this process may use run all the same and are labelled
"oversubscribed" (so are their targets): then ranks wait for a core, and spin-waiting transports
lose most. --pin places rank r on CPU r % ncpus, so two ranks share a core rather than migrate.

Note [Budget]
--budget-s bounds the whole run: a job whose expected time (the last job at that world size, else
the previous world size's scaled by the ratio of ranks) does not fit in what is left is not
started, and a running job is stopped when the budget runs out; both are listed as "not
measured (budget)", which is not a failure. The repeats are the outer loop, so the budget drops
repeats before world sizes. A job that fails (exit code, wrong result, --job-timeout) fails the
run: exit 3, after writing what was measured. The JSON is rewritten after every job.

Note [Targets]
Issue 30's targets, set for the 16-core machine with each backend alone; here evaluated on
whatever machine runs this, and printed as met / NOT met / n/a with the machine's CPU count (they
say nothing where the world size exceeds the cores): at 16 ranks, 4 B allreduce at most 2x
braid's own 2-rank time and at least 25x faster than gloo; allreduce busbw at 16 and 64 MiB at
least 100% of roofline(16); allgather, reduce_scatter and broadcast at 64 KiB and up at least
70%; co-resident with a gloo group within 1.5x of alone at 8 and 16 ranks (every point).
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)

import _bench_common as bc  # noqa: E402
import collectives as coll  # noqa: E402  (imports no torch in this process)

COLL = os.path.join(_HERE, "collectives.py")
SCALING_OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter")
ALONE = ("braid", "gloo")
CO = "braid,gloo"
TABLE_RESERVE_S = 15  # what --budget-s keeps for the table, JSON and plot
SCHEMA = "braid-bench-scaling/1"


# ---- the jobs ------------------------------------------------------------------------------------
def plan_jobs(args):
    """[(repeat, n, mode, backends)] in run order (Note [Alternation])."""
    jobs = []
    for k in range(args.repeats):
        for i, n in enumerate(args.nprocs):
            order = ALONE if (i + k) % 2 == 0 else ALONE[::-1]
            jobs += [(k, n, "alone", be) for be in order]
            if n in args.coresident_at:
                jobs.append((k, n, "coresident", CO))
    return jobs


def job_cmd(args, n, backends, json_path):
    cmd = [sys.executable, COLL, "--nprocs", str(n), "--backends", backends,
           "--ops", ",".join(args.ops), "--sizes", ",".join(bc.fmt_size(s) for s in args.sizes),
           "--dtypes", args.dtype, "--rounds", str(args.rounds),
           "--time-per-point", str(args.time_per_point), "--settle-ms", str(args.settle_ms),
           "--memcpy-bytes", bc.fmt_size(args.memcpy_bytes), "--no-accuracy", "--no-progress",
           "--timeout", str(args.pg_timeout), "--json", json_path]
    return cmd + (["--pin"] if args.pin else []) + shlex.split(args.child_args)


def expected_s(done, n):
    """Note [Budget]: the last job's time at n, else the nearest smaller n's scaled by ranks."""
    same = [j["wall_s"] for j in done if j["n"] == n and j["status"] == "ok"]
    if same:
        return same[-1]
    smaller = [j for j in done if j["n"] < n and j["status"] == "ok"]
    if smaller:
        j = max(smaller, key=lambda j: (j["n"], j["index"]))
        return j["wall_s"] * n / j["n"]
    return 0.0


def run_job(args, index, rep, n, mode, backends, tmp, deadline):
    """One collectives.py job; its record (status ok | failed | timeout | budget)."""
    tag = f"n{n}-{'co' if mode == 'coresident' else backends}-r{rep}"
    js = os.path.join(tmp, f"{tag}.json")
    log = os.path.join(args.log_dir or tmp, f"{tag}.log")
    job = dict(index=index, repeat=rep, n=n, mode=mode, backends=backends, log=log)
    limit = args.job_timeout
    if deadline is not None:
        limit = min(limit, max(deadline - time.monotonic(), 1.0))
    t0 = time.monotonic()
    with open(log, "w") as out:
        # The launcher dies with this process (and its ranks with the launcher), however it ends.
        p = subprocess.Popen(job_cmd(args, n, backends, js), stdout=out,
                             stderr=subprocess.STDOUT, preexec_fn=bc._die_with_parent)
        try:
            rc = p.wait(limit)
        except subprocess.TimeoutExpired:
            p.kill()  # the ranks follow (PR_SET_PDEATHSIG)
            p.wait()
            rc = None
    job["wall_s"] = time.monotonic() - t0
    job["rc"] = rc
    if rc is None:
        by_budget = limit < args.job_timeout
        job["status"] = "budget" if by_budget else "timeout"
        job["error"] = (f"stopped: the budget ran out after {job['wall_s']:.0f} s" if by_budget
                        else f"timed out after {args.job_timeout:.0f} s (--job-timeout)")
    elif rc != 0:
        job["status"] = "failed"
        with open(log, errors="replace") as f:
            said = [ln.strip() for ln in f if ln.startswith("bench: ")]
        job["error"] = f"exit {rc}" + (f": {said[-1][len('bench: '):]}" if said else "")
    else:
        try:
            with open(js) as f:
                job["report"] = json.load(f)
            job["status"] = "ok"
        except (OSError, ValueError) as e:
            job["status"], job["error"] = "failed", f"exit 0 but no JSON: {e!r}"
    return job


def run_sweep(args, save_partial):
    deadline = time.monotonic() + args.budget_s - TABLE_RESERVE_S if args.budget_s else None
    plan, done = plan_jobs(args), []
    with tempfile.TemporaryDirectory(prefix="braid-scaling-") as tmp:
        for index, (rep, n, mode, backends) in enumerate(plan):
            what = f"n={n} {'co-resident ' + backends if mode == 'coresident' else backends}"
            what += f" (repeat {rep + 1}/{args.repeats})"
            if deadline is not None:
                left = deadline - time.monotonic()
                if expected_s(done, n) > left or left < 1:
                    done.append(dict(index=index, repeat=rep, n=n, mode=mode, backends=backends,
                                     status="budget", wall_s=0.0, rc=None,
                                     error=f"not started: {left:.0f} s left of the budget"))
                    log_line(args, f"[{index + 1}/{len(plan)}] {what}: not started (budget)")
                    continue
            job = run_job(args, index, rep, n, mode, backends, tmp, deadline)
            done.append(job)
            log_line(args, f"[{index + 1}/{len(plan)}] {what}: {job['status']} in "
                           f"{job['wall_s']:.1f} s" + (f": {job['error']}" if job.get("error")
                                                       else ""))
            if job["status"] in ("failed", "timeout"):
                with open(job["log"], errors="replace") as f:
                    tail = f.read()[-3000:]
                print(f"# log of the failed job ({job['log']}):\n{tail}", file=sys.stderr)
            save_partial(done)
    return done


def log_line(args, text):
    if not args.quiet:
        print(f"# {text}", file=sys.stderr, flush=True)


# ---- aggregation ---------------------------------------------------------------------------------
def label_of(job, backend):
    return backend if job["mode"] == "alone" else f"{backend} (co)"


def mean_concurrent(m):
    return statistics.mean(m["concurrent_per_rank_GBps"])


def aggregate(args, jobs, cores):
    """(worlds: {n: ...}, cells: {(n, op, size, label): ...}) from the jobs that ran."""
    worlds, samples = {}, {}
    for n in args.nprocs:
        ok = [j for j in jobs if j["n"] == n and j["status"] == "ok"]
        runs = [j["report"]["runs"][0] for j in ok]
        conc = [mean_concurrent(r[k]) for r in runs for k in ("memcpy_before", "memcpy_after")]
        single = [r[k]["single_rank_GBps"] for r in runs for k in ("memcpy_before",
                                                                   "memcpy_after")]
        pinned = [j["report"]["meta"].get("pinned_cpus") for j in ok]
        worlds[n] = dict(
            ranks=n, cores=cores, oversubscribed=n > cores, jobs_ok=len(ok),
            jobs_not_measured=[f"{j['backends']} repeat {j['repeat'] + 1}: {j['status']}"
                               for j in jobs if j["n"] == n and j["status"] != "ok"],
            roofline_GBps=statistics.median(conc) if conc else None,
            roofline_min_GBps=min(conc) if conc else None,
            roofline_max_GBps=max(conc) if conc else None,
            single_rank_memcpy_GBps=statistics.median(single) if single else None,
            pinned_cpus=next((p for p in pinned if p), None))
        for j, run in zip(ok, runs):
            for r in run["results"]:
                key = (n, r["op"], r["requested_bytes"], label_of(j, r["backend"]))
                samples.setdefault(key, []).append(r)
    cells = {}
    for key, rs in samples.items():
        n, op = key[0], key[1]
        good = [r for r in rs if r["status"] == "ok"]
        if not good:
            cells[key] = dict(status=rs[0]["status"], error=rs[0].get("error", ""),
                              bytes=rs[0].get("bytes", 0))
            continue
        times = [r["time_us"] for r in good]
        t = statistics.median(times)
        cell = dict(status="ok", repeats=len(times), time_us=t, times_us=times,
                    spread=(max(times) - min(times)) / t if len(times) > 1 else None,
                    bytes=good[0]["bytes"], emulated=any(r.get("emulated") for r in good))
        factor = coll.busbw_factor(op, n)
        if factor is not None and cell["bytes"]:
            cell["busbw_GBps"] = cell["bytes"] / (t * 1e-6) / 1e9 * factor
            roof = worlds[n]["roofline_GBps"]
            cell["frac_roofline"] = cell["busbw_GBps"] / roof if roof else None
        cells[key] = cell
    return worlds, cells


# ---- targets (Note [Targets]) --------------------------------------------------------------------
def evaluate_targets(args, worlds, cells):
    def ok(n, op, size, label):
        c = cells.get((n, op, size, label))
        return c if c and c["status"] == "ok" else None

    def why_na(n, *points):
        if n not in worlds:
            return f"{n} ranks not in this sweep"
        missing = [f"{op} {bc.fmt_size(s)}B {lb}" for op, s, lb in points
                   if not ok(n, op, s, lb)]
        return "not measured: " + ", ".join(missing) if missing else None

    out = []

    def add(target, point, n, value, thr, rel, na=None):
        if na is None:
            met = value <= thr if rel == "<=" else value >= thr
        out.append(dict(target=target, point=point, ranks=n, value=None if na else value,
                        threshold=thr, rel=rel, met=None if na else met, why=na,
                        oversubscribed=bool(worlds.get(n, {}).get("oversubscribed"))))

    w = "4 B allreduce at 16 ranks: braid time / braid's 2-rank time"
    na = why_na(16, ("allreduce", 4, "braid")) or why_na(2, ("allreduce", 4, "braid"))
    add(w, "allreduce 4B", 16, None if na else
        ok(16, "allreduce", 4, "braid")["time_us"] / ok(2, "allreduce", 4, "braid")["time_us"],
        2.0, "<=", na)
    w = "4 B allreduce at 16 ranks: gloo time / braid time"
    na = why_na(16, ("allreduce", 4, "braid"), ("allreduce", 4, "gloo"))
    add(w, "allreduce 4B", 16, None if na else
        ok(16, "allreduce", 4, "gloo")["time_us"] / ok(16, "allreduce", 4, "braid")["time_us"],
        25.0, ">=", na)
    for op, sizes, thr in (("allreduce", [16 << 20, 64 << 20], 1.0),
                           ("allgather", None, 0.7), ("reduce_scatter", None, 0.7),
                           ("broadcast", None, 0.7)):
        pts = sizes or [s for s in args.sizes if s >= 64 << 10] or [64 << 10]
        w = f"{op} busbw at 16 ranks / roofline(16)"
        if op not in args.ops or 16 not in worlds:  # one line, not one per size
            what = f"{op} {','.join(bc.fmt_size(s) for s in (sizes or [64 << 10]))}B" + \
                ("" if sizes else " and up")
            add(w, what, 16, None, thr, ">=", "not in --ops" if op not in args.ops
                else "16 ranks not in this sweep")
            continue
        for s in pts:
            na = why_na(16, (op, s, "braid"))
            if na is None and not worlds[16]["roofline_GBps"]:
                na = "no memcpy measurement at 16 ranks"
            add(w, f"{op} {bc.fmt_size(s)}B", 16,
                None if na else ok(16, op, s, "braid")["frac_roofline"], thr, ">=", na)
    for n in (8, 16):
        w = f"co-resident with gloo at {n} ranks: braid time co / alone (worst point)"
        if n not in args.coresident_at or n not in worlds:
            add(w, "every point", n, None, 1.5, "<=",
                f"no co-resident job at {n} ranks (--coresident-at)")
            continue
        ratios = []
        for (m, op, s, lb), c in cells.items():
            if m == n and lb == "braid (co)" and c["status"] == "ok" and ok(n, op, s, "braid"):
                ratios.append((c["time_us"] / ok(n, op, s, "braid")["time_us"], op, s))
        if not ratios:
            add(w, "every point", n, None, 1.5, "<=", "no point measured both ways")
            continue
        v, op, s = max(ratios)
        add(w, f"{op} {bc.fmt_size(s)}B (worst of {len(ratios)})", n, v, 1.5, "<=")
    return out


def format_targets(targets, cores):
    lines = [f"\n# Targets (issue 30; set for the 16-core machine, each backend alone; this "
             f"machine: {cores} CPU(s), so ranks above {cores} are oversubscribed):"]
    for t in targets:
        head = f"  {t['target']}: {t['point']}: "
        if t["met"] is None:
            lines.append(head + f"n/a ({t['why']})")
            continue
        pct = "roofline" in t["target"]
        v = f"{100 * t['value']:.0f}%" if pct else f"{t['value']:.2f}"
        thr = f"{100 * t['threshold']:.0f}%" if pct else f"{t['threshold']:g}"
        note = " (oversubscribed)" if t["oversubscribed"] else ""
        lines.append(head + f"{v} (target {t['rel']} {thr}): "
                     f"{'met' if t['met'] else 'NOT met'}{note}")
    return "\n".join(lines)


# ---- output --------------------------------------------------------------------------------------
def fmt_time(c):
    if c is None:
        return ["-", ""]
    if c["status"] != "ok":
        return ["n/a" if c["status"] == "unsupported" else c["status"], ""]
    sp = f"{100 * c['spread']:.0f}" if c.get("spread") is not None else ""
    return [f"{c['time_us']:.1f}" + ("*" if c.get("emulated") else ""), sp]


def fmt_bw(c):
    if not c or c["status"] != "ok" or "busbw_GBps" not in c:
        return ["", ""]
    roof = c.get("frac_roofline")
    return [f"{c['busbw_GBps']:.3f}", f"{100 * roof:.0f}" if roof is not None else ""]


def format_tables(args, worlds, cells, cores):
    have_co = any(lb == "braid (co)" for (_, _, _, lb) in cells)
    head = [("", ["ranks", "op", "size"])]
    for lb in ALONE:
        head.append((lb, ["time(us)", "+-%", "busbw", "%roof"]))
    head.append(("", ["gloo/braid"]))
    if have_co:
        head.append(("braid beside gloo", ["time(us)", "+-%", "co/alone"]))
    rows = []
    for n in args.nprocs:
        for op in args.ops:
            for s in args.sizes:
                got = {lb: cells.get((n, op, s, lb)) for lb in ALONE + ("braid (co)",)}
                if not any(got.values()):
                    continue
                b, g = got["braid"], got["gloo"]
                row = [f"{n}{'!' if worlds[n]['oversubscribed'] else ''}", op, bc.fmt_size(s)]
                for c in (b, g):
                    row += fmt_time(c) + fmt_bw(c)
                both = b and g and b["status"] == g["status"] == "ok"
                row.append(f"{g['time_us'] / b['time_us']:.2f}" if both else "-")
                if have_co:
                    co = got["braid (co)"]
                    row += fmt_time(co) if co else ["", ""]
                    row.append(f"{co['time_us'] / b['time_us']:.2f}"
                               if co and b and co["status"] == b["status"] == "ok" else "")
                rows.append(row)
    notes = ["! = oversubscribed: more ranks than the CPUs this run may use "
             f"({cores}); +-% = (max - min) / median over the repeats",
             "%roof = busbw / roofline(n), the concurrent per-rank memcpy rate below"]
    if any(c.get("emulated") for c in cells.values()):
        notes.append("* gloo's reduce_scatter emulated by all_reduce + copy")
    errs = sorted({f"{lb}: {op}: {c['error'][:160]}" for (n, op, s, lb), c in cells.items()
                   if c["status"] not in ("ok", "skipped") and c.get("error")})
    notes += errs
    pinned = any(w["pinned_cpus"] for w in worlds.values())
    title = (f"\n# scaling: {args.dtype}, ranks pinned to CPUs: "
             f"{'yes (rank r on CPU r % ' + str(cores) + ')' if pinned else 'no'} (braid binds "
             f"its own where they outnumber the CPUs: BRAID_PIN_RANKS="
             f"{os.environ.get('BRAID_PIN_RANKS', 'auto')}); "
             f"{cores} CPU(s); repeats {args.repeats}")
    table = bc.render_table(title, head, rows, notes)
    whead = [("", ["ranks", "cores", "oversubscribed", "roofline GB/s/rank", "min", "max",
                   "1-rank memcpy", "jobs ok", "not measured"])]
    wrows = []
    for n in args.nprocs:
        w = worlds[n]
        f = (lambda v: f"{v:.2f}" if v is not None else "-")
        wrows.append([str(n), str(cores), "yes" if w["oversubscribed"] else "no",
                      f(w["roofline_GBps"]), f(w["roofline_min_GBps"]),
                      f(w["roofline_max_GBps"]), f(w["single_rank_memcpy_GBps"]),
                      str(w["jobs_ok"]), "; ".join(w["jobs_not_measured"]) or "-"])
    wt = bc.render_table(f"\n# world sizes: roofline(n) = every rank's {bc.fmt_size(args.memcpy_bytes)}B "
                         "torch copy_ at once, GB/s per rank (median over the jobs)",
                         whead, wrows)
    return wt + "\n" + table


def write_plot(path, args, worlds, cells, cores):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    big = [s for s in args.sizes if s >= 1 << 20] or [max(args.sizes)]
    small = min(args.sizes)
    panels = [("allreduce", "time")] if "allreduce" in args.ops else []
    panels += [(op, "busbw") for op in args.ops]
    cols = 2
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12, 3.8 * rows), squeeze=False)
    colors = {"braid": "tab:blue", "gloo": "tab:orange", "braid (co)": "tab:green",
              "gloo (co)": "tab:red"}
    styles = ["-", "--", ":", "-."]
    ns = args.nprocs
    for ax, (op, kind) in zip(axes.flat, panels):
        sizes = [small] if kind == "time" else big
        for lb in colors:
            for si, s in enumerate(sizes):
                pts = [(n, cells[(n, op, s, lb)]) for n in ns if (n, op, s, lb) in cells
                       and cells[(n, op, s, lb)]["status"] == "ok"]
                if kind == "busbw":
                    pts = [(n, c) for n, c in pts if "busbw_GBps" in c]
                if not pts:
                    continue
                x = [n for n, _ in pts]
                if kind == "time":
                    y = [c["time_us"] for _, c in pts]
                    lo = [c["time_us"] - min(c["times_us"]) for _, c in pts]
                    hi = [max(c["times_us"]) - c["time_us"] for _, c in pts]
                else:
                    y = [c["busbw_GBps"] for _, c in pts]
                    lo = [c["busbw_GBps"] - c["bytes"] / max(c["times_us"]) * 1e-3 *
                          coll.busbw_factor(op, n) for n, c in pts]
                    hi = [c["bytes"] / min(c["times_us"]) * 1e-3 * coll.busbw_factor(op, n) -
                          c["busbw_GBps"] for n, c in pts]
                yerr = [[max(v, 0.0) for v in lo], [max(v, 0.0) for v in hi]]  # rounding
                ax.errorbar(x, y, yerr=yerr, marker="o", ms=4, capsize=3,
                            color=colors[lb], ls=styles[si % len(styles)],
                            label=f"{lb} {bc.fmt_size(s)}B")
        if kind == "busbw":
            rf = [(n, worlds[n]["roofline_GBps"]) for n in ns if worlds[n]["roofline_GBps"]]
            if rf:
                ax.plot([n for n, _ in rf], [v for _, v in rf], color="gray", ls=":", marker="s",
                        ms=3, label="roofline: memcpy per rank, all at once")
            ax.set_ylabel("busbw (GB/s)")
            ax.set_title(f"{op}: bus bandwidth vs ranks")
        else:
            ax.set_yscale("log")
            ax.set_ylabel("time per op (us)")
            ax.set_title(f"{op} {bc.fmt_size(small)}B: latency vs ranks")
        if max(ns) > cores:
            ax.axvspan(cores * 1.15, max(ns) * 1.05, color="gray",
                       alpha=0.12, label=f"oversubscribed (> {cores} CPUs)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.set_xlabel("ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    pinned = any(w["pinned_cpus"] for w in worlds.values())
    fig.suptitle(f"braid and gloo against ranks, each alone (co: braid beside gloo in the same "
                 f"processes); {cores} CPUs, ranks {'pinned' if pinned else 'not pinned'}, "
                 f"{args.repeats} repeat(s), error bars min..max", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report_of(args, jobs, cores, worlds=None, cells=None, targets=None):
    meta = next((j["report"]["meta"] for j in jobs if j["status"] == "ok"), {})
    keep = ("hostname", "cpu", "cpu_count", "python", "torch", "braid_info")
    out = {"schema": SCHEMA,
           "meta": dict({k: meta[k] for k in keep if k in meta}, cpus_usable=cores,
                        pinned=bool(args.pin), nprocs=args.nprocs, ops=args.ops,
                        sizes=args.sizes, dtype=args.dtype, repeats=args.repeats,
                        coresident_at=args.coresident_at, budget_s=args.budget_s,
                        time_stat="median over repeats of collectives.py's time (median over "
                                  "rounds of the mean over ranks)", gb=1e9,
                        args={k: v for k, v in vars(args).items()}),
           "jobs": [job_record(j) for j in jobs]}
    if worlds is not None:
        out["worlds"] = [worlds[n] for n in args.nprocs]
        out["points"] = [dict(ranks=n, op=op, requested_bytes=s, backend=lb, **c)
                         for (n, op, s, lb), c in sorted(cells.items())]
        out["targets"] = targets
    return out


def job_record(job):
    """A job for the JSON: how it ran, and what its collectives.py report measured."""
    out = {k: v for k, v in job.items() if k != "report"}
    if "report" in job:
        run = job["report"]["runs"][0]
        out.update(memcpy_before=run["memcpy_before"], memcpy_after=run["memcpy_after"],
                   pinned_cpus=job["report"]["meta"].get("pinned_cpus"), results=run["results"])
    return out


def write_json(path, report):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, path)


# ---- entry point ---------------------------------------------------------------------------------
def int_list(text):
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1].split("\nNote [")[0])
    p.add_argument("--nprocs", default="2,4,8", help="world sizes, comma list (default 2,4,8)")
    p.add_argument("--ops", default="allreduce",
                   help=f"comma list of {','.join(SCALING_OPS)} (default allreduce)")
    p.add_argument("--sizes", default="4,64K,16M", help="message sizes (default 4,64K,16M)")
    p.add_argument("--dtype", default="fp32", help="fp32 (default), bf16, fp16 or int32")
    p.add_argument("--repeats", type=int, default=2,
                   help="times the whole sweep runs (Note [Alternation]; default 2)")
    p.add_argument("--coresident-at", default="",
                   help="world sizes that also get a braid,gloo job in the same processes "
                        "(Note [Co-residence]; default none)")
    p.add_argument("--pin", action="store_true",
                   help="pin rank r to CPU r %% ncpus in every job (collectives.py --pin)")
    p.add_argument("--rounds", type=int, default=3, help="collectives.py --rounds (3)")
    p.add_argument("--time-per-point", type=float, default=0.1,
                   help="collectives.py --time-per-point, seconds (0.1)")
    p.add_argument("--settle-ms", type=float, default=20, help="collectives.py --settle-ms (20)")
    p.add_argument("--memcpy-bytes", default="64M",
                   help="per rank, for the roofline (64M; every rank holds two such buffers)")
    p.add_argument("--pg-timeout", type=float, default=120,
                   help="process group timeout of each job, seconds")
    p.add_argument("--job-timeout", type=float, default=600,
                   help="a job running longer fails the run, seconds (600)")
    p.add_argument("--budget-s", type=float, default=0,
                   help="fit the whole run into this many seconds (Note [Budget]; 0: no limit)")
    p.add_argument("--child-args", default="", help="more collectives.py options for every job")
    p.add_argument("--log-dir", default=None, help="keep each job's output here")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="PNG: latency and busbw against ranks")
    p.add_argument("--table", default=None, help="also write the printed tables to this file")
    p.add_argument("--quiet", action="store_true", help="no line per job on stderr")
    args = p.parse_args(argv)
    try:
        args.nprocs = sorted(set(int_list(args.nprocs)))
        args.coresident_at = sorted(set(int_list(args.coresident_at)))
        args.sizes = [bc.parse_size(s) for s in args.sizes.split(",") if s.strip()]
        args.memcpy_bytes = bc.parse_size(args.memcpy_bytes)
    except ValueError as e:
        p.error(str(e))
    args.ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in args.ops:
        if o not in SCALING_OPS:
            p.error(f"unknown op {o!r}; choose from {','.join(SCALING_OPS)}")
    if not args.nprocs or min(args.nprocs) < 2:
        p.error("--nprocs: world sizes of 2 or more")
    if not set(args.coresident_at) <= set(args.nprocs):
        p.error("--coresident-at: each size must be one of --nprocs")
    if args.repeats < 1 or not args.sizes:
        p.error("--repeats >= 1 and at least one size")
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    return args


def main(argv=None):
    args = parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    t0 = time.monotonic()
    over = [n for n in args.nprocs if n > cores]
    log_line(args, f"scaling: ranks {args.nprocs} on {cores} CPU(s)"
             + (f" ({','.join(map(str, over))} oversubscribed)" if over else "")
             + f", pinned: {'yes' if args.pin else 'no'}, {len(plan_jobs(args))} jobs"
             + (f", budget {args.budget_s:.0f} s" if args.budget_s else ""))

    def save_partial(jobs):
        if args.json:
            write_json(args.json, report_of(args, jobs, cores))

    jobs = run_sweep(args, save_partial)
    worlds, cells = aggregate(args, jobs, cores)
    targets = evaluate_targets(args, worlds, cells)
    text = format_tables(args, worlds, cells, cores) + "\n" + format_targets(targets, cores)
    failed = [j for j in jobs if j["status"] in ("failed", "timeout")]
    cut = [j for j in jobs if j["status"] == "budget"]
    text += (f"\n\n# {len(jobs) - len(failed) - len(cut)} of {len(jobs)} jobs measured, "
             f"{len(cut)} not measured (budget), {len(failed)} failed, in "
             f"{time.monotonic() - t0:.0f} s")
    for j in failed:
        text += f"\n# FAILED: n={j['n']} {j['backends']} repeat {j['repeat'] + 1}: {j['error']}"
    print(text, flush=True)
    if args.table:
        os.makedirs(os.path.dirname(os.path.abspath(args.table)), exist_ok=True)
        with open(args.table, "w") as f:
            f.write(text.lstrip("\n") + "\n")
    if args.json:
        write_json(args.json, report_of(args, jobs, cores, worlds, cells, targets))
    if args.plot and any(c["status"] == "ok" for c in cells.values()):
        os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
        write_plot(args.plot, args, worlds, cells, cores)
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

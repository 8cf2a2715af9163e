#!/usr/bin/env python3
"""FSDP2 training throughput: torch.distributed.fsdp.fully_shard on braid and on gloo, side
by side in the same processes (CPU, fp32).

    python3 benchmarks/fsdp.py                       # 2 and 4 ranks, 57M-parameter MLP
    python3 benchmarks/fsdp.py --ranks 2 --rounds 1 --steps 3     # a quick look
    torchrun --nproc-per-node 2 benchmarks/fsdp.py   (one world size)

Model: an MLP of --layers Linear(--width, --width) with Tanh between them (6 x 3072: 56.6M
parameters, 226 MB in fp32), batch --batch per rank, MSE loss, SGD. fully_shard on every
Linear and at the root (reshard_after_forward=True: each layer is all-gathered in forward and
again in backward, and its gradient reduce-scattered), on a DeviceMesh made from the group
under test (DeviceMesh.from_group). A step is forward, backward, optimizer step, zero_grad.

Rows fsdp/braid and fsdp/gloo are rebuilt in each of --rounds rounds, in alternating order
(Note [Rounds] in collectives.py); steps/s = --steps / the slowest rank's time after --warmup
steps, median over rounds. Every round's losses are printed; braid's and gloo's are compared
(at 2 ranks every reduction adds two values: they must be equal bit for bit).

FSDP2 reduces fp32 gradients with ReduceOp.AVG. Where gloo refuses AVG, its row runs with
SUM and a division afterwards (set_force_sum_reduction_for_comms), which the table notes.

torch 2.6's FSDP2 cannot run on CPU: torch.cpu.Stream has no record_event (nor wait_event),
and with both added as no-ops its backward still fails ("modified by an inplace operation").
The run then says so and measures nothing.

Breakdown (--breakdown, default on): the same step's compute alone (the unsharded model, no
communication, all ranks at once), and the collectives alone: per step FSDP2 all-gathers every
layer twice and reduce-scatters it once; these are timed as all_gather_into_tensor and
reduce_scatter_tensor (AVG) of one layer's flat parameters on each group.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.append(os.path.join(os.path.dirname(_HERE), "python"))

import _bench_common as bc  # noqa: E402

torch = dist = None  # imported in the ranks only
PART_ENV = "BENCH_FSDP_PART"
TARGET = ("FSDP2 at 2 ranks: braid vs gloo (steps/s)", 1.3)


def fsdp2_unusable():
    """Why this torch cannot run FSDP2 on CPU, or None."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as e:
        return f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard): {e}"
    if not hasattr(torch.cpu.Stream, "record_event"):
        return (f"torch {torch.__version__}'s FSDP2 does not run on CPU: torch.cpu.Stream has no "
                "record_event, which FSDP2's all-gather calls")
    return None


def make_model(args):
    nn = torch.nn
    torch.manual_seed(0)
    layers = []
    for i in range(args.layers):
        layers.append(nn.Linear(args.width, args.width))
        if i < args.layers - 1:
            layers.append(nn.Tanh())
    return nn.Sequential(*layers)


def batch(step, rank, args):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (torch.randn(args.batch, args.width, generator=g),
            torch.randn(args.batch, args.width, generator=g))


def run_row(group, args, force_sum):
    """(steps/s of the slowest rank, this rank's losses of every step)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = DeviceMesh.from_group(group, "cpu")
    model = make_model(args)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if force_sum:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    rank = dist.get_rank()

    def step(i):
        x, y = batch(i, rank, args)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))

    for i in range(args.warmup):
        step(i)
    bc.control_barrier()
    t0 = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        step(i)
    elapsed = max(bc.gather_floats(time.perf_counter() - t0))
    del model, opt
    gc.collect()
    return args.steps / elapsed, losses


def gloo_needs_force_sum(group):
    """Whether gloo refuses FSDP2's AVG reduce_scatter (then its row reduces with SUM)."""
    out = torch.empty(4)
    try:
        dist.reduce_scatter_tensor(out, torch.ones(4 * dist.get_world_size(group)),
                                   op=dist.ReduceOp.AVG, group=group)
        return False
    except (RuntimeError, ValueError):
        return True


def breakdown(groups, args):
    """Seconds per step: compute alone, and each group's collectives alone."""
    model = make_model(args)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rank = dist.get_rank()

    def compute():
        x, y = batch(0, rank, args)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    compute()
    bc.control_barrier()
    t_compute = max(bc.gather_floats(bc.time_iters(compute, args.steps, bc.control_barrier)))
    del model, opt
    n = dist.get_world_size()
    layer = args.width * args.width + args.width
    shard = -(-layer // n)
    out = {"compute": t_compute}
    for label, group in groups.items():
        full = torch.empty(shard * n)
        part = torch.randn(shard)
        op = dist.ReduceOp.SUM if label == "gloo" and gloo_needs_force_sum(group) else \
            dist.ReduceOp.AVG

        def comms():
            for _ in range(args.layers):
                dist.all_gather_into_tensor(full, part, group=group)
                dist.all_gather_into_tensor(full, part, group=group)
                dist.reduce_scatter_tensor(part, full, op=op, group=group)

        comms()
        out[f"comm/{label}"] = max(bc.gather_floats(bc.time_iters(comms, args.steps,
                                                                    bc.control_barrier)))
    return out


def worker(args):
    global torch, dist
    info = bc.init_worker(timeout_s=args.timeout, threads=args.threads)
    import torch as _torch
    import torch.distributed as _dist

    torch, dist = _torch, _dist
    why = fsdp2_unusable()
    if why:
        if info.rank == 0:
            print(f"bench: {why}", file=sys.stderr)
            out = os.environ.get(PART_ENV)
            if out:
                with open(out, "w") as f:
                    json.dump({"ranks": info.world_size, "unusable": why,
                               "meta": bc.machine_meta()}, f)
        return 0
    load0 = os.getloadavg()[0]
    backends = bc.resolve_backends(args.backends, devices=("cpu",))
    groups = {b.label: dist.new_group(backend=b.name) for b in backends}
    force = {label: label.startswith("gloo") and gloo_needs_force_sum(g)
             for label, g in groups.items()}
    labels = list(groups)
    sps = {label: [] for label in labels}
    losses = {label: [] for label in labels}
    progress = bc.Progress(args.rounds * len(labels), enabled=info.rank == 0 and not args.quiet)
    for rnd in range(args.rounds):
        for label in (labels if rnd % 2 == 0 else labels[::-1]):
            s, l = run_row(groups[label], args, force[label])
            sps[label].append(s)
            losses[label].append(l)
            progress.update(f"round {rnd + 1} {label}")
    progress.clear()
    parts = breakdown(groups, args) if args.breakdown else {}
    all_losses = bc.gather_objects(losses)
    if info.rank == 0:
        part = {"ranks": info.world_size, "steps_per_s": sps, "losses": all_losses,
                "force_sum": force, "breakdown": parts, "meta": bc.machine_meta(),
                "load": [load0, os.getloadavg()[0]],
                "params": sum(p.numel() for p in make_model(args).parameters())}
        out = os.environ.get(PART_ENV)
        if out:
            with open(out, "w") as f:
                json.dump(part, f)
        else:
            report([part], args)
    dist.barrier()
    return 0


def report(parts, args):
    meta = next((p["meta"] for p in parts), {})
    print(f"# torch {meta.get('torch')}, python {meta.get('python')}, {meta.get('cpu_count')} "
          f"CPUs ({meta.get('cpu')}), {meta.get('time')}")
    for p in parts:  # a shared machine: how busy it was while each world size ran
        if p.get("load"):
            print(f"# {p['ranks']} ranks: load average (1 min) {p['load'][0]:.1f} at the start, "
                  f"{p['load'][1]:.1f} at the end")
    rows, notes, checks, results = [], [], [], []
    for p in parts:
        if p.get("unusable"):
            print(f"{p['ranks']} ranks: not run: {p['unusable']}")
            continue
        n = p["ranks"]
        labels = list(p["steps_per_s"])
        med = {k: statistics.median(v) for k, v in p["steps_per_s"].items()}
        gloo = next((k for k in labels if k.startswith("gloo")), None)
        for k in labels:
            ratio = med[k] / med[gloo] if gloo else None
            rows.append([str(n), f"fsdp/{k}" + (" (SUM)" if p["force_sum"].get(k) else ""),
                         f"{med[k]:.3f}", f"{1e3 / med[k]:.0f}",
                         " ".join(f"{s:.3f}" for s in p["steps_per_s"][k]),
                         "-" if ratio is None else f"{ratio:.2f}"])
            results.append({"ranks": n, "row": k, "steps_per_s": med[k],
                            "rounds": p["steps_per_s"][k], "vs_gloo": ratio})
        if "braid" in med and gloo and n == 2:
            checks.append((med["braid"] / med[gloo]))
        # Losses: rank by rank, round by round; braid's against gloo's.
        for r, per_rank in enumerate(p["losses"]):
            for k in labels:
                first = per_rank[k][0]
                print(f"losses {n} ranks, rank {r}, fsdp/{k} (round 1): "
                      + " ".join(f"{x:.9g}" for x in first))
        if "braid" in labels and gloo:
            diffs = [abs(a - b) for per_rank in p["losses"]
                     for rb, rg in zip(per_rank["braid"], per_rank[gloo])
                     for a, b in zip(rb, rg)]
            differ = sum(1 for d in diffs if d != 0)
            rounds_agree = all(rb == per_rank["braid"][0] for per_rank in p["losses"]
                               for rb in per_rank["braid"])
            what = ("equal gloo's in every rank, round and step" if not differ else
                    f"differ from gloo's in {differ} of {len(diffs)} (rank, round, step) "
                    f"values, by at most {max(diffs):.3g}")
            notes.append(f"{n} ranks: braid's losses {what}; braid's rounds "
                         f"{'agree' if rounds_agree else 'DISAGREE'} with each other")
        bd = p.get("breakdown") or {}
        if bd:
            parts_txt = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in bd.items())
            notes.append(f"{n} ranks, one step's parts alone: {parts_txt}")
        if any(p["force_sum"].values()):
            notes.append(f"{n} ranks: gloo refuses ReduceOp.AVG for reduce_scatter; its row "
                         f"reduces with SUM and divides afterwards")
        params = p["params"]
    if rows:
        head = [("", ["ranks", "row"]), ("speed", ["steps/s", "ms/step"]),
                ("", ["steps/s per round", "x gloo"])]
        title = (f"FSDP2 training steps/s (median over {args.rounds} rounds; MLP {args.layers} x "
                 f"{args.width}, {params / 1e6:.1f}M parameters, batch {args.batch} per rank, fp32)")
        print(bc.render_table(title, head, rows, notes))
    label, threshold = TARGET
    if checks:
        v = checks[0]
        print(f"\nTarget: {label}: {v:.2f} vs {threshold}: {'met' if v >= threshold else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "parts": parts, "results": results}, fh, indent=1)
        print(f"wrote {args.json}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,4", help="world sizes, one job each")
    p.add_argument("--store", choices=("file", "tcp"), default="file")
    p.add_argument("--backends", default="braid,gloo")
    p.add_argument("--width", type=int, default=3072)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-breakdown", dest="breakdown", action="store_false")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=float, default=600, help="group timeout (s)")
    p.add_argument("--json", default=None)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    args.ranks = [int(r) for r in args.ranks.split(",") if r]
    return args


def main(argv=None):
    args = parse_args(argv)
    rc, parts = bc.run_rank_counts(worker, args, PART_ENV, "braid-fsdp-bench-")
    if rc:
        return rc
    report(parts, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""DDP training throughput: PyTorch DDP on gloo and on braid, braid's reducer, and each
torch_braid.hooks communication hook, side by side in the same processes.

    /usr/bin/python3 benchmarks/ddp.py --quick                    # MLP, 2 ranks, < 2 minutes
    /usr/bin/python3 benchmarks/ddp.py --ranks 1,2,4 --models mlp,cnn,transformer \
        --bucket-mb 5,25 --steps 10 --rounds 3 --json results/ddp.json
    torchrun --nproc-per-node 2 benchmarks/ddp.py --models mlp      (one world size)
    /usr/bin/python3 benchmarks/ddp.py --device cuda --quick      # MLP on CUDA, 4 ranks, 1 GPU

Rows (per model, bucket cap and world size):
  ddp/<backend>            torch.nn.parallel.DistributedDataParallel on that group
  ddp/<backend>+<hook>     the same with a torch_braid.hooks hook (Python hook path:
                           ddp.register_comm_hook(state, hooks.<hook>))
  ddp/<backend>+cpp_<hook> the same hook through torch_braid.hooks.register(ddp, state): DDP's
                           C++ reducer calls the C++ hook, no Python per bucket
  reducer/braid[+<hook>]   torch_braid.ddp.DistributedDataParallel, its defaults (bucket views
                           on; skipped if absent)
  local/none               the same model and step without DDP, every rank at once (the ceiling)
  ~view, ~copy             with --bucket-view: ddp/<backend>~view (gradient_as_bucket_view=True)
                           for every backend, the same for each hook row
                           (ddp/braid+<hook>~view), and reducer/braid~copy (False)
Models: mlp (6 x Linear(2048, 2048), batch 1: 25M parameters, communication-bound), cnn (a
small conv net, batch 16 of 3x32x32), transformer (one TransformerEncoderLayer, d_model 256,
4 heads, feed-forward 1024: 0.8M parameters; batch 2 x 32 tokens), resnet50 (torchvision's, 25.6M
parameters; --resnet-batch images of --resnet-size pixels per rank, default 2 of 224x224; needs
python3-torchvision; not in the default list).

A step is zero_grad, forward, MSE loss, backward, SGD step. steps/s = steps / the slowest
rank's time for --steps steps, after --warmup steps (DDP rebuilds its buckets after the first
one; PowerSGD starts compressing at iteration 2 here). Every configuration is built afresh
in each of --rounds rounds, in alternating order, and its steps/s is the median over rounds
(Note [Rounds] in collectives.py: the speed of a shared machine drifts). After each timed
block the replicas' parameters are compared through the control group; a mismatch fails the
run.

wire MB/step: bytes each rank moves per step under the nccl-tests convention (allreduce of S
bytes: S * 2(n-1)/n; allgather of S bytes per rank: S * (n-1)). Hooks count what they issue;
rows without a hook are computed from the parameter bytes (every gradient is allreduced once).
Ratios: braid/gloo = ddp/braid over ddp/gloo; vs base = a hook row over the same backend's
no-hook row, reducer over ddp/braid; eff = steps/s at n ranks over steps/s at 1 rank (same
per-rank batch: ideal 1.0). Targets (2 ranks, MLP) are checked at the end.

--device cuda: the model, its inputs and the gradients live on GPU local_rank % device_count (with
one GPU every rank shares it), DDP gets device_ids, and each timed block ends with
torch.cuda.synchronize(). Backends: braid and gloo (gloo's CUDA path stages through the host), and
nccl where no two ranks share a GPU (NCCL refuses that layout). The reducer row runs too (braid's
reducer takes CUDA modules); hook rows only when asked for (--hooks). The targets: 4 ranks on one
GPU, MLP, DDP on braid at least 2x DDP on gloo in steps/s (issue 28), and at least 5x with braid's
same-GPU collectives (issue 29). --quick: mlp, 4 ranks, 2 rounds of 5 steps.
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
# The in-tree package (setup.py build_ext --inplace) when torch_braid is not installed.
sys.path.append(os.path.join(os.path.dirname(_HERE), "python"))

import _bench_common as bc  # noqa: E402

torch = dist = None  # imported in the ranks only

MODELS = ("mlp", "cnn", "transformer", "resnet50")
HOOKS = ("allreduce", "fp16", "bf16", "powersgd", "int8")
# PyTorch's own Python hooks (torch.distributed.algorithms.ddp_comm_hooks), for reference.
TORCH_HOOKS = ("torch_allreduce", "torch_fp16", "torch_bf16", "torch_powersgd")
# The same hooks registered on DDP's C++ reducer (torch_braid.hooks.register).
CPP_HOOKS = tuple("cpp_" + h for h in HOOKS)
PART_ENV = "BENCH_DDP_PART"  # where a child world writes its results (ranks sweep)
CUDA_TARGETS = [
    # (label, row, base row, ratio kind, threshold): checked on mlp at the largest world size
    # whose ranks share a GPU
    ("DDP on CUDA, ranks sharing a GPU: PyTorch DDP on braid vs on gloo (steps/s)",
     "ddp/braid", "ddp/gloo", "speed", 2.0),
    # issue 29: every rank on one GPU, braid's same-GPU collectives
    ("DDP on CUDA, ranks sharing one GPU (same-GPU collectives): braid vs gloo (steps/s)",
     "ddp/braid", "ddp/gloo", "speed", 5.0),
]
TARGETS = [
    # (label, row, base row, ratio kind, threshold[, model]): checked at 2 ranks, on mlp
    # unless a model is named
    ("MLP batch 1: PyTorch DDP on braid vs on gloo (steps/s)", "ddp/braid", "ddp/gloo",
     "speed", 1.6),
    ("braid reducer vs PyTorch DDP, both on braid (steps/s)", "reducer/braid", "ddp/braid",
     "speed", 1.0),
    ("bf16 hook vs no hook on braid (steps/s)", "ddp/braid+bf16", "ddp/braid", "speed", 1.3),
    # issue 31: the bf16 hook must beat no hook; the same with its C++ registration
    ("bf16 hook, registered in C++, vs no hook on braid (steps/s)", "ddp/braid+cpp_bf16",
     "ddp/braid", "speed", 1.0),
    ("bf16 hook vs no hook on braid (bytes, at most)", "ddp/braid+bf16", "ddp/braid",
     "bytes", 0.5),
    ("PowerSGD hook vs no hook on braid (bytes, at most 1/10)", "ddp/braid+powersgd",
     "ddp/braid", "bytes", 0.1),
    # issue 31: the step as a multiple of the same step without communication ("time": at most)
    ("PyTorch DDP on braid, step over the no-communication step", "ddp/braid", "local/none",
     "time", 1.45),
    ("torch_braid.ddp, step over the no-communication step", "reducer/braid", "local/none",
     "time", 1.25),
    ("PyTorch DDP on braid with bucket views (--bucket-view), step over the no-communication "
     "step", "ddp/braid~view", "local/none", "time", 1.3),
    ("the same with braid's allreduce hook registered in C++ (no division pass)",
     "ddp/braid+cpp_allreduce~view", "local/none", "time", 1.3),
    # issue 31: ResNet-50 (--models resnet50), with DDP's defaults and with bucket views on both
    ("ResNet-50: PyTorch DDP on braid vs on gloo (steps/s)", "ddp/braid", "ddp/gloo", "speed",
     1.15, "resnet50"),
    ("ResNet-50, bucket views on both (--bucket-view): PyTorch DDP on braid vs on gloo (steps/s)",
     "ddp/braid~view", "ddp/gloo~view", "speed", 1.15, "resnet50"),
]


# ---- models --------------------------------------------------------------------------------------
def make_model(name, args):
    """(module, input, target); the same on every rank (seeded) and for every row."""
    nn = torch.nn
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "mlp":
        layers = []
        for i in range(args.mlp_layers):
            layers.append(nn.Linear(args.mlp_width, args.mlp_width))
            if i + 1 < args.mlp_layers:
                layers.append(nn.ReLU())
        x = torch.randn(args.mlp_batch, args.mlp_width, generator=g)
        return nn.Sequential(*layers), x, torch.randn(args.mlp_batch, args.mlp_width, generator=g)
    if name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
        x = torch.randn(args.cnn_batch, 3, 32, 32, generator=g)
        return model, x, torch.randn(args.cnn_batch, 10, generator=g)
    if name == "transformer":
        layer = nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                           dropout=0.0, batch_first=True)
        x = torch.randn(args.tf_batch, 32, 256, generator=g)
        return layer, x, torch.randn(args.tf_batch, 32, 256, generator=g)
    if name == "resnet50":  # torchvision, as Debian ships it (python3-torchvision)
        try:
            import torchvision
        except ImportError as e:
            raise SystemExit(f"--models resnet50 needs torchvision (apt install "
                             f"python3-torchvision): {e}")
        model = torchvision.models.resnet50(num_classes=1000)
        side = args.resnet_size
        x = torch.randn(args.resnet_batch, 3, side, side, generator=g)
        return model, x, torch.randn(args.resnet_batch, 1000, generator=g)
    raise ValueError(f"unknown model {name!r} (choose from {', '.join(MODELS)})")


# ---- rows ----------------------------------------------------------------------------------------
class Row:
    def __init__(self, kind, backend, hook=None, view=None):
        # kind: ddp | reducer | local (the same model and step without DDP: the ceiling);
        # view: gradient_as_bucket_view, None for the wrapper's default (torch's DDP: off;
        # torch_braid.ddp: on), labelled ~view (True) or ~copy (False) otherwise
        self.kind, self.backend, self.hook, self.view = kind, backend, hook, view
        self.label = (f"{kind}/{backend.label}" + (f"+{hook}" if hook else "") +
                      {None: "", True: "~view", False: "~copy"}[view])


class _NoBackend:
    """The local row's stand-in: no group, no communication."""
    name = label = "none"
    group = None


def make_state(hook, group, args):
    if hook.startswith("torch_"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as D
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P

        if hook == "torch_powersgd":
            return P.PowerSGDState(process_group=group,
                                   matrix_approximation_rank=args.powersgd_rank,
                                   start_powerSGD_iter=2), P.powerSGD_hook
        fn = {"torch_allreduce": D.allreduce_hook, "torch_fp16": D.fp16_compress_hook,
              "torch_bf16": D.bf16_compress_hook}[hook]
        return group, fn
    import torch_braid.hooks as H

    if hook.startswith("cpp_"):  # registered through H.register (run_row)
        state, _ = make_state(hook[4:], group, args)
        return state, None
    if hook == "powersgd":
        return H.powersgd_state(group, matrix_approximation_rank=args.powersgd_rank,
                                start_powerSGD_iter=2), H.powersgd
    if hook == "int8":
        return H.int8_state(group), H.int8_compress
    fn = H._HOOK_FUNCTIONS[hook]
    return getattr(H, f"{hook}_state")(group), fn


def run_row(row, model_name, bucket_mb, args, reducer_cls):
    """steps/s of one row (slowest rank), its wire bytes per step and whether replicas agree."""
    module, x, y = make_model(model_name, args)
    group = row.backend.group
    kw = {}
    if args.device == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device())
        module, x, y = module.to(dev), x.to(dev), y.to(dev)
        kw["device_ids"] = [dev.index]
    if row.kind == "local":
        net = module
    else:
        if row.view is not None:
            kw["gradient_as_bucket_view"] = row.view
        if row.kind == "ddp":
            wrapper = torch.nn.parallel.DistributedDataParallel
        else:
            wrapper = reducer_cls
            kw.pop("device_ids", None)  # torch_braid.ddp takes the module's device
        net = wrapper(module, process_group=group, bucket_cap_mb=bucket_mb, **kw)
    state = counter = None
    if row.hook:
        state, fn = make_state(row.hook, group, args)
        if fn is None:
            import torch_braid.hooks as H

            H.register(net, state)
        else:
            net.register_comm_hook(state, fn)
        counter = state if hasattr(state, "wire_bytes") else None
    opt = torch.optim.SGD(module.parameters(), lr=1e-4)
    loss_fn = torch.nn.functional.mse_loss

    phases = {"fwd": 0.0, "bwd": 0.0, "opt": 0.0}

    def step(timed=False):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=args.zero_grad == "none")
        loss = loss_fn(net(x), y)
        t1 = time.perf_counter()
        loss.backward()  # DDP's backward returns once every bucket's allreduce has
        t2 = time.perf_counter()
        opt.step()
        if timed:
            phases["fwd"] += t1 - t0
            phases["bwd"] += t2 - t1
            phases["opt"] += time.perf_counter() - t2

    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    sync()
    if counter is not None:
        counter.reset_counters()
    bc.control_barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(timed=args.device == "cpu")  # on CUDA the phases would need a sync each
    sync()
    elapsed = max(bc.gather_floats(time.perf_counter() - t0))
    phase_ms = ({k: 1e3 * v / args.steps for k, v in phases.items()}
                if args.device == "cpu" else None)
    n = dist.get_world_size(group)
    if row.kind == "local":
        wire = 0.0
    elif counter is not None:
        wire = counter.wire_bytes / args.steps
    elif row.hook is None or row.hook == "torch_allreduce":
        param_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
        wire = param_bytes * 2 * (n - 1) / n
    elif row.hook in ("torch_fp16", "torch_bf16"):
        param_bytes = sum(p.numel() * 2 for p in module.parameters())
        wire = param_bytes * 2 * (n - 1) / n
    else:
        wire = None  # torch's PowerSGD does not count its bytes
    with torch.no_grad():
        checksum = sum(float(p.double().sum()) for p in module.parameters())
    sums = bc.gather_floats(checksum)
    del net, module, opt, state, counter
    gc.collect()
    return args.steps / elapsed, wire, all(s == sums[0] for s in sums), phase_ms


def rows_for(backends, args, reducer_cls):
    # The ceiling (issue 31): every rank trains the same model and batch without DDP, at once.
    rows = [Row("local", _NoBackend())] + [Row("ddp", b) for b in backends]
    hook_backends = [b for b in backends if b.name == args.hook_backend] or backends[:1]
    for b in hook_backends:
        for h in args.hooks:
            if h == "torch_bf16" and torch.__version__.startswith("1."):
                # torch 1.x's DDP refuses bf16_compress_hook without CUDA 11 and NCCL 2.10.
                if dist.get_rank() == 0:
                    print(f"# skipped ddp/{b.label}+torch_bf16: torch 1.x accepts it only with "
                          "CUDA and NCCL", file=sys.stderr)
                continue
            rows.append(Row("ddp", b, h))
            if args.bucket_view:  # a hook replaces DDP's division pass over the bucket
                rows.append(Row("ddp", b, h, view=True))
    braid = next((b for b in backends if b.name == "braid"), None)
    if args.bucket_view:  # every backend, so that braid's ~view row has its like to compare to
        rows += [Row("ddp", b, view=True) for b in backends]
    if reducer_cls is not None and braid is not None:
        rows.append(Row("reducer", braid))
        if args.bucket_view:
            rows.append(Row("reducer", braid, view=False))
        rows += [Row("reducer", braid, h) for h in args.reducer_hooks]
    return rows


def worker(args):
    global torch, dist
    info = bc.init_worker(timeout_s=args.timeout, threads=args.threads)
    import torch as _torch
    import torch.distributed as _dist

    torch, dist = _torch, _dist
    try:
        if args.device == "cuda":
            torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
            backends = bc.resolve_backends(cuda_spec(args.backends, info.world_size),
                                           devices=("cuda",))
            for b in backends:
                b.label = b.name
        else:
            backends = bc.resolve_backends(args.backends, devices=("cpu",))
    except bc.BenchFailure as e:
        if info.rank == 0:
            print(f"bench: {e}", file=sys.stderr)
        return 2
    for b in backends:
        b.group = dist.new_group(backend=b.name)
    reducer_cls, why = None, ""
    try:
        from torch_braid.ddp import DistributedDataParallel as reducer_cls  # noqa: N813
    except Exception as e:  # written by another part of the project; may be absent
        why = why or repr(e)
    if args.hooks:
        import torch_braid.hooks  # noqa: F401  fails loudly: hooks were asked for
    rows = rows_for(backends, args, reducer_cls)
    results = []
    total = len(args.models) * len(args.bucket_mb) * args.rounds * len(rows)
    progress = bc.Progress(total, enabled=info.rank == 0 and not args.quiet)
    for model_name in args.models:
        for bucket_mb in args.bucket_mb:
            per_row = {r.label: {"sps": [], "wire": [], "phases": []} for r in rows}
            for rnd in range(args.rounds):
                for row in (rows if rnd % 2 == 0 else rows[::-1]):
                    sps, wire, same, phase_ms = run_row(row, model_name, bucket_mb, args,
                                                        reducer_cls)
                    if not same:
                        raise SystemExit(f"bench: replicas diverged in {row.label} ({model_name},"
                                         f" bucket {bucket_mb} MB)")
                    per_row[row.label]["sps"].append(sps)
                    per_row[row.label]["wire"].append(wire)
                    if phase_ms:
                        per_row[row.label]["phases"].append(phase_ms)
                    progress.update(f"{model_name} {bucket_mb}MB {row.label}")
            for r in rows:
                d = per_row[r.label]
                results.append({"model": model_name, "bucket_mb": bucket_mb,
                                "ranks": info.world_size, "row": r.label, "kind": r.kind,
                                "backend": r.backend.name, "hook": r.hook,
                                "steps_per_s": statistics.median(d["sps"]),
                                "rounds_steps_per_s": d["sps"],
                                # rank 0's per-step phases, median over rounds (CPU only)
                                "phase_ms": ({k: statistics.median(p[k] for p in d["phases"])
                                              for k in ("fwd", "bwd", "opt")}
                                             if d["phases"] else None),
                                "wire_bytes_per_step": (statistics.median(d["wire"])
                                                        if None not in d["wire"] else None)})
    progress.clear()
    if info.rank == 0:
        meta = bc.machine_meta()
        if args.device == "cuda":
            meta.update(device="cuda", cuda_devices=torch.cuda.device_count(),
                        gpu=torch.cuda.get_device_name())
        part = {"ranks": info.world_size, "results": results, "reducer_missing": why,
                "meta": meta}
        out = os.environ.get(PART_ENV)
        if out:
            with open(out, "w") as f:
                json.dump(part, f)
        else:
            report([part], args)
    dist.barrier()
    return 0  # main() destroys the groups: Note [Bounded teardown] in _bench_common.py


# ---- report --------------------------------------------------------------------------------------
def report(parts, args):
    res = [r for p in parts for r in p["results"]]
    by = {(r["model"], r["bucket_mb"], r["ranks"], r["row"]): r for r in res}
    for r in res:
        key = (r["model"], r["bucket_mb"], r["ranks"])
        gloo = by.get(key + ("ddp/gloo",))
        # a hook row and a ~view row: the same backend's ddp row; a reducer row: ddp/braid
        base_row = "ddp/braid" if r["kind"] == "reducer" else f"ddp/{r['backend']}"
        base = by.get(key + (base_row,)) if r["row"] != base_row else None
        one = by.get((r["model"], r["bucket_mb"], 1, r["row"]))
        r["vs_gloo_ddp"] = r["steps_per_s"] / gloo["steps_per_s"] if gloo else None
        r["vs_base"] = r["steps_per_s"] / base["steps_per_s"] if base else None
        r["bytes_vs_base"] = (r["wire_bytes_per_step"] / base["wire_bytes_per_step"]
                              if base and base["wire_bytes_per_step"]
                              and r["wire_bytes_per_step"] is not None else None)
        r["scaling_eff"] = r["steps_per_s"] / one["steps_per_s"] if one and r["ranks"] > 1 else None
        local = by.get(key + ("local/none",))
        r["x_local"] = local["steps_per_s"] / r["steps_per_s"] if local else None

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    rows = [[r["model"], str(r["bucket_mb"]), str(r["ranks"]), r["row"],
             f(r["steps_per_s"], ".2f"), f(1e3 / r["steps_per_s"], ".1f"),
             f(None if r["wire_bytes_per_step"] is None else r["wire_bytes_per_step"] / 1e6,
               ".2f"), f(r["vs_gloo_ddp"], ".2f"),
             f(r["vs_base"], ".2f"), f(r["bytes_vs_base"], ".3f"), f(r["scaling_eff"], ".2f"),
             f(r["x_local"], ".2f")] +
            [f((r.get("phase_ms") or {}).get(k), ".1f") for k in ("fwd", "bwd", "opt")]
            for r in res]
    head = [("", ["model", "MB", "ranks", "row"]),
            ("speed", ["steps/s", "ms/step"]), ("", ["wire MB/step"]),
            ("ratios", ["x gloo DDP", "x base", "bytes x base", "eff", "step x local"]),
            ("rank 0 ms/step", ["fwd", "bwd", "opt"])]
    notes = ["local/none: the same model and step without DDP, every rank at once (the ceiling)",
             "fwd: zero_grad, forward and loss; bwd: backward, which for DDP includes the copies "
             "into buckets, the hooks and waiting for the last allreduce; opt: the SGD step "
             "(CPU only)",
             "step x local: this row's step time over local/none's (1.0: communication is free)",
             "base: the same backend's ddp row for a hook, ddp/braid for the reducer",
             "eff: steps/s over the 1-rank steps/s of the same row (weak scaling, ideal 1.0)"]
    missing = next((p["reducer_missing"] for p in parts if p["reducer_missing"]), "")
    if missing.startswith("--device"):
        notes.append(f"reducer rows skipped: {missing}")
    elif missing:
        notes.append(f"reducer rows skipped: torch_braid.ddp did not import ({missing})")
    print(bc.render_table("DDP training steps/s (median over rounds)", head, rows, notes))

    checks = []
    targets, at = TARGETS, 2
    if args.device == "cuda":
        gpus = parts[0]["meta"].get("cuda_devices", 1) if parts else 1
        shared = [n for n in args.ranks if n > gpus]
        targets, at = CUDA_TARGETS, max(shared) if shared else None
    for label, row, base_row, kind, threshold, *model in targets:
        model = model[0] if model else "mlp"
        r = by.get((model, args.target_bucket_mb, at, row))
        b = by.get((model, args.target_bucket_mb, at, base_row))
        if r is None or b is None:
            checks.append({"target": label, "value": None, "threshold": threshold,
                           "met": None})
            continue
        if kind == "speed":
            v = r["steps_per_s"] / b["steps_per_s"]
            met = v >= threshold
        elif kind == "time":  # r's step time over b's, at most
            v = b["steps_per_s"] / r["steps_per_s"]
            met = v <= threshold
        else:
            v = r["wire_bytes_per_step"] / b["wire_bytes_per_step"]
            met = v <= threshold
        checks.append({"target": label, "value": v, "threshold": threshold, "met": met})
    where = "CUDA, " if args.device == "cuda" else ""
    print(f"\nTargets ({where}mlp unless named, {at} ranks, bucket {args.target_bucket_mb} MB):")
    for c in checks:
        state = "n/a (not measured)" if c["met"] is None else ("met" if c["met"] else "NOT met")
        value = "" if c["value"] is None else f"{c['value']:.3f} vs {c['threshold']}: "
        print(f"  {c['target']}: {value}{state}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "meta": parts[0]["meta"] if parts else {},
                       "results": res, "targets": checks}, fh, indent=1)
        print(f"wrote {args.json}")


# ---- launcher ------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default=None,
                   help="world sizes to run, one job each (e.g. 1,2,4); ignored under torchrun "
                        "(default 2; --device cuda --quick: 4)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model and gradients live (cuda: GPU local_rank %% count)")
    p.add_argument("--store", choices=("file", "tcp"), default="file")
    p.add_argument("--backends", default="auto",
                   help="comma list, e.g. braid,gloo; auto = braid if importable, and gloo")
    p.add_argument("--models", default="mlp,cnn,transformer")
    p.add_argument("--bucket-mb", default="25", help="DDP bucket_cap_mb values, e.g. 1,5,25")
    p.add_argument("--hooks", default=None,
                   help="hooks to time ('' for none; default: all of braid's, none with "
                        "--device cuda); also torch_allreduce, torch_fp16, "
                        "torch_bf16, torch_powersgd: PyTorch's Python hooks, for reference")
    p.add_argument("--hook-backend", default="braid",
                   help="backend the hook rows use (the first backend if it is absent)")
    p.add_argument("--reducer-hooks", default=None,
                   help="hooks also timed on braid's reducer ('' for none; default bf16)")
    p.add_argument("--zero-grad", choices=("none", "zero"), default="none",
                   help="how each step clears the gradients: set them to None (torch 2.x's "
                        "default: autograd allocates fresh ones) or zero them in place (torch "
                        "1.13's default: backward accumulates into the same memory, which with "
                        "bucket views is the bucket)")
    p.add_argument("--bucket-view", action="store_true",
                   help="also time DDP with gradient_as_bucket_view=True (rows "
                        "ddp/<backend>~view) and reducer/braid with it off (reducer/braid~copy: "
                        "torch_braid.ddp has it on by default)")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mlp-width", type=int, default=2048)
    p.add_argument("--mlp-layers", type=int, default=6)
    p.add_argument("--mlp-batch", type=int, default=1)
    p.add_argument("--cnn-batch", type=int, default=16)
    p.add_argument("--tf-batch", type=int, default=2)
    p.add_argument("--resnet-batch", type=int, default=2, help="resnet50: images per rank")
    p.add_argument("--resnet-size", type=int, default=224, help="resnet50: image side")
    p.add_argument("--target-bucket-mb", type=float, default=None,
                   help="bucket cap the targets are read at (default: the largest)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--timeout", type=float, default=600, help="group timeout (s)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--quick", action="store_true",
                   help="mlp only, 2 ranks, 1 round of 5 steps: a smoke run under 2 minutes")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    if args.hooks is None:
        # The C++ registrations of the two hooks issue 31's targets read.
        args.hooks = "" if cuda else ",".join(HOOKS + ("cpp_allreduce", "cpp_bf16"))
    if args.reducer_hooks is None:
        args.reducer_hooks = "" if cuda else "bf16"
    if args.quick and cuda:
        args.models, args.rounds, args.steps = "mlp", 2, 5
        args.ranks = args.ranks or "4"
    elif args.quick:
        args.models, args.ranks, args.rounds, args.steps = "mlp", "2", 1, 5
    args.ranks = args.ranks or "2"
    args.models = [m for m in args.models.split(",") if m]
    for m in args.models:
        if m not in MODELS:
            p.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    args.ranks = [int(r) for r in args.ranks.split(",") if r]
    args.bucket_mb = [float(b) if "." in b else int(b) for b in args.bucket_mb.split(",") if b]
    args.hooks = [h for h in args.hooks.split(",") if h]
    args.reducer_hooks = [h for h in args.reducer_hooks.split(",") if h]
    for h in args.hooks + args.reducer_hooks:
        if h not in HOOKS + CPP_HOOKS + TORCH_HOOKS:
            p.error(f"unknown hook {h!r}; choose from {', '.join(HOOKS + CPP_HOOKS + TORCH_HOOKS)}")
    if args.warmup < 3 and "powersgd" in args.hooks + args.reducer_hooks:
        p.error("--warmup must be >= 3 so that PowerSGD (start_powerSGD_iter=2) is compressing")
    if args.target_bucket_mb is None:
        args.target_bucket_mb = max(args.bucket_mb)
    return args


def cuda_unavailable():
    """Why --device cuda cannot run here, or None."""
    import torch as t

    if t.version.cuda is None:
        return f"torch {t.__version__} was built without CUDA (torch.version.cuda is None)"
    if not t.cuda.is_available() or t.cuda.device_count() == 0:
        return f"torch {t.__version__} (CUDA {t.version.cuda}) sees no CUDA device"
    return None


def cuda_spec(spec, world):
    """Backends on cuda; auto = braid (if it imports), gloo, and nccl where no two ranks share a
    GPU (NCCL refuses that: "Duplicate GPU detected")."""
    if spec != "auto":
        return ",".join(x if "@" in x or x == "nccl" else f"{x}@cuda"
                        for x in (y.strip() for y in spec.split(",")) if x)
    names = ["gloo@cuda"]
    try:
        import torch_braid  # noqa: F401
        names.insert(0, "braid@cuda")
    except Exception as e:
        if dist.get_rank() == 0:
            print(f"# braid not measured: torch_braid did not import: {e!r}", file=sys.stderr)
    if world <= torch.cuda.device_count():
        names.append("nccl")
    elif dist.get_rank() == 0:
        print(f"# nccl not measured: n/a (Duplicate GPU): {world} ranks on "
              f"{torch.cuda.device_count()} GPU(s)", file=sys.stderr)
    return ",".join(names)


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda":
        why = cuda_unavailable()
        if why:
            print(f"bench: --device cuda: {why}", file=sys.stderr)
            return 2
    rc, parts = bc.run_rank_counts(worker, args, PART_ENV, "braid-ddp-bench-")
    if rc:
        return rc
    report(parts, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

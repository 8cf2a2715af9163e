"""Where PyTorch DDP's step over braid spends its time beyond the no-communication step (issue 31):
2 ranks, the MLP of benchmarks/ddp.py (6 x Linear(2048, 2048), batch 1, SGD), alternating variants:
  local          zero_grad, forward, backward, SGD step, every rank at once, no communication
  local~flat     the same, gradients in one flat buffer (as DDP's bucket views), zeroed by zero_grad
  local+div      plus flat.div_(n)
  local+div+ar   plus braid allreduces of the flat buffer in 4 pieces of 25 MB after backward
  local+ar       the allreduces without the division
  local+avg      the allreduces as AVG (braid divides each reduced share in cache), no division pass
  ddp~view       torch DDP over braid, gradient_as_bucket_view=True, 25 MB buckets
  local~zero     local, but zero_grad zeroes each parameter's own gradient (DDP's default layout,
                 and the baseline of benchmarks/ddp.py --zero-grad zero)
  local~zero+copy      plus DDP's two copies without bucket views: each gradient times 1/n into
                 a flat buffer (DDP's copy into the bucket), then back into the gradient
  local~zero+copy+ar   plus braid allreduces of the flat buffer between the two copies
  ddp            torch DDP over braid, default options, 25 MB buckets

    /usr/bin/python3 benchmarks/ddp_anatomy.py [rounds]      # default 5 rounds of 10 steps

Each variant is built afresh in every round, the rounds alternate the order, a variant's time is
the slowest rank's mean step over 10 steps after 3 warm-up steps, and rank 0 prints the median
over rounds and each round's. The differences between rows price each pass: the zeroing of
flat gradients, DDP's division pass, braid's allreduce with SUM, and with AVG (Note [Averaging
inside the allreduce] in csrc/reducer/reducer.cc).
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)])

def flat_buffer(m):
    return torch.zeros(sum(p.numel() for p in m.parameters()))

def bucket_views(m, flat):
    """Views of `flat` shaped as m's parameters, in order (DDP's bucket views)."""
    out, at = [], 0
    for p in m.parameters():
        out.append(flat[at:at + p.numel()].view_as(p)); at += p.numel()
    return out

def run(rank, n, port, rounds, steps):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch_braid  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group("braid", rank=rank, world_size=n)
    ctl = dist.new_group(backend="gloo")
    x = torch.randn(1, 2048); y = torch.randn(1, 2048)
    def flat_model():
        m = model(); flat = flat_buffer(m)
        for p, v in zip(m.parameters(), bucket_views(m, flat)): p.grad = v
        return m, flat
    def variant(name):
        if name.startswith("ddp"):
            m = torch.nn.parallel.DistributedDataParallel(model(), gradient_as_bucket_view=(name == "ddp~view"), bucket_cap_mb=25)
            flat = None
        elif name == "local" or name == "local~zero":
            m = model(); flat = None
        elif name.startswith("local~zero+"):
            m = model(); flat = flat_buffer(m)
        else:
            m, flat = flat_model()
        opt = torch.optim.SGD(m.parameters(), lr=1e-4)
        pieces = None if flat is None else list(flat.split(flat.numel() // 4 + 1))
        views = None if flat is None else bucket_views(m, flat)
        def step():
            opt.zero_grad(set_to_none=(name == "local"))
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            if "copy" in name:
                for p, v in zip(m.parameters(), views): torch.mul(p.grad, 1.0 / n, out=v)
            if "div" in name: flat.div_(n)
            if "ar" in name:
                for p in reversed(pieces): dist.all_reduce(p)
            if "avg" in name:
                for p in reversed(pieces): dist.all_reduce(p, op=dist.ReduceOp.AVG)
            if "copy" in name:
                for p, v in zip(m.parameters(), views): p.grad.copy_(v)
            opt.step()
        return step
    names = ["local", "local~flat", "local+div", "local+ar", "local+div+ar", "local+avg", "ddp~view",
             "local~zero", "local~zero+copy", "local~zero+copy+ar", "ddp"]
    res = {k: [] for k in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            step = variant(k)
            for _ in range(3): step()
            dist.barrier(group=ctl)
            t0 = time.perf_counter()
            for _ in range(steps): step()
            t = torch.tensor([(time.perf_counter() - t0) / steps * 1e3])
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
            res[k].append(t.item())
    if rank == 0:
        base = statistics.median(res["local"])
        zbase = statistics.median(res["local~zero"])
        for k in names:
            med = statistics.median(res[k])
            print(f"{k:20s} {med:7.1f} ms  x local {med / base:4.2f}  x local~zero {med / zbase:4.2f}   rounds: "
                  + " ".join(f"{v:.0f}" for v in res[k]), flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    mp.start_processes(run, args=(2, 29000 + os.getpid() % 900, rounds, 10), nprocs=2, start_method="spawn")

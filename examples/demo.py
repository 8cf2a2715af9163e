"""braid demo: DDP training of a small model, on braid and on gloo side by side.

    torchrun --nproc_per_node=2 examples/demo.py        (or ./examples/demo.sh)

The script is an ordinary DDP training loop; the only braid-specific lines
are `import torch_braid` and the backend name. Both backends train the same
model from the same seed in the same processes, alternating per epoch, so
their step times are measured under the same conditions and their losses
should agree.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_braid  # noqa: F401  registers the "braid" backend


def make_model(width):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))


def make_data(rank, steps, batch):
    g = torch.Generator().manual_seed(1234 + rank)
    x = torch.randn(steps, batch, 64, generator=g)
    w = torch.linspace(-1, 1, 64)
    y = (x @ w).unsqueeze(-1).sin()
    return x, y


def train_epoch(ddp, opt, x, y):
    loss_fn = nn.MSELoss()
    total, t0 = 0.0, time.perf_counter()
    for i in range(x.shape[0]):
        opt.zero_grad()
        loss = loss_fn(ddp(x[i]), y[i])
        loss.backward()
        opt.step()
        total += loss.item()
    return total / x.shape[0], (time.perf_counter() - t0) / x.shape[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--width", type=int, default=512)
    a = p.parse_args()
    torch.set_num_threads(1)  # one core per rank, as on a loaded node

    dist.init_process_group("braid")
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    runs = {}
    for name, group in (("braid", None), ("gloo", gloo)):
        model = make_model(a.width)
        ddp = DDP(model, process_group=group)
        runs[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    x, y = make_data(rank, a.steps, a.batch)
    params = sum(t.numel() for t in runs["braid"][0].parameters())
    if rank == 0:
        print(f"DDP on {dist.get_world_size()} ranks, model of {params / 1e6:.1f}M parameters, "
              f"{a.steps} steps per epoch")
        print(f"{'epoch':>5}  {'loss (braid)':>12}  {'loss (gloo)':>11}  "
              f"{'braid ms/step':>13}  {'gloo ms/step':>12}  {'speedup':>7}")
    totals = {"braid": 0.0, "gloo": 0.0}
    for epoch in range(1, a.epochs + 1):
        res = {name: train_epoch(ddp, opt, x, y) for name, (ddp, opt) in runs.items()}
        for name in totals:
            if epoch > 1:  # the first epoch includes warm-up
                totals[name] += res[name][1]
        if rank == 0:
            (lb, tb), (lg, tg) = res["braid"], res["gloo"]
            print(f"{epoch:>5}  {lb:>12.5f}  {lg:>11.5f}  {tb * 1e3:>13.2f}  {tg * 1e3:>12.2f}  "
                  f"{tg / tb:>6.2f}x")
    if rank == 0 and a.epochs > 1:
        print(f"mean step time after warm-up: braid {totals['braid'] / (a.epochs - 1) * 1e3:.2f} ms, "
              f"gloo {totals['gloo'] / (a.epochs - 1) * 1e3:.2f} ms "
              f"({totals['gloo'] / totals['braid']:.2f}x)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

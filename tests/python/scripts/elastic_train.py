"""DDP training on braid that survives a killed worker under torchrun.

    tools/torchrun --standalone --nproc_per_node=2 --max-restarts=2 \\
        tests/python/scripts/elastic_train.py --dir DIR [--kill-rank 1 --kill-step 17]

Run by test_elastic.py. Data and initial weights are pure functions of the
step and the rank, so every attempt sees the same batches. Rank 0 writes a
checkpoint (weights, optimizer state, step, losses so far) every
--ckpt-every steps, atomically (write a temporary file, then rename), and
every attempt resumes from the last one. With --kill-step, worker
--kill-rank kills itself with SIGKILL at that step on the first attempt only
(TORCHELASTIC_RESTART_COUNT == 0); torchrun then stops the other worker and
restarts both.

At the end rank 0 writes DIR/result.json: the losses of every step, where
this attempt started, and the restart count.
"""

import argparse
import datetime
import json
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

BACKEND = os.environ.get("BRAID_TEST_BACKEND", "braid")
if BACKEND == "braid":
    import torch_braid  # noqa: F401  registers the "braid" backend


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(32, 16, generator=g)
    return x, 0.5 * x[:, :4].sum(1, keepdim=True)  # learnable within the run


def save_atomically(state, path):
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)  # a reader sees the old checkpoint or the new one, never half


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--ckpt-every", type=int, default=5)
    ap.add_argument("--kill-rank", type=int, default=1)
    ap.add_argument("--kill-step", type=int, default=-1)
    args = ap.parse_args()

    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # A short group timeout: the survivor of a kill must not wait 30 minutes
    # should torchrun fail to stop it.
    dist.init_process_group(BACKEND, timeout=datetime.timedelta(seconds=60))
    rank, n = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ckpt = os.path.join(args.dir, "checkpoint.pt")
    start, losses = 0, []
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location="cpu")
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, losses = state["step"], state["losses"]
    print(f"rank {rank}: attempt {attempt} starts at step {start}", flush=True)

    for step in range(start, args.steps):
        if attempt == 0 and rank == args.kill_rank and step == args.kill_step:
            with open(os.path.join(args.dir, "killed"), "w") as f:
                f.write(f"rank {rank} step {step} pid {os.getpid()}")
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = batch(step, rank)
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # DDP averages the gradients over braid
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / n)
        if rank == 0 and (step + 1) % args.ckpt_every == 0:
            save_atomically({"model": model.module.state_dict(), "opt": opt.state_dict(),
                             "step": step + 1, "losses": losses}, ckpt)

    dist.barrier()
    if rank == 0:
        with open(os.path.join(args.dir, "result.json"), "w") as f:
            json.dump({"losses": losses, "started_at": start, "attempt": attempt,
                       "world_size": n}, f)
        print(f"elastic_train: OK final loss {losses[-1]:.6f} after {len(losses)} steps "
              f"(attempt {attempt}, resumed at step {start})", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

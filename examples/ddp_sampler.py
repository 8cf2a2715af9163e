"""DDP with a DistributedSampler: each rank trains on its own share of the
dataset, reshuffled every epoch by sampler.set_epoch.

    torchrun --nproc_per_node=2 examples/ddp_sampler.py

An ordinary PyTorch script; the braid-specific lines are `import torch_braid`
and the backend name (BRAID_EXAMPLE_BACKEND=gloo runs it on gloo).
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

BACKEND = os.environ.get("BRAID_EXAMPLE_BACKEND", "braid")
if BACKEND == "braid":
    import torch_braid  # noqa: F401  registers the "braid" backend


def main():
    dist.init_process_group(BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 20, generator=g)
    y = x @ torch.randn(20, 1, generator=g) + 0.05 * torch.randn(512, 1, generator=g)
    dataset = TensorDataset(torch.arange(512), x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()

    previous = None
    for epoch in range(4):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        seen, total = [], 0.0
        for idx, xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            seen.append(idx)
            total += loss.item()
        seen = torch.cat(seen)

        # The ranks' shares are disjoint and together cover the dataset.
        shares = [None] * world
        dist.all_gather_object(shares, seen.tolist())
        everything = sorted(i for share in shares for i in share)
        assert everything == list(range(512)), "the shares overlap or miss samples"
        assert previous is None or seen.tolist() != previous, "set_epoch did not reshuffle"
        previous = seen.tolist()
        if rank == 0:
            print(f"epoch {epoch}: mean loss {total / len(loader):.4f} "
                  f"({len(seen)} samples on each of {world} ranks)")

    if rank == 0:
        print(f"ddp_sampler: OK final_loss={total / len(loader):.4f}")
    # Let every rank finish its last collective before the group goes away
    # (torch 1.13's gloo can deadlock at exit otherwise).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""DDP around a model made of two sub-modules (an encoder and a head), each
with its own parameters and a buffer (BatchNorm's running statistics).

    torchrun --nproc_per_node=2 examples/ddp_submodules.py

An ordinary PyTorch script; the braid-specific lines are `import torch_braid`
and the backend name (BRAID_EXAMPLE_BACKEND=gloo runs it on gloo).
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

BACKEND = os.environ.get("BRAID_EXAMPLE_BACKEND", "braid")
if BACKEND == "braid":
    import torch_braid  # noqa: F401  registers the "braid" backend


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(),
                                 nn.Linear(64, 16))

    def forward(self, x):
        return self.net(x)


class Head(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.fc = nn.Linear(16, classes)

    def forward(self, z):
        return self.fc(torch.relu(z))


class Classifier(nn.Module):
    def __init__(self, classes=4):
        super().__init__()
        self.encoder = Encoder()
        self.head = Head(classes)

    def forward(self, x):
        return self.head(self.encoder(x))


def main():
    dist.init_process_group(BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, 32, generator=g) * 2
    labels = torch.randint(0, 4, (1024,), generator=g)
    x = centers[labels] + torch.randn(1024, 32, generator=g)

    model = DDP(Classifier())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    first = None
    for step in range(60):
        idx = torch.arange(step * 64 % 1024, step * 64 % 1024 + 64)[rank::world]
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), labels[idx])
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()

    # Both sub-modules' weights stayed identical across ranks.
    for name, p in model.module.named_parameters():
        ref = p.detach().clone()
        dist.broadcast(ref, 0)
        assert torch.equal(ref, p.detach()), f"{name} differs from rank 0's"

    model.eval()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == labels).float().mean().item()
    if rank == 0:
        print(f"loss {first:.3f} -> {loss.item():.3f}, accuracy {accuracy:.3f}")
        assert accuracy > 0.9, accuracy
        print(f"ddp_submodules: OK accuracy={accuracy:.3f}")
    # Let every rank finish its last collective before the group goes away
    # (torch 1.13's gloo can deadlock at exit otherwise).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

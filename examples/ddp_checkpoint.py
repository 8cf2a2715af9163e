"""Save a DDP checkpoint on rank 0, wait for it with a barrier, and load it on
every rank with map_location (the PyTorch DDP tutorial's pattern).

    torchrun --nproc_per_node=2 examples/ddp_checkpoint.py

An ordinary PyTorch script; the braid-specific lines are `import torch_braid`
and the backend name (BRAID_EXAMPLE_BACKEND=gloo runs it on gloo).
"""
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

BACKEND = os.environ.get("BRAID_EXAMPLE_BACKEND", "braid")
if BACKEND == "braid":
    import torch_braid  # noqa: F401  registers the "braid" backend


def make_model():
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 5))


def train(model, steps, seed):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(torch.randn(16, 10, generator=g)),
                                      torch.randn(16, 5, generator=g))
        loss.backward()
        opt.step()
    return loss.item()


def main():
    dist.init_process_group(BACKEND)
    rank = dist.get_rank()
    torch.set_num_threads(1)
    # One file per run (the launcher's port is unique), so parallel runs do not collide.
    path = os.path.join(tempfile.gettempdir(),
                        f"braid_example_{os.environ.get('MASTER_PORT', '0')}.checkpoint")

    torch.manual_seed(rank)  # different on purpose: DDP broadcasts rank 0's weights
    model = DDP(make_model())
    train(model, steps=20, seed=0)

    if rank == 0:
        # All ranks hold the same weights; one copy is enough.
        torch.save(model.state_dict(), path)
    dist.barrier()  # the others must not read the file before rank 0 wrote it

    torch.manual_seed(100 + rank)
    restored = DDP(make_model())
    restored.load_state_dict(torch.load(path, map_location="cpu"))
    for a, b in zip(model.parameters(), restored.parameters()):
        assert torch.equal(a, b), "the restored weights differ"

    # Training goes on from the checkpoint identically on both copies.
    loss_a = train(model, steps=5, seed=1)
    loss_b = train(restored, steps=5, seed=1)
    assert loss_a == loss_b, (loss_a, loss_b)

    dist.barrier()  # everyone has read the file
    if rank == 0:
        os.remove(path)
        print(f"ddp_checkpoint: OK loss_after_restore={loss_b:.4f}")
    # Let every rank finish its last collective before the group goes away
    # (torch 1.13's gloo can deadlock at exit otherwise).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

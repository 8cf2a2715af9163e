"""DDP with a gradient-compression hook from torch_braid.hooks: gradients
travel as bfloat16 (half the bytes); other hooks are swapped in the same way.

    torchrun --nproc_per_node=2 examples/ddp_hook.py
    BRAID_EXAMPLE_HOOK=powersgd torchrun --nproc_per_node=2 examples/ddp_hook.py

An ordinary PyTorch script; the braid-specific lines are the torch_braid
imports, the backend name (BRAID_EXAMPLE_BACKEND=gloo runs it on gloo) and the
hook registration.
"""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_braid.hooks  # C++ hooks; also registers the "braid" backend

BACKEND = os.environ.get("BRAID_EXAMPLE_BACKEND", "braid")
HOOK = os.environ.get("BRAID_EXAMPLE_HOOK", "bf16")


def register_hook(model):
    hooks = torch_braid.hooks
    makers = {
        "bf16": hooks.bf16_state,
        "powersgd": lambda: hooks.powersgd_state(matrix_approximation_rank=2,
                                                 start_powerSGD_iter=10),
        "int8": hooks.int8_state,
    }
    if HOOK not in makers:
        raise SystemExit(f"unknown BRAID_EXAMPLE_HOOK={HOOK!r} (bf16, powersgd, int8)")
    state = makers[HOOK]()
    # The hook runs in C++, called by DDP's C++ reducer; the Python way,
    # model.register_comm_hook(state, hooks.bf16_compress), gives the same values.
    hooks.register(model, state)
    return state


def main():
    dist.init_process_group(BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 64, generator=g)
    y = torch.sin(x @ torch.randn(64, 8, generator=g) / 8)

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8)))
    state = register_hook(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.MSELoss()
    first = None
    steps = 100
    for step in range(steps):
        idx = torch.arange(step * 128 % 2048, step * 128 % 2048 + 128)[rank::world]
        opt.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()

    grads = sum(p.numel() for p in model.parameters())
    if rank == 0:
        print(f"{HOOK} hook: loss {first:.4f} -> {loss.item():.4f}; "
              f"{state.wire_bytes / steps / 1e3:.1f} kB per step on the wire per rank "
              f"(fp32 allreduce: {grads * 4 * 2 * (world - 1) / world / 1e3:.1f} kB)")
        assert loss.item() < first / 2, (first, loss.item())
        print(f"ddp_hook: OK hook={HOOK} final_loss={loss.item():.4f}")
    # Let every rank finish its last collective before the group goes away
    # (torch 1.13's gloo can deadlock at exit otherwise).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Page faults per step of PyTorch DDP over braid (issue 31): the MLP of benchmarks/ddp.py
(6 x Linear(2048, 2048), batch 1), 2 ranks, default DDP options, zero_grad zeroing in place,
with no hook (none), braid's allreduce hook through ddp.register_comm_hook (py), or through
torch_braid.hooks.register (cpp); local is the same step without DDP, every rank at once:

    /usr/bin/python3 benchmarks/ddp_faults.py local|none|py|cpp

Each rank prints its mean step over 30 steps after 5 warm-up steps and the minor page faults
per step (getrusage). Run it with and without glibc's tunables that keep the heap (see
docs/hooks.md, "The Python path and malloc's trimming"):

    GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296
"""
import os
import resource
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddp_anatomy import model  # the MLP of benchmarks/ddp.py


def run(rank, mode, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch_braid  # noqa: F401  (registers the backend)
    from torch_braid import hooks
    torch.set_num_threads(1)
    dist.init_process_group("braid", rank=rank, world_size=2)
    mlp = model()
    ddp = mlp if mode == "local" else torch.nn.parallel.DistributedDataParallel(mlp, bucket_cap_mb=25)
    if mode == "py":
        ddp.register_comm_hook(hooks.allreduce_state(), hooks.allreduce)
    elif mode == "cpp":
        hooks.register(ddp, hooks.allreduce_state())
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x, y = torch.randn(1, 2048), torch.randn(1, 2048)

    def step():
        opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    for _ in range(5):
        step()
    dist.barrier()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    for _ in range(30):
        step()
    ms = (time.perf_counter() - t0) / 30 * 1e3
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 30
    print(f"{mode} rank {rank}: {ms:.1f} ms/step, {faults:.0f} minor faults/step", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "py"
    if mode not in ("local", "none", "py", "cpp"):
        sys.exit("usage: ddp_faults.py local|none|py|cpp")
    mp.start_processes(run, args=(mode, 29500 + os.getpid() % 400), nprocs=2, start_method="spawn")

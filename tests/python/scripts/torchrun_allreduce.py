"""Run by test_init.py under torchrun: env:// init, a few collectives, clean exit.

When every check passed, each rank writes "ok R of N, USE_LIBUV=V" to
$BRAID_TORCHRUN_OUT/rank<R> (files, because the ranks' stdout lines interleave); V is
what the worker found in its environment (Note [torchrun without libuv] in
tools/torchrun.py), "-" when unset.
"""

import os
import sys

import torch
import torch.distributed as dist

backend = os.environ.get("BRAID_TEST_BACKEND", "braid")
if backend == "braid":
    import torch_braid  # noqa: F401

dist.init_process_group(backend)  # env:// from torchrun: RANK, WORLD_SIZE, MASTER_*
rank, n = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and n == int(os.environ["WORLD_SIZE"])
assert dist.get_backend() == backend, (dist.get_backend(), backend)

# 1000 elements, and 300007 (1.2 MB: across hosts, braid's three-stage allreduce).
for count in (1000, 300007):
    t = torch.full((count,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((count,), n * (n + 1) / 2)), (count, t[:4])

b = torch.arange(10) * (rank == n - 1)
dist.broadcast(b, n - 1)
assert torch.equal(b, torch.arange(10)), b

outs = [torch.zeros(3, dtype=torch.int64) for _ in range(n)]
dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int64))
assert all(torch.equal(o, torch.full((3,), r, dtype=torch.int64)) for r, o in enumerate(outs))

dist.barrier()
dist.destroy_process_group()
with open(os.path.join(os.environ["BRAID_TORCHRUN_OUT"], f"rank{rank}"), "w") as f:
    f.write(f"ok {rank} of {n}, USE_LIBUV={os.environ.get('USE_LIBUV', '-')}")
sys.exit(0)

"""One rank of test_hosts.py's jobs across simulated hosts (tools/hosts.py).

    hosts_rank.py RANK WORLD STORE_ADDR PORT BACKEND[,BACKEND...]

Rank 0 hosts a TCPStore on STORE_ADDR (host 0's address); every rank joins the default
group (the first backend) through it, then a group of each further backend over all ranks.
With HOSTS_INIT=tcp the default group comes from init_method="tcp://STORE_ADDR:PORT" instead.
On each group: allreduce, broadcast and allgather, checked against closed forms, then five DDP
steps whose losses the test compares between backends. Prints one
JSON line: {"rank", "host", "results": {backend: "ok" | the error}}. A backend whose group
cannot be made reports the error and the next
backend still runs.
"""

import datetime
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def collectives(group, rank, n):
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t, group=group)
    assert torch.equal(t, torch.full((1000,), n * (n + 1) / 2)), f"allreduce: {t[:4]}"
    b = torch.arange(10) * (rank == n - 1)
    dist.broadcast(b, n - 1, group=group)
    assert torch.equal(b, torch.arange(10)), f"broadcast: {b}"
    outs = [torch.zeros(3, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(outs, torch.full((3,), rank, dtype=torch.int64), group=group)
    for r, o in enumerate(outs):
        assert torch.equal(o, torch.full((3,), r, dtype=torch.int64)), f"allgather[{r}]: {o}"


def ddp_losses(group, rank):
    """Five DDP steps of a small model (the same seed and data on every backend); the losses.
    The buckets (1 MiB) take braid's hierarchical allreduce across hosts."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group,
                                                    bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(5):
        x, y = torch.randn(16, 64, generator=g), torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    rank, n, addr, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    backends = sys.argv[5].split(",")
    if "braid" in backends:
        import torch_braid  # noqa: F401
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    results = {}
    if os.environ.get("HOSTS_INIT") == "tcp":  # as multi-node tutorials write it
        dist.init_process_group(backends[0], init_method=f"tcp://{addr}:{port}", rank=rank,
                                world_size=n, timeout=timeout)
    else:
        store = harness.tcp_store(addr, port, n, rank == 0, timeout)
        dist.init_process_group(backends[0], store=dist.PrefixStore("default", store), rank=rank,
                                world_size=n, timeout=timeout)
    groups = {backends[0]: None}
    for be in backends[1:]:
        try:
            groups[be] = dist.new_group(backend=be, timeout=timeout)
        except Exception as e:  # noqa: BLE001  reported, not raised
            results[be] = f"{type(e).__name__}: {e}"
    losses = {}
    for be, group in groups.items():
        try:
            collectives(group, rank, n)
            losses[be] = ddp_losses(group, rank)
            results[be] = "ok"
        except Exception as e:  # noqa: BLE001
            results[be] = f"{type(e).__name__}: {e}"
    dist.barrier()  # rank 0's store must outlive every rank's last use of it
    print(json.dumps({"rank": rank, "host": socket.gethostname(), "results": results,
                      "losses": losses}), flush=True)
    os._exit(0)  # a failed backend's half-made group must not hang the exit


if __name__ == "__main__":
    main()

"""One rank of test_hosts_collectives.py's unreceived-send job (2 ranks, one per host).

    hosts_unreceived_send.py RANK STORE_ADDR PORT COUNT

Rank 0 isends COUNT float32 to rank 1, then both run an allreduce, and only then does rank 1
post the receive: legal in c10d (and in MPI: a nonblocking send must not stop the collectives
that follow it). Run on a gloo group (the reference) and then on a braid group with a short
timeout. Prints one JSON line: {"rank", "gloo": "ok" | error, "braid": "ok" | error, "seconds"}.
"""

import datetime
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torch_braid  # noqa: E402,F401


def pattern(group, count):
    rank = dist.get_rank()
    data = torch.arange(count, dtype=torch.float32)
    w = dist.isend(data, 1, group=group) if rank == 0 else None
    t = torch.ones(1)
    dist.all_reduce(t, group=group)  # behind the send on the pair's connection
    assert t.item() == 2, t
    if rank == 1:
        got = torch.zeros(count)
        dist.irecv(got, 0, group=group).wait()
        assert torch.equal(got, data), "the received tensor differs"
    else:
        w.wait()


def main():
    rank, addr, port, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = harness.tcp_store(addr, port, 2, rank == 0, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore("default", store), rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    braid = dist.new_group(backend="braid", timeout=datetime.timedelta(seconds=10))
    out = {"rank": rank, "seconds": {}}
    for name, group in (("gloo", dist.group.WORLD), ("braid", braid)):
        t0 = time.monotonic()
        try:
            pattern(group, count)
            out[name] = "ok"
        except Exception as e:  # noqa: BLE001  reported
            out[name] = f"{type(e).__name__}: {str(e)[:800]}"
        out["seconds"][name] = round(time.monotonic() - t0, 2)
    print(json.dumps(out), flush=True)
    os._exit(0)  # a broken braid group must not hang the exit


if __name__ == "__main__":
    main()

"""One rank of test_hosts_faults.py's clean-exit test (Note [Leaving quietly]).

    hosts_leave_rank.py RANK WORLD STORE_ADDR PORT ROUNDS OPS

Rank 0 hosts a TCPStore on STORE_ADDR. ROUNDS times, every rank makes a braid default group,
runs OPS small collectives (allreduce, broadcast, allgather, reduce in turn, each checked
against its closed form) and destroys the group at once: ranks that finish first leave while
the others may still have to take their last messages. Prints one JSON line: {"rank",
"rounds": rounds completed, "error": None or the first error}.
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


def one_op(i, rank, n):
    k, root = i % 4, i % n
    x = torch.full((1,), float(rank + 1))
    if k == 0:
        dist.all_reduce(x)
        want = n * (n + 1) / 2
    elif k == 1:
        dist.broadcast(x, root)
        want = root + 1
    elif k == 2:
        outs = [torch.zeros(1) for _ in range(n)]
        dist.all_gather(outs, x)
        assert [o.item() for o in outs] == [r + 1.0 for r in range(n)], f"op {i}: {outs}"
        return
    else:
        dist.reduce(x, root)
        want = n * (n + 1) / 2 if rank == root else rank + 1
    assert x.item() == want, f"op {i} ({k}): {x.item()} != {want}"


def main():
    rank, n, addr, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    rounds, ops = int(sys.argv[5]), int(sys.argv[6])
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=30)
    store = harness.tcp_store(addr, port, n, rank == 0, timeout)
    done, error = 0, None
    try:
        for r in range(rounds):
            dist.init_process_group("braid", store=dist.PrefixStore(f"round{r}", store),
                                    rank=rank, world_size=n, timeout=timeout)
            for i in range(ops):
                one_op(i, rank, n)
            dist.destroy_process_group()
            done += 1
    except Exception as e:  # noqa: BLE001  reported, not raised
        error = f"{type(e).__name__}: {e}"
    # Rank 0's store must outlive every rank's last use of it: the others' add.
    if rank:
        store.add("left", 1)
    else:
        while int(store.add("left", 0)) < n - 1:
            time.sleep(0.01)
    print(json.dumps({"rank": rank, "rounds": done, "error": error}), flush=True)
    os._exit(0)  # a failed round's group must not hang the exit


if __name__ == "__main__":
    main()

"""One rank of a flight-recorder case (test_flight_recorder.py).

    python flight_recorder.py CASE RANK WORLD STORE_FILE OUT_DIR

Settings come from the environment, per rank (BRAID_FR_*). Cases:
- ops: a known series of ops, then an on-demand dump to OUT_DIR/fr_<rank>.
- timeout: four allreduces, but rank 1 skips the fourth; the others time out
  after 1 s and dump (BRAID_FR_DUMP_FILE); rank 1 sleeps past that, then
  destroys the group, sees the store key and dumps too.
- off: a few ops with the recorder off; the dump must hold no entry.
Prints "CAUGHT <message>" for an error it caught, "DONE" at the end.
"""
import datetime
import os
import sys
import time

CASE, RANK, WORLD, STORE_FILE, OUT = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                      sys.argv[4], sys.argv[5])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "python"))
import torch_braid  # noqa: E402
import torch_braid.fr  # noqa: E402


def init(timeout_s):
    store = dist.FileStore(STORE_FILE, WORLD)
    dist.init_process_group("braid", store=store, rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=timeout_s))


def ops():
    init(30)
    t = torch.ones(4)
    dist.all_reduce(t)
    b = torch.zeros(2, 3, dtype=torch.int64)
    dist.broadcast(b, src=0)
    outs = [torch.zeros(5, dtype=torch.float64) for _ in range(WORLD)]
    dist.all_gather(outs, torch.ones(5, dtype=torch.float64))
    msg = torch.zeros(7, dtype=torch.bfloat16)
    if RANK == 0:
        dist.send(msg, dst=1)
    else:
        dist.recv(msg, src=0)
    dist.barrier()
    # Rank 0's arguments fail its own checks (a poison header tells rank 1):
    # both still record one op, so the sequence numbers stay aligned.
    op = dist.ReduceOp.BAND if RANK == 0 else dist.ReduceOp.SUM  # BAND: no floats
    try:
        dist.all_reduce(torch.zeros(3), op=op)
    except RuntimeError as e:
        print("CAUGHT " + str(e).splitlines()[0], flush=True)
    dist.barrier()  # runs after the poison op: the dump sees it completed
    torch_braid.fr.dump(os.path.join(OUT, "fr_"))
    dist.destroy_process_group()


def timeout():
    init(1.0)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    if RANK == 1:
        time.sleep(2.5)  # never arrives at the fourth; the others time out
    else:
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            print("CAUGHT " + str(e).splitlines()[0], flush=True)
    dist.destroy_process_group()


def off():
    init(30)
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    assert not torch_braid.fr.enabled()
    torch_braid.fr.dump(os.path.join(OUT, "fr_"))
    dist.destroy_process_group()


{"ops": ops, "timeout": timeout, "off": off}[CASE]()
print("DONE", flush=True)

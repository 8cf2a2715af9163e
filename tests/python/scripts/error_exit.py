"""One rank of a 2-rank job that makes one error happen, catches it, and exits 0.

    python error_exit.py CASE RANK STORE_FILE

Run by test_error_exit.py, which fails on any exit by a signal: an error that
braid raises must reach Python as an exception on every torch version, never
kill the process (issue 8: torch 2.11 died with SIGSEGV on every error path).
Prints "CAUGHT <type>: <message>" for the error it caught, "NOERROR" if none
was raised; a rank that has no error to raise in a case prints "BYSTANDER".
"""
import datetime
import os
import sys
import time

CASE, RANK, STORE_FILE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
WORLD = 2

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "python"))
import torch_braid  # noqa: E402,F401


def backend_object():
    pg = dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_get_backend"):
        return pg._get_backend(torch.device("cpu"))
    return pg


def init(timeout_s=30.0):
    store = dist.FileStore(STORE_FILE, WORLD)
    dist.init_process_group("braid", store=store, rank=RANK, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=timeout_s))


def reducer_shape_mismatch():
    from torch_braid.ddp import DistributedDataParallel

    DistributedDataParallel(torch.nn.Linear(4, 3 + RANK))


def hook_bad_state():
    from torch_braid.ddp import DistributedDataParallel

    DistributedDataParallel(torch.nn.Linear(4, 3)).register_comm_hook(object(), None)


# Each case runs after init; rank 1 is the odd one out in mismatches.
CASES = {
    "shape": lambda: dist.all_reduce(torch.ones(3 if RANK == 1 else 4)),
    "dtype": lambda: dist.all_reduce(
        torch.ones(4, dtype=torch.float16 if RANK == 1 else torch.float32)),
    "op": lambda: (dist.all_reduce(torch.ones(4)) if RANK == 1
                   else dist.broadcast(torch.ones(4), 0)),
    "root": lambda: dist.broadcast(torch.ones(4), 1 if RANK == 1 else 0),
    "reduce_op": lambda: dist.all_reduce(
        torch.ones(4), op=dist.ReduceOp.MAX if RANK == 1 else dist.ReduceOp.SUM),
    "complex": lambda: backend_object().allreduce([torch.ones(4, dtype=torch.complex64)]).wait(),
    "band_float": lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND),
    "sparse_max": lambda: dist.all_reduce(torch.eye(3).to_sparse(), op=dist.ReduceOp.MAX),
    "async_mismatch": lambda: dist.all_reduce(torch.ones(3 if RANK == 1 else 4),
                                              async_op=True).wait(),
    "future_mismatch": lambda: dist.all_reduce(torch.ones(3 if RANK == 1 else 4),
                                               async_op=True).get_future().wait(),
    "send_size": lambda: (dist.send(torch.ones(3), 1) if RANK == 0
                          else dist.recv(torch.ones(4), 0)),
    "reducer": reducer_shape_mismatch,
    "hook_arguments": hook_bad_state,
}


def run_case():
    if CASE == "timeout":  # rank 1 never joins the allreduce
        init(timeout_s=2.0)
        if RANK == 1:
            time.sleep(4.0)
            return "BYSTANDER"
        dist.all_reduce(torch.ones(4))
    elif CASE == "dead_peer":
        init()
        if RANK == 1:
            os._exit(0)  # gone without a word
        time.sleep(0.5)
        dist.all_reduce(torch.ones(4))
    elif CASE == "spans_hosts":
        if RANK == 1:  # another host, whose interface setting names none it has
            os.environ["BRAID_HOST_ID_OVERRIDE"] = "some-other-host"
            os.environ["BRAID_SOCKET_IFNAME"] = "no-such-if0"
        init()
    else:
        init()
        CASES[CASE]()
    return "NOERROR"


def main():
    try:
        outcome = run_case()
    except Exception as e:  # noqa: BLE001 - printing what was caught is the point
        outcome = f"CAUGHT {type(e).__name__}: {e}"
    print(outcome.replace("\n", " | "), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The flight recorder's cost on small allreduces, end to end.

    /usr/bin/python3 benchmarks/fr_overhead.py [--nprocs 2] [--bytes 4] [--rounds 40] [--ops 2000]

One job, the recorder on (BRAID_FR_BUFFER_SIZE, default 2000): every round
times a block of `--ops` allreduces with the recorder recording and a block
with it paused (torch_braid._C._fr_pause: record() returns at once, as with
BRAID_FR_BUFFER_SIZE=0), in alternating order. Runs of collectives.py
--env BRAID_FR_BUFFER_SIZE=0,2000 are separate processes minutes apart, and on
a shared machine their times vary far more than the 2% under test (3.7-49 us
per 4-byte allreduce in one sweep here); paired blocks in the same processes
see the same load, so the median of the per-round ratios measures the cost.
Prints rank 0's per-op times (median and best block) and that ratio.
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def _rank(rank, args, store_path, q):
    import torch_braid  # noqa: F401
    from torch_braid import _C

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, args.nprocs)
    dist.init_process_group("braid", store=store, rank=rank, world_size=args.nprocs,
                            timeout=datetime.timedelta(seconds=60))
    t = torch.ones(max(1, args.bytes // 4))

    def block(record):
        _C._fr_pause(not record)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(args.ops):
            dist.all_reduce(t)
        return ((time.perf_counter() - t0) / args.ops * 1e6,
                (time.thread_time() - c0) / args.ops * 1e6)

    for _ in range(3):
        block(True)
    times = {True: [], False: []}
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for record in order:
            times[record].append(block(record))
    _C._fr_pause(False)
    dist.destroy_process_group()
    if rank == 0:
        q.put(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nprocs", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--ops", type=int, default=2000)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_rank, args=(r, args, os.path.join(d, "store"), q))
                 for r in range(args.nprocs)]
        for p in procs:
            p.start()
        times = q.get()
        for p in procs:
            p.join(120)
    print(f"# flight recorder overhead: allreduce {args.bytes} B, {args.nprocs} ranks, torch "
          f"{torch.__version__}, {args.rounds} rounds of {args.ops} ops per mode, rank 0, "
          f"load {os.getloadavg()[0]:.1f}")
    for i, what in ((0, "wall time"), (1, "CPU time of the calling thread")):
        on = [x[i] for x in times[True]]
        off = [x[i] for x in times[False]]
        ratios = [a / b for a, b in zip(on, off)]
        q = statistics.quantiles(ratios, n=4)
        print(f"{what}: recording median {statistics.median(on):.2f} us/op (best block "
              f"{min(on):.2f}), paused median {statistics.median(off):.2f} (best {min(off):.2f}); "
              f"recording/paused: median of per-round ratios {statistics.median(ratios):.4f} "
              f"(quartiles {q[0]:.4f}, {q[2]:.4f}), ratio of best blocks {min(on) / min(off):.4f}")


if __name__ == "__main__":
    main()

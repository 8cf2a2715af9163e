#!/usr/bin/env python3
r"""How braid's allreduce recovers after a block of another backend's ops in the same processes.

    /usr/bin/python3 benchmarks/coresidence.py --nprocs 4 --size 4
    BRAID_PIN_RANKS=0 /usr/bin/python3 benchmarks/coresidence.py --nprocs 4 --size 4   # unbound
    ... --pin        # bind rank r to CPU r % ncpus before braid starts (as a launcher would)

Every rank holds a braid group and a gloo group (issue 30 item 4). After 2000 untimed braid
allreduces of --size bytes, each of 6 repeats times 5 windows of braid allreduces (the base),
then runs one disturbance, then times 10 more windows. A window is 200 calls below 100 KB, else
5. Disturbances (--modes): none; gloo4 (300 gloo allreduces of 4 bytes); gloo16M (three gloo
allreduces of 16 MiB); sleep (50 ms idle). Rank 0 prints, per mode, the median base time per
call and the median over repeats of each later window, in us: a disturbance that leaves traces
shows as windows above the base that come down to it (Note [Pinning ranks on a full host] in
csrc/common/rank_pinning.h).
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))


def run(rank, n, mode, size, port, pin):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    import torch_braid  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("braid", rank=rank, world_size=n)
    g = dist.new_group(backend="gloo")
    x = torch.ones(max(size // 4, 1))
    y = torch.ones(16 << 18)
    k = 200 if size < 100000 else 5

    def window():
        t0 = time.perf_counter()
        for _ in range(k):
            dist.all_reduce(x)
        return (time.perf_counter() - t0) / k * 1e6

    for _ in range(2000 if size < 100000 else 20):
        dist.all_reduce(x)
    reps = []
    for _ in range(6):
        base = [window() for _ in range(5)]
        if mode == "gloo16M":
            for _ in range(3):
                dist.all_reduce(y, group=g)
        elif mode == "gloo4":
            for _ in range(300):
                dist.all_reduce(x[:1], group=g)
        elif mode == "sleep":
            time.sleep(0.05)
        reps.append((statistics.median(base), [window() for _ in range(10)]))
    if rank == 0:
        b = statistics.median(r[0] for r in reps)
        cols = [statistics.median(r[1][i] for r in reps) for i in range(10)]
        print(f"{mode:8s} n={n} size={size} base={b:.1f}us, windows of {k} after: "
              + " ".join(f"{c:.0f}" for c in cols), flush=True)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nprocs", type=int, default=4)
    p.add_argument("--size", type=int, default=4, help="bytes per braid allreduce (4)")
    p.add_argument("--modes", default="none,gloo4,gloo16M,sleep")
    p.add_argument("--pin", action="store_true", help="bind rank r to CPU r %% ncpus first")
    args = p.parse_args()
    import torch.multiprocessing as mp

    print(f"# coresidence: BRAID_PIN_RANKS={os.environ.get('BRAID_PIN_RANKS', 'auto')} "
          f"pin={'yes' if args.pin else 'no'} cpus={len(os.sched_getaffinity(0))}", flush=True)
    for i, mode in enumerate(args.modes.split(",")):
        port = 29500 + (os.getpid() * 7 + i) % 2000
        mp.start_processes(run, args=(args.nprocs, mode, args.size, port, args.pin),
                           nprocs=args.nprocs, start_method="spawn")


if __name__ == "__main__":
    main()

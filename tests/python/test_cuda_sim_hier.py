"""Ranks that share several GPUs: braid's hierarchical CUDA collectives through torch_braid.

4 ranks on 2 simulated GPUs (ranks 0 and 1 on cuda:0, 2 and 3 on cuda:1): the group
chooses the hierarchical executor (Note [Hierarchical CUDA collectives] in
csrc/cuda/hier.h): braid's same-GPU collectives within each GPU, NCCL between the GPUs'
leaders. The simulated NCCL meets its communicators inside one process, so the ranks
here are threads, each with its own ProcessGroupBraid over one store, as
tests/cpp/test_cuda_hier.cc's are. all_reduce (SUM, MAX, AVG) and broadcast are checked
against closed forms at counts 0, 1, odd and several same-GPU halves, the executor's
op counter shows they ran hierarchically; so do reduce, allgather and reduce_scatter,
in a contiguous and an interleaved layout; and gather, which the hierarchical executor
lacks (as AVG of integers), is staged and still right.
"""

import datetime
import os
import threading

import pytest

import harness as H

pytestmark = [pytest.mark.braid_only, H.simulated_cuda_only()]

HALF = 4096  # BRAID_CUDA_SAME_GPU_BYTES / 2: several chunks per op
N = 4


def _run_ranks(body, n=N, timeout_s=60, device_of=lambda r: r // 2):
    import torch
    import torch_braid._sim_cuda
    from torch_braid import _C

    torch_braid._sim_cuda.install(2)
    _C._sim_nccl_install()
    os.environ["BRAID_CUDA_SAME_GPU_BYTES"] = str(2 * HALF)
    store = torch.distributed.HashStore()
    errors = [None] * n

    def main(r):
        pg = _C.ProcessGroupBraid(store, r, n, datetime.timedelta(seconds=30))
        try:
            body(r, pg, torch.device("cuda", device_of(r)))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[r] = e
        finally:
            pg.shutdown()

    threads = [threading.Thread(target=main, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
        assert not t.is_alive(), "a rank hangs"
    for r, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"rank {r}: {e!r}") from e


def _value(torch, r, count, dtype):
    return (torch.arange(count, dtype=torch.float64) % 5 + r + 1).to(dtype)


def test_all_reduce_and_broadcast_run_hierarchically():
    import torch
    import torch.distributed as dist

    def body(r, pg, cuda):
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for op in ("SUM", "MAX", "AVG"):
                if op == "AVG" and not dtype.is_floating_point:
                    continue
                for count in (0, 1, 7, 3 * HALF // 4 + 1, 2 * HALF + 3):
                    t = _value(torch, r, count, dtype).to(cuda)
                    opts = dist.AllreduceOptions()
                    opts.reduceOp = getattr(dist.ReduceOp, op)
                    pg.allreduce([t], opts).wait()
                    got = t.cpu().double()
                    inputs = [_value(torch, q, count, dtype).double() for q in range(N)]
                    if op == "MAX":
                        want = torch.stack(inputs).max(0).values if count else got
                        assert torch.equal(got, want), (dtype, op, count)
                    elif op == "SUM":
                        assert torch.equal(got, sum(inputs)), (dtype, op, count)
                    else:
                        # AVG within each GPU, then among the leaders: rounded
                        # twice (Note [Hierarchical CUDA collectives]), so within
                        # 2u of the exact mean for inputs of one sign.
                        u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -24
                        want = sum(inputs) / N
                        assert torch.all((got - want).abs() <= 2 * u * want), (dtype, count)
        executor = pg._cuda_executor()
        assert executor.startswith("hier: 4 ranks on 2 GPUs"), executor
        before = pg._cuda_executor_ops()
        for root in range(N):
            for count in (0, 1, 7, 2 * HALF + 3):
                t = _value(torch, r, count, torch.float32).to(cuda)
                opts = dist.BroadcastOptions()
                opts.rootRank = root
                pg.broadcast([t], opts).wait()
                assert torch.equal(t.cpu(), _value(torch, root, count, torch.float32)), (root, count)
        assert pg._cuda_executor_ops() - before == N * 4, "broadcasts ran hierarchically"

    _run_ranks(body)


def test_ops_it_lacks_are_staged():
    import torch
    import torch.distributed as dist

    def body(r, pg, cuda):
        t = torch.ones(3, device=cuda)
        pg.allreduce([t]).wait()  # the executor is chosen at the first op
        assert pg._cuda_executor().startswith("hier"), pg._cuda_executor()
        before = pg._cuda_executor_ops()
        count = 2 * HALF + 3
        inp = _value(torch, r, count, torch.float32).to(cuda)
        outs = [torch.zeros(count, device=cuda) for _ in range(N)] if r == 1 else []
        opts = dist.GatherOptions()
        opts.rootRank = 1
        pg.gather([outs] if r == 1 else [], [inp], opts).wait()
        if r == 1:
            for q in range(N):
                assert torch.equal(outs[q].cpu(), _value(torch, q, count, torch.float32)), q
        # AVG of integers: the same-GPU kernels divide floats only, so staged
        # (the integer sum divided, truncating, as braid's CPU path does).
        t = _value(torch, r, 11, torch.int32).to(cuda)
        aopts = dist.AllreduceOptions()
        aopts.reduceOp = dist.ReduceOp.AVG
        pg.allreduce([t], aopts).wait()
        total = sum(_value(torch, q, 11, torch.int32) for q in range(N))
        assert torch.equal(t.cpu(), torch.div(total, N, rounding_mode="trunc").int())
        assert pg._cuda_executor_ops() == before, "gather and int AVG were staged"

    _run_ranks(body)


@pytest.mark.parametrize("layout", ["blocks", "interleaved"])
def test_reduce_allgather_reduce_scatter_run_hierarchically(layout):
    """reduce (to a leader and to a non-leader), _allgather_base and _reduce_scatter_base
    (Note [Hierarchical reduce, allgather and reduce_scatter] in csrc/cuda/hier.h), with
    ranks 0, 1 on cuda:0 (blocks) or ranks 0, 2 on cuda:0 (interleaved: the GPUs' blocks
    are not in rank order), against closed forms; the executor's op counter moves by one
    per op, which the staged path never touches."""
    import torch
    import torch.distributed as dist

    def body(r, pg, cuda):
        t = torch.ones(3, device=cuda)
        pg.allreduce([t]).wait()
        executor = pg._cuda_executor()
        assert executor.startswith("hier: 4 ranks on 2 GPUs"), executor
        before = pg._cuda_executor_ops()
        ops = 0
        for dtype in (torch.float32, torch.bfloat16, torch.int32):
            for count in (0, 1, 7, 2 * HALF + 3):
                inputs = [_value(torch, q, count, dtype) for q in range(N)]
                for root in (1, 2):
                    t = inputs[r].to(cuda)
                    ropts = dist.ReduceOptions()
                    ropts.rootRank = root
                    ropts.reduceOp = dist.ReduceOp.MAX if dtype == torch.int32 else dist.ReduceOp.SUM
                    pg.reduce([t], ropts).wait()
                    want = (torch.stack(inputs).max(0).values if count else inputs[r]) \
                        if dtype == torch.int32 else sum(x.double() for x in inputs).to(dtype)
                    got = t.cpu()
                    if r == root:
                        assert torch.equal(got, want), ("reduce", dtype, count, root)
                    else:
                        assert torch.equal(got, inputs[r]), ("reduce kept input", dtype, count)
                    ops += 1
                out = torch.full((N * count,), -1, dtype=dtype, device=cuda)
                pg._allgather_base(out, inputs[r].to(cuda)).wait()
                assert torch.equal(out.cpu(), torch.cat(inputs)), ("allgather", dtype, count)
                full = [_value(torch, q, N * count, dtype) for q in range(N)]
                got = torch.full((count,), -1, dtype=dtype, device=cuda)
                pg._reduce_scatter_base(got, full[r].to(cuda)).wait()
                want = sum(x.double() for x in full).to(dtype)[r * count:(r + 1) * count]
                assert torch.equal(got.cpu(), want), ("reduce_scatter", dtype, count)
                ops += 2
        assert pg._cuda_executor_ops() - before == ops, "they ran hierarchically"

    _run_ranks(body, device_of=(lambda r: r // 2) if layout == "blocks" else (lambda r: r % 2))

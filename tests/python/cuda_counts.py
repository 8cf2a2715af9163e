"""What a group's CUDA executors ran, for the CUDA tests (Note [Counting what an
executor moved] in csrc/cuda/staged.h): ProcessGroupBraid._cuda_executor_stats() gives
the executor chosen, the staged executor's ops and the bytes it copied device-to-host
and host-to-device, and the NCCL executor's (NCCL, same-GPU, hierarchical) ops and the
bytes of their buffers. Each CUDA test states what its ops imply, exactly, and checks
the difference, so that an op that silently takes another path (a CPU copy, the staged
executor instead of NCCL's) fails it.

    exp = cuda_counts.Expected()
    before = cuda_counts.snapshot(backend)
    dist.all_reduce(t)                      # a float32 tensor of c elements
    exp.staged(d2h=4 * c, h2d=4 * c)
    ok, detail = cuda_counts.compare(backend, before, exp, "staged")
"""

import math

KEYS = ("staged_ops", "staged_d2h_bytes", "staged_h2d_bytes", "nccl_ops", "nccl_bytes")


def backend(ctx, device, group=None):
    """The ProcessGroupBraid that serves `device` in `group` (the default group if None):
    torch 2.x holds one backend per device, torch 1.13's group is braid's."""
    dist = ctx.dist
    group = group if group is not None else dist.distributed_c10d._get_default_group()
    return group._get_backend(device) if ctx.torch2 else group


def chosen_backend(ctx, device, group=None):
    """backend(), once the group chose its CUDA executor: an allreduce of one element
    first. (The choice is made at the first op that could run on NCCL; an allgather of a
    list, the coalesced forms, send and recv never ask, and the executor reads '' until
    then.)"""
    ctx.dist.all_reduce(ctx.torch.zeros(1, device=device), group=group)
    return backend(ctx, device, group)


def snapshot(backend):
    return dict(backend._cuda_executor_stats())


class Expected:
    """The counts a sequence of ops implies, summed op by op."""

    def __init__(self):
        self.counts = dict.fromkeys(KEYS, 0)

    def staged(self, d2h=0, h2d=0, ops=1):
        """`ops` staged ops, each copying `d2h` bytes of inputs into its shadows and `h2d`
        bytes of outputs back."""
        self.counts["staged_ops"] += ops
        self.counts["staged_d2h_bytes"] += ops * d2h
        self.counts["staged_h2d_bytes"] += ops * h2d
        return self

    def recorded(self, ops, nccl=False):
        """The recorded ops (recorded_since), all on CUDA tensors: staged, each copies its
        inputs in and its outputs back; on the NCCL executor, each counts its larger
        buffer."""
        for name, nin, nout in ops:
            assert name in _WHOLE, f"no closed form here for {name} ({nin} -> {nout} bytes)"
            if nccl:
                self.nccl(max(nin, nout))
            else:
                self.staged(d2h=nin, h2d=nout)
        return self

    def nccl(self, nbytes, ops=1):
        """`ops` ops on the NCCL executor, each of `nbytes`: its larger buffer on this rank."""
        self.counts["nccl_ops"] += ops
        self.counts["nccl_bytes"] += ops * nbytes
        return self


# Element sizes of the flight recorder's dtype names (c10::toString).
_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2,
          "Char": 1, "Byte": 1, "Bool": 1}
# The ops whose staged copies are every input in and every output back, on every rank.
_WHOLE = {"braid:all_reduce", "braid:broadcast", "braid:all_gather", "braid:_all_gather_base"}


def recorded_mark():
    """The last record id of braid's flight recorder in this process (torch_braid.fr):
    recorded_since(mark) then lists the ops issued after this call."""
    import torch_braid.fr as fr

    return max((e["record_id"] for e in fr.entries()["entries"]), default=-1)


def recorded_since(mark):
    """(name, input bytes, output bytes) of every braid op this process issued after
    `mark`, in order, as the flight recorder saw them (ops a library issues for us: DDP's
    buckets, a hook's collectives)."""
    import torch_braid.fr as fr

    def nbytes(sizes, dtypes):
        return sum(math.prod(s) * _BYTES[d] for s, d in zip(sizes, dtypes))

    return [(e["profiling_name"], nbytes(e["input_sizes"], e["input_dtypes"]),
             nbytes(e["output_sizes"], e["output_dtypes"]))
            for e in sorted(fr.entries()["entries"], key=lambda e: e["record_id"])
            if e["record_id"] > mark]


def compare(backend, before, expected, executor):
    """(ok, detail): the executor is `executor` (None: any, or none yet) and the counts
    moved by exactly `expected` since `before` (a snapshot)."""
    after = snapshot(backend)
    got = {k: after[k] - before[k] for k in KEYS}
    ok = executor in (None, after["executor"]) and got == expected.counts
    wrong = {k: (got[k], expected.counts[k]) for k in KEYS if got[k] != expected.counts[k]}
    detail = (f"executor {after['executor']!r} (expected {executor!r}); "
              f"(got, expected) counts: {wrong or 'as expected'}")
    return ok, detail


def check(ch, what, backend, before, expected, executor):
    """compare() into a harness Checker."""
    ok, detail = compare(backend, before, expected, executor)
    ch.true(f"{what}: the CUDA executor's counts", ok, detail)


def require(what, backend, before, expected, executor):
    """compare(), asserted."""
    ok, detail = compare(backend, before, expected, executor)
    assert ok, f"{what}: {detail}"

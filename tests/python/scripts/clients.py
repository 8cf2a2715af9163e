"""Shared pieces of the tests that run torch's own clients of a process group on braid
(tests/python/test_clients_*.py): FSDP2, DTensor and tensor parallelism, functional
collectives, compiled DDP.

Each such test runs the client twice in the same ranks, once over braid (the default group
of a pooled harness world, or groups made on it) and once over gloo (ctx.ref, or gloo groups
made beside it), from the same seeds and inputs, and compares the two runs: bit for bit
where the reduction order allows, else within a tolerance the test states. Where gloo
itself fails on this torch (AVG, PREMUL_SUM or bf16 reductions), the test says so and
compares braid with a closed form or a reference computed in one process instead.

Note [Which runs can be bit for bit]
A client's numbers differ between backends only through its reductions. A sum of two
values is the same in either order; AVG and the FSDP divide factors of these tests divide
by a power of two (exact). So at 2 ranks braid and gloo must agree bit for bit on every
loss and parameter. At 4 ranks each backend adds the four ranks' values in its own order
(gloo's ring starts each chunk at another rank), so fp32 results differ in the last bits
and the differences grow by a few ulps per step: there the tests use FP32_TOL, about 100
ulps of the values involved, far below any real error (a missing or doubled rank's share,
a wrong divide) which moves results by percents.
"""

import os
import sys

# rtol, atol for fp32 results that went through sums of 4 ranks in different orders
# (Note [Which runs can be bit for bit]); and for fp32 runs compared with a one-process
# reference (same maths, different summation order in every matmul and reduction).
FP32_TOL = (1e-5, 1e-6)
# bf16 results against an fp32 reference: bf16 keeps 8 significant bits (relative
# rounding 2^-9 = 2e-3 per operation); a few steps of a small model stay within 2e-2.
BF16_TOL = (2e-2, 2e-3)
# bf16 training against fp32: each parameter's update (final - initial) within this fraction
# of the tensor's largest update. bf16 gradients carry ~2^-8 relative error (a few 1e-3 after
# the sums); a rank's share lost or doubled changes updates by 1/n of them or more.
BF16_UPDATE = 0.05


def _old():
    import torch

    return f"torch {torch.__version__.split('+')[0]} (older than 2.6)"


def torch_version():
    import torch

    return tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def fsdp2_missing():
    """Why this torch cannot run FSDP2, or None."""
    if torch_version() < (2, 6):
        return f"{_old()} has no public FSDP2 (torch.distributed.fsdp.fully_shard)"
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError as e:
        return f"this torch has no torch.distributed.fsdp.fully_shard ({e})"
    import torch

    if not hasattr(torch.cpu.Stream, "record_event"):
        # torch 2.6: FSDP2 records events on its streams, which CPU streams cannot yet.
        return (f"torch {torch.__version__}'s FSDP2 does not run on CPU: torch.cpu.Stream has "
                f"no record_event (FSDP2's all-gather calls it; CPU support came in later torch)")
    return None


def dtensor_missing():
    if torch_version() < (2, 6):
        return f"{_old()} has no public torch.distributed.tensor (DTensor)"
    try:
        from torch.distributed.tensor import distribute_tensor  # noqa: F401
        from torch.distributed.tensor.parallel import parallelize_module  # noqa: F401
    except ImportError as e:
        return f"this torch has no torch.distributed.tensor ({e})"
    return None


def funcol_missing():
    if torch_version() < (2, 6):
        return (f"{_old()}: torch.distributed._functional_collectives predates the native "
                f"_c10d_functional ops these tests use")
    try:
        import torch.distributed._functional_collectives  # noqa: F401
    except ImportError as e:
        return f"this torch has no torch.distributed._functional_collectives ({e})"
    return None


def compile_missing():
    """Why torch.compile(backend='aot_eager') cannot run here, or None."""
    import torch

    if torch_version() < (2, 6):
        return f"{_old()} has no torch.compile"
    if not hasattr(torch, "compile"):
        return "this torch has no torch.compile"
    try:
        import torch._dynamo  # noqa: F401
    except ModuleNotFoundError as e:
        # Only the module missing is a reason to skip (a build that leaves dynamo out);
        # anything else going wrong in its import is a failure, not a skip.
        if e.name != "torch._dynamo":
            raise
        return f"this torch has no torch._dynamo ({e})"
    return None


def gloo_error(exc):
    """True when exc is gloo refusing a reduce op or dtype it lacks on this torch."""
    import re

    return isinstance(exc, (RuntimeError, ValueError, TypeError)) and re.search(
        r"Invalid scalar type|Cannot use ReduceOp|not supported|[Uu]nsupported|does not support|"
        r"Gloo", str(exc)) is not None


def compare_tensors(what, got, expected, tol=None):
    """Failure lines (empty when equal): bit for bit with tol None, else allclose(rtol, atol)."""
    import torch

    out = []
    if len(got) != len(expected):
        return [f"{what}: {len(got)} tensors against {len(expected)}"]
    for i, (g, e) in enumerate(zip(got, expected)):
        if g.shape != e.shape or g.dtype != e.dtype:
            out.append(f"{what}[{i}]: {g.dtype}{list(g.shape)} against {e.dtype}{list(e.shape)}")
            continue
        if tol is None:
            if not torch.equal(g, e):
                diff = (g.double() - e.double()).abs()
                bad = int((g != e).sum())
                out.append(f"{what}[{i}]: {bad} of {g.numel()} elements differ, max "
                           f"|diff| {diff.max().item():.3g}")
        else:
            rtol, atol = tol
            g64, e64 = g.double(), e.double()
            if not torch.allclose(g64, e64, rtol=rtol, atol=atol):
                diff = (g64 - e64).abs()
                bad = int((diff > atol + rtol * e64.abs()).sum())
                out.append(f"{what}[{i}]: {bad} of {g.numel()} elements beyond rtol {rtol} "
                           f"atol {atol}; max |diff| {diff.max().item():.3g}")
    return out


def compare_updates(what, got, ref, init, frac):
    """Failure lines unless every |(got - init) - (ref - init)| <= frac * max|ref - init|
    (per tensor)."""
    out = []
    for i, (g, r, p0) in enumerate(zip(got, ref, init)):
        dg, dr = g.double() - p0.double(), r.double() - p0.double()
        scale = dr.abs().max().item()
        err = (dg - dr).abs().max().item()
        if err > frac * scale + 1e-12:
            out.append(f"{what}[{i}]: update off by {err:.3g}, more than {frac} of the largest "
                       f"update {scale:.3g}")
    return out


def add_scripts_path():
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)

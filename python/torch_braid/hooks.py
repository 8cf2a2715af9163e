"""DDP communication hooks implemented in C++ (csrc/hooks).

With PyTorch's DistributedDataParallel::

    import torch_braid.hooks as hooks
    state = hooks.bf16_state()                      # default process group
    ddp.register_comm_hook(state, hooks.bf16_compress)

    state = hooks.powersgd_state(matrix_approximation_rank=4, start_powerSGD_iter=1000)
    ddp.register_comm_hook(state, hooks.powersgd)

Faster, with the same values: ``hooks.register(ddp, state)`` hands the C++ hook
to DDP's C++ reducer, so no Python runs per bucket (see :func:`register`).

With braid's reducer, pass the same pair; it runs ``state._cpp_hook()`` in C++
without calling back into Python.

Every hook averages over the group, as PyTorch's built-in hooks do. A state
belongs to one model: it keeps per-bucket memory (PowerSGD's Q and residuals,
the int8 residuals) keyed by bucket index.
"""

import torch.distributed as dist

from torch_braid import _C

__all__ = [
    "HookState",
    "register",
    "allreduce_state",
    "fp16_state",
    "bf16_state",
    "powersgd_state",
    "int8_state",
    "allreduce",
    "fp16_compress",
    "bf16_compress",
    "powersgd",
    "int8_compress",
]


def _group(process_group):
    if process_group is not None:
        return process_group
    if not dist.is_initialized():
        raise RuntimeError(
            "torch_braid.hooks: no process_group given and the default group is not "
            "initialized; call torch.distributed.init_process_group first")
    return dist.distributed_c10d._get_default_group()


class HookState:
    """State of one C++ hook: pass it to ``register_comm_hook`` with its hook function."""

    def __init__(self, kind, cpp_hook):
        self._kind = kind
        self._hook = cpp_hook

    def _cpp_hook(self):
        """The ``torch_braid._C._CommHook`` (a shared C++ c10d::CommHookInterface)."""
        return self._hook

    @property
    def kind(self):
        return self._kind

    @property
    def payload_bytes(self):
        """Bytes this rank handed to collectives since creation or reset_counters()."""
        return self._hook.payload_bytes

    @property
    def wire_bytes(self):
        """Bytes each rank moved (allreduce S*2(n-1)/n, allgather S*(n-1)) so far."""
        return self._hook.wire_bytes

    def reset_counters(self):
        self._hook.reset_counters()

    @property
    def iteration(self):
        """Completed iterations (PowerSGD counts them to switch on compression)."""
        return self._hook.iteration

    def residual(self, bucket_index):
        """A copy of the error-feedback residual of a bucket, or None."""
        return self._hook.residual(bucket_index)

    # DDP pickles the state with the model in some paths (e.g. torch.save of a
    # DDP module); a C++ hook holds a process group and cannot travel.
    def __getstate__(self):
        raise TypeError("torch_braid.hooks state cannot be pickled; create it again after loading")

    def __repr__(self):
        return "HookState(%s, rank=%d, world_size=%d)" % (
            self._kind, self._hook.rank, self._hook.world_size)


def allreduce_state(process_group=None):
    """State for :func:`allreduce` (mean over the group)."""
    return HookState("allreduce", _C._allreduce_hook(_group(process_group)))


def fp16_state(process_group=None):
    """State for :func:`fp16_compress` (float16 on the wire, half the bytes)."""
    return HookState("fp16", _C._fp16_compress_hook(_group(process_group)))


def bf16_state(process_group=None):
    """State for :func:`bf16_compress` (bfloat16 on the wire, half the bytes)."""
    return HookState("bf16", _C._bf16_compress_hook(_group(process_group)))


def powersgd_state(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=1000,
                   min_compression_rate=2, use_error_feedback=True, warm_start=True,
                   orthogonalization_epsilon=0, random_seed=0):
    """State for :func:`powersgd`; arguments as torch's ``PowerSGDState``.

    Before ``start_powerSGD_iter`` iterations the hook is a plain allreduce. A
    gradient of rank < 2, or one where (n + m) * r * min_compression_rate >= n * m,
    is allreduced uncompressed.
    """
    hook = _C._powersgd_hook(
        _group(process_group), int(matrix_approximation_rank), int(start_powerSGD_iter),
        float(min_compression_rate), bool(use_error_feedback), bool(warm_start),
        float(orthogonalization_epsilon), int(random_seed))
    return HookState("powersgd", hook)


def int8_state(process_group=None, chunk_size=512, use_error_feedback=True):
    """State for :func:`int8_compress`: int8 values with one fp32 scale per
    ``chunk_size`` elements, allgathered, with error feedback (see docs/hooks.md)."""
    return HookState("int8", _C._int8_hook(_group(process_group), int(chunk_size),
                                           bool(use_error_feedback)))


def _first(fut):
    return fut.value()[0]


def _run(state, bucket, kind):
    if not isinstance(state, HookState) or state._kind != kind:
        raise TypeError(
            "torch_braid.hooks: the %s hook needs the state from torch_braid.hooks.%s_state(), "
            "got %r" % (kind, kind, state))
    hook = state._hook
    gradients = bucket.gradients() if hook.needs_layout else []
    fut = hook.run(bucket.buffer(), bucket.index(), bucket.is_last(), gradients)
    # PyTorch's DDP reads a Python hook's result as a Python object holding
    # one tensor; the C++ future holds a one-tensor list.
    return fut.then(_first)


def allreduce(state, bucket):
    """Mean of the bucket over the group (PyTorch's allreduce_hook)."""
    return _run(state, bucket, "allreduce")


def fp16_compress(state, bucket):
    """Mean computed in float16 on the wire (PyTorch's fp16_compress_hook)."""
    return _run(state, bucket, "fp16")


def bf16_compress(state, bucket):
    """Mean computed in bfloat16 on the wire (PyTorch's bf16_compress_hook)."""
    return _run(state, bucket, "bf16")


def powersgd(state, bucket):
    """PowerSGD low-rank compression (PyTorch's powerSGD_hook)."""
    return _run(state, bucket, "powersgd")


def int8_compress(state, bucket):
    """int8 quantized mean with per-chunk scales and error feedback."""
    return _run(state, bucket, "int8")


_HOOK_FUNCTIONS = {"allreduce": allreduce, "fp16": fp16_compress, "bf16": bf16_compress,
                   "powersgd": powersgd, "int8": int8_compress}


def register(model, state):
    """Registers the hook of ``state`` on a DDP model, to run in C++.

    ``model`` is a ``torch.nn.parallel.DistributedDataParallel`` or a
    ``torch_braid.ddp.DistributedDataParallel``; call it where you would call
    ``model.register_comm_hook``, once per model. The values are the same as
    through ``model.register_comm_hook(state, hooks.<kind>)``, but that path
    runs a Python function per bucket under the GIL, which cost up to 12 ms
    per step on a 100 MB model (2 ranks, 2 cores; 6.4 ms on average without
    bucket views, 2.4 with them): about what a hook saves over DDP's own
    division pass. Here PyTorch's C++ reducer calls the C++ hook itself (Note
    [Reaching DDP's reducer] in csrc/c10d/compat_reducer.h). A DDP model that runs its
    Python reducer (compiled autograd's optimize_ddp='python_reducer') calls
    hooks per parameter, not per bucket; register refuses it.
    """
    import torch

    from torch_braid.ddp import DistributedDataParallel as BraidDDP

    if not isinstance(state, HookState):
        raise TypeError("torch_braid.hooks.register: the state must come from "
                        "torch_braid.hooks.*_state(), got %r" % (state,))
    if isinstance(model, BraidDDP):  # braid's reducer runs C++ hooks already
        model.register_comm_hook(state, _HOOK_FUNCTIONS[state.kind])
        return
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError("torch_braid.hooks.register: expected a DistributedDataParallel model, "
                        "got %s" % type(model).__name__)
    if getattr(model, "_use_python_reducer", False):
        # There DDP calls hooks per parameter with (grad, param), not per bucket.
        raise RuntimeError("torch_braid.hooks.register: this DDP model runs its Python reducer "
                           "(torch._dynamo.config.optimize_ddp='python_reducer'), which calls "
                           "hooks per parameter; braid's hooks take DDP's buckets")
    _C._register_on_reducer(model.reducer, state._cpp_hook())
    logger = getattr(model, "logger", None)
    if logger is not None:  # what DDP's logging data reports as the hook
        logger._set_comm_hook_name(state._hook.name)

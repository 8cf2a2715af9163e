"""braid's DDP gradient reducer behind an ``nn.Module`` wrapper.

    import torch_braid
    from torch_braid.ddp import DistributedDataParallel as DDP

    dist.init_process_group("braid")        # or gloo, nccl: any process group works
    model = DDP(model)                      # checks shapes, broadcasts rank 0's state
    loss_fn(model(x), y).backward()         # grads are averaged over ranks on return
    with model.no_sync():                   # accumulate locally, no communication
        loss_fn(model(x), y).backward()

The reducer is C++ (csrc/reducer): gradients are copied into flat buckets by
autograd hooks, and each bucket's allreduce starts as soon as backward has
filled it. The options mean what they mean for ``torch.nn.parallel.
DistributedDataParallel``; see ``DistributedDataParallel`` below for the
differences.
"""

import contextlib
from typing import Any, Iterator, List

import torch
import torch.distributed as dist  # registers c10d's pybind types before _C uses them
from torch import nn

from . import _C

__all__ = ["DistributedDataParallel"]

_MIB = 1024 * 1024


def _find_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Yields the tensors in a forward output (nested lists, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _find_tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _find_tensors(x)


class DistributedDataParallel(nn.Module):
    """Data-parallel training of ``module`` with braid's C++ reducer.

    Construction is collective: parameter shapes are checked to be the same
    on every rank (the error names the first parameter that differs), then
    rank 0's parameters and buffers are broadcast.

    Args:
        module: the model; its forward is called unchanged.
        process_group: any c10d process group; the default group when None.
        bucket_cap_mb: size cap of the gradient buckets after the first.
        first_bucket_mb: size of the first bucket, small so that
            communication starts early in backward.
        find_unused_parameters: walk the autograd graph from forward's
            outputs each iteration; parameters it does not reach are reduced
            as zeros, and one unused on every rank keeps its ``.grad``.
        gradient_as_bucket_view: ``param.grad`` becomes a view into its
            bucket: no copy into the bucket before the allreduce and none
            back after it, and less memory. On by default (torch's DDP has it
            off): braid's views survive ``grad.detach_()``, ``zero_grad`` both
            ways and ``no_sync`` (a gradient set to None is re-pointed at its
            bucket by the next backward). Measured on this project's 2-core
            machine, 2 ranks, a 25M-parameter MLP: the step went from 1.93x to
            1.46x the same step without communication (benchmarks/ddp.py
            --bucket-view). Pass False for gradients that own their memory.
        broadcast_buffers: broadcast rank 0's buffers before each forward
            (not under ``no_sync``).
        static_graph: the used parameters, and how often each is used, are
            learned in the first iteration and must not change.

    On a braid group whose ranks share a host, CPU buckets live in memory
    every rank maps (``BRAID_SHARED_BUFFERS``, on by default): each rank
    reduces its slice of a bucket straight from its peers' buckets and writes
    the result into them, reading and writing each bucket once (Note
    [Registered buffers]). With a power-of-two world and float32/float64
    buckets the allreduce also averages, instead of a divide pass over every
    bucket, with the same bits (Note [Averaging inside the allreduce]).

    Differences from torch's DDP: gradients used during ``no_sync`` steps
    count as used for ``find_unused_parameters``, and buffers are not
    broadcast during ``no_sync`` steps.
    """

    def __init__(
        self,
        module: nn.Module,
        process_group=None,
        bucket_cap_mb: float = 25,
        first_bucket_mb: float = 1,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = True,
        broadcast_buffers: bool = True,
        static_graph: bool = False,
    ):
        super().__init__()
        if bucket_cap_mb <= 0 or first_bucket_mb <= 0:
            raise ValueError(
                f"bucket sizes must be positive: bucket_cap_mb={bucket_cap_mb}, "
                f"first_bucket_mb={first_bucket_mb}"
            )
        self.module = module
        if process_group is None:
            process_group = dist.distributed_c10d._get_default_group()
        self.process_group = process_group
        self.find_unused_parameters = find_unused_parameters
        self.broadcast_buffers = broadcast_buffers
        self.static_graph = static_graph

        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        names = [n for n, _ in named]
        params = [p for _, p in named]
        _C._ddp_verify_params(process_group, params, names)
        states = list(module.parameters()) + self._module_buffers()
        _C._ddp_broadcast_coalesced(process_group, states, 0)
        self._reducer = _C.Reducer(
            params,
            names,
            process_group,
            first_bucket_bytes=int(first_bucket_mb * _MIB),
            bucket_cap_bytes=int(bucket_cap_mb * _MIB),
            find_unused_parameters=find_unused_parameters,
            gradient_as_bucket_view=gradient_as_bucket_view,
            static_graph=static_graph,
        )

    def _module_buffers(self) -> List[torch.Tensor]:
        return list(self.module.buffers())

    def forward(self, *inputs, **kwargs):
        sync = self._reducer.sync()
        reduce = torch.is_grad_enabled() and sync
        if reduce:
            self._reducer.prepare_for_forward()
        if self.broadcast_buffers and sync:
            buffers = self._module_buffers()
            if buffers:
                _C._ddp_broadcast_coalesced(self.process_group, buffers, 0)
        output = self.module(*inputs, **kwargs)
        if reduce:
            walk = self.find_unused_parameters and not self.static_graph
            self._reducer.prepare_for_backward(list(_find_tensors(output)) if walk else [])
        return output

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside accumulates gradients locally, with no
        communication; the next synced backward reduces the accumulated sum."""
        previous = self._reducer.sync()
        self._reducer.set_sync(False)
        try:
            yield
        finally:
            self._reducer.set_sync(previous)

    def register_comm_hook(self, state: object, hook=None):
        """Replaces the default allreduce-and-average. Call before the first
        backward.

        ``state`` may come from ``torch_braid.hooks``: a state object with a
        ``_cpp_hook()`` method returning a ``torch_braid._C.CommHook`` (a C++
        ``c10d::CommHookInterface``), which then runs without the GIL; ``hook``
        is then only documentation (pass the matching torch_braid.hooks
        function or None). Otherwise ``hook`` is a Python callable
        ``hook(state, bucket: dist.GradBucket) -> torch.futures.Future``, as for
        torch's DDP (e.g. torch.distributed.algorithms.ddp_comm_hooks
        .default_hooks.allreduce_hook); it holds the GIL while it runs.
        A hook sees undivided gradients and does the averaging itself.
        """
        make_cpp = getattr(state, "_cpp_hook", None)
        if callable(make_cpp):
            cpp_hook = make_cpp()
            if not isinstance(cpp_hook, _C.CommHook):
                raise TypeError(
                    f"{type(state).__name__}._cpp_hook() returned {type(cpp_hook).__name__}, "
                    "expected a torch_braid._C.CommHook"
                )
            self._reducer.register_comm_hook(cpp_hook)
        elif callable(hook):
            self._reducer.register_python_comm_hook(state, hook)
        else:
            raise TypeError(
                "register_comm_hook needs a state with _cpp_hook() (torch_braid.hooks) "
                f"or a callable hook; got state={type(state).__name__}, hook={hook!r}"
            )

    # For tests and benchmarks.
    def _bucket_indices(self) -> List[List[int]]:
        return self._reducer.bucket_indices()

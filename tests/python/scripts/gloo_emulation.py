"""Test-only: fills gloo's gaps so the suites' oracles can be checked without braid.

With BRAID_TEST_BACKEND=gloo BRAID_TEST_EMULATE=1, every worker calls install()
before serving calls. It wraps torch.distributed's functions so that what
gloo (torch 1.13) lacks is built from what it has:
  - dtypes gloo rejects (bfloat16, int16, bool) go through a wider dtype for
    reductions, and through their bytes (uint8) for data movement;
  - all_gather_into_tensor/_all_gather_base via all_gather, reduce_scatter*
    via all_reduce, all_to_all (lists) via all_to_all_single.
Emulated calls are synchronous and return None, even with async_op=True, and
byte views need contiguous tensors; so test_async's into-tensor/reduce-scatter
cases and bf16 strided allgather fail under emulation. The emulation exists to
validate closed forms and inputs, not a backend.
"""

import functools

import torch
import torch.distributed as dist

_WIDER = {torch.bfloat16: torch.float32, torch.int16: torch.int32, torch.bool: torch.uint8}
_BOOL_OPS = {"SUM": "MAX", "PRODUCT": "MIN"}  # logical or/and on 0/1
_orig = {}


def _op_name(op):
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
        if op == getattr(dist.ReduceOp, name):
            return name
    return None


def _wide_op(t, op):
    if t.dtype == torch.bool and _op_name(op) in _BOOL_OPS:
        return getattr(dist.ReduceOp, _BOOL_OPS[_op_name(op)])
    return op


def _bytes(t):
    return t.view(torch.uint8) if t.dtype in _WIDER and t.is_contiguous() else t


def _all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    if tensor.dtype not in _WIDER:
        return _orig["all_reduce"](tensor, op=op, group=group, async_op=async_op)
    wide = tensor.to(_WIDER[tensor.dtype])
    _orig["all_reduce"](wide, op=_wide_op(tensor, op), group=group)
    tensor.copy_(wide)  # int32 -> int16 keeps the low bits: same wrap as int16 arithmetic


def _reduce(tensor, dst, op=dist.ReduceOp.SUM, group=None, async_op=False):
    if tensor.dtype not in _WIDER:
        return _orig["reduce"](tensor, dst, op=op, group=group, async_op=async_op)
    wide = tensor.to(_WIDER[tensor.dtype])
    _orig["reduce"](wide, dst, op=_wide_op(tensor, op), group=group)
    tensor.copy_(wide)


def _mover(name):
    """Data movement: pass byte views of tensors gloo would reject."""
    fn = _orig[name]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        def conv(a):
            if isinstance(a, torch.Tensor):
                return _bytes(a)
            if isinstance(a, list):
                return [conv(x) for x in a]
            return a
        return fn(*[conv(a) for a in args], **{k: conv(v) for k, v in kwargs.items()})
    return wrapper


def _all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                       group=None, async_op=False):
    k = input.element_size() if input.dtype in _WIDER else 1
    scale = (lambda s: [x * k for x in s]) if k > 1 else (lambda s: s)
    return _orig["all_to_all_single"](
        _bytes(output), _bytes(input), scale(output_split_sizes) if output_split_sizes else None,
        scale(input_split_sizes) if input_split_sizes else None, group=group, async_op=async_op)


def _all_gather_base(output, input, group=None, async_op=False):
    if input.numel() == 0:
        return  # gloo's all_gather dies of SIGFPE on empty tensors
    n = dist.get_world_size(group)
    outs = [torch.empty_like(input) for _ in range(n)]
    dist.all_gather(outs, input.contiguous(), group=group)
    output.view(-1).copy_(torch.cat(outs))


def _reduce_scatter_base(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    flat = input.reshape(-1).clone()
    dist.all_reduce(flat, op=op, group=group)
    r, c = dist.get_rank(group), output.numel()
    output.view(-1).copy_(flat[r * c:(r + 1) * c])


def _reduce_scatter(output, input_list, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _reduce_scatter_base(output, torch.cat([t.reshape(-1) for t in input_list]), op, group)


def _all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    inp = torch.cat([t.reshape(-1) for t in input_tensor_list])
    out = torch.empty(sum(t.numel() for t in output_tensor_list), dtype=inp.dtype)
    dist.all_to_all_single(out, inp, [t.numel() for t in output_tensor_list],
                           [t.numel() for t in input_tensor_list], group=group)
    offset = 0
    for t in output_tensor_list:
        t.view(-1).copy_(out[offset:offset + t.numel()])
        offset += t.numel()


def install():
    for name in ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter",
                 "all_to_all_single"):
        _orig[name] = getattr(dist, name)
    dist.all_reduce = _all_reduce
    dist.reduce = _reduce
    for name in ("broadcast", "all_gather", "gather", "scatter"):
        setattr(dist, name, _mover(name))
    dist.all_to_all_single = _all_to_all_single
    dist._all_gather_base = _all_gather_base
    dist.all_gather_into_tensor = _all_gather_base
    dist._reduce_scatter_base = _reduce_scatter_base
    dist.reduce_scatter_tensor = _reduce_scatter_base
    dist.reduce_scatter = _reduce_scatter
    dist.all_to_all = _all_to_all

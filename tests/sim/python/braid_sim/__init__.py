"""Test-only: braid's simulated CUDA device in this process (Note [Simulated CUDA in
tests], tests/sim/torch/sim_cuda.h; Note [ATen on the simulated device], sim_aten.cc).

``install(devices)`` registers the simulated device with torch (a CPU-only torch),
so that "CUDA" tensors live in host memory, ATen runs on them through its CPU
kernels, and braid's real CUDA path serves them. It also answers the few
``torch.cuda`` questions that torch's Python asks about a CUDA tensor, which a
torch without CUDA cannot answer. Never for real work: it refuses where torch has
CUDA.
"""

import torch
import torch_braid  # noqa: F401  (loads torch_braid._C, whose testing hooks _C uses)

from . import _C
from ._C import (  # noqa: F401
    begin_capture, compute_capability, contexts, delay_comm_stream, delay_current_stream, empty,
    end_capture, forget_contexts, is_current_stream_capturing, kernel_load_error, nccl_install,
    read, set_compute_capability, set_kernel_images, set_thread_process, synchronize, write)
# Note [Injected device failures] in tests/sim/device/faulty_device.h.
from ._C import (clear_device_faults, device_calls, device_failures, faults_install,  # noqa: F401
                 inject_device_fault)
# Note [Injected NCCL failures] in tests/sim/nccl/faulty_nccl.h.
from ._C import (clear_nccl_faults, inject_nccl_fault, nccl_async_error,  # noqa: F401
                 nccl_faults_install, nccl_hang_finalize, nccl_teardown)

_installed = 0


def install(devices: int = 2) -> None:
    global _installed
    _C.install(devices)
    if _installed:
        return
    _installed = devices
    cuda = torch.cuda

    def set_device(device) -> None:
        index = torch.device("cuda", device).index if isinstance(device, int) else \
            torch.device(device).index
        if index is None or not 0 <= index < devices:
            raise ValueError(f"simulated CUDA: no device {device!r} (it has {devices})")
        # The calling thread's, as cudaSetDevice: it makes the device's context
        # (Note [Simulated contexts] in tests/sim/device/sim_device.h).
        _C.set_device(index)

    # Moving a tensor to "cuda" first calls torch.cuda._lazy_init, which a torch
    # without CUDA answers with "Torch not compiled with CUDA enabled".
    cuda._lazy_init = lambda: None
    # torch 2.14's dist.broadcast asks for a CUDA tensor's compute capability.
    # The simulated device's own (Note [Simulated kernel images], tests/sim/device/sim_arch.h).
    def get_device_capability(device=None):
        index = None
        if isinstance(device, int):
            index = device
        elif device is not None:
            index = torch.device(device).index
        return compute_capability(_C.current_device() if index is None else index)

    cuda.get_device_capability = get_device_capability
    cuda.device_count = lambda: devices
    cuda.current_device = _C.current_device
    cuda.set_device = set_device

// c10d::Reducer, PyTorch DDP's C++ reducer, for the one call braid makes on
// it: register_comm_hook (torch_braid.hooks.register). Kept apart from
// compat.h because reducer.hpp pulls in autograd and distributed autograd.
#pragma once

#include <memory>
#include <torch/csrc/distributed/c10d/comm.hpp>

// Note [Reaching DDP's reducer]
// A hook registered from Python (DistributedDataParallel.register_comm_hook)
// is a PythonCommHook: DDP calls a Python function per bucket under the GIL,
// and the hook's future completes through a Python callback, which braid's
// worker thread runs under the GIL too. Measured on issue 31's MLP (2 ranks,
// 2 cores), that path costs 5-12 ms per step over the same C++ hook
// registered on the reducer itself, more than the division pass a hook saves.
// So torch_braid.hooks.register hands the C++ hook to the reducer directly:
// ddp.reducer is a pybind11 object holding std::shared_ptr<c10d::Reducer> in
// every torch braid supports. Debian's torch 1.13 ships reducer.hpp without
// the distributed-autograd headers it includes; there we declare the one
// member braid calls. It is non-virtual, exported by libtorch_cpu, and has
// the same signature in 1.13, 2.6 and 2.14 (checked against each header); the
// class is used only through pointers that torch made.
#if __has_include(<torch/csrc/distributed/autograd/context/context.h>)
#include <torch/csrc/distributed/c10d/reducer.hpp>
#else
namespace c10d {
class TORCH_API Reducer {
 public:
  void register_comm_hook(std::unique_ptr<CommHookInterface> iface);
};
}  // namespace c10d
#endif

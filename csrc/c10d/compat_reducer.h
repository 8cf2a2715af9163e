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
// worker thread runs under the GIL too. On issue 31's MLP (2 ranks, 2 cores,
// four runs of benchmarks/ddp.py) that path took 6.4 ms per step more than
// the same C++ hook registered on the reducer itself on average without
// bucket views (2 to 12), 2.4 with them (-2 to 6.5), and varied more from run
// to run: about what a hook saves by averaging inside the allreduce instead
// of DDP's division pass. It is not the callback: a variant that made the
// result's Python object on the hook's own thread, so that the worker never
// took the GIL, kept the gap (6 and 11 ms without bucket views, two runs).
// perf on both paths: with the Python hook, 11% of the samples fall in the
// kernel (1.5% with the C++ one), nearly all page faults under the memset of
// fresh sgemm outputs in backward. So the Python path leaves the allocator
// returning and refaulting gradient-sized blocks; why, was not found.
// torch_braid.hooks.register hands the C++ hook to the reducer directly:
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

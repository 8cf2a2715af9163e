// The one place that absorbs the differences between torch 1.13 and 2.x.
// See Note [torch 1.13 vs 2.x] below; nothing else in braid tests the torch
// version.
#pragma once

#include <torch/version.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/autograd/variable.h>

#include <utility>

// Note [torch 1.13 vs 2.x]
// On 1.13 a third-party backend is a c10d::ProcessGroup. On 2.x it is a
// c10d::Backend, and c10d::ProcessGroup became a dispatcher that holds one
// backend per device type. 2.x also grew virtuals that 1.13 lacks (the
// *_coalesced tensor variants), and ReduceOp became a struct that can carry a
// PREMUL_SUM factor.
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define BRAID_TORCH2 1
#define BRAID_TORCH2_OVERRIDE override
#else
#define BRAID_TORCH2 0
#define BRAID_TORCH2_OVERRIDE
#endif

namespace braid {
namespace compat {

#if BRAID_TORCH2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

constexpr bool kTorch2 = BRAID_TORCH2;

// The OpType of the Work that ends a coalescing window (1.13 has none).
#if BRAID_TORCH2
constexpr c10d::OpType kCoalescedOpType = c10d::OpType::COALESCED;
#else
constexpr c10d::OpType kCoalescedOpType = c10d::OpType::UNKNOWN;
#endif

// The owning pointer to an autograd node: std::shared_ptr up to torch 2.13,
// c10::intrusive_ptr from 2.14 on. Both have get() and ->.
using NodePtr =
    decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

// Python name of the pybind class our backend derives from, in torch._C._distributed_c10d.
const char* pythonBaseClassName();

// The factor of a PREMUL_SUM ReduceOp (1.13 keeps a tensor list, 2.x one
// tensor). Returns false when the op carries no factor.
bool premulSumFactor(const c10d::ReduceOp& op, double* factor);

// A c10d::GradBucket (2.x added a sparse-indices argument).
c10d::GradBucket makeGradBucket(size_t index, size_t bucketCount, const at::Tensor& buffer,
                                const std::vector<size_t>& offsets,
                                const std::vector<size_t>& lengths,
                                const std::vector<c10::IntArrayRef>& sizes,
                                const std::vector<at::Tensor>& parameters);

// torch 2.x TCPStores default to libuv, which Debian's torch lacks: follow
// USE_LIBUV (default on), as torch's Python side does. No-op on 1.13.
void applyLibuvSetting(c10d::TCPStoreOptions* opts);

// A communication failure (a timeout, a lost peer) as torch reports its own:
// c10::DistBackendError where torch has it (Python: torch.distributed.
// DistBackendError, a RuntimeError), so scripts and tools that match on
// either type work. Other errors pass through unchanged.
std::exception_ptr asTorchError(std::exception_ptr error);

// The name and description torch gave a backend's group (2.x sets them after
// creating it); empty strings on 1.13, which has neither.
std::pair<std::string, std::string> groupNameAndDesc(const BackendBase& backend);

// Wraps a braid backend as a c10d::ProcessGroup (itself on 1.13).
// The host of the TCPStore under `store`'s prefixes, else MASTER_ADDR, else
// "" (a FileStore or HashStore has no host): TCP takes its interface from
// the route to it (Note [Choosing a group's transport]).
std::string storeHost(const c10::intrusive_ptr<c10d::Store>& store);

c10::intrusive_ptr<c10d::ProcessGroup> wrapAsProcessGroup(
    const c10::intrusive_ptr<BackendBase>& backend, const c10::intrusive_ptr<c10d::Store>& store);

// The backend that runs `pg`'s ops on `device` (1.13: the group itself);
// nullptr when the group has none for that device type.
BackendBase* backendFor(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, c10::DeviceType device);

}  // namespace compat
}  // namespace braid

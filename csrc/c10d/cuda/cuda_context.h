// A group's CUDA state: which device API serves CUDA tensors, braid's comm
// stream, pooled events, and pinned staging memory (Note [The staged CUDA
// executor] in c10d/cuda/cuda_op.h).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/device_api.h"
#include "cuda/nccl/executor_choice.h"
#include "cuda/staged.h"
#include "transport/store.h"

namespace braid {
namespace cuda {
class NcclApi;
class NcclExecutor;
}  // namespace cuda
}  // namespace braid

namespace braid {

// The DeviceApi that serves CUDA tensors in this process: the one a test
// installed with setDeviceApiForTesting, else the CUDA runtime that torch
// loaded (throws braid::Error saying why when there is none).
cuda::DeviceApi& cudaApi();
// Tests only: serve CUDA tensors with `api` from now on (the simulated device
// of tests/sim/device/sim_device.h, which never ships). `api` must outlive
// every group.
void setDeviceApiForTesting(cuda::DeviceApi* api);
// Tests only: the NCCL that groups use while a DeviceApi set for testing
// serves them (tests/sim/nccl/nccl_sim.h); without one they stage (the real
// NCCL never runs on a device set for testing).
void setNcclApiForTesting(cuda::NcclApi* nccl);
// Tests only: how a torch stream of the device set for testing maps to its
// DeviceApi handle (the simulated device's guard knows; null: unknown).
using StreamResolver = cuda::Stream (*)(int device, int64_t streamId);
void setStreamResolverForTesting(StreamResolver resolve);
// Throws braid::Error naming `op` and `rank` when the calling thread's
// current stream of `device` is capturing a CUDA graph (Note [Graph capture
// in the front end] in cuda_context.cc). Enqueues nothing.
void refuseIfCapturing(c10::Device device, const char* op, int rank);

// What a group needs to choose and build its CUDA executor.
struct CudaGroupInfo {
  int rank = 0;
  int size = 1;
  std::shared_ptr<transport::Store> store;  // the group's keys, prefixed
  std::chrono::milliseconds timeout{0};
};

// An event from a context's pool, returned to it when the last owner drops it.
using PooledEvent = cuda::SharedEvent;

// What a group's CUDA executors have run so far (Note [Counting what an
// executor moved] in cuda/staged.h).
struct CudaExecutorStats {
  // "nccl", "same-gpu", "hier" or "staged" (cuda::toString); "" before the
  // first CUDA collective chose it.
  std::string executor;
  // The staged executor: every CUDA op the chosen executor does not take.
  cuda::StagedCounts staged;
  // The NCCL executor (NCCL, same-gpu, hier; 0 when staged): its ops, and the
  // bytes of their larger buffers (NcclExecutor::bytesIssued).
  uint64_t ncclOps = 0;
  uint64_t ncclBytes = 0;
};

// Note [Staging memory]
// Page-locked host memory is slow to allocate (cudaHostAlloc takes
// milliseconds and serializes the device), so staging buffers come from a
// pool: blocks are kept by size after use and handed out again, best fit.
// The pool keeps at most BRAID_CUDA_STAGING_BYTES of idle blocks; a block
// larger than that, or one returned when the pool is full, is freed at once.
// Blocks go back only once the copies that use them have completed (the op's
// end event), see CudaContext::retire.
class PinnedPool {
 public:
  PinnedPool(cuda::DeviceApi& api, size_t idleLimit);
  ~PinnedPool();
  // A block of at least `bytes` (its true size in *capacity).
  void* acquire(size_t bytes, size_t* capacity);
  void release(void* p, size_t capacity);

 private:
  cuda::DeviceApi& api_;
  const size_t idleLimit_;
  std::mutex mu_;
  std::multimap<size_t, void*> idle_;
  size_t idleBytes_ = 0;
};

class CudaContext : public std::enable_shared_from_this<CudaContext> {
 public:
  CudaContext(const CudaGroupInfo& group, c10::Device device);
  ~CudaContext();

  // The group's executor for collectives (Note [Choosing a CUDA executor]
  // in cuda/nccl/executor_choice.h): decided at the first CUDA collective, on
  // every rank at once, through the store. null: staged.
  cuda::NcclExecutor* nccl();
  // "nccl" or "staged" and why, once chosen; "" before.
  std::string executorDescription();
  // Counts of both executors; never chooses one (no store traffic).
  CudaExecutorStats stats();
  // The staged executor's steps for one op on this context (cuda_op.h).
  cuda::StagedOp::Env stagedEnv();
  // Shuts the NCCL executor down: `drain` lets pending ops finish first,
  // else idle communicators are finalized and destroyed (bounded) and busy
  // ones aborted.
  void shutdownNccl(bool drain);

  c10::Device device() const { return device_; }
  cuda::DeviceApi& api() const { return api_; }
  cuda::Stream comm() const { return comm_; }
  // A c10 pool stream of the device on which Futures are completed: it waits
  // on the op's end event first, so the Future's own events follow it.
  const c10::Stream& futureStream() const { return futureStream_; }

  PooledEvent event();
  // A pooled event recorded on the calling thread's current stream of the
  // device: the point after which an op may read and write the caller's
  // tensors (the staged and the NCCL path alike).
  PooledEvent recordOnCurrentStream(const char* op);
  // A contiguous CPU tensor over pinned memory, of `like`'s dtype and shape.
  at::Tensor pinnedLike(const at::Tensor& like);

  // Keeps `keep` (user tensors, staging tensors) alive until `end` has
  // completed on the device; then drops them (pinned blocks return to the
  // pool). Called on the worker; reap() runs there too.
  void retire(PooledEvent end, std::vector<at::Tensor> keep);
  void reap();

  // Waits on the host for `ev` until `deadline`, or throws TimeoutError
  // naming `op`; an abort() fails it at once.
  void hostWait(void* ev, std::chrono::steady_clock::time_point deadline,
                std::chrono::milliseconds timeout, const char* op);
  // Host waits fail at once, and the NCCL executor (if any) aborts.
  void abort();
  // The streams this group's collectives run on: the staged executor's comm
  // stream and, once chosen, the NCCL executor's (tests slow them down on
  // the simulated device).
  std::vector<cuda::Stream> commStreams();

 private:
  const CudaGroupInfo group_;
  const int rank_;
  const c10::Device device_;
  std::once_flag chosen_;
  std::string choice_;
  std::atomic<bool> decided_{false};  // choice_, kind_ and nccl_ are set
  cuda::CudaExecutorKind kind_ = cuda::CudaExecutorKind::kStaged;
  cuda::StagedCounters staged_;
  // The hierarchical collectives (kHier), before nccl_: the executor that
  // uses them goes first.
  std::unique_ptr<cuda::NcclApi> hier_;
  std::unique_ptr<cuda::NcclExecutor> nccl_;
  std::atomic<cuda::NcclExecutor*> ncclLive_{nullptr};  // nccl_, for abort() from any thread
  void choose();
  cuda::DeviceApi& api_;
  cuda::Stream comm_ = nullptr;
  c10::Stream futureStream_;
  std::shared_ptr<PinnedPool> pinned_;
  std::mutex eventsMu_;
  std::vector<void*> idleEvents_;
  std::atomic<bool> aborted_{false};
  struct Retired {
    PooledEvent end;
    std::vector<at::Tensor> keep;
  };
  std::mutex retiredMu_;
  std::deque<Retired> retired_;
};

// Which CUDA device a group's CUDA ops run on: bound by the first CUDA op, and
// every later one must use the same (Note [One device per group]).
class CudaBinding {
 public:
  explicit CudaBinding(CudaGroupInfo group) : group_(std::move(group)), rank_(group_.rank) {}
  // The group's context for `device`, created on first use; throws naming op,
  // rank and both devices when the group is bound to another.
  std::shared_ptr<CudaContext> get(c10::Device device, const char* op);
  // The context if one was made (abort and shutdown), else null.
  std::shared_ptr<CudaContext> existing();

 private:
  const CudaGroupInfo group_;
  const int rank_;
  std::mutex mu_;
  std::shared_ptr<CudaContext> ctx_;
};

}  // namespace braid

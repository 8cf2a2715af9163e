#include "c10d/cuda/cuda_context.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <dlfcn.h>

#include <thread>

#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"
#include "cuda/shared_gpu/multi_gpu.h"
#include "cuda/nccl/nccl_api.h"
#include "cuda/nccl/nccl_executor.h"
#include "cuda/on_device.h"
#include "cuda/shared_gpu/same_gpu.h"
#include "cuda/teardown.h"

namespace braid {

BRAID_SETTING_INT(kStagingBytes, "BRAID_CUDA_STAGING_BYTES", int64_t{1} << 30,
                  "Most bytes of idle pinned host memory a group keeps for staging CUDA tensors "
                  "(Note [Staging memory]); blocks beyond it are freed after use.");

namespace {
std::atomic<cuda::DeviceApi*> gTestingDevice{nullptr};
std::atomic<cuda::NcclApi*> gTestingNccl{nullptr};
std::atomic<StreamResolver> gTestingStreams{nullptr};

size_t roundUp(size_t bytes) {
  size_t cap = 4096;
  while (cap < bytes) cap <<= 1;
  return cap;
}

c10::Stream poolStreamOf(c10::Device device) {
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
}
}  // namespace

cuda::DeviceApi& cudaApi() {
  if (auto* api = gTestingDevice.load(std::memory_order_acquire)) return *api;
  return cuda::cudaRuntime();
}

void setDeviceApiForTesting(cuda::DeviceApi* api) {
  gTestingDevice.store(api, std::memory_order_release);
}

void setNcclApiForTesting(cuda::NcclApi* nccl) {
  gTestingNccl.store(nccl, std::memory_order_release);
}

void setStreamResolverForTesting(StreamResolver resolve) {
  gTestingStreams.store(resolve, std::memory_order_release);
}

// Note [Graph capture in the front end]
// A collective issued while the caller's current stream captures a CUDA
// graph would record braid's ready event into the graph and pull the comm
// stream into it; the staged executor's host wait and the NCCL watchdog's
// query of that event would then fail (Note [Graph capture] in
// cuda/device_api.h). braid does not support capture yet, so every executor
// refuses such a collective here, at its first CUDA tensor, before it makes
// a context, an event or a copy: the user's capture is left as it was, and
// the group stays usable. The stream's handle: torch's
// c10::cuda::CUDAStream::stream() (libc10_cuda, looked up at run time, since
// braid links no CUDA library; a CUDAStream holds only its c10::Stream), or
// the simulated device's resolver in tests. When neither answers, braid
// cannot tell and does not refuse.
namespace {
cuda::Stream handleOf(cuda::DeviceApi& api, const c10::Stream& s, bool* known) {
  *known = false;
  if (&api == gTestingDevice.load(std::memory_order_acquire)) {
    StreamResolver r = gTestingStreams.load(std::memory_order_acquire);
    if (!r) return nullptr;
    *known = true;
    return r(s.device_index(), s.id());
  }
  using StreamFn = void* (*)(const void* cudaStream);
  static StreamFn fn = []() -> StreamFn {
    void* lib = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) return nullptr;
    // c10::cuda::CUDAStream::stream() const
    return reinterpret_cast<StreamFn>(dlsym(lib, "_ZNK3c104cuda10CUDAStream6streamEv"));
  }();
  if (!fn) return nullptr;
  *known = true;
  return fn(&s);
}
}  // namespace

void refuseIfCapturing(c10::Device device, const char* op, int rank) {
  cuda::DeviceApi& api = cudaApi();
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  const c10::Stream current = impl.getStream(device);
  bool known = false;
  cuda::Stream raw = handleOf(api, current, &known);
  if (!known) return;
  BRAID_ENFORCE(!api.streamIsCapturing(raw), op, rank,
                "the current stream is capturing a CUDA graph; braid's collectives cannot be "
                "captured (issue them outside torch.cuda.graph, or on another stream). "
                "Nothing was enqueued.");
}

namespace {
// The NCCL that pairs with `api`, or null (and why) when there is none: a
// device set for testing never runs the real NCCL.
cuda::NcclApi* ncclFor(cuda::DeviceApi& api, std::string* why) {
  if (&api == gTestingDevice.load(std::memory_order_acquire)) {
    cuda::NcclApi* nccl = gTestingNccl.load(std::memory_order_acquire);
    if (!nccl) *why = strCat("the device set for testing (", api.name(), ") has no NCCL");
    return nccl;
  }
  try {
    cuda::NcclApi& lib = cuda::ncclLibrary();
    lib.version();
    return &lib;
  } catch (const std::exception& e) {
    *why = e.what();
    return nullptr;
  }
}
}  // namespace

PinnedPool::PinnedPool(cuda::DeviceApi& api, size_t idleLimit) : api_(api), idleLimit_(idleLimit) {}

PinnedPool::~PinnedPool() {
  // Note [No exception out of teardown] in cuda/teardown.h.
  for (auto& kv : idle_) {
    cuda::ignoreTeardownError("freeing an idle pinned block (PinnedPool)", -1,
                              [&] { api_.hostFree(kv.second); });
  }
}

void* PinnedPool::acquire(size_t bytes, size_t* capacity) {
  const size_t cap = roundUp(bytes);
  *capacity = cap;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(cap);
    if (it != idle_.end()) {
      void* p = it->second;
      idle_.erase(it);
      idleBytes_ -= cap;
      return p;
    }
  }
  cuda::RelaxedCaptureMode relaxed(api_);  // Note [Graph capture] in cuda/device_api.h
  return api_.hostAlloc(cap);
}

void PinnedPool::release(void* p, size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (idleBytes_ + capacity <= idleLimit_) {
      idle_.emplace(capacity, p);
      idleBytes_ += capacity;
      return;
    }
  }
  // Reached from a pinned tensor's deleter (noexcept): Note [No exception
  // out of teardown] in cuda/teardown.h.
  cuda::ignoreTeardownError("freeing a pinned block (PinnedPool::release)", -1,
                            [&] { api_.hostFree(p); });
}

CudaContext::CudaContext(const CudaGroupInfo& group, c10::Device device)
    : group_(group),
      rank_(group.rank),
      device_(device),
      api_(cudaApi()),
      futureStream_(poolStreamOf(device)) {
  BRAID_ENFORCE(device.index() >= 0 && device.index() < api_.deviceCount(), "cuda", rank_,
                "device ", device.str(), " does not exist (", api_.deviceCount(),
                " CUDA devices on ", api_.name(), ")");
  comm_ = api_.streamCreate(device.index());
  pinned_ = std::make_shared<PinnedPool>(api_, static_cast<size_t>(kStagingBytes.get()));
}

CudaContext::~CudaContext() {
  // Nothing here may throw (Note [No exception out of teardown] in
  // cuda/teardown.h), and it runs on the context's device, whichever thread
  // drops the context last (Note [A current device per thread] in
  // cuda/on_device.h).
  cuda::OnDevice on(api_, device_.index(), std::nothrow);
  cuda::ignoreTeardownError("shutting the NCCL executor down (CudaContext)", rank_,
                            [&] { shutdownNccl(false); });
  // Nothing may still read or write memory that is about to go: the comm
  // stream drains (each op on it ended by its deadline or failed), then the
  // kept tensors and pinned blocks are dropped. After a sticky device error
  // the memory is the runtime's to reclaim.
  cuda::ignoreTeardownError("synchronizing the comm stream (CudaContext)", rank_,
                            [&] {
                              cuda::RelaxedCaptureMode relaxed(api_);
                              api_.streamSynchronize(comm_);
                            });
  {
    std::lock_guard<std::mutex> lock(retiredMu_);
    retired_.clear();
  }
  cuda::ignoreTeardownError("destroying the comm stream (CudaContext)", rank_,
                            [&] { api_.streamDestroy(comm_); });
  std::lock_guard<std::mutex> lock(eventsMu_);
  for (void* e : idleEvents_) {
    cuda::ignoreTeardownError("destroying a pooled event (CudaContext)", rank_,
                              [&] { api_.eventDestroy(e); });
  }
}

PooledEvent CudaContext::event() {
  void* ev = nullptr;
  {
    std::lock_guard<std::mutex> lock(eventsMu_);
    if (!idleEvents_.empty()) {
      ev = idleEvents_.back();
      idleEvents_.pop_back();
    }
  }
  if (!ev) ev = api_.eventCreate(device_.index());
  std::weak_ptr<CudaContext> self = weak_from_this();
  cuda::DeviceApi* api = &api_;
  return PooledEvent(ev, [self, api](void* e) {
    if (auto ctx = self.lock()) {
      // (A context being destroyed can no longer be locked.)
      std::lock_guard<std::mutex> lock(ctx->eventsMu_);
      ctx->idleEvents_.push_back(e);
      return;
    }
    cuda::ignoreTeardownError("destroying a pooled event (its last owner)", -1,
                              [&] { api->eventDestroy(e); });
  });
}

PooledEvent CudaContext::recordOnCurrentStream(const char* op) {
  PooledEvent ev = event();
  // The c10 guard records our own event on the current stream: in every
  // torch, CUDA's guard takes a non-null event as the cudaEvent_t to record
  // (Note [The device seam] in cuda/device_api.h).
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  void* raw = ev.get();
  impl.record(&raw, impl.getStream(device_), device_.index(), c10::EventFlag::PYTORCH_DEFAULT);
  BRAID_ENFORCE(raw == ev.get(), op, rank_, "the CUDA guard recorded a different event than braid's");
  return ev;
}

at::Tensor CudaContext::pinnedLike(const at::Tensor& like) {
  auto opts = like.options().device(at::kCPU);
  const size_t bytes = like.nbytes();
  if (bytes == 0) return at::empty(like.sizes(), opts);
  size_t cap = 0;
  void* p = pinned_->acquire(bytes, &cap);
  std::shared_ptr<PinnedPool> pool = pinned_;
  return at::from_blob(p, like.sizes(), [pool, p, cap](void*) { pool->release(p, cap); }, opts);
}

void CudaContext::retire(PooledEvent end, std::vector<at::Tensor> keep) {
  std::lock_guard<std::mutex> lock(retiredMu_);
  retired_.push_back(Retired{std::move(end), std::move(keep)});
}

void CudaContext::reap() {
  std::deque<Retired> done;
  cuda::RelaxedCaptureMode relaxed(api_);  // Note [Graph capture] in cuda/device_api.h
  {
    std::lock_guard<std::mutex> lock(retiredMu_);
    // Ops complete in stream order, so the first one not done ends the scan.
    while (!retired_.empty() && api_.eventQuery(retired_.front().end.get())) {
      done.push_back(std::move(retired_.front()));
      retired_.pop_front();
    }
  }
  // Dropped outside the lock: a tensor's deleter may take the GIL.
}

void CudaContext::hostWait(void* ev, std::chrono::steady_clock::time_point deadline,
                           std::chrono::milliseconds timeout, const char* op) {
  cuda::RelaxedCaptureMode relaxed(api_);  // Note [Graph capture] in cuda/device_api.h
  int spins = 0;
  auto nap = std::chrono::microseconds(5);
  while (!api_.eventQuery(ev)) {
    BRAID_ENFORCE(!aborted_.load(std::memory_order_relaxed), op, rank_,
                  "the group was aborted while waiting for ", device_.str());
    if (std::chrono::steady_clock::now() > deadline) {
      BRAID_THROW(TimeoutError, op, rank_, "Timed out after ", timeout.count(), " ms waiting for ",
                  device_.str(), " to finish the op's copies (the device is stuck or too busy)");
    }
    if (++spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      if (nap < std::chrono::microseconds(500)) nap *= 2;
    }
  }
}

void CudaContext::choose() {
  std::string noNccl;
  cuda::NcclApi* nccl = ncclFor(api_, &noNccl);
  cuda::CudaRankInfo mine;
  mine.setting = cuda::cudaExecutorSetting(rank_);
  mine.ncclVersion = nccl ? nccl->version() : 0;
  mine.uuid = api_.deviceUuid(device_.index());
  // Whether braid's kernels load here, for the same-GPU and hierarchical
  // executors (Note [Kernel images] in cuda/kernel_images.h).
  mine.device = device_.index();
  mine.process = api_.processId();  // Note [Thread ranks on one GPU] in executor_choice.h
  try {
    mine.cc = api_.computeCapability(device_.index());
    mine.kernels = api_.kernelLoadError(device_.index());
  } catch (const std::exception& e) {
    mine.kernels = e.what();
  }
  std::string missing;
  auto deadline = std::chrono::steady_clock::now() + group_.timeout;
  std::vector<std::string> all = transport::exchangeThroughStore(
      *group_.store, [](int r) { return strCat("cuda/info/", r); }, rank_, group_.size,
      mine.encode(), deadline, &missing);
  std::vector<cuda::CudaRankInfo> infos;
  for (int r = 0; r < group_.size; ++r) infos.push_back(cuda::CudaRankInfo::decode(all[r], r));
  cuda::CudaExecutorChoice c = cuda::chooseCudaExecutor(infos, rank_);
  if (c.kind != cuda::CudaExecutorKind::kStaged) {
    // NCCL, or braid's same-GPU collectives behind the same seam (Note
    // [Same-GPU collectives] in cuda/shared_gpu/same_gpu.h).
    // Hierarchical: the same-GPU collectives within each GPU, this NCCL
    // between the GPUs' leaders (Note [Hierarchical CUDA collectives] in
    // cuda/shared_gpu/multi_gpu.h); the choice vouches that the leaders load it.
    if (c.kind == cuda::CudaExecutorKind::kHier) {
      hier_ = cuda::hierarchicalCollectives(api_, *nccl, *group_.store, "cuda/",
                                            cuda::hierLayoutOf(infos), group_.timeout);
    }
    cuda::NcclApi& api = c.kind == cuda::CudaExecutorKind::kNccl   ? *nccl
                         : c.kind == cuda::CudaExecutorKind::kHier ? *hier_
                                                                    : cuda::sameGpuCollectives(api_);
    cuda::NcclExecutor::Options o;
    o.rank = rank_;
    o.size = group_.size;
    o.storePrefix = "cuda/";
    o.timeout = group_.timeout;
    nccl_ = std::make_unique<cuda::NcclExecutor>(api, api_, *group_.store, o);
    ncclLive_.store(nccl_.get(), std::memory_order_release);
    if (aborted_.load()) nccl_->abort(strCat("braid: the group was aborted (rank ", rank_, ")"));
  }
  choice_ = strCat(cuda::toString(c.kind), ": ", c.reason,
                   nccl || c.kind != cuda::CudaExecutorKind::kStaged ? "" : strCat(" (", noNccl, ")"));
  kind_ = c.kind;
  decided_.store(true, std::memory_order_release);
  BRAID_LOG(kInfo, "cuda", rank_) << "CUDA ops on " << device_.str() << " run " << choice_;
}

void CudaContext::abort() {
  aborted_.store(true);
  if (auto* n = ncclLive_.load(std::memory_order_acquire)) {
    n->abort(strCat("braid: the group was aborted (abort() on rank ", rank_, ")"));
  }
}

cuda::NcclExecutor* CudaContext::nccl() {
  std::call_once(chosen_, [this] { choose(); });
  return nccl_.get();
}

std::string CudaContext::executorDescription() { return choice_; }

CudaExecutorStats CudaContext::stats() {
  CudaExecutorStats s;
  s.staged = staged_.snapshot();
  if (!decided_.load(std::memory_order_acquire)) return s;
  s.executor = cuda::toString(kind_);
  if (nccl_) {
    s.ncclOps = nccl_->opsIssued();
    s.ncclBytes = nccl_->bytesIssued();
  }
  return s;
}

cuda::StagedOp::Env CudaContext::stagedEnv() {
  cuda::StagedOp::Env env;
  env.api = &api_;
  env.device = device_.index();
  env.comm = comm_;
  // The op holds its context (CudaOp::ctx_), so the pool outlives the call.
  env.event = [this] { return event(); };
  env.counters = &staged_;
  return env;
}

void CudaContext::shutdownNccl(bool drain) {
  // Once: a later abort() finds nothing left to abort.
  cuda::NcclExecutor* n = ncclLive_.exchange(nullptr, std::memory_order_acq_rel);
  if (!n) return;
  // Draining waits for pending ops (each ends by its deadline); otherwise
  // idle communicators are destroyed and busy ones aborted.
  n->shutdown(drain ? group_.timeout : std::chrono::milliseconds(0));
}

std::vector<cuda::Stream> CudaContext::commStreams() {
  std::vector<cuda::Stream> out{comm_};
  if (cuda::NcclExecutor* n = nccl()) {
    if (cuda::Stream s = n->commStream(device_.index())) out.push_back(s);
  }
  return out;
}

std::shared_ptr<CudaContext> CudaBinding::get(c10::Device device, const char* op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ctx_) {
    ctx_ = std::make_shared<CudaContext>(group_, device);
  } else {
    // Note [One device per group]
    // As with NCCL, a group's CUDA ops run on one device: its comm stream,
    // staging memory and (later) communicator belong to it.
    BRAID_ENFORCE(ctx_->device() == device, op, rank_, "this group runs its CUDA ops on ",
                  ctx_->device().str(), ", got a tensor on ", device.str(),
                  " (use one group per device)");
  }
  return ctx_;
}

std::shared_ptr<CudaContext> CudaBinding::existing() {
  std::lock_guard<std::mutex> lock(mu_);
  return ctx_;
}

}  // namespace braid

// simulatedDevice(): CUDA's ordering rules on the CPU (Note [The device seam]
// in csrc/cuda/device_api.h, Note [Simulated ordering] in sim_stream.h).
//
// Note [The simulated device's lifetime]
// The device is a process-lifetime singleton that is never destroyed, so no
// static destructor joins or frees anything while another thread still uses
// it. At exit, stream threads that were never destroyed sit in a condition
// wait; exit() does not wait for them. Streams are destroyed (drained and
// joined) only by streamDestroy.
//
// Handles are the addresses of the SimStream / SimEvent objects, looked up in
// a registry, so a destroyed or foreign handle throws instead of crashing.
// The null stream is the current device's default stream, created at first
// use. Like every stream here it orders only through events: it does not
// synchronize implicitly with other streams (the streams braid creates are
// cudaStreamNonBlocking, which do not either).
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "cuda/host_kernels.h"
#include "sim/device/sim_arch.h"
#include "sim/device/sim_device.h"
#include "sim/device/sim_ipc.h"
#include "sim/device/sim_stream.h"

namespace braid {
namespace cuda {
namespace {

using sim::SimEvent;
using sim::SimStream;

constexpr size_t kAlignment = 64;

// Per thread, as cudaSetDevice; -1 until the thread sets one (Note [Simulated
// contexts] in sim_device.h).
thread_local int tCurrentDevice = -1;
// Note [Simulated IPC] in sim_ipc.h: the simulated process this thread acts
// as for the IPC rules (0: the real one); sim::setThreadProcess.
thread_local int tProcess = 0;

// A shareable allocation's tail: set when its exporter frees it.
constexpr size_t kFreedFlagBytes = 64;
std::atomic<uint32_t>* freedFlag(const transport::shm::SharedRegion& r) {
  return reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(r.data()) + r.size() -
                                                  kFreedFlagBytes);
}

// Per thread, as cudaThreadExchangeStreamCaptureMode (Note [Simulated graph
// capture] in sim_device.h).
thread_local DeviceApi::CaptureMode tCaptureMode = DeviceApi::CaptureMode::kGlobal;

const char* modeName(DeviceApi::CaptureMode m) {
  switch (m) {
    case DeviceApi::CaptureMode::kGlobal: return "global";
    case DeviceApi::CaptureMode::kThreadLocal: return "thread-local";
    case DeviceApi::CaptureMode::kRelaxed: return "relaxed";
  }
  return "?";
}

std::string bootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  // Without /proc the identity would not be shared across processes; say so
  // in the UUID rather than make one up.
  return id.empty() ? "no-boot-id" : id;
}

class SimDevice final : public SimulatedDevice {
 public:
  explicit SimDevice(int devices) : devices_(devices), bootId_(bootId()), arch_(checked(devices)) {
    defaults_.resize(devices);
  }

  std::string name() const override { return strCat("simulated (", devices_, " devices)"); }
  bool simulated() const override { return true; }
  int deviceCount() override { return devices_; }
  int getDevice() override { return tCurrentDevice < 0 ? 0 : tCurrentDevice; }
  void setDevice(int device) override {
    checkDevice("setDevice", device);
    createContext(device);
    tCurrentDevice = device;
  }
  bool primaryContextActive(int device) override {
    checkDevice("primaryContextActive", device);
    std::lock_guard<std::mutex> lk(ctxMu_);
    return contexts_.count(device) > 0;
  }
  std::vector<int> contexts() override {
    std::lock_guard<std::mutex> lk(ctxMu_);
    return std::vector<int>(contexts_.begin(), contexts_.end());
  }
  void forgetContexts() override {
    std::lock_guard<std::mutex> lk(ctxMu_);
    contexts_.clear();
  }
  std::string deviceUuid(int device) override {
    checkDevice("deviceUuid", device);
    return strCat("sim-", bootId_, "-", device);
  }

  // Note [Simulated kernel images] in sim_arch.h.
  int computeCapability(int device) override {
    checkDevice("computeCapability", device);
    return arch_.computeCapability(device);
  }
  std::string kernelLoadError(int device) override {
    checkDevice("kernelLoadError", device);
    return arch_.loadError(device);
  }
  void setComputeCapability(int device, int cc) override {
    checkDevice("setComputeCapability", device);
    arch_.setComputeCapability(device, cc);
  }
  void setKernelImages(std::optional<KernelImages> images) override {
    arch_.setImages(std::move(images));
  }

  Stream streamCreate(int device) override {
    checkDevice("streamCreate", device);
    onDeviceCall(device);
    std::lock_guard<std::mutex> lk(mu_);
    auto s = std::make_shared<SimStream>(device, strCat("simulated stream ", ++streamIds_,
                                                        " (device ", device, ")"));
    streams_[s.get()] = s;
    return s.get();
  }

  void streamDestroy(Stream handle) override {
    needContext();
    std::shared_ptr<SimStream> s;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = streams_.find(handle);
      if (handle == nullptr || it == streams_.end() || isDefault(it->second)) {
        throw Error(strCat("braid: streamDestroy(", handle, "): not a stream from streamCreate ",
                           "(unknown, already destroyed, or a default stream)"));
      }
      s = std::move(it->second);
      streams_.erase(it);
    }
    s->shutdown();  // outside the lock: drains the queue, then joins
  }

  void streamSynchronize(Stream s) override {
    needContext();
    checkCapture("streamSynchronize");
    stream("streamSynchronize", s)->synchronize();
  }
  void deviceSynchronize(int device) override {
    checkDevice("deviceSynchronize", device);
    checkCapture("deviceSynchronize");
    std::vector<std::shared_ptr<SimStream>> all;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (const auto& [h, st] : streams_) {
        if (st->device() == device) all.push_back(st);
      }
    }
    for (const auto& st : all) st->synchronize();
  }
  bool streamQuery(Stream s) override {
    needContext();
    checkCapture("streamQuery");
    return stream("streamQuery", s)->query();
  }

  Event eventCreate(int device) override {
    checkDevice("eventCreate", device);
    onDeviceCall(device);
    auto e = std::make_shared<SimEvent>(device);
    std::lock_guard<std::mutex> lk(mu_);
    events_[e.get()] = e;
    return e.get();
  }

  void eventDestroy(Event handle) override {
    // Pending records and waits hold their own reference, so destroying an
    // event with work in flight is safe, as on CUDA. It does not end a wait
    // on it either (Note [Simulated IPC]).
    needContext();
    std::lock_guard<std::mutex> lk(mu_);
    auto ipc = ipcEvents_.find(handle);
    if (ipc != ipcEvents_.end()) {
      if (!ipc->second->owner()) openedHandles_.erase({tProcess, ipc->second->handle()});
      ipcEvents_.erase(ipc);
      return;
    }
    if (events_.erase(handle) == 0) {
      throw Error(strCat("braid: eventDestroy(", handle, "): unknown or already destroyed event"));
    }
  }

  void eventRecord(Event handle, Stream sh) override {
    needContext();
    if (auto ipc = ipcEvent(handle)) return ipc->record(stream("eventRecord", sh));
    auto e = event("eventRecord", handle);
    auto s = stream("eventRecord", sh);
    if (e->device() != s->device()) {
      // cudaEventRecord fails the same way (cudaErrorInvalidResourceHandle).
      throw Error(strCat("braid: eventRecord: event of device ", e->device(), " recorded on ",
                         s->label()));
    }
    const uint64_t g = e->beginRecord(s);
    try {
      s->enqueue("eventRecord", [e, g] { e->complete(g); }, /*work=*/false);
    } catch (...) {
      e->complete(g);  // the stream was destroyed meanwhile: nothing may wait for g forever
      throw;
    }
  }

  void streamWaitEvent(Stream sh, Event handle) override {
    needContext();
    auto s = stream("streamWaitEvent", sh);
    if (auto ipc = ipcEvent(handle)) return ipc->waitOn(s);
    auto e = event("streamWaitEvent", handle);
    const uint64_t g = e->latest();  // the record as of this call
    if (e->done(g)) return;
    s->enqueue("streamWaitEvent", [e, g] { e->waitFor(g); }, /*work=*/false);
  }

  bool eventQuery(Event handle) override {
    needContext();
    checkCapture("eventQuery");
    if (auto ipc = ipcEvent(handle)) return ipc->query();
    auto e = event("eventQuery", handle);
    if (!e->done(e->latest())) return false;
    throwIfFailed(e);
    return true;
  }

  void eventSynchronize(Event handle) override {
    needContext();
    checkCapture("eventSynchronize");
    if (auto ipc = ipcEvent(handle)) return ipc->synchronize();
    auto e = event("eventSynchronize", handle);
    e->waitFor(e->latest());
    throwIfFailed(e);
  }

  void memcpyAsync(void* dst, const void* src, size_t bytes, Stream sh) override {
    needContext();
    auto s = stream("memcpyAsync", sh);
    if (bytes == 0) return;
    if (dst == nullptr || src == nullptr) {
      throw Error(strCat("braid: memcpyAsync(dst=", dst, ", src=", src, ", bytes=", bytes,
                         "): null pointer"));
    }
    auto mapped = mappedPeers({dst, src});
    s->enqueue(strCat("memcpyAsync(dst=", dst, ", src=", src, ", bytes=", bytes, ")"),
               [dst, src, bytes, mapped] {
                 checkMapped(mapped);
                 std::memmove(dst, src, bytes);
               });
  }

  void* hostAlloc(size_t bytes) override {
    needContext();
    checkCapture("hostAlloc");
    return allocate("hostAlloc", bytes, -1);
  }
  void hostFree(void* p) override {
    needContext();
    release("hostFree", p, -1);
  }
  void* deviceAlloc(int device, size_t bytes) override {
    checkDevice("deviceAlloc", device);
    checkCapture("deviceAlloc");
    onDeviceCall(device);
    return allocate("deviceAlloc", bytes, device);
  }
  void deviceFree(void* p) override {
    needContext();
    checkCapture("deviceFree");
    freeDevice(p);
  }
  void freeDevice(void* p) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = shared_.find(p);
      if (it != shared_.end()) {
        // Note [Simulated IPC]: a peer that still maps it faults on its next touch.
        freedFlag(*it->second)->store(1, std::memory_order_release);
        shared_.erase(it);  // the region unmaps when its last owner goes
        return;
      }
    }
    release("deviceFree", p, 0);
  }

  // Note [Simulated IPC] in sim_ipc.h.
  void* deviceAllocShareable(int device, size_t bytes) override {
    checkDevice("deviceAllocShareable", device);
    onDeviceCall(device);
    const size_t rounded = (bytes + kFreedFlagBytes - 1) / kFreedFlagBytes * kFreedFlagBytes;
    auto r = sim::SharedRegion::create(rounded + kFreedFlagBytes, "deviceAllocShareable");
    new (freedFlag(*r)) std::atomic<uint32_t>(0);
    std::lock_guard<std::mutex> lk(mu_);
    shared_[r->data()] = r;
    exportedBy_[r->handle()] = tProcess;
    return r->data();
  }
  std::string ipcMemHandle(void* p) override {
    needContext();
    std::lock_guard<std::mutex> lk(mu_);
    auto it = shared_.find(p);
    if (it == shared_.end()) {
      for (const auto& [base, r] : shared_) {
        const char* b = static_cast<const char*>(base);
        if (p > base && static_cast<const char*>(p) < b + r->size()) {
          // cudaIpcGetMemHandle names an allocation; an interior pointer's
          // handle would open at the base.
          throw Error(strCat("braid: ipcMemHandle(", p, "): ", static_cast<const char*>(p) - b,
                             " bytes into the allocation at ", base,
                             "; a handle is only for an allocation's base"));
        }
      }
      throw Error(strCat("braid: ipcMemHandle(", p, "): not memory from deviceAllocShareable"));
    }
    return it->second->handle();
  }
  void* ipcOpenMem(const std::string& handle) override {
    needContext();
    auto r = sim::SharedRegion::open(handle, "ipcOpenMem");
    std::lock_guard<std::mutex> lk(mu_);
    checkOpen("ipcOpenMem", handle, r->exporter());
    opened_[r->data()] = r;
    return r->data();
  }
  void ipcCloseMem(void* p) override {
    needContext();
    std::lock_guard<std::mutex> lk(mu_);
    auto it = opened_.find(p);
    if (it == opened_.end()) {
      throw Error(strCat("braid: ipcCloseMem(", p, "): not memory opened with ipcOpenMem"));
    }
    openedHandles_.erase({tProcess, it->second->handle()});
    opened_.erase(it);
  }
  Event eventCreateShareable(int device) override {
    checkDevice("eventCreateShareable", device);
    onDeviceCall(device);
    auto e = std::make_shared<sim::SharedEvent>(device);
    std::lock_guard<std::mutex> lk(mu_);
    ipcEvents_[e.get()] = e;
    exportedBy_[e->handle()] = tProcess;
    return e.get();
  }
  std::string ipcEventHandle(Event handle) override {
    needContext();
    auto e = ipcEvent(handle);
    if (!e || !e->owner()) {
      throw Error(strCat("braid: ipcEventHandle(", handle,
                         "): not an event from eventCreateShareable"));
    }
    return e->handle();
  }
  Event ipcOpenEvent(const std::string& handle) override {
    needContext();
    auto e = std::make_shared<sim::SharedEvent>(getDevice(), handle);
    std::lock_guard<std::mutex> lk(mu_);
    checkOpen("ipcOpenEvent", handle, e->exporter());
    ipcEvents_[e.get()] = e;
    return e.get();
  }
  int64_t processId() override {
    return tProcess == 0 ? static_cast<int64_t>(getpid())
                         : (static_cast<int64_t>(getpid()) << 16) + tProcess;
  }

  void reduceMultiAsync(DataType type, ReduceOp op, void* dst, const void* const* srcs, int n,
                        double divisor, size_t count, Stream sh) override {
    needContext();
    auto s = stream("reduceMultiAsync", sh);
    checkReduceMultiArgs("reduceMultiAsync", type, op, dst, srcs, n, divisor, count);
    if (count == 0) return;
    arch_.checkLaunch(reduceMultiKernelName(type, op), s->device());
    std::vector<const void*> sources(srcs, srcs + n);
    std::vector<const void*> touched(sources);
    touched.push_back(dst);
    auto mapped = mappedPeers(touched);
    s->enqueue(strCat("reduceMultiAsync(", toString(type), ", ", toString(op), ", ", n,
                      " sources, count=", count, ")"),
               [type, op, dst, sources, divisor, count, mapped] {
                 checkMapped(mapped);
                 hostReduceMulti(type, op, dst, sources.data(), static_cast<int>(sources.size()),
                                 divisor, count);
               });
  }

  void reduceAsync(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
                   Stream sh) override {
    needContext();
    auto s = stream("reduceAsync", sh);
    checkReduceArgs("reduceAsync", type, op, dst, src, count);
    if (count == 0) return;
    arch_.checkLaunch(reduceKernelName(type, op), s->device());
    s->enqueue(strCat("reduceAsync(", toString(type), ", ", toString(op), ", count=", count, ")"),
               [type, op, dst, src, count] { hostReduce(type, op, dst, src, count); });
  }

  bool streamIsCapturing(Stream sh) override {
    needContext();
    auto s = stream("streamIsCapturing", sh);
    std::lock_guard<std::mutex> lk(captureMu_);
    return captures_.count(s.get()) > 0;
  }
  CaptureMode exchangeCaptureMode(CaptureMode mode) override {
    const CaptureMode prev = tCaptureMode;
    tCaptureMode = mode;
    return prev;
  }
  void beginCapture(Stream sh, CaptureMode mode) override {
    needContext();
    auto s = stream("beginCapture", sh);
    {
      std::lock_guard<std::mutex> lk(captureMu_);
      if (captures_.count(s.get())) {
        throw Error(strCat("braid simulated device: beginCapture on ", s->label(),
                           ", which is capturing already (cudaErrorIllegalState)"));
      }
      captures_[s.get()] = Capture{mode, std::this_thread::get_id(), ""};
    }
    s->beginCapture();
  }
  size_t endCapture(Stream sh) override {
    needContext();
    auto s = stream("endCapture", sh);
    Capture c;
    {
      std::lock_guard<std::mutex> lk(captureMu_);
      auto it = captures_.find(s.get());
      if (it == captures_.end()) {
        throw Error(strCat("braid simulated device: endCapture on ", s->label(),
                           ", which is not capturing (cudaErrorIllegalState)"));
      }
      c = it->second;
      captures_.erase(it);
    }
    const size_t n = s->endCapture();
    if (!c.invalidatedBy.empty()) {
      throw Error(strCat("braid simulated device: endCapture on ", s->label(),
                         ": the capture (", modeName(c.mode), " mode) was invalidated by ",
                         c.invalidatedBy, " (cudaErrorStreamCaptureInvalidated)"));
    }
    return n;
  }

  void setStreamDelay(Stream sh, std::chrono::microseconds delay) override {
    stream("setStreamDelay", sh)->setDelay(delay);
  }

  void launchHostFunc(Stream sh, std::function<void()> fn) override {
    if (!fn) throw Error("braid: launchHostFunc: empty function");
    needContext();
    auto s = stream("launchHostFunc", sh);
    const int device = s->device();
    s->enqueue("launchHostFunc", [device, fn = std::move(fn)] {
      tCurrentDevice = device;  // the stream's thread, on its device (which has a context)
      fn();
    });
  }

  void enqueueFree(Stream sh, void* p) override {
    std::shared_ptr<SimStream> s;
    try {
      s = stream("enqueueFree", sh);
      s->enqueue("enqueueFree", [this, p] { freeDevice(p); });
    } catch (const std::exception&) {
      freeDevice(p);  // the stream is gone: nothing is queued on it
    }
  }

 private:
  static int checked(int devices) {
    if (devices < 1) throw Error(strCat("braid: simulatedDevice(", devices, "): need >= 1 device"));
    return devices;
  }

  // Note [Simulated contexts]: a call that needs a context, on a thread that
  // set no device, makes device 0's and makes 0 current, as CUDA 12+ does.
  void needContext() {
    if (tCurrentDevice >= 0) return;
    createContext(0);
    tCurrentDevice = 0;
  }
  void createContext(int device) {
    std::lock_guard<std::mutex> lk(ctxMu_);
    contexts_.insert(device);
  }
  // A call that takes `device`, as braid's CUDA runtime makes it: switched to
  // `device`, and back only to a previous device that has a context.
  void onDeviceCall(int device) {
    const int previous = getDevice();
    if (previous == device) return needContext();
    createContext(device);
    tCurrentDevice = primaryContextActive(previous) ? previous : device;
  }

  void checkDevice(const char* call, int device) const {
    if (device < 0 || device >= devices_) {
      throw Error(strCat("braid: ", call, "(", device, "): the simulated device has ", devices_,
                         " devices"));
    }
  }

  bool isDefault(const std::shared_ptr<SimStream>& s) const {
    return defaults_[s->device()] == s;
  }

  std::shared_ptr<SimStream> stream(const char* call, Stream handle) {
    std::lock_guard<std::mutex> lk(mu_);
    if (handle == nullptr) {
      const int device = tCurrentDevice < 0 ? 0 : tCurrentDevice;
      auto& d = defaults_[device];
      if (!d) {
        d = std::make_shared<SimStream>(device, strCat("default stream (device ", device, ")"));
        streams_[d.get()] = d;
      }
      return d;
    }
    auto it = streams_.find(handle);
    if (it == streams_.end()) {
      throw Error(strCat("braid: ", call, ": ", handle,
                         " is not a stream of the simulated device (destroyed, or foreign)"));
    }
    return it->second;
  }

  // Note [Simulated IPC]: CUDA refuses a handle opened in the process that
  // exported it, and one opened twice in a process. Under mu_.
  void checkOpen(const char* call, const std::string& handle, pid_t exporter) {
    if (exporter == getpid()) {
      auto it = exportedBy_.find(handle);
      const int by = it == exportedBy_.end() ? 0 : it->second;
      if (by == tProcess) {
        throw Error(strCat("braid: ", call, ": the handle was exported by this process (pid ",
                           getpid(), tProcess ? strCat(", simulated process ", tProcess) : "",
                           "); CUDA opens IPC handles in other processes only"));
      }
    }
    // A thread that no test marked (an executor's own, polling for its
    // rank) opening a simulated process's handle: which process it stands
    // for is unknown here, so only the rule above applies.
    if (exporter == getpid() && tProcess == 0) return;
    if (!openedHandles_.insert({tProcess, handle}).second) {
      throw Error(strCat("braid: ", call, ": the handle is already open in this process (pid ",
                         getpid(), tProcess ? strCat(", simulated process ", tProcess) : "",
                         "); CUDA opens an IPC handle once per process"));
    }
  }

  // The peers' regions mapped here that `ptrs` point into, for checkMapped.
  std::vector<std::shared_ptr<sim::SharedRegion>> mappedPeers(
      const std::vector<const void*>& ptrs) {
    std::vector<std::shared_ptr<sim::SharedRegion>> out;
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [base, r] : opened_) {
      const char* b = static_cast<const char*>(base);
      for (const void* p : ptrs) {
        if (p >= base && static_cast<const char*>(p) < b + r->size()) {
          out.push_back(r);
          break;
        }
      }
    }
    return out;
  }
  // On the stream: memory its exporter freed is an illegal address here.
  static void checkMapped(const std::vector<std::shared_ptr<sim::SharedRegion>>& mapped) {
    for (const auto& r : mapped) {
      if (freedFlag(*r)->load(std::memory_order_acquire)) {
        throw Error(strCat("braid: an illegal memory access was encountered "
                           "(cudaErrorIllegalAddress): IPC memory at ", r->data(),
                           " was freed by its exporter (pid ", r->exporter(),
                           ") while mapped here"));
      }
    }
  }

  std::shared_ptr<sim::SharedEvent> ipcEvent(Event handle) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = ipcEvents_.find(handle);
    return it == ipcEvents_.end() ? nullptr : it->second;
  }

  std::shared_ptr<SimEvent> event(const char* call, Event handle) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = events_.find(handle);
    if (it == events_.end()) {
      throw Error(strCat("braid: ", call, ": ", handle,
                         " is not an event of the simulated device (destroyed, or foreign)"));
    }
    return it->second;
  }

  // An event's record is done; the stream it was recorded on may have failed.
  static void throwIfFailed(const std::shared_ptr<SimEvent>& e) {
    if (auto s = e->lastStream()) {
      const std::string error = s->error();
      if (!error.empty()) throw Error(error);
    }
  }

  // device -1: pinned host memory. Size 0 gives nullptr (freeing it is a no-op).
  void* allocate(const char* call, size_t bytes, int device) {
    if (bytes == 0) return nullptr;
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    if (rounded < bytes) throw Error(strCat("braid: ", call, "(", bytes, " bytes): too large"));
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) throw Error(strCat("braid: ", call, "(", bytes, " bytes): out of memory"));
    std::lock_guard<std::mutex> lk(mu_);
    allocs_[p] = device;
    return p;
  }

  void release(const char* call, void* p, int kind) {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = allocs_.find(p);
      const bool host = kind < 0;
      if (it == allocs_.end() || (it->second < 0) != host) {
        throw Error(strCat("braid: ", call, "(", p, "): not ",
                           host ? "pinned host memory from hostAlloc" :
                                  "device memory from deviceAlloc",
                           " (unknown, already freed, or of the other kind)"));
      }
      allocs_.erase(it);
    }
    std::free(p);
  }

  const int devices_;
  const std::string bootId_;
  sim::SimArch arch_;
  // Note [Simulated graph capture] in sim_device.h: a prohibited call on
  // this thread invalidates every capture it is prohibited under, and throws.
  void checkCapture(const char* call) {
    std::lock_guard<std::mutex> lk(captureMu_);
    const auto self = std::this_thread::get_id();
    std::string hit;
    for (auto& [stream, c] : captures_) {
      const bool prohibited =
          (c.mode == CaptureMode::kGlobal && tCaptureMode != CaptureMode::kRelaxed) ||
          (c.mode == CaptureMode::kThreadLocal && c.thread == self);
      if (!prohibited) continue;
      if (c.invalidatedBy.empty()) c.invalidatedBy = strCat(call, " on another thread");
      if (c.thread == self) c.invalidatedBy = strCat(call, " on the capturing thread");
      if (hit.empty()) hit = strCat(stream->label(), " (", modeName(c.mode), " mode)");
    }
    if (!hit.empty()) {
      throw Error(strCat("braid simulated device: ", call,
                         " is prohibited while a CUDA graph is captured on ", hit,
                         "; the capture is invalidated (cudaErrorStreamCaptureUnsupported)"));
    }
  }
  struct Capture {
    CaptureMode mode = CaptureMode::kGlobal;
    std::thread::id thread;
    std::string invalidatedBy;  // the first prohibited call; "" while valid
  };
  std::mutex captureMu_;
  std::unordered_map<SimStream*, Capture> captures_;

  std::mutex mu_;  // the registries below
  std::unordered_map<void*, std::shared_ptr<SimStream>> streams_;
  std::unordered_map<void*, std::shared_ptr<SimEvent>> events_;
  std::vector<std::shared_ptr<SimStream>> defaults_;  // per device, created at first use
  std::unordered_map<void*, int> allocs_;             // pointer -> device, -1 for host
  std::unordered_map<void*, std::shared_ptr<sim::SharedRegion>> shared_;  // shareable, ours
  std::unordered_map<void*, std::shared_ptr<sim::SharedRegion>> opened_;  // a peer's, mapped
  std::unordered_map<void*, std::shared_ptr<sim::SharedEvent>> ipcEvents_;
  std::unordered_map<std::string, int> exportedBy_;  // handle -> tProcess of its exporter
  std::set<std::pair<int, std::string>> openedHandles_;  // (tProcess, handle) open here
  uint64_t streamIds_ = 0;
  std::mutex ctxMu_;       // contexts_
  std::set<int> contexts_;  // Note [Simulated contexts]
};

}  // namespace

namespace sim {
void setThreadProcess(int id) { tProcess = id; }
}  // namespace sim

SimulatedDevice& simulatedDevice(int devices) {
  // Never destroyed: Note [The simulated device's lifetime].
  static SimDevice* device = new SimDevice(devices);
  return *device;
}

}  // namespace cuda
}  // namespace braid

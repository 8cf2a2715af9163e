// cudaRuntime(): DeviceApi over the CUDA runtime torch loaded (Note [Loading
// the CUDA runtime] in cudart.cc). Every call is checked; an error names the
// CUDA function, its arguments and the runtime's message.
//
// Note [The current device]
// cudaSetDevice is per host thread, and CUDA creates a device's primary
// context (hundreds of MiB on that GPU) when a thread first uses the device.
// - Calls that take a device (streamCreate, eventCreate, deviceAlloc,
//   kernelLoadError) and reduceAsync (a kernel launch must go to a stream of
//   the current device) switch to that device for the call and back
//   afterwards, like torch's CUDAGuard. They do not switch back when the
//   previous device has no primary context yet: that would create one (the
//   classic "every rank allocates on GPU 0"); the thread then stays on the
//   new device.
// - The other calls take a stream or event, whose device CUDA knows; they do
//   not change the current device. A thread that makes them (a worker thread
//   especially) should call setDevice(device) first, so that CUDA has no
//   reason to initialize device 0 on it (Note [A current device per thread]
//   in cuda/on_device.h).
// - deviceUuid, deviceCount and computeCapability need no current device.
//
// Note [A stream's device]
// A kernel launch must go to a stream of the current device, so reduceAsync
// and reduceMultiAsync switch to the stream's device first. Which device
// that is, cudaStreamGetDevice says, but only from CUDA 12.8 on; the
// calling thread's current device is no answer (a worker thread, or a user
// thread that last touched another GPU, launches on the wrong device:
// cudaErrorInvalidResourceHandle at best). So, in this order:
// - cudaStreamGetDevice where the runtime has it;
// - the device of a stream this DeviceApi created (streamCreate remembers
//   it, streamDestroy forgets it);
// - the device the caller names (reduceMultiAsyncOn: braid launches on
//   torch's streams only for a group, whose device it knows);
// - the current device, only for the null stream (the legacy default
//   stream is the current device's) or when nothing else is known.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cudart.h"
#include "cuda/device_api.h"

namespace braid {
namespace cuda {
namespace {

class DeviceGuard {
 public:
  DeviceGuard(const rt::Runtime& r, int device) : r_(r) {
    BRAID_CUDART(r.f.getDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      BRAID_CUDART(r.f.setDevice(device), "cudaSetDevice(", device, ")");
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    // Errors cannot be thrown from here; a failed switch back leaves the
    // thread on the guard's device, which the next CUDA call reports if bad.
    if (changed_ && rt::primaryContextMayExist(r_, previous_)) r_.f.setDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  const rt::Runtime& r_;
  int previous_ = 0;
  bool changed_ = false;
};

class CudaRuntime final : public DeviceApi {
 public:
  explicit CudaRuntime(const rt::Runtime& r) : r_(r), f_(r.f) {}

  std::string name() const override {
    return strCat("cuda runtime ", r_.version / 1000, ".", r_.version % 1000 / 10, " (",
                  r_.soname, ")");
  }
  bool simulated() const override { return false; }

  int deviceCount() override {
    int n = 0;
    BRAID_CUDART(f_.getDeviceCount(&n), "cudaGetDeviceCount");
    return n;
  }
  int getDevice() override {
    int d = 0;
    BRAID_CUDART(f_.getDevice(&d), "cudaGetDevice");
    return d;
  }
  void setDevice(int device) override {
    BRAID_CUDART(f_.setDevice(device), "cudaSetDevice(", device, ")");
  }
  bool primaryContextActive(int device) override {
    return rt::primaryContextMayExist(r_, device);
  }

  std::string deviceUuid(int device) override {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = uuids_.find(device);
    if (it != uuids_.end()) return it->second;
    std::vector<unsigned char> prop(rt::kPropBufferBytes, 0);
    BRAID_CUDART(f_.getDeviceProperties(prop.data(), device), "cudaGetDeviceProperties(device=",
                 device, ")");
    static const char kHex[] = "0123456789abcdef";
    std::string uuid;
    for (size_t i = 0; i < 16; ++i) {
      const unsigned char b = prop[rt::kPropUuidOffset + i];
      uuid += kHex[b >> 4];
      uuid += kHex[b & 15];
    }
    if (uuid == std::string(32, '0')) {
      throw Error(strCat("braid: cudaGetDeviceProperties(device=", device,
                         ") reported an all-zero UUID; braid cannot tell which ranks share "
                         "this GPU"));
    }
    uuids_[device] = uuid;
    return uuid;
  }

  int computeCapability(int device) override {
    int major = 0;
    int minor = 0;
    BRAID_CUDART(f_.deviceGetAttribute(&major, rt::kDevAttrComputeCapabilityMajor, device),
                 "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMajor, device=", device, ")");
    BRAID_CUDART(f_.deviceGetAttribute(&minor, rt::kDevAttrComputeCapabilityMinor, device),
                 "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMinor, device=", device, ")");
    return major * 10 + minor;
  }

  std::string kernelLoadError(int device) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = kernelErrors_.find(device);
      if (it != kernelErrors_.end()) return it->second;
    }
    std::string why;
    try {
      const int cc = computeCapability(device);
      // The load goes to the current device's context: `device`'s, and no
      // other's (Note [The current device]).
      DeviceGuard guard(r_, device);
      why = cuda::kernelLoadError(r_, cc);
    } catch (const Error& e) {
      why = e.what();
    }
    std::lock_guard<std::mutex> lk(mu_);
    kernelErrors_[device] = why;
    return why;
  }

  Stream streamCreate(int device) override {
    DeviceGuard guard(r_, device);
    rt::StreamT s = nullptr;
    BRAID_CUDART(f_.streamCreateWithFlags(&s, rt::kStreamNonBlocking),
                 "cudaStreamCreateWithFlags(device=", device, ", cudaStreamNonBlocking)");
    std::lock_guard<std::mutex> lk(mu_);
    streamDevices_[s] = device;  // Note [A stream's device]
    return s;
  }
  void streamDestroy(Stream s) override {
    if (s == nullptr) throw Error("braid: cudaStreamDestroy(null): the default stream");
    {
      std::lock_guard<std::mutex> lk(mu_);
      streamDevices_.erase(s);
    }
    BRAID_CUDART(f_.streamDestroy(s), "cudaStreamDestroy(", s, ")");
  }
  void streamSynchronize(Stream s) override {
    BRAID_CUDART(f_.streamSynchronize(s), "cudaStreamSynchronize(", s, ")");
  }
  bool streamQuery(Stream s) override {
    const rt::Status err = f_.streamQuery(s);
    if (err == rt::kErrorNotReady) {
      f_.getLastError();  // not an error: clear it, as torch's CUDAStream::query does
      return false;
    }
    BRAID_CUDART(err, "cudaStreamQuery(", s, ")");
    return true;
  }

  bool streamIsCapturing(Stream s) override {
    if (f_.streamIsCapturing == nullptr) return false;
    int status = 0;  // cudaStreamCaptureStatusNone; 1 active, 2 invalidated
    BRAID_CUDART(f_.streamIsCapturing(s, &status), "cudaStreamIsCapturing(", s, ")");
    return status != 0;
  }
  CaptureMode exchangeCaptureMode(CaptureMode mode) override {
    if (f_.threadExchangeStreamCaptureMode == nullptr) return mode;
    int m = static_cast<int>(mode);
    BRAID_CUDART(f_.threadExchangeStreamCaptureMode(&m),
                 "cudaThreadExchangeStreamCaptureMode(", static_cast<int>(mode), ")");
    return static_cast<CaptureMode>(m);
  }

  Event eventCreate(int device) override {
    DeviceGuard guard(r_, device);
    rt::EventT e = nullptr;
    BRAID_CUDART(f_.eventCreateWithFlags(&e, rt::kEventDisableTiming),
                 "cudaEventCreateWithFlags(device=", device, ", cudaEventDisableTiming)");
    return e;
  }
  void eventDestroy(Event e) override {
    BRAID_CUDART(f_.eventDestroy(e), "cudaEventDestroy(", e, ")");
  }
  void eventRecord(Event e, Stream s) override {
    BRAID_CUDART(f_.eventRecord(e, s), "cudaEventRecord(event=", e, ", stream=", s, ")");
  }
  void streamWaitEvent(Stream s, Event e) override {
    BRAID_CUDART(f_.streamWaitEvent(s, e, rt::kEventWaitDefault), "cudaStreamWaitEvent(stream=",
                 s, ", event=", e, ")");
  }
  bool eventQuery(Event e) override {
    const rt::Status err = f_.eventQuery(e);
    if (err == rt::kErrorNotReady) {
      f_.getLastError();
      return false;
    }
    BRAID_CUDART(err, "cudaEventQuery(", e, ")");
    return true;
  }
  void eventSynchronize(Event e) override {
    BRAID_CUDART(f_.eventSynchronize(e), "cudaEventSynchronize(", e, ")");
  }

  void memcpyAsync(void* dst, const void* src, size_t bytes, Stream s) override {
    if (bytes == 0) return;
    BRAID_CUDART(f_.memcpyAsync(dst, src, bytes, rt::kMemcpyDefault, s), "cudaMemcpyAsync(dst=",
                 dst, ", src=", src, ", bytes=", bytes, ", cudaMemcpyDefault, stream=", s, ")");
  }

  // Size 0 gives nullptr without asking CUDA (freeing nullptr is a no-op),
  // as on the simulated device.
  void* hostAlloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    BRAID_CUDART(f_.hostAlloc(&p, bytes, rt::kHostAllocPortable), "cudaHostAlloc(", bytes,
                 " bytes, cudaHostAllocPortable)");
    return p;
  }
  void hostFree(void* p) override {
    if (p == nullptr) return;
    BRAID_CUDART(f_.freeHost(p), "cudaFreeHost(", p, ")");
  }
  void* deviceAlloc(int device, size_t bytes) override {
    if (bytes == 0) return nullptr;
    DeviceGuard guard(r_, device);
    void* p = nullptr;
    BRAID_CUDART(f_.malloc(&p, bytes), "cudaMalloc(device=", device, ", ", bytes, " bytes)");
    return p;
  }
  void deviceFree(void* p) override {
    if (p == nullptr) return;
    BRAID_CUDART(f_.free(p), "cudaFree(", p, ")");
  }

  void reduceAsync(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
                   Stream s) override {
    // The launch must go to the stream's device (Note [A stream's device]).
    DeviceGuard guard(r_, streamDevice(s, -1));
    launchReduce(r_, type, op, dst, src, count, s);
  }

  void reduceMultiAsync(DataType type, ReduceOp op, void* dst, const void* const* srcs, int n,
                        double divisor, size_t count, Stream s) override {
    DeviceGuard guard(r_, streamDevice(s, -1));
    launchReduceMulti(r_, type, op, dst, srcs, n, divisor, count, s);
  }
  void reduceMultiAsyncOn(int device, DataType type, ReduceOp op, void* dst,
                          const void* const* srcs, int n, double divisor, size_t count,
                          Stream s) override {
    DeviceGuard guard(r_, streamDevice(s, device));
    launchReduceMulti(r_, type, op, dst, srcs, n, divisor, count, s);
  }

  // cudaMalloc'd memory can always be exported.
  void* deviceAllocShareable(int device, size_t bytes) override {
    return deviceAlloc(device, bytes);
  }
  std::string ipcMemHandle(void* p) override {
    rt::IpcHandle h{};
    BRAID_CUDART(f_.ipcGetMemHandle(&h, p), "cudaIpcGetMemHandle(", p, ")");
    return std::string(h.reserved, sizeof(h.reserved));
  }
  void* ipcOpenMem(const std::string& handle) override {
    rt::IpcHandle h = toHandle(handle, "cudaIpcOpenMemHandle");
    void* p = nullptr;
    BRAID_CUDART(f_.ipcOpenMemHandle(&p, h, rt::kIpcMemLazyEnablePeerAccess),
                 "cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess)");
    return p;
  }
  void ipcCloseMem(void* p) override {
    BRAID_CUDART(f_.ipcCloseMemHandle(p), "cudaIpcCloseMemHandle(", p, ")");
  }
  Event eventCreateShareable(int device) override {
    DeviceGuard guard(r_, device);
    Event e = nullptr;
    BRAID_CUDART(f_.eventCreateWithFlags(&e, rt::kEventDisableTiming | rt::kEventInterprocess),
                 "cudaEventCreateWithFlags(device=", device,
                 ", cudaEventDisableTiming | cudaEventInterprocess)");
    return e;
  }
  std::string ipcEventHandle(Event e) override {
    rt::IpcHandle h{};
    BRAID_CUDART(f_.ipcGetEventHandle(&h, e), "cudaIpcGetEventHandle(", e, ")");
    return std::string(h.reserved, sizeof(h.reserved));
  }
  Event ipcOpenEvent(const std::string& handle) override {
    rt::IpcHandle h = toHandle(handle, "cudaIpcOpenEventHandle");
    Event e = nullptr;
    BRAID_CUDART(f_.ipcOpenEventHandle(&e, h), "cudaIpcOpenEventHandle");
    return e;
  }

  // `s`'s device (Note [A stream's device]); `named`: the caller's word for
  // it (-1: none).
  int streamDevice(Stream s, int named) {
    if (s != nullptr) {
      if (f_.streamGetDevice != nullptr) {
        int device = -1;
        BRAID_CUDART(f_.streamGetDevice(s, &device), "cudaStreamGetDevice(", s, ")");
        return device;
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = streamDevices_.find(s);
        if (it != streamDevices_.end()) return it->second;
      }
    }
    if (named >= 0) return named;
    return getDevice();
  }

  static rt::IpcHandle toHandle(const std::string& bytes, const char* call) {
    rt::IpcHandle h{};
    if (bytes.size() != sizeof(h.reserved)) {
      throw Error(strCat("braid: ", call, ": a handle of ", bytes.size(), " bytes, expected ",
                         sizeof(h.reserved)));
    }
    std::memcpy(h.reserved, bytes.data(), sizeof(h.reserved));
    return h;
  }

 private:
  const rt::Runtime& r_;
  const rt::Functions& f_;
  std::mutex mu_;  // uuids_, kernelErrors_, streamDevices_
  std::unordered_map<int, std::string> uuids_;
  std::unordered_map<int, std::string> kernelErrors_;  // kernelLoadError, per device
  std::unordered_map<Stream, int> streamDevices_;  // the streams streamCreate made
};

}  // namespace

std::unique_ptr<DeviceApi> cudaRuntimeOver(const rt::Runtime& r) {
  return std::unique_ptr<DeviceApi>(new CudaRuntime(r));
}

DeviceApi& cudaRuntime() {
  // Built once; a failure (no runtime, no driver, no GPU) is remembered and
  // thrown again. Never destroyed (Note [Loading the CUDA runtime]).
  static std::mutex mu;
  static CudaRuntime* device = nullptr;
  static std::string failure;
  std::lock_guard<std::mutex> lk(mu);
  if (device != nullptr) return *device;
  if (!failure.empty()) throw Error(failure);
  try {
    const rt::Runtime& r = rt::runtime();
    int n = 0;
    BRAID_CUDART(r.f.getDeviceCount(&n), "cudaGetDeviceCount (", r.soname, ")");
    if (n < 1) throw Error(strCat("braid: the CUDA runtime (", r.soname, ") sees no GPU"));
    device = new CudaRuntime(r);
  } catch (const Error& e) {
    failure = e.what();
    throw;
  }
  return *device;
}

}  // namespace cuda
}  // namespace braid

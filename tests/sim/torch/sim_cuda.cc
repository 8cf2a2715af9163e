#include "sim/torch/sim_cuda.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "common/error.h"

namespace braid {
namespace sim {

namespace {
using c10::DeviceIndex;
using c10::StreamId;

constexpr int kMaxDevices = 16;
constexpr StreamId kPoolStreams = 4;  // ids 1..4; 0 is the default stream

// Streams are numbered per device; the simulated stream behind each is made
// on first use and lives as long as the process.
class Streams {
 public:
  explicit Streams(cuda::DeviceApi& api) : api_(api) {}
  cuda::Stream get(DeviceIndex device, StreamId id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& s = streams_[{device, id}];
    if (!s) s = api_.streamCreate(device);
    return s;
  }
  StreamId fresh() { return next_.fetch_add(1); }
  std::vector<cuda::Stream> all(DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<cuda::Stream> out;
    for (auto& kv : streams_)
      if (kv.first.first == device) out.push_back(kv.second);
    return out;
  }

 private:
  cuda::DeviceApi& api_;
  std::mutex mu_;
  std::map<std::pair<DeviceIndex, StreamId>, cuda::Stream> streams_;
  std::atomic<StreamId> next_{kPoolStreams + 1};
};

thread_local std::array<StreamId, kMaxDevices> tStream{};

// The current device is the simulated device's, shared with braid's calls,
// as torch's guard and braid share CUDA's. Where torch's CUDAGuardImpl (1.13)
// switches to a stream's device for a call and back with a plain
// cudaSetDevice (block, record, destroyEvent, a DeviceGuard's restore), so
// does this one: on a thread that set no device the switch back to "0"
// creates device 0's context (Note [Simulated contexts] in
// tests/sim/device/sim_device.h), as on CUDA 12+.
class Guard final : public c10::impl::DeviceGuardImplInterface {
 public:
  Guard(cuda::DeviceApi& api, int devices) : api_(api), devices_(devices), streams_(api) {}

  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (old.index() != d.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(c10::DeviceType::CUDA, static_cast<DeviceIndex>(api_.getDevice()));
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.index() >= 0 && d.index() < devices_, "simulated CUDA: no device ", d.str());
    api_.setDevice(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      api_.setDevice(d.index());
    } catch (...) {
    }
  }
  c10::Stream getStream(c10::Device d) const noexcept override {
    return c10::Stream(c10::Stream::UNSAFE, d, tStream[index(d)]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool = false) const override {
    static std::atomic<StreamId> rr{0};
    return c10::Stream(c10::Stream::UNSAFE, d, 1 + rr.fetch_add(1) % kPoolStreams);
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  c10::Stream getNewStream(c10::Device d, int = 0) const override {
    return c10::Stream(c10::Stream::UNSAFE, d, streams_.fresh());
  }
  void synchronizeEvent(void* e) const override {
    if (e) api_.eventSynchronize(e);
  }
  void synchronizeDevice(const DeviceIndex device) const override {
    for (cuda::Stream s : streams_.all(device)) api_.streamSynchronize(s);
  }
#endif
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    c10::Stream old = getStream(s.device());
    tStream[index(s.device())] = s.id();
    return old;
  }
  void destroyEvent(void* e, const DeviceIndex device) const noexcept override {
    if (!e) return;
    try {
      const c10::Device orig = getDevice();  // torch: a CUDAGuard on `device`
      if (device >= 0) setDevice(c10::Device(c10::DeviceType::CUDA, device));
      api_.eventDestroy(e);
      uncheckedSetDevice(orig);
    } catch (...) {
    }
  }
  void record(void** event, const c10::Stream& s, const DeviceIndex, const c10::EventFlag)
      const override {
    const c10::Device orig = getDevice();
    setDevice(s.device());
    if (!*event) *event = api_.eventCreate(s.device_index());
    api_.eventRecord(*event, stream(s));
    setDevice(orig);
  }
  void block(void* e, const c10::Stream& s) const override {
    if (!e) return;
    const c10::Device orig = getDevice();
    setDevice(s.device());
    api_.streamWaitEvent(stream(s), e);
    setDevice(orig);
  }
  bool queryEvent(void* e) const override { return !e || api_.eventQuery(e); }
  DeviceIndex deviceCount() const noexcept override { return static_cast<DeviceIndex>(devices_); }
  bool queryStream(const c10::Stream& s) const override { return api_.streamQuery(stream(s)); }
  void synchronizeStream(const c10::Stream& s) const override {
    api_.streamSynchronize(stream(s));
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

  cuda::Stream stream(const c10::Stream& s) const {
    return streams_.get(s.device_index(), s.id());
  }

 private:
  size_t index(c10::Device d) const {
    return static_cast<size_t>(d.index() < 0 ? api_.getDevice() : d.index()) % kMaxDevices;
  }
  cuda::DeviceApi& api_;
  const int devices_;
  mutable Streams streams_;
};

std::mutex gMu;
Guard* gGuard = nullptr;
cuda::SimulatedDevice* gDevice = nullptr;

Guard& guard() {
  std::lock_guard<std::mutex> lock(gMu);
  BRAID_ENFORCE(gGuard, "simulated cuda", -1, "not installed: call install() first");
  return *gGuard;
}
}  // namespace

void install(int devices, void (*setDeviceApi)(cuda::DeviceApi*)) {
  std::lock_guard<std::mutex> lock(gMu);
  if (gGuard) return;
  BRAID_ENFORCE(devices > 0 && devices <= kMaxDevices, "simulated cuda", -1,
                "devices must be 1..", kMaxDevices, ", got ", devices);
  BRAID_ENFORCE(!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA), "simulated cuda", -1,
                "torch has a CUDA device guard already (a CUDA build): the simulated device "
                "stands in only where there is no CUDA");
  // Lives as long as the process, as torch's own registrations do.
  gDevice = &cuda::simulatedDevice(devices);
  gGuard = new Guard(*gDevice, devices);
  static c10::impl::DeviceGuardImplRegistrar registrar(c10::DeviceType::CUDA, gGuard);
  installAtenFallback();
  installAcceleratorHooks();
  setDeviceApi(gDevice);
}

cuda::SimulatedDevice& device() {
  guard();
  return *gDevice;
}

cuda::Stream currentStream(int device) {
  Guard& g = guard();
  return g.stream(g.getStream(c10::Device(c10::DeviceType::CUDA, device)));
}

at::Tensor empty(at::IntArrayRef sizes, at::ScalarType dtype, int device,
                 at::IntArrayRef strides) {
  cuda::SimulatedDevice& api = sim::device();
  int64_t n = 1;
  if (strides.empty()) {
    for (int64_t s : sizes) n *= s;
  } else {
    for (size_t i = 0; i < sizes.size(); ++i) n += (sizes[i] - 1) * strides[i];
  }
  const size_t bytes = static_cast<size_t>(n) * c10::elementSize(dtype);
  void* p = api.deviceAlloc(device, bytes > 0 ? bytes : 1);
  std::memset(p, 0, bytes > 0 ? bytes : 1);
  const c10::Device dev(c10::DeviceType::CUDA, static_cast<DeviceIndex>(device));
  // target_device: torch must not ask a CUDA runtime where the pointer lives.
  auto maker = at::for_blob(p, sizes);
  if (!strides.empty()) maker.strides(strides);
  // Freed in the order of the stream current at allocation, as the caching
  // allocator reuses a block only after the work queued on its stream: a
  // write still queued there (sim::write) must not land in freed memory.
  cuda::Stream stream = currentStream(device);
  return maker
      .deleter([&api, stream](void* q) { api.enqueueFree(stream, q); })
      .options(at::TensorOptions().dtype(dtype).device(dev))
      .target_device(dev)
      .make_tensor();
}

void write(const at::Tensor& dst, const at::Tensor& src) {
  TORCH_CHECK(dst.is_cuda() && src.device().is_cpu() && dst.nbytes() == src.nbytes(),
              "sim write: a CUDA tensor and a CPU tensor of the same size");
  // A copy owned here: the stream's thread drops it, and must not touch a
  // Python object doing so.
  at::Tensor hold = src.contiguous().clone();
  void* d = dst.data_ptr();  // the caller keeps dst alive until the stream ran
  device().launchHostFunc(currentStream(dst.device().index()), [d, hold] {
    std::memcpy(d, hold.data_ptr(), hold.nbytes());
  });
}

at::Tensor read(const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), "sim read: a CUDA tensor");
  at::Tensor out = at::empty(t.sizes(), t.options().device(at::kCPU));
  cuda::Stream s = currentStream(t.device().index());
  if (t.nbytes() > 0) device().memcpyAsync(out.data_ptr(), t.data_ptr(), t.nbytes(), s);
  device().streamSynchronize(s);
  return out;
}

cuda::Stream streamOf(int device, int64_t streamId) {
  Guard& g = guard();
  return g.stream(c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::CUDA, device),
                              streamId));
}

void delayCurrentStream(int device, std::chrono::microseconds delay) {
  sim::device().setStreamDelay(currentStream(device), delay);
}

}  // namespace sim
}  // namespace braid

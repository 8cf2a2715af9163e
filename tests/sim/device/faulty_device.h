// Test-only: a DeviceApi that wraps another (the simulated device, or any
// DeviceApi) and makes chosen calls fail as the CUDA runtime's would.
//
// Note [Injected device failures]
// A fault names a DeviceApi call ("hostFree", "streamDestroy", ...; "*" is
// every call) and which of its calls fail, counted from when it was
// injected: the nth only, or the nth and every later one. The failing call
// throws the braid::Error that cudaRuntime() would throw for that CUDA error
// ("braid: <call> failed: <message> (<code> <name>)") without reaching the
// wrapped device. A sticky fault (cudaErrorIllegalAddress, cudaErrorLaunch-
// Failure: the context is corrupt) also makes every later call of any kind
// fail with the same error, as CUDA does after such an error, until clear().
// name() and simulated() never fail (they make no CUDA call).
// The wrapped device's extras (SimulatedDevice's setStreamDelay,
// launchHostFunc, enqueueFree, contexts and the compute-capability setters)
// pass through unfailed: they stand in for what a test, a user's kernel or
// torch's allocator does, not for braid's calls.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "sim/device/sim_device.h"

namespace braid {
namespace cuda {

struct DeviceFault {
  std::string call;  // a DeviceApi method's name, or "*"
  int nth = 1;       // the nth matching call from now fails (1: the next)
  bool every = false;  // and every matching call after it
  bool sticky = false;  // and every later call of any kind (a corrupt context)
  int code = 700;       // cudaErrorIllegalAddress
  std::string errorName = "cudaErrorIllegalAddress";
  std::string message = "an illegal memory access was encountered";
};

class FaultyDevice final : public SimulatedDevice {
 public:
  explicit FaultyDevice(SimulatedDevice& inner) : inner_(inner) {}

  void inject(DeviceFault fault);
  // Removes every fault and a sticky error already raised.
  void clear();
  // Calls of `call` made so far (failed ones included), and calls failed.
  int calls(const std::string& call);
  int failures();
  // The calls that failed, in order ("hostFree", ...).
  std::vector<std::string> failedCalls();

  std::string name() const override { return "faulty(" + inner_.name() + ")"; }
  bool simulated() const override { return inner_.simulated(); }

  int deviceCount() override;
  int getDevice() override;
  void setDevice(int device) override;
  std::string deviceUuid(int device) override;
  bool primaryContextActive(int device) override;
  int computeCapability(int device) override;
  std::string kernelLoadError(int device) override;
  Stream streamCreate(int device) override;
  void streamDestroy(Stream s) override;
  void streamSynchronize(Stream s) override;
  bool streamQuery(Stream s) override;
  Event eventCreate(int device) override;
  void eventDestroy(Event e) override;
  void eventRecord(Event e, Stream s) override;
  void streamWaitEvent(Stream s, Event e) override;
  bool eventQuery(Event e) override;
  void eventSynchronize(Event e) override;
  void memcpyAsync(void* dst, const void* src, size_t bytes, Stream s) override;
  void* hostAlloc(size_t bytes) override;
  void hostFree(void* p) override;
  void* deviceAlloc(int device, size_t bytes) override;
  void deviceFree(void* p) override;
  void reduceAsync(DataType type, ReduceOp op, void* dst, const void* src, size_t count,
                   Stream s) override;
  void reduceMultiAsync(DataType type, ReduceOp op, void* dst, const void* const* srcs, int n,
                        double divisor, size_t count, Stream s) override;
  void reduceMultiAsyncOn(int device, DataType type, ReduceOp op, void* dst,
                          const void* const* srcs, int n, double divisor, size_t count,
                          Stream s) override;
  void* deviceAllocShareable(int device, size_t bytes) override;
  std::string ipcMemHandle(void* p) override;
  void* ipcOpenMem(const std::string& handle) override;
  void ipcCloseMem(void* p) override;
  Event eventCreateShareable(int device) override;
  std::string ipcEventHandle(Event e) override;
  Event ipcOpenEvent(const std::string& handle) override;
  int64_t processId() override;

  void setStreamDelay(Stream s, std::chrono::microseconds delay) override {
    inner_.setStreamDelay(s, delay);
  }
  void launchHostFunc(Stream s, std::function<void()> fn) override {
    inner_.launchHostFunc(s, std::move(fn));
  }
  void enqueueFree(Stream s, void* p) override { inner_.enqueueFree(s, p); }
  void deviceSynchronize(int device) override { inner_.deviceSynchronize(device); }
  std::vector<int> contexts() override { return inner_.contexts(); }
  bool streamIsCapturing(Stream s) override { return inner_.streamIsCapturing(s); }
  CaptureMode exchangeCaptureMode(CaptureMode mode) override {
    return inner_.exchangeCaptureMode(mode);
  }
  void beginCapture(Stream s, CaptureMode mode) override { inner_.beginCapture(s, mode); }
  size_t endCapture(Stream s) override { return inner_.endCapture(s); }
  void forgetContexts() override { inner_.forgetContexts(); }
  void setComputeCapability(int device, int cc) override { inner_.setComputeCapability(device, cc); }
  void setKernelImages(std::optional<KernelImages> images) override {
    inner_.setKernelImages(std::move(images));
  }

 private:
  // Throws the injected error if `call` is to fail now.
  void check(const char* call, const std::string& args);

  SimulatedDevice& inner_;
  std::mutex mu_;
  struct Armed {
    DeviceFault fault;
    int seen = 0;  // matching calls since injected
  };
  std::vector<Armed> faults_;
  bool stuck_ = false;
  DeviceFault sticky_;
  std::map<std::string, int> calls_;
  std::vector<std::string> failed_;
};

}  // namespace cuda
}  // namespace braid

// Test-only: braid's simulated CUDA device (Note [The device seam] in
// csrc/cuda/device_api.h, Note [Simulated ordering] in sim_stream.h). Never
// linked into what ships: tests install it with setDeviceApiForTesting
// (csrc/c10d/cuda/cuda_context.h) or hand it to an executor directly.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include "cuda/device_api.h"
#include "cuda/kernel_images.h"

namespace braid {
namespace cuda {

// The DeviceApi with what only a simulator can do: the calls a test needs to
// widen races and to stand in for a user's kernels.
class SimulatedDevice : public DeviceApi {
 public:
  // Every task enqueued on `s` from now on first sleeps for `delay`.
  virtual void setStreamDelay(Stream s, std::chrono::microseconds delay) = 0;
  // Enqueues `fn` on `s`, to run in stream order on the stream's thread (a
  // stand-in for a user's kernel). An exception it throws fails the stream.
  // `fn` runs with the stream's device current.
  virtual void launchHostFunc(Stream s, std::function<void()> fn) = 0;
  // Note [Simulated kernel images] in sim_arch.h: `device`'s compute
  // capability (75 is 7.5; 0: back to the default), and the kernel images
  // the simulated build holds (nullopt: back to the default).
  virtual void setComputeCapability(int device, int cc) = 0;
  virtual void setKernelImages(std::optional<KernelImages> images) = 0;
  // Frees device memory `p` after the work queued on `s` so far, as torch's
  // caching allocator returns a block: no CUDA call, so no context.
  virtual void enqueueFree(Stream s, void* p) = 0;
  // cudaDeviceSynchronize: waits for every stream of `device` (braid's own
  // included), as torch.cuda.synchronize() does on a GPU; throws a failed
  // stream's error.
  virtual void deviceSynchronize(int device) = 0;

  // Note [Simulated graph capture]
  // CUDA graph capture with CUDA's three modes (Note [Graph capture] in
  // csrc/cuda/device_api.h). beginCapture(s, mode) starts capturing on `s`
  // from the calling thread: tasks enqueued on `s` are recorded, not run,
  // and streamIsCapturing(s) is true. While it lasts, eventQuery,
  // streamQuery, streamSynchronize, eventSynchronize, hostAlloc, deviceAlloc
  // and deviceFree are prohibited: in kGlobal mode on every thread whose own
  // mode (exchangeCaptureMode) is not kRelaxed, in kThreadLocal mode on the
  // capturing thread only, in kRelaxed mode nowhere. A prohibited call
  // throws (cudaErrorStreamCaptureUnsupported) and invalidates the capture;
  // endCapture then throws too (cudaErrorStreamCaptureInvalidated). It
  // returns how many tasks the graph holds (they are dropped: no replay).
  virtual void beginCapture(Stream s, CaptureMode mode) = 0;
  virtual size_t endCapture(Stream s) = 0;

  // Note [Simulated contexts]
  // The device keeps CUDA 12+'s rules for contexts (Note [A current device
  // per thread] in csrc/cuda/on_device.h): a current device per thread, none
  // until the thread sets one, and a primary context per process and device.
  // getDevice on a thread with none answers 0 and creates nothing;
  // setDevice(d) creates d's context; every call that needs a context (one
  // taking a stream, an event, memory, or an IPC handle) on a thread with no
  // device creates device 0's and makes 0 current there, as the runtime does;
  // primaryContextActive creates nothing. Calls that take a device
  // (streamCreate, eventCreate, deviceAlloc, ...) behave as braid's CUDA
  // runtime does with its guard (Note [The current device] in
  // csrc/cuda/cuda_runtime.cc): d's context, and the thread back on its
  // previous device only when that one has a context. The process's contexts
  // are what `nvidia-smi --query-compute-apps` would list for it.
  // The devices this process holds a primary context on, ascending.
  virtual std::vector<int> contexts() = 0;
  // Tests only: as if this process had no context yet (threads keep the
  // device they set).
  virtual void forgetContexts() = 0;
};

namespace sim {
// Tests only (Note [Simulated IPC] in sim_ipc.h): the calling thread acts as
// simulated process `id` (0: the real process) for the IPC rules and for
// DeviceApi::processId, so that ranks run as threads of one test may open
// each other's handles. Only a test that says so sets it.
void setThreadProcess(int id);
}  // namespace sim

// The simulated device, with `devices` devices on first call (later calls
// return the same one). Never destroyed: Note [The simulated device's
// lifetime] in sim_device.cc.
SimulatedDevice& simulatedDevice(int devices = 2);

}  // namespace cuda
}  // namespace braid

// Test-only: braid's simulated CUDA device (Note [The device seam] in
// csrc/cuda/device_api.h, Note [Simulated ordering] in sim_stream.h). Never
// linked into what ships: tests install it with setDeviceApiForTesting
// (csrc/c10d/cuda/cuda_context.h) or hand it to an executor directly.
#pragma once

#include <chrono>
#include <functional>
#include <optional>

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
  virtual void launchHostFunc(Stream s, std::function<void()> fn) = 0;
  // Note [Simulated kernel images] in sim_arch.h: `device`'s compute
  // capability (75 is 7.5; 0: back to the default), and the kernel images
  // the simulated build holds (nullopt: back to the default).
  virtual void setComputeCapability(int device, int cc) = 0;
  virtual void setKernelImages(std::optional<KernelImages> images) = 0;
};

// The simulated device, with `devices` devices on first call (later calls
// return the same one). Never destroyed: Note [The simulated device's
// lifetime] in sim_device.cc.
SimulatedDevice& simulatedDevice(int devices = 2);

}  // namespace cuda
}  // namespace braid

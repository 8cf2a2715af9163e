// Test-only: the simulated devices' compute capabilities, and braid's kernel
// images as the simulated device sees them, so that the executor choice's
// kernel check (Note [Kernel images] in csrc/cuda/kernel_images.h) is tested
// without a GPU of each kind.
//
// Note [Simulated kernel images]
// - Every simulated device has a compute capability: 9.0 unless
//   BRAID_SIM_COMPUTE_CAPABILITY says otherwise ("8.0,7.5": device 0 is 8.0,
//   device 1 is 7.5, any further device 9.0; read when the simulated device
//   is made), or a test sets it (SimulatedDevice::setComputeCapability,
//   braid_sim.set_compute_capability).
// - The images are those this build's fatbin holds (builtKernelImages()),
//   or BRAID_SIM_KERNEL_IMAGES ("sm_80,compute_90"; "none" for a build
//   without kernels), or what a test sets. A build without nvcc has none, but
//   the simulated device then takes those the default arch list builds: it
//   runs the kernels' CPU bodies, which every build has, and the same-GPU
//   and hierarchical executors must stay tested on the CI legs that have no
//   nvcc. A test that wants a build without kernels sets no images.
// - A device runs braid's kernels by CUDA's rule (KernelImages::runOn).
//   kernelLoadError answers as the real runtime does, and a reduceAsync or
//   reduceMultiAsync on a stream of a device that cannot run them throws at
//   the call, as cudaLaunchKernel returns cudaErrorNoKernelImageForDevice,
//   with CUDA's text.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cuda/kernel_images.h"

namespace braid {
namespace cuda {
namespace sim {

class SimArch {
 public:
  explicit SimArch(int devices);

  int computeCapability(int device) const;
  // cc 0: back to the default.
  void setComputeCapability(int device, int cc);
  KernelImages images() const;
  // nullopt: back to the default.
  void setImages(std::optional<KernelImages> images);

  // "" or why braid's kernels do not load on `device` (DeviceApi::kernelLoadError).
  std::string loadError(int device) const;
  // Throws braid::Error as a launch of `kernel` on `device` fails when the
  // device cannot run it.
  void checkLaunch(const char* kernel, int device) const;

  // "7.5" -> 75; throws braid::Error naming `what` for anything else.
  static int parseCapability(const std::string& s, const char* what);

 private:
  std::vector<int> defaults_;  // per device
  KernelImages defaultImages_;
  mutable std::mutex mu_;
  std::vector<int> cc_;  // per device
  KernelImages images_;
};

}  // namespace sim
}  // namespace cuda
}  // namespace braid

// Which GPUs braid's kernels run on: the images the build's fatbin holds, and
// CUDA's rule for picking one. Torch-free and CUDA-free; the simulated device
// applies the same rule (tests/sim/device/sim_arch.h).
//
// Note [Kernel images]
// braid's kernels are one fatbin (cmake/CudaKernels.cmake) holding machine
// code (SASS) for several architectures and the PTX of one. CUDA runs a kernel
// on a device of compute capability X.Y when the fatbin holds
//   - machine code sm_XZ with Z <= Y: cubins run on later minor versions of
//     their own major only (sm_80 code runs on 8.6 and 8.9, never on 9.0), or
//   - PTX compute_AB with A.B <= X.Y, which the driver compiles at load time
//     (a driver older than the PTX's ISA refuses it: cudaErrorUnsupportedPtxVersion).
// Else the load, and every launch, fail with cudaErrorNoKernelImageForDevice,
// "no kernel image is available for execution on the device". sm_90 code and
// compute_90 PTX alone (what braid built before) fail on every A100, L40S or
// RTX 4090.
// The same-GPU and hierarchical executors launch braid's kernels; NCCL and
// staging do not. So when a group chooses its executor every rank asks its
// own device whether the kernels load there (DeviceApi::kernelLoadError: the
// rule above, then a real load of one kernel, which also catches a driver
// that cannot compile the PTX), shares the answer with the rest, and the
// group runs those executors only when every rank's device said yes (Note
// [Choosing a CUDA executor] in cuda/nccl/executor_choice.h); otherwise it
// stages, and _cuda_executor() names the device, its sm_XY and CUDA's text.
// A build without nvcc has no images at all: it stages from the start
// rather than choosing same-gpu and throwing at the first op.
#pragma once

#include <string>
#include <vector>

namespace braid {
namespace cuda {

// CUDA's text for cudaErrorNoKernelImageForDevice (209).
constexpr const char* kNoKernelImageText =
    "no kernel image is available for execution on the device";

// A compute capability as major * 10 + minor (75 is 7.5), as "sm_75".
std::string smName(int cc);

struct KernelImages {
  std::vector<int> sm;   // machine code, by compute capability, ascending
  std::vector<int> ptx;  // PTX, likewise

  bool empty() const { return sm.empty() && ptx.empty(); }
  // Whether a device of compute capability `cc` can run one of them (Note
  // [Kernel images]).
  bool runOn(int cc) const;
  // "sm_80, sm_90 and compute_90 PTX", or "none".
  std::string str() const;
  // "sm_80,sm_90,compute_90" (what CMake passes), back; throws braid::Error
  // naming `what` for anything else.
  static KernelImages parse(const std::string& list, const char* what);
};

// The images of this build's fatbin (none when it was built without nvcc).
const KernelImages& builtKernelImages();

}  // namespace cuda
}  // namespace braid

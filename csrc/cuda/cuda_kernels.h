// Launching kernels.cu's kernels on a real GPU: the fatbin embedded at build
// time (cmake/CudaKernels.cmake), loaded at first use.
#pragma once

#include <cstddef>
#include <string>

#include "common/types.h"
#include "cuda/cudart.h"

namespace braid {
namespace cuda {

// Whether this build has the fatbin (nvcc was found at configure time).
bool haveKernels();

// The embedded fatbin's bytes, or null (and 0) without nvcc: for tests that
// check what it holds against builtKernelImages().
const unsigned char* kernelFatbin(size_t* bytes);

// "" when braid's kernels load on the current device, of compute capability
// `cc`; else why not (Note [Kernel images] in kernel_images.h): a build
// without nvcc, a runtime without the library API, no image for `cc`, or
// CUDA's own error from loading one kernel into the device's context (its
// text and code, e.g. "no kernel image is available for execution on the
// device (209 cudaErrorNoKernelImageForDevice)"). Never throws for those.
std::string kernelLoadError(const rt::Runtime& r, int cc);

// Launches dst = op(dst, src) over count elements on `stream`, which must
// belong to the current device. Arguments as checkReduceArgs accepts them.
// Throws braid::Error when the build has no kernels, the runtime has no
// library API (CUDA < 12.0), or the launch fails.
void launchReduceMulti(const rt::Runtime& r, DataType type, ReduceOp op, void* dst,
                       const void* const* srcs, int n, double divisor, size_t count,
                       rt::StreamT stream);

void launchReduce(const rt::Runtime& r, DataType type, ReduceOp op, void* dst, const void* src,
                  size_t count, rt::StreamT stream);

}  // namespace cuda
}  // namespace braid

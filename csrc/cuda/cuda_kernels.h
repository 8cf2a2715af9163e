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

// The GPU entry points of the kernel bodies in kernels.cuh, compiled by nvcc
// into a fatbin (cmake/CudaKernels.cmake) that cuda_kernels.cc loads with
// cudaLibraryLoadData and launches by name. extern "C": the names are looked
// up as plain strings (reduceKernelName in host_kernels.cc, from the same
// X-macro list).
//
// Each kernel is a grid-stride loop: any grid covers any count, so the
// launcher may cap the grid (cuda_kernels.cc). Arguments: (dst, src, count),
// dst[i] = op(dst[i], src[i]), pointers aligned to the element size.
#include "cuda/kernel_list.h"
#include "cuda/kernels.cuh"

using namespace braid::cuda::kernels;  // NOLINT: the codecs and ops the list names

#define BRAID_FIRST (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x)
#define BRAID_STRIDE (static_cast<size_t>(gridDim.x) * blockDim.x)

#define BRAID_REDUCE_KERNEL(tname, dtype, codec, opname, rop, opstruct)                     \
  extern "C" __global__ void braid_reduce_##tname##_##opname(                               \
      codec::Mem* dst, const codec::Mem* src, size_t count) {                  \
    reduceRange<codec, opstruct>(dst, src, BRAID_FIRST, count, BRAID_STRIDE);               \
  }
BRAID_CUDA_REDUCE_KERNELS(BRAID_REDUCE_KERNEL)
#undef BRAID_REDUCE_KERNEL

// dst[i] = op over n sources (Note [Multi-source reduce] in kernels.cuh).
#define BRAID_REDUCE_MULTI_KERNEL(tname, dtype, codec, opname, rop, opstruct)              \
  extern "C" __global__ void braid_reduce_multi_##tname##_##opname(                        \
      codec::Mem* dst, ReduceSources srcs, int n, double divisor, size_t count) {          \
    reduceMultiRange<codec, opstruct>(dst, srcs, n, divisor, BRAID_FIRST, count, BRAID_STRIDE); \
  }
BRAID_CUDA_REDUCE_KERNELS(BRAID_REDUCE_MULTI_KERNEL)
#undef BRAID_REDUCE_MULTI_KERNEL

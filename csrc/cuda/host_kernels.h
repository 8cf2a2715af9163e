// The kernel bodies of kernels.cuh run on the CPU (the simulated device, and
// the tests), and the argument checks both devices share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace braid {
namespace cuda {

// "braid_reduce_f32_sum": the name of (type, op)'s kernel in the fatbin, or
// nullptr when it has none (kAvg, kPremulSum, bitwise ops on floats).
const char* reduceKernelName(DataType type, ReduceOp op);

// Throws braid::Error naming `call` unless reduceAsync(type, op, dst, src,
// count) is valid: a kernel exists, pointers are non-null when count > 0 and
// aligned to the element size, and dst either equals src or does not overlap
// it (a GPU kernel over a partial overlap would race).
void checkReduceArgs(const char* call, DataType type, ReduceOp op, const void* dst,
                     const void* src, size_t count);

// dst[i] = op(dst[i], src[i]) for i < count: the GPU kernel's body, on the
// CPU. Arguments as checkReduceArgs accepts them.
void hostReduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count);

// reduce::scale and reduce::divide, through the kernel bodies. scale needs a
// float type; divide a nonzero divisor (both throw braid::Error otherwise).
// The multi-source kernel's name, or null (Note [Multi-source reduce]).
const char* reduceMultiKernelName(DataType type, ReduceOp op);
// Checks reduceMultiAsync's arguments; throws braid::Error naming `call`.
void checkReduceMultiArgs(const char* call, DataType type, ReduceOp op, const void* dst,
                          const void* const* srcs, int n, double divisor, size_t count);
void hostReduceMulti(DataType type, ReduceOp op, void* dst, const void* const* srcs, int n,
                     double divisor, size_t count);

void hostScale(DataType type, void* dst, const void* src, double factor, size_t count);
void hostDivide(DataType type, void* dst, const void* src, int64_t divisor, size_t count);

}  // namespace cuda
}  // namespace braid

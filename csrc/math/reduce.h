// Type-erased reduction kernels over raw bytes.
//
// The collectives call these with pointers into shared memory and user
// buffers; nothing here knows about tensors. Each entry point picks the best
// implementation for the CPU at run time (AVX-512, AVX2, or portable C++).
//
// See Note [Reduced-precision accumulation].
#pragma once

#include <cstddef>

#include "common/types.h"

namespace braid {
namespace reduce {

// Note [Reduced-precision accumulation]
// float16 and bfloat16 inputs are widened to float32 once, all inputs are
// combined in float32, and the result is rounded to the storage type once
// (round-to-nearest-even). gloo rounds after every hop, which loses bits as
// the world grows; reduceN over all n inputs avoids that by construction.
// Integer results are exact (wrap-around on overflow, as in torch).
// bool is treated as logical: SUM/MAX/BOR -> or, PRODUCT/MIN/BAND -> and,
// BXOR -> xor.

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[nsrcs-1][i]) for i < count.
// dst may alias srcs[0] (and only srcs[0]). Pointers need no alignment.
// op must be kSum, kProduct, kMin, kMax, kBand, kBor or kBxor
// (kAvg and kPremulSum are composed by the caller from kSum and scale()).
// Throws braid::Error when !supported(type, op).
// (Implementation notes: nsrcs == 1 is a copy, except that bool outputs are
// normalized to 0/1; any nsrcs >= 1 works, 64 is what is tested. Each block
// of dst is written after all sources were read, so dst equal to any source
// works too; a dst that partly overlaps a source, nsrcs == 0 or a null
// pointer with count > 0 throws braid::Error. Floating MIN/MAX propagate NaN
// like torch.minimum/maximum; the result is the same bits at every SIMD
// level.)
void reduceN(DataType type, ReduceOp op, void* dst, const void* const* srcs, size_t nsrcs,
             size_t count);

// dst[i] = src[i] * factor (float types; computed in float32 for fp16/bf16,
// float64 for float64). dst may alias src.
void scale(DataType type, void* dst, const void* src, double factor, size_t count);

// dst[i] = src[i] / divisor. Floats: true division (in float32 for fp16/bf16);
// integers: truncating division, as torch's ReduceOp.AVG on integers with NCCL.
// (Integers are divided in int64 and wrapped back, so INT64_MIN / -1 wraps to
// INT64_MIN; bool gives (x / divisor) != 0. divisor == 0 throws braid::Error;
// scale() throws for non-float types.)
void divide(DataType type, void* dst, const void* src, int64_t divisor, size_t count);

// Whether reduceN supports the pair. Bitwise ops need integer or bool types.
bool supported(DataType type, ReduceOp op);

// "avx512", "avx2" or "scalar": the level the dispatcher chose for this CPU.
// BRAID_SIMD (auto, avx512, avx2, scalar) caps it.
const char* simdLevel();

}  // namespace reduce
}  // namespace braid

// The hooks' fast loops (math/cast.h, int8_kernels.h, PowerSGD's
// Gram-Schmidt) written as ATen ops, for buckets that are not on the CPU.
//
// On a GPU bucket the CPU loops cannot run: the memory is the device's, and
// its values are only final in the order of a stream. ATen ops run as the
// device's kernels on the current stream, after what is queued there (the
// caller's gradients; in a Future callback, the collective that completed).
// Each function follows the rules of its CPU loop, op by op (same products,
// same rounding points), so a GPU bucket gets the same values as a CPU one
// except where a sum's order differs (noted per function).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace braid {
namespace hooks {

// compressed = round(buffer / divisor) in compressed's dtype, rounded once
// (narrowDivided). buffer is float32.
void narrowDividedAten(const at::Tensor& buffer, const at::Tensor& compressed, float divisor);

// quantizeInt8 on x (float32, n elements): writes the packed layout of the
// int8 hook into `packed` (int8, nchunks * 4 + n bytes: nchunks float32
// scales, then n int8 values) and, when `residual` is defined, the new
// residual into it. Bit-identical to the CPU loop.
void quantizeInt8Aten(const at::Tensor& x, const at::Tensor& residual, int64_t chunk,
                      const at::Tensor& packed);

// dequantizeSumInt8 over every rank's packed tensor, in rank order, into out
// (float32, n elements). Bit-identical to the CPU loop.
void dequantizeSumInt8Aten(const std::vector<at::Tensor>& packed, int64_t chunk, float factor,
                           const at::Tensor& out);

// Modified Gram-Schmidt on the rows of m (or its columns when !rows), in
// place, with double dot products, as PowerSGD's CPU loop; a zero vector stays
// zero. The dot products are summed in another order than the CPU loop's, so
// the results agree to rounding, not bit for bit.
void orthogonalizeAten(const at::Tensor& m, bool rows, double epsilon);

}  // namespace hooks
}  // namespace braid

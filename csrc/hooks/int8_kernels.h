// Loops of the int8 hook, on raw floats (no torch). Chunks of `chunk`
// consecutive elements share one float32 scale.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid {
namespace hooks {

// v[i] = x[i] + (residual ? residual[i] : 0). Per chunk c: scales[c] =
// max|v| / 127 and q[i] = round-half-away(v[i] / scales[c]) in [-127, 127].
// When residual is given it receives v[i] - q[i] * scales[c] (never above
// scales[c] / 2 in magnitude). A chunk holding inf or NaN gets a NaN scale,
// so it decodes to NaN rather than to plausible numbers, and a zero residual,
// so one bad step does not poison the following ones.
void quantizeInt8(const float* x, float* residual, size_t n, size_t chunk, float* scales,
                  int8_t* q);

// out[i] = factor * sum over r of q[r][i] * scales[r][i / chunk], summed in
// rank order, so every rank computes the same bits.
void dequantizeSumInt8(const int8_t* const* q, const float* const* scales, size_t nranks, size_t n,
                       size_t chunk, float factor, float* out);

}  // namespace hooks
}  // namespace braid

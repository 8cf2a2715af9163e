// Fused loops of the fp16/bf16 hooks: divide and round to 16 bits in one
// pass, and widen back (optionally accumulating), on raw memory.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid {
namespace hooks {

enum class Half16 { kFloat16, kBFloat16 };

// out[i] = round_to_nearest_even(x[i] / divisor) in the 16-bit type, rounded
// as torch rounds (c10::Half, c10::BFloat16): overflow to inf, NaN kept.
void narrowDivided(const float* x, uint16_t* out, size_t n, float divisor, Half16 type);

// out[i] = float(in[i]), or out[i] += float(in[i]) when accumulate (exact widening).
void widen(const uint16_t* in, float* out, size_t n, Half16 type, bool accumulate);

}  // namespace hooks
}  // namespace braid

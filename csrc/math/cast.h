// Fused loops between float32 and a 16-bit type on raw memory: divide and
// round in one pass, and widen back (optionally accumulating). The fp16/bf16
// compression hooks run them on CPU buckets, and the allreduce on a narrower
// wire runs them inside its steps (Note [Allreduce on a narrower wire] in
// collectives/shm/collectives.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/types.h"

namespace braid {
namespace reduce {

// out[i] = round_to_nearest_even(x[i] / divisor) in `wire` (kFloat16 or
// kBFloat16), rounded as torch rounds (c10::Half, c10::BFloat16): overflow to
// inf, NaN kept.
void narrowDivided(const float* x, uint16_t* out, size_t n, float divisor, DataType wire);

// out[i] = float(in[i]), or out[i] += float(in[i]) when accumulate (exact widening).
void widen(const uint16_t* in, float* out, size_t n, DataType wire, bool accumulate);

}  // namespace reduce
}  // namespace braid

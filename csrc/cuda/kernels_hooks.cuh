// Kernel bodies of the DDP compression hooks (included by kernels.cuh): the
// fp16/bf16 casts of math/cast.h and the int8 scheme of
// hooks/int8_kernels.h, with the same bits as those CPU loops.
#pragma once

namespace braid {
namespace cuda {
namespace kernels {

// ---- Casts -----------------------------------------------------------------

// out[i] = round_to_nearest_even(x[i] / divisor) (narrowDivided). fp16 rounds
// as F16C does (math/half.h); bf16 as c10::BFloat16 (NaN -> 0x7fc0), as the
// hook does.
BRAID_HD inline void narrowHalfRange(const float* x, uint16_t* out, float divisor, size_t begin,
                                     size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) out[i] = floatToHalf(x[i] / divisor);
}
BRAID_HD inline void narrowBf16Range(const float* x, uint16_t* out, float divisor, size_t begin,
                                     size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) out[i] = floatToBf16Torch(x[i] / divisor);
}

// out[i] = float(in[i]), or out[i] += float(in[i]) when accumulate (widen).
BRAID_HD inline void widenHalfRange(const uint16_t* in, float* out, bool accumulate, size_t begin,
                                    size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) {
    const float v = halfToFloat(in[i]);
    out[i] = accumulate ? out[i] + v : v;
  }
}
BRAID_HD inline void widenBf16Range(const uint16_t* in, float* out, bool accumulate, size_t begin,
                                    size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) {
    const float v = bf16ToFloat(in[i]);
    out[i] = accumulate ? out[i] + v : v;
  }
}

// ---- int8 (quantizeInt8 / dequantizeSumInt8) -----------------------------------
// Chunks of `chunk` consecutive elements share a float32 scale = max|v| / 127,
// with v = x + residual (residual may be null). A GPU runs one block per
// chunk: each thread takes the max of its elements (int8AbsMaxRange), the
// block combines them (max is exact in any order), then every thread
// quantizes its elements (int8QuantizeRange).

// |v| as bits: for |v| the integer order is the float order, and inf and NaN
// sort above every finite value, so one integer max finds both the scale and
// whether the chunk is finite.
BRAID_HD inline uint32_t int8AbsMaxRange(const float* x, const float* residual, size_t begin,
                                         size_t end, size_t stride) {
  uint32_t m = 0;
  for (size_t i = begin; i < end; i += stride) {
    const float v = residual ? x[i] + residual[i] : x[i];
    const uint32_t bits = floatBits(v) & 0x7fffffffu;
    m = bits > m ? bits : m;
  }
  return m;
}

// The chunk's scale from its max |v| bits: NaN for a chunk holding inf or NaN.
BRAID_HD inline float int8Scale(uint32_t maxBits) {
  return maxBits >= 0x7f800000u ? bitsFloat(0x7fc00000u) : bitsFloat(maxBits) / 127.f;
}

// static_cast<int32_t> as x86's cvttss2si does it: out of range or NaN gives
// INT32_MIN. (The CPU hook compiles to that instruction; a GPU's conversion
// saturates instead, so a chunk whose 127 / max overflows to inf would
// otherwise round differently.)
BRAID_HD inline int32_t truncToInt32X86(float y) {
  if (!(y > -2147483904.f && y < 2147483648.f)) return INT32_MIN;
  return static_cast<int32_t>(y);
}

// q[i] (and residual[i], when given) for the i of one chunk in [begin, end).
BRAID_HD inline void int8QuantizeRange(const float* x, float* residual, int8_t* q, uint32_t maxBits,
                                       size_t begin, size_t end, size_t stride) {
  if (maxBits >= 0x7f800000u) {
    // One bad step must not poison the following ones: zero q and residual.
    for (size_t i = begin; i < end; i += stride) {
      q[i] = 0;
      if (residual) residual[i] = 0.f;
    }
    return;
  }
  const float m = bitsFloat(maxBits);
  const float scale = m / 127.f;
  const float inv = m > 0 ? 127.f / m : 0.f;
  for (size_t i = begin; i < end; i += stride) {
    const float v = residual ? x[i] + residual[i] : x[i];
    const float y = v * inv;
    const float half = (floatBits(y) & 0x80000000u) ? -0.5f : 0.5f;  // copysign(0.5f, y)
    float r = static_cast<float>(truncToInt32X86(y + half));
    r = r < -127.f ? -127.f : r;  // std::min(127, std::max(-127, r))
    r = r > 127.f ? 127.f : r;
    q[i] = static_cast<int8_t>(r);
    if (residual) residual[i] = v - r * scale;
  }
}

// out[i] (+)= (scales[i / chunk] * factor) * q[i]: one rank's term. Called
// for ranks 0, 1, ... in order with accumulate = (rank > 0), it gives the
// bits of dequantizeSumInt8.
BRAID_HD inline void int8DequantizeRange(const int8_t* q, const float* scales, size_t chunk,
                                         float factor, float* out, bool accumulate, size_t begin,
                                         size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) {
    const float s = scales[i / chunk] * factor;
    const float v = s * static_cast<float>(q[i]);
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace braid

// Portable float16 / bfloat16 <-> float32 conversions (round-to-nearest-even),
// bit-compatible with the F16C instructions and with the AVX2/AVX-512 bf16
// rounding in kernels_avx2.cc / kernels_avx512.cc, so that every SIMD level
// produces the same bits. Not for ISA files: see Note [ISA isolation].
#pragma once

#include <cstdint>
#include <cstring>

namespace braid {
namespace reduce {

inline uint32_t floatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float bitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) {
    // Inf, or NaN made quiet as VCVTPH2PS does.
    return bitsFloat(sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  }
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float32.
    const float f = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -f : f;
  }
  return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t floatToHalf(float f) {
  const uint32_t x = floatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u | ((a >> 13) & 0x3FFu);  // NaN stays NaN
  if (a >= 0x477FF000u) return sign | 0x7C00u;                        // >= 65520 rounds to Inf
  if (a >= 0x38800000u) {                                             // normal half (>= 2^-14)
    a += 0xFFFu + ((a >> 13) & 1u);  // round to nearest, ties to even
    return sign | static_cast<uint16_t>((a - 0x38000000u) >> 13);
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25 rounds to zero (the tie goes to even 0)
  // Subnormal half: units of 2^-24.
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14..24
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

inline float bf16ToFloat(uint16_t b) { return bitsFloat(static_cast<uint32_t>(b) << 16); }

inline uint16_t floatToBf16(float f) {
  const uint32_t x = floatBits(f);
  // Truncating a NaN whose payload sits in the low half would make it Inf:
  // set the quiet bit instead.
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace reduce
}  // namespace braid

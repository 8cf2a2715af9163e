#include "hooks/int8_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

// Each entry point is compiled twice, for AVX2 and for baseline x86-64, and
// the loader picks one (GCC target_clones); the loops are written with
// independent lanes so that both versions vectorize.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BRAID_INT8_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define BRAID_INT8_CLONES
#endif

namespace braid {
namespace hooks {
namespace {
constexpr int kLanes = 16;

// Max |v| over a chunk, on the bit patterns: for |v| (sign bit cleared) the
// integer order is the float order, and inf and NaN sort above every finite
// value, so one integer max finds both the scale and whether the chunk is
// finite.
template <bool kResidual>
inline __attribute__((always_inline)) uint32_t chunkMaxAbsBits(const float* xc, const float* ec,
                                                               size_t len) {
  uint32_t lanes[kLanes] = {0};
  size_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float v = kResidual ? xc[i + l] + ec[i + l] : xc[i + l];
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      bits &= 0x7fffffffu;
      lanes[l] = bits > lanes[l] ? bits : lanes[l];
    }
  }
  uint32_t m = 0;
  for (; i < len; ++i) {
    const float v = kResidual ? xc[i] + ec[i] : xc[i];
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits &= 0x7fffffffu;
    m = bits > m ? bits : m;
  }
  for (int l = 0; l < kLanes; ++l) m = lanes[l] > m ? lanes[l] : m;
  return m;
}

template <bool kResidual>
inline __attribute__((always_inline)) void quantizeImpl(const float* x, float* residual, size_t n,
                                                        size_t chunk, float* scales, int8_t* q) {
  for (size_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
    const size_t len = std::min(chunk, n - begin);
    const float* xc = x + begin;
    float* ec = kResidual ? residual + begin : nullptr;
    int8_t* qc = q + begin;
    const uint32_t mBits = chunkMaxAbsBits<kResidual>(xc, ec, len);
    if (mBits >= 0x7f800000u) {
      scales[c] = std::nanf("");
      std::fill(qc, qc + len, int8_t(0));
      if (kResidual) std::fill(ec, ec + len, 0.f);
      continue;
    }
    float m;
    std::memcpy(&m, &mBits, 4);
    const float scale = m / 127.f;
    const float inv = m > 0 ? 127.f / m : 0.f;
    scales[c] = scale;
    for (size_t i = 0; i < len; ++i) {
      const float v = kResidual ? xc[i] + ec[i] : xc[i];
      const float y = v * inv;
      float r = static_cast<float>(static_cast<int32_t>(y + std::copysign(0.5f, y)));
      r = std::min(127.f, std::max(-127.f, r));
      qc[i] = static_cast<int8_t>(r);
      if (kResidual) ec[i] = v - r * scale;
    }
  }
}

}  // namespace

BRAID_INT8_CLONES
void quantizeInt8(const float* x, float* residual, size_t n, size_t chunk, float* scales,
                  int8_t* q) {
  if (residual) {
    quantizeImpl<true>(x, residual, n, chunk, scales, q);
  } else {
    quantizeImpl<false>(x, nullptr, n, chunk, scales, q);
  }
}

BRAID_INT8_CLONES
void dequantizeSumInt8(const int8_t* const* q, const float* const* scales, size_t nranks, size_t n,
                       size_t chunk, float factor, float* out) {
  for (size_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
    const size_t len = std::min(chunk, n - begin);
    float* oc = out + begin;
    for (size_t r = 0; r < nranks; ++r) {
      const int8_t* qc = q[r] + begin;
      const float s = scales[r][c] * factor;
      if (r == 0) {
        for (size_t i = 0; i < len; ++i) oc[i] = s * static_cast<float>(qc[i]);
      } else {
        for (size_t i = 0; i < len; ++i) oc[i] += s * static_cast<float>(qc[i]);
      }
    }
  }
}

}  // namespace hooks
}  // namespace braid

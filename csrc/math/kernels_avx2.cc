// AVX2 (+FMA, F16C) kernels. This file is compiled with -mavx2 -mfma -mf16c;
// the dispatcher calls it only on CPUs that have them. Everything here must
// stay in the unnamed namespace: see Note [ISA isolation] in dispatch.h.
#include "math/dispatch.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "math/simd_loops.h"

namespace braid {
namespace reduce {
namespace avx2 {
namespace {

// ---- Codecs ---------------------------------------------------------------

struct F32 {
  using V = __m256;
  using Mem = float;
  static constexpr size_t kLanes = 8;
  static V load(const char* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static void store(char* p, V v) { _mm256_storeu_ps(reinterpret_cast<float*>(p), v); }
};

struct F64 {
  using V = __m256d;
  using Mem = double;
  static constexpr size_t kLanes = 4;
  static V load(const char* p) { return _mm256_loadu_pd(reinterpret_cast<const double*>(p)); }
  static void store(char* p, V v) { _mm256_storeu_pd(reinterpret_cast<double*>(p), v); }
};

struct F16 {
  using V = __m256;
  using Mem = uint16_t;
  static constexpr size_t kLanes = 8;
  static V load(const char* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(char* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// Rounds like floatToBf16 in half.h (nearest-even; NaN kept NaN by setting
// the quiet bit before truncation).
struct BF16 {
  using V = __m256;
  using Mem = uint16_t;
  static constexpr size_t kLanes = 8;
  static V load(const char* p) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
  }
  static void store(char* p, V v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    const __m256i q = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
    const __m256i w = _mm256_srli_epi32(_mm256_blendv_epi8(r, q, nan), 16);
    // Every lane is <= 0xFFFF, so the saturating pack is exact.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};

template <class T>
struct Int {
  using V = __m256i;
  using Mem = T;
  static constexpr size_t kLanes = 32 / sizeof(T);
  static V load(const char* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store(char* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};

// min(byte, 1) maps any nonzero byte to 1, so and/or/xor yield 0 or 1.
struct Bool {
  using V = __m256i;
  using Mem = uint8_t;
  static constexpr size_t kLanes = 32;
  static V load(const char* p) {
    return _mm256_min_epu8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
                           _mm256_set1_epi8(1));
  }
  static void store(char* p, V v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
};

// ---- Float ops --------------------------------------------------------------

struct FAdd {
  static __m256 apply(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
  static __m256d apply(__m256d a, __m256d b) { return _mm256_add_pd(a, b); }
};

struct FMul {
  static __m256 apply(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
  static __m256d apply(__m256d a, __m256d b) { return _mm256_mul_pd(a, b); }
};

struct FDiv {
  static __m256 apply(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
  static __m256d apply(__m256d a, __m256d b) { return _mm256_div_pd(a, b); }
};

// vminps/vmaxps return b when either is NaN; put a back where a is NaN.
// See Note [NaN in min and max] in kernels_scalar.cc.
struct FMin {
  static __m256 apply(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_min_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static __m256d apply(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_min_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
};

struct FMax {
  static __m256 apply(__m256 a, __m256 b) {
    return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
  }
  static __m256d apply(__m256d a, __m256d b) {
    return _mm256_blendv_pd(_mm256_max_pd(a, b), a, _mm256_cmp_pd(a, a, _CMP_UNORD_Q));
  }
};

// ---- Integer ops (wrap-around, like torch) ----------------------------------

template <class T>
struct IAdd {
  static __m256i apply(__m256i a, __m256i b) {
    if constexpr (sizeof(T) == 1) return _mm256_add_epi8(a, b);
    if constexpr (sizeof(T) == 2) return _mm256_add_epi16(a, b);
    if constexpr (sizeof(T) == 4) return _mm256_add_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm256_add_epi64(a, b);
  }
};

template <class T>
struct IMul {
  static __m256i apply(__m256i a, __m256i b) {
    if constexpr (sizeof(T) == 1) {
      // No 8-bit multiply: even bytes from a 16-bit multiply, odd bytes from
      // another on the operands shifted down, then merge the low bytes.
      const __m256i even = _mm256_mullo_epi16(a, b);
      const __m256i odd = _mm256_mullo_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8));
      return _mm256_or_si256(_mm256_and_si256(even, _mm256_set1_epi16(0xFF)),
                             _mm256_slli_epi16(odd, 8));
    }
    if constexpr (sizeof(T) == 2) return _mm256_mullo_epi16(a, b);
    if constexpr (sizeof(T) == 4) return _mm256_mullo_epi32(a, b);
    if constexpr (sizeof(T) == 8) {
      // No 64-bit multiply before AVX-512DQ: lo*lo + ((hi*lo + lo*hi) << 32).
      const __m256i lo = _mm256_mul_epu32(a, b);
      const __m256i c1 = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b);
      const __m256i c2 = _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32));
      return _mm256_add_epi64(lo, _mm256_slli_epi64(_mm256_add_epi64(c1, c2), 32));
    }
  }
};

template <class T>
struct IMin {
  static __m256i apply(__m256i a, __m256i b) {
    if constexpr (std::is_unsigned_v<T>) return _mm256_min_epu8(a, b);  // uint8 only
    if constexpr (std::is_signed_v<T> && sizeof(T) == 1) return _mm256_min_epi8(a, b);
    if constexpr (sizeof(T) == 2) return _mm256_min_epi16(a, b);
    if constexpr (sizeof(T) == 4) return _mm256_min_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm256_blendv_epi8(a, b, _mm256_cmpgt_epi64(a, b));
  }
};

template <class T>
struct IMax {
  static __m256i apply(__m256i a, __m256i b) {
    if constexpr (std::is_unsigned_v<T>) return _mm256_max_epu8(a, b);
    if constexpr (std::is_signed_v<T> && sizeof(T) == 1) return _mm256_max_epi8(a, b);
    if constexpr (sizeof(T) == 2) return _mm256_max_epi16(a, b);
    if constexpr (sizeof(T) == 4) return _mm256_max_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm256_blendv_epi8(b, a, _mm256_cmpgt_epi64(a, b));
  }
};

struct And {
  static __m256i apply(__m256i a, __m256i b) { return _mm256_and_si256(a, b); }
};
struct Or {
  static __m256i apply(__m256i a, __m256i b) { return _mm256_or_si256(a, b); }
};
struct Xor {
  static __m256i apply(__m256i a, __m256i b) { return _mm256_xor_si256(a, b); }
};

struct Kit {
  using F32 = avx2::F32;
  using F64 = avx2::F64;
  using F16 = avx2::F16;
  using BF16 = avx2::BF16;
  template <class T>
  using Int = avx2::Int<T>;
  using Bool = avx2::Bool;
  using FAdd = avx2::FAdd;
  using FMul = avx2::FMul;
  using FDiv = avx2::FDiv;
  using FMin = avx2::FMin;
  using FMax = avx2::FMax;
  template <class T>
  using IAdd = avx2::IAdd<T>;
  template <class T>
  using IMul = avx2::IMul<T>;
  template <class T>
  using IMin = avx2::IMin<T>;
  template <class T>
  using IMax = avx2::IMax<T>;
  using And = avx2::And;
  using Or = avx2::Or;
  using Xor = avx2::Xor;
  static __m256 splat(float x) { return _mm256_set1_ps(x); }
  static __m256d splat(double x) { return _mm256_set1_pd(x); }
};

}  // namespace

bool compiled() { return true; }

void reduceN(DataType type, ReduceOp op, void* dst, const void* const* srcs, size_t n,
             size_t count) {
  simd::reduceByType<Kit>(type, op, dst, srcs, n, count);
}

void scale(DataType type, void* dst, const void* src, double factor, size_t count) {
  simd::scaleByType<Kit>(type, dst, src, factor, count);
}

void divide(DataType type, void* dst, const void* src, int64_t divisor, size_t count) {
  simd::divideByType<Kit>(type, dst, src, divisor, count);
}

}  // namespace avx2
}  // namespace reduce
}  // namespace braid

#else  // built without the ISA flags: never chosen, see dispatch.h

namespace braid {
namespace reduce {
namespace avx2 {

bool compiled() { return false; }

void reduceN(DataType type, ReduceOp op, void* dst, const void* const* srcs, size_t n,
             size_t count) {
  scalar::reduceN(type, op, dst, srcs, n, count);
}

void scale(DataType type, void* dst, const void* src, double factor, size_t count) {
  scalar::scale(type, dst, src, factor, count);
}

void divide(DataType type, void* dst, const void* src, int64_t divisor, size_t count) {
  scalar::divide(type, dst, src, divisor, count);
}

}  // namespace avx2
}  // namespace reduce
}  // namespace braid

#endif

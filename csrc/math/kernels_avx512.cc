// AVX-512 (F, BW, VL, DQ) kernels. This file is compiled with -mavx512*; the
// dispatcher calls it only on CPUs that have them. Everything here must stay
// in the unnamed namespace: see Note [ISA isolation] in dispatch.h.
#include "math/dispatch.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512DQ__) && defined(__F16C__)

// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own
// _mm*_undefined_* placeholders (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "math/simd_loops.h"

namespace braid {
namespace reduce {
namespace avx512 {
namespace {

// ---- Codecs ---------------------------------------------------------------

struct F32 {
  using V = __m512;
  using Mem = float;
  static constexpr size_t kLanes = 16;
  static V load(const char* p) { return _mm512_loadu_ps(p); }
  static void store(char* p, V v) { _mm512_storeu_ps(p, v); }
};

struct F64 {
  using V = __m512d;
  using Mem = double;
  static constexpr size_t kLanes = 8;
  static V load(const char* p) { return _mm512_loadu_pd(p); }
  static void store(char* p, V v) { _mm512_storeu_pd(p, v); }
};

struct F16 {
  using V = __m512;
  using Mem = uint16_t;
  static constexpr size_t kLanes = 16;
  static V load(const char* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(char* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

// Rounds like floatToBf16 in half.h (nearest-even; NaN kept NaN by setting
// the quiet bit before truncation).
struct BF16 {
  using V = __m512;
  using Mem = uint16_t;
  static constexpr size_t kLanes = 16;
  static V load(const char* p) {
    const __m512i h =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
  }
  static void store(char* p, V v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(x, _mm512_set1_epi32(0x00400000)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
};

template <class T>
struct Int {
  using V = __m512i;
  using Mem = T;
  static constexpr size_t kLanes = 64 / sizeof(T);
  static V load(const char* p) { return _mm512_loadu_si512(p); }
  static void store(char* p, V v) { _mm512_storeu_si512(p, v); }
};

// min(byte, 1) maps any nonzero byte to 1, so and/or/xor yield 0 or 1.
struct Bool {
  using V = __m512i;
  using Mem = uint8_t;
  static constexpr size_t kLanes = 64;
  static V load(const char* p) {
    return _mm512_min_epu8(_mm512_loadu_si512(p), _mm512_set1_epi8(1));
  }
  static void store(char* p, V v) { _mm512_storeu_si512(p, v); }
};

// ---- Float ops --------------------------------------------------------------

struct FAdd {
  static __m512 apply(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
  static __m512d apply(__m512d a, __m512d b) { return _mm512_add_pd(a, b); }
};

struct FMul {
  static __m512 apply(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
  static __m512d apply(__m512d a, __m512d b) { return _mm512_mul_pd(a, b); }
};

struct FDiv {
  static __m512 apply(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
  static __m512d apply(__m512d a, __m512d b) { return _mm512_div_pd(a, b); }
};

// vminps/vmaxps return b when either is NaN; put a back where a is NaN.
// See Note [NaN in min and max] in kernels_scalar.cc.
struct FMin {
  static __m512 apply(__m512 a, __m512 b) {
    return _mm512_mask_mov_ps(_mm512_min_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  static __m512d apply(__m512d a, __m512d b) {
    return _mm512_mask_mov_pd(_mm512_min_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
  }
};

struct FMax {
  static __m512 apply(__m512 a, __m512 b) {
    return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
  }
  static __m512d apply(__m512d a, __m512d b) {
    return _mm512_mask_mov_pd(_mm512_max_pd(a, b), _mm512_cmp_pd_mask(a, a, _CMP_UNORD_Q), a);
  }
};

// ---- Integer ops (wrap-around, like torch) ----------------------------------

template <class T>
struct IAdd {
  static __m512i apply(__m512i a, __m512i b) {
    if constexpr (sizeof(T) == 1) return _mm512_add_epi8(a, b);
    if constexpr (sizeof(T) == 2) return _mm512_add_epi16(a, b);
    if constexpr (sizeof(T) == 4) return _mm512_add_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm512_add_epi64(a, b);
  }
};

template <class T>
struct IMul {
  static __m512i apply(__m512i a, __m512i b) {
    if constexpr (sizeof(T) == 1) {
      // No 8-bit multiply: even bytes from a 16-bit multiply, odd bytes from
      // another on the operands shifted down, then merge the low bytes.
      const __m512i even = _mm512_mullo_epi16(a, b);
      const __m512i odd = _mm512_mullo_epi16(_mm512_srli_epi16(a, 8), _mm512_srli_epi16(b, 8));
      return _mm512_or_si512(_mm512_and_si512(even, _mm512_set1_epi16(0xFF)),
                             _mm512_slli_epi16(odd, 8));
    }
    if constexpr (sizeof(T) == 2) return _mm512_mullo_epi16(a, b);
    if constexpr (sizeof(T) == 4) return _mm512_mullo_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm512_mullo_epi64(a, b);
  }
};

template <class T>
struct IMin {
  static __m512i apply(__m512i a, __m512i b) {
    if constexpr (std::is_unsigned_v<T>) return _mm512_min_epu8(a, b);  // uint8 only
    if constexpr (std::is_signed_v<T> && sizeof(T) == 1) return _mm512_min_epi8(a, b);
    if constexpr (sizeof(T) == 2) return _mm512_min_epi16(a, b);
    if constexpr (sizeof(T) == 4) return _mm512_min_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm512_min_epi64(a, b);
  }
};

template <class T>
struct IMax {
  static __m512i apply(__m512i a, __m512i b) {
    if constexpr (std::is_unsigned_v<T>) return _mm512_max_epu8(a, b);
    if constexpr (std::is_signed_v<T> && sizeof(T) == 1) return _mm512_max_epi8(a, b);
    if constexpr (sizeof(T) == 2) return _mm512_max_epi16(a, b);
    if constexpr (sizeof(T) == 4) return _mm512_max_epi32(a, b);
    if constexpr (sizeof(T) == 8) return _mm512_max_epi64(a, b);
  }
};

struct And {
  static __m512i apply(__m512i a, __m512i b) { return _mm512_and_si512(a, b); }
};
struct Or {
  static __m512i apply(__m512i a, __m512i b) { return _mm512_or_si512(a, b); }
};
struct Xor {
  static __m512i apply(__m512i a, __m512i b) { return _mm512_xor_si512(a, b); }
};

struct Kit {
  using F32 = avx512::F32;
  using F64 = avx512::F64;
  using F16 = avx512::F16;
  using BF16 = avx512::BF16;
  template <class T>
  using Int = avx512::Int<T>;
  using Bool = avx512::Bool;
  using FAdd = avx512::FAdd;
  using FMul = avx512::FMul;
  using FDiv = avx512::FDiv;
  using FMin = avx512::FMin;
  using FMax = avx512::FMax;
  template <class T>
  using IAdd = avx512::IAdd<T>;
  template <class T>
  using IMul = avx512::IMul<T>;
  template <class T>
  using IMin = avx512::IMin<T>;
  template <class T>
  using IMax = avx512::IMax<T>;
  using And = avx512::And;
  using Or = avx512::Or;
  using Xor = avx512::Xor;
  static __m512 splat(float x) { return _mm512_set1_ps(x); }
  static __m512d splat(double x) { return _mm512_set1_pd(x); }
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

}  // namespace avx512
}  // namespace reduce
}  // namespace braid

#else  // built without the ISA flags: never chosen, see dispatch.h

namespace braid {
namespace reduce {
namespace avx512 {

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

}  // namespace avx512
}  // namespace reduce
}  // namespace braid

#endif

// Kernel bodies for CUDA tensors, written once for the GPU and the CPU: each
// is a loop over an index range (begin, end, stride), so a GPU kernel runs it
// as a grid-stride loop (kernels.cu) and the simulated device and the tests
// run it with stride 1 (host_kernels.cc). Plain C++17 for g++; with nvcc the
// functions are __host__ __device__.
//
// The results are those of the CPU path, bit for bit:
// - reduce: dst = op(dst, src) is reduce::reduceN over {dst, src} (Note
//   [Reduced-precision accumulation] in math/reduce.h: fp16/bf16 widened to
//   fp32 and rounded once, to nearest even; floating MIN/MAX propagate NaN as
//   in Note [NaN in min and max]; integers wrap; bool is logical).
// - scale/divide: reduce::scale/reduce::divide.
// - casts: the fp16/bf16 compression hooks (math/cast.h).
// - int8: the int8 hook (hooks/int8_kernels.h).
// kernels.cu is compiled with -fmad=false: a fused multiply-add would round
// once where the CPU rounds twice (the int8 residual and dequantized sums).
//
// Note [NaN payloads]
// "Bit for bit" holds for every value but one: a NaN produced by arithmetic
// (SUM, PRODUCT, scale, divide, casts of a sum) on a GPU is the canonical
// 0x7fffffff, where x86 passes an input NaN's sign and payload on. It is a
// NaN either way (torch's CUDA ops behave the same). MIN/MAX select an input
// without arithmetic, and the fp16/bf16 conversions are integer code, so
// those keep the payload on both. Checked on an H100 (test_cuda_runtime).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <cstring>
#include <type_traits>

#ifdef __CUDACC__
#define BRAID_HD __host__ __device__
#else
#define BRAID_HD
#endif

namespace braid {
namespace cuda {
namespace kernels {

// ---- Bits ---------------------------------------------------------------------

BRAID_HD inline uint32_t floatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

BRAID_HD inline float bitsFloat(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// The conversions of math/half.h (which is host-only), step for step.
BRAID_HD inline float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return bitsFloat(sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  if (exp == 0) {
    const float f = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24, exact
    return sign ? -f : f;
  }
  return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

BRAID_HD inline uint16_t floatToHalf(float f) {
  const uint32_t x = floatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return sign | 0x7E00u | ((a >> 13) & 0x3FFu);
  if (a >= 0x477FF000u) return sign | 0x7C00u;
  if (a >= 0x38800000u) {
    a += 0xFFFu + ((a >> 13) & 1u);
    return sign | static_cast<uint16_t>((a - 0x38000000u) >> 13);
  }
  if (a <= 0x33000000u) return sign;
  const uint32_t e = a >> 23;
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - e;
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return sign | static_cast<uint16_t>(r);
}

BRAID_HD inline float bf16ToFloat(uint16_t b) { return bitsFloat(static_cast<uint32_t>(b) << 16); }

// The reduce path's bf16 rounding: a NaN keeps its sign and payload, made quiet.
BRAID_HD inline uint16_t floatToBf16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// The bf16 hook's rounding (c10::BFloat16): every NaN becomes 0x7fc0.
BRAID_HD inline uint16_t floatToBf16Torch(float f) {
  if (f != f) return 0x7fc0u;
  const uint32_t x = floatBits(f);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// ---- Codecs: storage type <-> the type elements are combined in ----------------

template <class T>
struct Plain {
  using Mem = T;
  using Acc = T;
  BRAID_HD static Acc widen(Mem m) { return m; }
  BRAID_HD static Mem narrow(Acc a) { return a; }
};

struct F16 {
  using Mem = uint16_t;
  using Acc = float;
  BRAID_HD static Acc widen(Mem m) { return halfToFloat(m); }
  BRAID_HD static Mem narrow(Acc a) { return floatToHalf(a); }
};

struct BF16 {
  using Mem = uint16_t;
  using Acc = float;
  BRAID_HD static Acc widen(Mem m) { return bf16ToFloat(m); }
  BRAID_HD static Mem narrow(Acc a) { return floatToBf16(a); }
};

// Any nonzero byte is true; outputs are exactly 0 or 1.
struct Bool {
  using Mem = uint8_t;
  using Acc = uint8_t;
  BRAID_HD static Acc widen(Mem m) { return m != 0; }
  BRAID_HD static Mem narrow(Acc a) { return a; }
};

// ---- Ops (math/kernels_scalar.cc's, for two operands) -----------------------

// Integer sums and products wrap: computed in an unsigned type at least as
// wide as int, so that neither signed overflow nor promotion is undefined.
template <class T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct Add {
  template <class A>
  BRAID_HD static A apply(A a, A b) {
    if constexpr (std::is_integral<A>::value) {
      return static_cast<A>(static_cast<Wide<A>>(static_cast<Wide<A>>(a) + static_cast<Wide<A>>(b)));
    } else {
      return a + b;
    }
  }
};

struct Mul {
  template <class A>
  BRAID_HD static A apply(A a, A b) {
    if constexpr (std::is_integral<A>::value) {
      return static_cast<A>(static_cast<Wide<A>>(static_cast<Wide<A>>(a) * static_cast<Wide<A>>(b)));
    } else {
      return a * b;
    }
  }
};

// NaN in the first operand wins, then the comparison (a tie gives b): the
// CPU kernels' expression (Note [NaN in min and max] in kernels_scalar.cc).
struct Min {
  template <class A>
  BRAID_HD static A apply(A a, A b) {
    if constexpr (std::is_floating_point<A>::value) {
      if (a != a) return a;
    }
    return a < b ? a : b;
  }
};

struct Max {
  template <class A>
  BRAID_HD static A apply(A a, A b) {
    if constexpr (std::is_floating_point<A>::value) {
      if (a != a) return a;
    }
    return a > b ? a : b;
  }
};

struct And {
  template <class A>
  BRAID_HD static A apply(A a, A b) {
    return static_cast<A>(a & b);
  }
};
struct Or {
  template <class A>
  BRAID_HD static A apply(A a, A b) {
    return static_cast<A>(a | b);
  }
};
struct Xor {
  template <class A>
  BRAID_HD static A apply(A a, A b) {
    return static_cast<A>(a ^ b);
  }
};

// ---- Elementwise bodies ---------------------------------------------------------

// dst[i] = op(dst[i], src[i]). dst may equal src.
template <class C, class Op>
BRAID_HD inline void reduceRange(typename C::Mem* dst, const typename C::Mem* src, size_t begin,
                                 size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) {
    dst[i] = C::narrow(Op::apply(C::widen(dst[i]), C::widen(src[i])));
  }
}

// dst[i] = src[i] * factor for float types: F is float for fp32/fp16/bf16 and
// double for fp64, as reduce::scale.
// Note [Multi-source reduce]
// dst[i] = op(srcs[0][i], ..., srcs[n-1][i]) in source order, accumulated in
// the codec's Acc type and narrowed once (fp16/bf16 sum in fp32 and round
// once, the CPU path's rule), then divided by `divisor` before narrowing when
// it is not 1 (AVG). dst may be one of the sources: each element is read from
// every source before it is written. Ranks sharing a GPU reduce their slice
// this way, reading every peer's buffer directly (cuda/shared_gpu/same_gpu.cc).
constexpr int kMaxReduceSources = 16;
struct ReduceSources {  // passed by value to the kernel
  const void* p[kMaxReduceSources];
};

template <class C, class Op>
BRAID_HD inline void reduceMultiRange(typename C::Mem* dst, const ReduceSources& srcs, int n,
                                      double divisor, size_t begin, size_t end, size_t stride) {
  using M = typename C::Mem;
  using A = typename C::Acc;
  // One source is a copy, bit for bit (a signalling NaN stays one), as in
  // reduce::reduceN; bool still normalizes to 0/1.
  if (n == 1 && divisor == 1.0 && !std::is_same<C, Bool>::value) {
    for (size_t i = begin; i < end; i += stride) dst[i] = static_cast<const M*>(srcs.p[0])[i];
    return;
  }
  for (size_t i = begin; i < end; i += stride) {
    A a = C::widen(static_cast<const M*>(srcs.p[0])[i]);
    for (int k = 1; k < n; ++k) a = Op::apply(a, C::widen(static_cast<const M*>(srcs.p[k])[i]));
    if (divisor != 1.0) a = static_cast<A>(a / static_cast<A>(divisor));
    dst[i] = C::narrow(a);
  }
}

template <class C, class F>
BRAID_HD inline void scaleRange(typename C::Mem* dst, const typename C::Mem* src, F factor,
                                size_t begin, size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) dst[i] = C::narrow(C::widen(src[i]) * factor);
}

// dst[i] = src[i] / divisor for float types (true division in F).
template <class C, class F>
BRAID_HD inline void divideFloatRange(typename C::Mem* dst, const typename C::Mem* src, F divisor,
                                      size_t begin, size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) dst[i] = C::narrow(C::widen(src[i]) / divisor);
}

// Truncating division in int64, wrapped back to T; -1 is a wrapping negation
// (INT64_MIN / -1 would trap). divisor != 0 (checked by callers).
template <class T>
BRAID_HD inline void divideIntRange(T* dst, const T* src, int64_t d, size_t begin, size_t end,
                                    size_t stride) {
  for (size_t i = begin; i < end; i += stride) {
    const int64_t v = static_cast<int64_t>(src[i]);
    const int64_t q = d == -1 ? static_cast<int64_t>(0 - static_cast<uint64_t>(v)) : v / d;
    dst[i] = static_cast<T>(q);
  }
}

// bool: (x != 0) / divisor, nonzero -> 1.
BRAID_HD inline void divideBoolRange(uint8_t* dst, const uint8_t* src, int64_t d, size_t begin,
                                     size_t end, size_t stride) {
  for (size_t i = begin; i < end; i += stride) {
    dst[i] = static_cast<uint8_t>(static_cast<int64_t>(src[i] != 0) / d != 0);
  }
}

}  // namespace kernels
}  // namespace cuda
}  // namespace braid

#include "cuda/kernels_hooks.cuh"  // casts and int8 (the DDP compression hooks)

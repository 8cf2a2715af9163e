// Portable kernels: the fallback for CPUs without AVX2, the tail handler's
// model, and the semantics the SIMD kernels must match bit for bit.
//
// Elements are read and written with memcpy (pointers need no alignment) and
// combined in blocks of kBlock outputs: all sources are folded into an
// accumulator block before it is stored, so dst may equal any source.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "math/dispatch.h"
#include "math/half.h"

namespace braid {
namespace reduce {
namespace scalar {
namespace {

constexpr size_t kBlock = 256;

// A codec maps a stored element to the type it is combined in, and back.
template <class T>
struct Plain {
  using Mem = T;
  using Acc = T;
  static Acc widen(Mem m) { return m; }
  static Mem narrow(Acc a) { return a; }
};

struct Half {
  using Mem = uint16_t;
  using Acc = float;
  static Acc widen(Mem m) { return halfToFloat(m); }
  static Mem narrow(Acc a) { return floatToHalf(a); }
};

struct BHalf {
  using Mem = uint16_t;
  using Acc = float;
  static Acc widen(Mem m) { return bf16ToFloat(m); }
  static Mem narrow(Acc a) { return floatToBf16(a); }
};

// Any nonzero byte is true; outputs are exactly 0 or 1.
struct Bool {
  using Mem = uint8_t;
  using Acc = uint8_t;
  static Acc widen(Mem m) { return m != 0; }
  static Mem narrow(Acc a) { return a; }
};

template <class T>
T load(const char* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <class T>
void store(char* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// Integer sums and products wrap like torch's: compute in an unsigned type at
// least as wide as int, so that neither signed overflow nor the promotion of
// uint16_t to int can be undefined.
template <class T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct Add {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      return static_cast<A>(
          static_cast<Wide<A>>(static_cast<Wide<A>>(a) + static_cast<Wide<A>>(b)));
    } else {
      return a + b;
    }
  }
};

struct Mul {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      return static_cast<A>(
          static_cast<Wide<A>>(static_cast<Wide<A>>(a) * static_cast<Wide<A>>(b)));
    } else {
      return a * b;
    }
  }
};

// Note [NaN in min and max]
// torch.minimum/maximum propagate NaN. The SIMD kernels use vminps/vmaxps,
// which return the second operand when either is NaN, and then put back the
// first operand where it is NaN. This is the same expression, so all levels
// agree bit for bit (including which NaN, and -0.0 vs +0.0: on a tie the
// second operand wins).
struct Min {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      if (std::isnan(a)) return a;
    }
    return a < b ? a : b;
  }
};

struct Max {
  template <class A>
  static A apply(A a, A b) {
    if constexpr (std::is_floating_point_v<A>) {
      if (std::isnan(a)) return a;
    }
    return a > b ? a : b;
  }
};

struct And {
  template <class A>
  static A apply(A a, A b) {
    return static_cast<A>(a & b);
  }
};
struct Or {
  template <class A>
  static A apply(A a, A b) {
    return static_cast<A>(a | b);
  }
};
struct Xor {
  template <class A>
  static A apply(A a, A b) {
    return static_cast<A>(a ^ b);
  }
};

template <class C, class Op>
void reduceRows(void* dstv, const void* const* srcs, size_t n, size_t count) {
  using Mem = typename C::Mem;
  typename C::Acc acc[kBlock];
  char* dst = static_cast<char*>(dstv);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = count - base < kBlock ? count - base : kBlock;
    const char* s0 = static_cast<const char*>(srcs[0]) + base * sizeof(Mem);
    for (size_t j = 0; j < m; ++j) acc[j] = C::widen(load<Mem>(s0, j));
    for (size_t k = 1; k < n; ++k) {
      const char* s = static_cast<const char*>(srcs[k]) + base * sizeof(Mem);
      for (size_t j = 0; j < m; ++j) acc[j] = Op::apply(acc[j], C::widen(load<Mem>(s, j)));
    }
    char* d = dst + base * sizeof(Mem);
    for (size_t j = 0; j < m; ++j) store<Mem>(d, j, C::narrow(acc[j]));
  }
}

template <class C>
void reduceFloat(ReduceOp op, void* dst, const void* const* srcs, size_t n, size_t count) {
  switch (op) {
    case ReduceOp::kSum:
      return reduceRows<C, Add>(dst, srcs, n, count);
    case ReduceOp::kProduct:
      return reduceRows<C, Mul>(dst, srcs, n, count);
    case ReduceOp::kMin:
      return reduceRows<C, Min>(dst, srcs, n, count);
    case ReduceOp::kMax:
      return reduceRows<C, Max>(dst, srcs, n, count);
    default:
      return;  // excluded by supported()
  }
}

template <class T>
void reduceInt(ReduceOp op, void* dst, const void* const* srcs, size_t n, size_t count) {
  using C = Plain<T>;
  switch (op) {
    case ReduceOp::kSum:
      return reduceRows<C, Add>(dst, srcs, n, count);
    case ReduceOp::kProduct:
      return reduceRows<C, Mul>(dst, srcs, n, count);
    case ReduceOp::kMin:
      return reduceRows<C, Min>(dst, srcs, n, count);
    case ReduceOp::kMax:
      return reduceRows<C, Max>(dst, srcs, n, count);
    case ReduceOp::kBand:
      return reduceRows<C, And>(dst, srcs, n, count);
    case ReduceOp::kBor:
      return reduceRows<C, Or>(dst, srcs, n, count);
    case ReduceOp::kBxor:
      return reduceRows<C, Xor>(dst, srcs, n, count);
    default:
      return;
  }
}

void reduceBool(ReduceOp op, void* dst, const void* const* srcs, size_t n, size_t count) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return reduceRows<Bool, Or>(dst, srcs, n, count);
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return reduceRows<Bool, And>(dst, srcs, n, count);
    case ReduceOp::kBxor:
      return reduceRows<Bool, Xor>(dst, srcs, n, count);
    default:
      return;
  }
}

template <class C, class F>
void mapRows(void* dstv, const void* srcv, size_t count, F f) {
  using Mem = typename C::Mem;
  char* dst = static_cast<char*>(dstv);
  const char* src = static_cast<const char*>(srcv);
  for (size_t i = 0; i < count; ++i) store<Mem>(dst, i, C::narrow(f(C::widen(load<Mem>(src, i)))));
}

// Truncating division in int64, wrapped back to T. INT64_MIN / -1 would trap,
// so -1 is a (wrapping) negation.
template <class T>
void divideInt(void* dst, const void* src, int64_t d, size_t count) {
  mapRows<Plain<T>>(dst, src, count, [d](T x) {
    const int64_t v = static_cast<int64_t>(x);
    const int64_t q = d == -1 ? static_cast<int64_t>(0 - static_cast<uint64_t>(v)) : v / d;
    return static_cast<T>(q);
  });
}

}  // namespace

bool compiled() { return true; }

void reduceN(DataType type, ReduceOp op, void* dst, const void* const* srcs, size_t n,
             size_t count) {
  switch (type) {
    case DataType::kFloat32:
      return reduceFloat<Plain<float>>(op, dst, srcs, n, count);
    case DataType::kFloat64:
      return reduceFloat<Plain<double>>(op, dst, srcs, n, count);
    case DataType::kFloat16:
      return reduceFloat<Half>(op, dst, srcs, n, count);
    case DataType::kBFloat16:
      return reduceFloat<BHalf>(op, dst, srcs, n, count);
    case DataType::kInt8:
      return reduceInt<int8_t>(op, dst, srcs, n, count);
    case DataType::kUInt8:
      return reduceInt<uint8_t>(op, dst, srcs, n, count);
    case DataType::kInt16:
      return reduceInt<int16_t>(op, dst, srcs, n, count);
    case DataType::kInt32:
      return reduceInt<int32_t>(op, dst, srcs, n, count);
    case DataType::kInt64:
      return reduceInt<int64_t>(op, dst, srcs, n, count);
    case DataType::kBool:
      return reduceBool(op, dst, srcs, n, count);
  }
}

void scale(DataType type, void* dst, const void* src, double factor, size_t count) {
  const float f = static_cast<float>(factor);
  auto byFloat = [f](float x) { return x * f; };
  switch (type) {
    case DataType::kFloat32:
      return mapRows<Plain<float>>(dst, src, count, byFloat);
    case DataType::kFloat64:
      return mapRows<Plain<double>>(dst, src, count, [factor](double x) { return x * factor; });
    case DataType::kFloat16:
      return mapRows<Half>(dst, src, count, byFloat);
    case DataType::kBFloat16:
      return mapRows<BHalf>(dst, src, count, byFloat);
    default:
      return;
  }
}

void divide(DataType type, void* dst, const void* src, int64_t divisor, size_t count) {
  const float f = static_cast<float>(divisor);
  auto byFloat = [f](float x) { return x / f; };
  switch (type) {
    case DataType::kFloat32:
      return mapRows<Plain<float>>(dst, src, count, byFloat);
    case DataType::kFloat64: {
      const double d = static_cast<double>(divisor);
      return mapRows<Plain<double>>(dst, src, count, [d](double x) { return x / d; });
    }
    case DataType::kFloat16:
      return mapRows<Half>(dst, src, count, byFloat);
    case DataType::kBFloat16:
      return mapRows<BHalf>(dst, src, count, byFloat);
    case DataType::kInt8:
      return divideInt<int8_t>(dst, src, divisor, count);
    case DataType::kUInt8:
      return divideInt<uint8_t>(dst, src, divisor, count);
    case DataType::kInt16:
      return divideInt<int16_t>(dst, src, divisor, count);
    case DataType::kInt32:
      return divideInt<int32_t>(dst, src, divisor, count);
    case DataType::kInt64:
      return divideInt<int64_t>(dst, src, divisor, count);
    case DataType::kBool:
      // Logical: the quotient of 0/1 by the divisor, then nonzero -> 1.
      return mapRows<Bool>(dst, src, count, [divisor](uint8_t x) {
        return static_cast<uint8_t>(int64_t{x} / divisor != 0);
      });
  }
}

}  // namespace scalar
}  // namespace reduce
}  // namespace braid

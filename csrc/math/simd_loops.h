// Loop skeletons and type/op dispatch shared by kernels_avx2.cc and
// kernels_avx512.cc. Each ISA file supplies a Kit (see below) of codecs and
// ops built on its intrinsics. Include only from those files, and instantiate
// only with their unnamed-namespace types: see Note [ISA isolation].
//
// A codec C moves C::kLanes elements of storage type C::Mem between memory and
// a register of type C::V, widening on load and rounding on store:
//   static V load(const char* p);  static void store(char* p, V v);
// An op combines two registers: static V apply(V a, V b).
//
// A Kit provides: codecs F32, F64, F16, BF16 (fp16/bf16 held as fp32 lanes),
// Int<T>, Bool (loads normalize any nonzero byte to 1); float ops FAdd, FMul,
// FMin, FMax, FDiv (overloaded for the fp32 and fp64 registers); integer ops
// IAdd<T>, IMul<T>, IMin<T>, IMax<T>; bitwise ops And, Or, Xor; and
// splat(float), splat(double) to broadcast a scalar.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/types.h"
#include "math/dispatch.h"

namespace braid {
namespace reduce {
namespace simd {

// Register blocks per step: several independent dependency chains, while the
// n loads of each chain stream through the same cache lines.
constexpr size_t kUnroll = 4;

template <class C>
typename C::V loadPartial(const char* p, size_t m) {
  alignas(64) char buf[C::kLanes * sizeof(typename C::Mem)] = {};
  std::memcpy(buf, p, m * sizeof(typename C::Mem));
  return C::load(buf);
}

template <class C>
void storePartial(char* p, typename C::V v, size_t m) {
  alignas(64) char buf[C::kLanes * sizeof(typename C::Mem)];
  C::store(buf, v);
  std::memcpy(p, buf, m * sizeof(typename C::Mem));
}

// Every output block is loaded from each source once, combined in registers
// and stored once, so the loop is bound by memory bandwidth and dst may equal
// any source (the whole block is read before it is written).
template <class C, class Op>
void reduceRows(void* dstv, const void* const* srcs, size_t n, size_t count) {
  using V = typename C::V;
  constexpr size_t kVec = C::kLanes * sizeof(typename C::Mem);
  char* dst = static_cast<char*>(dstv);
  const size_t bytes = count * sizeof(typename C::Mem);
  // A lambda, not an inline helper: its type is local to this instantiation.
  auto at = [srcs](size_t k, size_t off) { return static_cast<const char*>(srcs[k]) + off; };
  static_assert(kUnroll == 4, "the main loop below is unrolled by hand");
  size_t i = 0;
  for (; i + kUnroll * kVec <= bytes; i += kUnroll * kVec) {
    V a0 = C::load(at(0, i));
    V a1 = C::load(at(0, i + kVec));
    V a2 = C::load(at(0, i + 2 * kVec));
    V a3 = C::load(at(0, i + 3 * kVec));
    for (size_t k = 1; k < n; ++k) {
      const char* s = at(k, i);
      a0 = Op::apply(a0, C::load(s));
      a1 = Op::apply(a1, C::load(s + kVec));
      a2 = Op::apply(a2, C::load(s + 2 * kVec));
      a3 = Op::apply(a3, C::load(s + 3 * kVec));
    }
    C::store(dst + i, a0);
    C::store(dst + i + kVec, a1);
    C::store(dst + i + 2 * kVec, a2);
    C::store(dst + i + 3 * kVec, a3);
  }
  for (; i + kVec <= bytes; i += kVec) {
    V a = C::load(at(0, i));
    for (size_t k = 1; k < n; ++k) a = Op::apply(a, C::load(at(k, i)));
    C::store(dst + i, a);
  }
  if (i < bytes) {
    const size_t m = (bytes - i) / sizeof(typename C::Mem);
    V a = loadPartial<C>(at(0, i), m);
    for (size_t k = 1; k < n; ++k) a = Op::apply(a, loadPartial<C>(at(k, i), m));
    storePartial<C>(dst + i, a, m);
  }
}

template <class C, class F>
void mapRows(void* dstv, const void* srcv, size_t count, F f) {
  constexpr size_t kVec = C::kLanes * sizeof(typename C::Mem);
  char* dst = static_cast<char*>(dstv);
  const char* src = static_cast<const char*>(srcv);
  const size_t bytes = count * sizeof(typename C::Mem);
  size_t i = 0;
  for (; i + kVec <= bytes; i += kVec) C::store(dst + i, f(C::load(src + i)));
  if (i < bytes) {
    const size_t m = (bytes - i) / sizeof(typename C::Mem);
    storePartial<C>(dst + i, f(loadPartial<C>(src + i, m)), m);
  }
}

template <class K, class C>
void reduceFloat(ReduceOp op, void* dst, const void* const* srcs, size_t n, size_t count) {
  switch (op) {
    case ReduceOp::kSum:
      return reduceRows<C, typename K::FAdd>(dst, srcs, n, count);
    case ReduceOp::kProduct:
      return reduceRows<C, typename K::FMul>(dst, srcs, n, count);
    case ReduceOp::kMin:
      return reduceRows<C, typename K::FMin>(dst, srcs, n, count);
    case ReduceOp::kMax:
      return reduceRows<C, typename K::FMax>(dst, srcs, n, count);
    default:
      return;  // excluded by supported()
  }
}

template <class K, class T>
void reduceInt(ReduceOp op, void* dst, const void* const* srcs, size_t n, size_t count) {
  using C = typename K::template Int<T>;
  switch (op) {
    case ReduceOp::kSum:
      return reduceRows<C, typename K::template IAdd<T>>(dst, srcs, n, count);
    case ReduceOp::kProduct:
      return reduceRows<C, typename K::template IMul<T>>(dst, srcs, n, count);
    case ReduceOp::kMin:
      return reduceRows<C, typename K::template IMin<T>>(dst, srcs, n, count);
    case ReduceOp::kMax:
      return reduceRows<C, typename K::template IMax<T>>(dst, srcs, n, count);
    case ReduceOp::kBand:
      return reduceRows<C, typename K::And>(dst, srcs, n, count);
    case ReduceOp::kBor:
      return reduceRows<C, typename K::Or>(dst, srcs, n, count);
    case ReduceOp::kBxor:
      return reduceRows<C, typename K::Xor>(dst, srcs, n, count);
    default:
      return;
  }
}

template <class K>
void reduceBool(ReduceOp op, void* dst, const void* const* srcs, size_t n, size_t count) {
  using C = typename K::Bool;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return reduceRows<C, typename K::Or>(dst, srcs, n, count);
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return reduceRows<C, typename K::And>(dst, srcs, n, count);
    case ReduceOp::kBxor:
      return reduceRows<C, typename K::Xor>(dst, srcs, n, count);
    default:
      return;
  }
}

template <class K>
void reduceByType(DataType type, ReduceOp op, void* dst, const void* const* srcs, size_t n,
                  size_t count) {
  switch (type) {
    case DataType::kFloat32:
      return reduceFloat<K, typename K::F32>(op, dst, srcs, n, count);
    case DataType::kFloat64:
      return reduceFloat<K, typename K::F64>(op, dst, srcs, n, count);
    case DataType::kFloat16:
      return reduceFloat<K, typename K::F16>(op, dst, srcs, n, count);
    case DataType::kBFloat16:
      return reduceFloat<K, typename K::BF16>(op, dst, srcs, n, count);
    case DataType::kInt8:
      return reduceInt<K, int8_t>(op, dst, srcs, n, count);
    case DataType::kUInt8:
      return reduceInt<K, uint8_t>(op, dst, srcs, n, count);
    case DataType::kInt16:
      return reduceInt<K, int16_t>(op, dst, srcs, n, count);
    case DataType::kInt32:
      return reduceInt<K, int32_t>(op, dst, srcs, n, count);
    case DataType::kInt64:
      return reduceInt<K, int64_t>(op, dst, srcs, n, count);
    case DataType::kBool:
      return reduceBool<K>(op, dst, srcs, n, count);
  }
}

// Float types only (the caller checks); fp16/bf16 are scaled in fp32.
template <class K>
void scaleByType(DataType type, void* dst, const void* src, double factor, size_t count) {
  const auto f = K::splat(static_cast<float>(factor));
  auto byF = [f](decltype(f) x) { return K::FMul::apply(x, f); };
  switch (type) {
    case DataType::kFloat32:
      return mapRows<typename K::F32>(dst, src, count, byF);
    case DataType::kFloat16:
      return mapRows<typename K::F16>(dst, src, count, byF);
    case DataType::kBFloat16:
      return mapRows<typename K::BF16>(dst, src, count, byF);
    case DataType::kFloat64: {
      const auto d = K::splat(factor);
      return mapRows<typename K::F64>(dst, src, count,
                                      [d](decltype(d) x) { return K::FMul::apply(x, d); });
    }
    default:
      return;
  }
}

// Float types are divided here; integer division has no SIMD instruction and
// stays scalar.
template <class K>
void divideByType(DataType type, void* dst, const void* src, int64_t divisor, size_t count) {
  const auto f = K::splat(static_cast<float>(divisor));
  auto byF = [f](decltype(f) x) { return K::FDiv::apply(x, f); };
  switch (type) {
    case DataType::kFloat32:
      return mapRows<typename K::F32>(dst, src, count, byF);
    case DataType::kFloat16:
      return mapRows<typename K::F16>(dst, src, count, byF);
    case DataType::kBFloat16:
      return mapRows<typename K::BF16>(dst, src, count, byF);
    case DataType::kFloat64: {
      const auto d = K::splat(static_cast<double>(divisor));
      return mapRows<typename K::F64>(dst, src, count,
                                      [d](decltype(d) x) { return K::FDiv::apply(x, d); });
    }
    default:
      return scalar::divide(type, dst, src, divisor, count);
  }
}

}  // namespace simd
}  // namespace reduce
}  // namespace braid

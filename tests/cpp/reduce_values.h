// Values as doubles in any dtype, and reduction inputs whose results are
// exact in every tested dtype, with their closed forms: shared by the suites
// that check reductions (test_core_net, test_core_hier).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "common/types.h"
#include "math/half.h"

namespace braid {
namespace testing {

inline double get(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(p)[i];
    case DataType::kFloat64: return static_cast<const double*>(p)[i];
    case DataType::kFloat16: return reduce::halfToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return reduce::bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
    case DataType::kInt32: return static_cast<const int32_t*>(p)[i];
    case DataType::kUInt8: return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    default: throw Error("test: dtype not handled");
  }
}
inline void set(DataType t, void* p, size_t i, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; break;
    case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = reduce::floatToHalf(static_cast<float>(v)); break;
    case DataType::kBFloat16: static_cast<uint16_t*>(p)[i] = reduce::floatToBf16(static_cast<float>(v)); break;
    case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); break;
    case DataType::kUInt8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    default: throw Error("test: dtype not handled");
  }
}

// Inputs whose results are exact in every tested dtype.
inline int64_t input(ReduceOp op, int r, size_t i) {
  switch (op) {
    case ReduceOp::kProduct: return 1 + (r + i) % 2;
    case ReduceOp::kMin:
    case ReduceOp::kMax: return 3 * ((r + i) % 5) + i % 7;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: return (r * 37 + i * 11) & 0x7f;
    default: return r + 1 + i % 5;
  }
}

inline double expected(ReduceOp op, DataType t, int n, size_t i) {
  int64_t acc = input(op, 0, i);
  for (int r = 1; r < n; ++r) {
    int64_t v = input(op, r, i);
    switch (op) {
      case ReduceOp::kProduct: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kBand: acc &= v; break;
      case ReduceOp::kBor: acc |= v; break;
      case ReduceOp::kBxor: acc ^= v; break;
      default: acc += v;
    }
  }
  if (op == ReduceOp::kAvg) {
    return isFloating(t) ? static_cast<double>(acc) / n : static_cast<double>(acc / n);
  }
  return static_cast<double>(acc);
}

inline bool close(DataType t, double got, double want) {
  if (!isFloating(t)) return got == want;
  double tol = (t == DataType::kFloat16 || t == DataType::kBFloat16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

inline std::vector<uint8_t> filled(DataType t, ReduceOp op, int r, size_t count) {
  std::vector<uint8_t> v(count * elementSize(t) + 1);
  for (size_t i = 0; i < count; ++i) set(t, v.data(), i, static_cast<double>(input(op, r, i)));
  return v;
}

// Mismatching elements of `p` against expected(op, ...).
inline size_t badReduced(DataType t, ReduceOp op, int n, const void* p, size_t count) {
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) bad += !close(t, get(t, p, i), expected(op, t, n, i));
  return bad;
}

inline std::vector<ReduceOp> opsFor(DataType t) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                               ReduceOp::kMax, ReduceOp::kAvg};
  if (!isFloating(t)) {
    ops.insert(ops.end(), {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor});
  }
  return ops;
}

inline const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kInt32,
                           DataType::kBFloat16, DataType::kFloat16, DataType::kUInt8};

}  // namespace testing
}  // namespace braid

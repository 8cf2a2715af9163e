// Element types and reduce operations, free of torch headers so that the
// transport, collective and kernel layers can be built and tested alone.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt8,
  kUInt8,
  kInt16,
  kInt32,
  kInt64,
  kBool,
};
constexpr int kNumDataTypes = 10;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kProduct,
  kMin,
  kMax,
  kBand,
  kBor,
  kBxor,
  kAvg,        // sum, then divide by the number of contributions
  kPremulSum,  // inputs scaled by a factor before the sum
};
constexpr int kNumReduceOps = 9;

size_t elementSize(DataType t);
const char* toString(DataType t);
const char* toString(ReduceOp op);
bool isFloating(DataType t);

}  // namespace braid

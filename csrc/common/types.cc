#include "common/types.h"

namespace braid {

size_t elementSize(DataType t) {
  switch (t) {
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kInt16:
      return 2;
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kBool:
      return 1;
  }
  return 0;
}

const char* toString(DataType t) {
  static const char* kNames[] = {"float32", "float64", "float16", "bfloat16", "int8",
                                 "uint8",   "int16",   "int32",   "int64",    "bool"};
  auto i = static_cast<int>(t);
  return i < kNumDataTypes ? kNames[i] : "unknown";
}

const char* toString(ReduceOp op) {
  static const char* kNames[] = {"SUM", "PRODUCT", "MIN", "MAX", "BAND",
                                 "BOR", "BXOR",    "AVG", "PREMUL_SUM"};
  auto i = static_cast<int>(op);
  return i < kNumReduceOps ? kNames[i] : "unknown";
}

bool isFloating(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

}  // namespace braid

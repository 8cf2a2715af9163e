#include "cuda/host_kernels.h"

#include "common/error.h"
#include "cuda/kernel_list.h"
#include "cuda/kernels.cuh"

namespace braid {
namespace cuda {

using namespace kernels;  // NOLINT: the codecs and ops the X-macro names

const char* reduceKernelName(DataType type, ReduceOp op) {
#define BRAID_NAME(tname, dtype, codec, opname, rop, opstruct) \
  if (type == DataType::dtype && op == ReduceOp::rop) return "braid_reduce_" #tname "_" #opname;
  BRAID_CUDA_REDUCE_KERNELS(BRAID_NAME)
#undef BRAID_NAME
  return nullptr;
}

void checkReduceArgs(const char* call, DataType type, ReduceOp op, const void* dst,
                     const void* src, size_t count) {
  if (reduceKernelName(type, op) == nullptr) {
    throw Error(strCat("braid: ", call, ": no kernel for ", toString(op), " on ",
                       toString(type),
                       " (AVG and PREMUL_SUM are composed from SUM and a scale or divide; "
                       "bitwise ops need an integer or bool type)"));
  }
  if (count == 0) return;
  if (dst == nullptr || src == nullptr) {
    throw Error(strCat("braid: ", call, ": null pointer (dst=", dst, ", src=", src, ") for ",
                       count, " elements"));
  }
  const size_t size = elementSize(type);
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  if (d % size != 0 || s % size != 0) {
    throw Error(strCat("braid: ", call, ": dst=", dst, " and src=", src,
                       " must be aligned to the ", size, "-byte elements of ", toString(type)));
  }
  const size_t bytes = count * size;
  if (d != s && d < s + bytes && s < d + bytes) {
    throw Error(strCat("braid: ", call, ": dst=", dst, " partly overlaps src=", src, " (",
                       bytes, " bytes); they must be equal or disjoint"));
  }
}

void hostReduce(DataType type, ReduceOp op, void* dst, const void* src, size_t count) {
  checkReduceArgs("hostReduce", type, op, dst, src, count);
#define BRAID_RUN(tname, dtype, codec, opname, rop, opstruct)                        \
  if (type == DataType::dtype && op == ReduceOp::rop) {                              \
    using M = codec::Mem;                                                            \
    return reduceRange<codec, opstruct>(static_cast<M*>(dst), static_cast<const M*>(src), 0, \
                                        count, 1);                                   \
  }
  BRAID_CUDA_REDUCE_KERNELS(BRAID_RUN)
#undef BRAID_RUN
}

const char* reduceMultiKernelName(DataType type, ReduceOp op) {
#define BRAID_NAME(tname, dtype, codec, opname, rop, opstruct) \
  if (type == DataType::dtype && op == ReduceOp::rop) return "braid_reduce_multi_" #tname "_" #opname;
  BRAID_CUDA_REDUCE_KERNELS(BRAID_NAME)
#undef BRAID_NAME
  return nullptr;
}

void checkReduceMultiArgs(const char* call, DataType type, ReduceOp op, const void* dst,
                          const void* const* srcs, int n, double divisor, size_t count) {
  if (n < 1 || n > kMaxReduceSources) {
    throw Error(strCat("braid: ", call, ": ", n, " sources; 1 to ", kMaxReduceSources,
                       " are allowed"));
  }
  if (divisor != 1.0 && !isFloating(type)) {
    throw Error(strCat("braid: ", call, ": a divisor of ", divisor, " needs a float type, got ",
                       toString(type)));
  }
  // Each source is checked as a pairwise reduce would be (alignment, kernel
  // exists); sources may equal dst, but not partly overlap it.
  for (int k = 0; k < n; ++k) checkReduceArgs(call, type, op, dst, srcs[k], count);
}

void hostReduceMulti(DataType type, ReduceOp op, void* dst, const void* const* srcs, int n,
                     double divisor, size_t count) {
  checkReduceMultiArgs("hostReduceMulti", type, op, dst, srcs, n, divisor, count);
  ReduceSources sources{};
  for (int k = 0; k < n; ++k) sources.p[k] = srcs[k];
#define BRAID_RUN(tname, dtype, codec, opname, rop, opstruct)                          \
  if (type == DataType::dtype && op == ReduceOp::rop) {                                \
    return reduceMultiRange<codec, opstruct>(static_cast<codec::Mem*>(dst), sources, n, \
                                             divisor, 0, count, 1);                     \
  }
  BRAID_CUDA_REDUCE_KERNELS(BRAID_RUN)
#undef BRAID_RUN
}

void hostScale(DataType type, void* dst, const void* src, double factor, size_t count) {
  const float f = static_cast<float>(factor);
  switch (type) {
    case DataType::kFloat32:
      return scaleRange<Plain<float>>(static_cast<float*>(dst), static_cast<const float*>(src), f,
                                      0, count, 1);
    case DataType::kFloat64:
      return scaleRange<Plain<double>>(static_cast<double*>(dst),
                                       static_cast<const double*>(src), factor, 0, count, 1);
    case DataType::kFloat16:
      return scaleRange<F16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), f, 0,
                             count, 1);
    case DataType::kBFloat16:
      return scaleRange<BF16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), f,
                              0, count, 1);
    default:
      throw Error(strCat("braid: hostScale: ", toString(type), " is not a float type"));
  }
}

void hostDivide(DataType type, void* dst, const void* src, int64_t divisor, size_t count) {
  if (divisor == 0) throw Error("braid: hostDivide: division by zero");
  const float f = static_cast<float>(divisor);
  switch (type) {
    case DataType::kFloat32:
      return divideFloatRange<Plain<float>>(static_cast<float*>(dst),
                                            static_cast<const float*>(src), f, 0, count, 1);
    case DataType::kFloat64:
      return divideFloatRange<Plain<double>>(static_cast<double*>(dst),
                                             static_cast<const double*>(src),
                                             static_cast<double>(divisor), 0, count, 1);
    case DataType::kFloat16:
      return divideFloatRange<F16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src),
                                   f, 0, count, 1);
    case DataType::kBFloat16:
      return divideFloatRange<BF16>(static_cast<uint16_t*>(dst),
                                    static_cast<const uint16_t*>(src), f, 0, count, 1);
    case DataType::kInt8:
      return divideIntRange(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), divisor,
                            0, count, 1);
    case DataType::kUInt8:
      return divideIntRange(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), divisor,
                            0, count, 1);
    case DataType::kInt16:
      return divideIntRange(static_cast<int16_t*>(dst), static_cast<const int16_t*>(src), divisor,
                            0, count, 1);
    case DataType::kInt32:
      return divideIntRange(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), divisor,
                            0, count, 1);
    case DataType::kInt64:
      return divideIntRange(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), divisor,
                            0, count, 1);
    case DataType::kBool:
      return divideBoolRange(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src),
                             divisor, 0, count, 1);
  }
}

}  // namespace cuda
}  // namespace braid

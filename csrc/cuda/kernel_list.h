// The reduce kernels, as an X-macro list shared by the GPU entry points
// (kernels.cu), the names cudaRuntime() looks up, and the CPU dispatch of the
// simulated device (host_kernels.cc), so that the three cannot drift apart.
//
// X(tname, DataType, Codec, opname, ReduceOp, Op): one kernel per supported
// (DataType, ReduceOp) pair, named braid_reduce_<tname>_<opname>, running
// kernels::reduceRange<Codec, Op> (csrc/cuda/kernels.cuh). Bool maps the
// arithmetic ops to logical ones (Note [Reduced-precision accumulation]).
// kAvg and kPremulSum have no kernel: callers compose them from kSum and
// scale/divide, as with reduce::reduceN.
#pragma once

#define BRAID_CUDA_FLOAT_OPS(X, tname, dtype, codec) \
  X(tname, dtype, codec, sum, kSum, Add)             \
  X(tname, dtype, codec, prod, kProduct, Mul)        \
  X(tname, dtype, codec, min, kMin, Min)             \
  X(tname, dtype, codec, max, kMax, Max)

#define BRAID_CUDA_INT_OPS(X, tname, dtype, codec) \
  BRAID_CUDA_FLOAT_OPS(X, tname, dtype, codec)     \
  X(tname, dtype, codec, band, kBand, And)         \
  X(tname, dtype, codec, bor, kBor, Or)            \
  X(tname, dtype, codec, bxor, kBxor, Xor)

#define BRAID_CUDA_BOOL_OPS(X, tname, dtype, codec) \
  X(tname, dtype, codec, sum, kSum, Or)             \
  X(tname, dtype, codec, prod, kProduct, And)       \
  X(tname, dtype, codec, min, kMin, And)            \
  X(tname, dtype, codec, max, kMax, Or)             \
  X(tname, dtype, codec, band, kBand, And)          \
  X(tname, dtype, codec, bor, kBor, Or)             \
  X(tname, dtype, codec, bxor, kBxor, Xor)

#define BRAID_CUDA_REDUCE_KERNELS(X)                        \
  BRAID_CUDA_FLOAT_OPS(X, f32, kFloat32, Plain<float>)      \
  BRAID_CUDA_FLOAT_OPS(X, f64, kFloat64, Plain<double>)     \
  BRAID_CUDA_FLOAT_OPS(X, f16, kFloat16, F16)               \
  BRAID_CUDA_FLOAT_OPS(X, bf16, kBFloat16, BF16)            \
  BRAID_CUDA_INT_OPS(X, i8, kInt8, Plain<int8_t>)           \
  BRAID_CUDA_INT_OPS(X, u8, kUInt8, Plain<uint8_t>)         \
  BRAID_CUDA_INT_OPS(X, i16, kInt16, Plain<int16_t>)        \
  BRAID_CUDA_INT_OPS(X, i32, kInt32, Plain<int32_t>)        \
  BRAID_CUDA_INT_OPS(X, i64, kInt64, Plain<int64_t>)        \
  BRAID_CUDA_BOOL_OPS(X, b8, kBool, Bool)

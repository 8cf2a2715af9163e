// The CUDA kernel bodies (csrc/cuda/kernels.cuh) run on the CPU: bit for bit
// against the CPU path they must match (reduce::reduceN/scale/divide, the
// int8 hook's loops, compiled into this test from csrc/hooks/int8_kernels.cc)
// and against closed forms, over every dtype and op, counts 0, 1, odd and
// large, and special values (NaN, inf, -0, subnormals, wrap-around).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "cuda/host_kernels.h"
#include "cuda/kernels.cuh"
#include "hooks/int8_kernels.h"
#include "math/half.h"
#include "math/reduce.h"

namespace braid {
namespace cuda {
namespace {

namespace k = kernels;

constexpr DataType kAllTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                  DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                                  DataType::kInt16,    DataType::kInt32,   DataType::kInt64,
                                  DataType::kBool};
constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax,
                             ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};
constexpr size_t kCounts[] = {0, 1, 2, 7, 31, 1001, 100003};

uint32_t f2u(float f) { return reduce::floatBits(f); }

// Bytes of `count` elements of `type`: mostly ordinary values, with some
// special ones (random bit patterns: NaN, inf, subnormals; zeros of both
// signs; extremes) mixed in.
std::vector<uint8_t> randomBytes(DataType type, size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t size = elementSize(type);
  std::vector<uint8_t> bytes(count * size + 1);  // +1: never an empty vector's null data()
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = bytes.data() + i * size;
    const uint64_t r = rng();
    const int kind = static_cast<int>(rng() % 8);
    if (kind == 0 || !isFloating(type)) {
      std::memcpy(p, &r, size);  // any bit pattern (ints: any value)
      if (type == DataType::kBool) *p = static_cast<uint8_t>(r % 3 == 0 ? r >> 8 : r % 2);
      continue;
    }
    const double v = kind == 1   ? 0.0 * (r % 2 ? -1 : 1)
                     : kind == 2 ? std::ldexp(static_cast<double>(r % 1000), -140)  // tiny
                                 : (static_cast<double>(r % 2000001) - 1000000.0) / 1024.0;
    switch (type) {
      case DataType::kFloat32: {
        const float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::kFloat64:
        std::memcpy(p, &v, 8);
        break;
      case DataType::kFloat16: {
        const uint16_t h = reduce::floatToHalf(static_cast<float>(v / 64));
        std::memcpy(p, &h, 2);
        break;
      }
      default: {
        const uint16_t b = reduce::floatToBf16(static_cast<float>(v));
        std::memcpy(p, &b, 2);
        break;
      }
    }
  }
  return bytes;
}

std::string label(DataType t, ReduceOp op, size_t count) {
  return strCat(toString(t), " ", toString(op), " count=", count);
}

// ---- Conversions ---------------------------------------------------------------

TEST(CudaKernels, HalfConversionsMatchTheCpuPath) {
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(f2u(k::halfToFloat(static_cast<uint16_t>(h))),
              f2u(reduce::halfToFloat(static_cast<uint16_t>(h))))
        << h;
    ASSERT_EQ(f2u(k::bf16ToFloat(static_cast<uint16_t>(h))),
              f2u(reduce::bf16ToFloat(static_cast<uint16_t>(h))))
        << h;
  }
  std::mt19937 rng(1);
  std::vector<uint32_t> bits = {0u,          0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffffffffu, 0x33000000u, 0x33000001u, 0x477ff000u,
                                0x477fefffu, 0x38800000u, 0x387fffffu, 0x00000001u};
  for (int i = 0; i < 2000000; ++i) bits.push_back(rng());
  for (uint32_t u = 0x33000000u; u < 0x39000000u; u += 0x1001u) bits.push_back(u);  // subnormals
  for (uint32_t u : bits) {
    const float f = reduce::bitsFloat(u);
    ASSERT_EQ(k::floatToHalf(f), reduce::floatToHalf(f)) << std::hex << u;
    ASSERT_EQ(k::floatToBf16(f), reduce::floatToBf16(f)) << std::hex << u;
    // The hook's bf16 rounding: the same, except that every NaN is 0x7fc0.
    ASSERT_EQ(k::floatToBf16Torch(f), std::isnan(f) ? 0x7fc0 : reduce::floatToBf16(f))
        << std::hex << u;
  }
}

// ---- Reduce --------------------------------------------------------------------

// hostReduce(dst = a, src = b) against reduceN({a, b}): the same bytes, for
// every type, op and count, out of place and in place (src == dst).
TEST(CudaKernels, ReduceMatchesReduceNBitForBit) {
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kOps) {
      if (!reduce::supported(t, op)) {
        EXPECT_EQ(reduceKernelName(t, op), nullptr);
        continue;
      }
      ASSERT_NE(reduceKernelName(t, op), nullptr) << label(t, op, 0);
      for (size_t n : kCounts) {
        const auto a = randomBytes(t, n, n * 31 + static_cast<int>(t));
        const auto b = randomBytes(t, n, n * 37 + static_cast<int>(op) + 1000);
        std::vector<uint8_t> want(a.size()), got = a;
        const void* srcs[] = {a.data(), b.data()};
        reduce::reduceN(t, op, want.data(), srcs, 2, n);
        hostReduce(t, op, got.data(), b.data(), n);
        ASSERT_EQ(std::memcmp(want.data(), got.data(), n * elementSize(t)), 0) << label(t, op, n);

        const void* same[] = {a.data(), a.data()};
        reduce::reduceN(t, op, want.data(), same, 2, n);
        got = a;
        hostReduce(t, op, got.data(), got.data(), n);
        ASSERT_EQ(std::memcmp(want.data(), got.data(), n * elementSize(t)), 0)
            << "in place " << label(t, op, n);
      }
    }
  }
}

// The multi-source kernel (Note [Multi-source reduce]) gives the CPU path's
// bits for 1 to 5 sources: ranks sharing a GPU get what the staged path gives.
TEST(CudaKernels, ReduceMultiMatchesReduceNBitForBit) {
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kOps) {
      if (!reduce::supported(t, op)) {
        EXPECT_EQ(reduceMultiKernelName(t, op), nullptr);
        continue;
      }
      for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1001)}) {
        for (int nsrc = 1; nsrc <= 5; ++nsrc) {
          std::vector<std::vector<uint8_t>> in;
          std::vector<const void*> srcs;
          for (int k = 0; k < nsrc; ++k) {
            in.push_back(randomBytes(t, n, n * 41 + k * 7 + static_cast<int>(op)));
          }
          for (auto& v : in) srcs.push_back(v.data());
          std::vector<uint8_t> want(std::max<size_t>(1, n * elementSize(t)));
          std::vector<uint8_t> got(want.size());
          reduce::reduceN(t, op, want.data(), srcs.data(), srcs.size(), n);
          hostReduceMulti(t, op, got.data(), srcs.data(), nsrc, 1.0, n);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), n * elementSize(t)), 0)
              << label(t, op, n) << ", " << nsrc << " sources";
          // In place: the destination is one of the sources.
          got = in[0];
          srcs[0] = got.data();
          hostReduceMulti(t, op, got.data(), srcs.data(), nsrc, 1.0, n);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), n * elementSize(t)), 0)
              << "in place " << label(t, op, n) << ", " << nsrc << " sources";
        }
      }
    }
  }
  const void* none[1] = {nullptr};
  float x = 0;
  EXPECT_THROW(hostReduceMulti(DataType::kFloat32, ReduceOp::kSum, &x, none, 0, 1.0, 1), Error);
  EXPECT_THROW(hostReduceMulti(DataType::kInt32, ReduceOp::kSum, &x, none, 1, 2.0, 1), Error);
}

// Closed forms on small integers, exact in every type: a = i % 11, b = 3 + i % 5.
double closedForm(ReduceOp op, int64_t a, int64_t b, bool isBool) {
  if (isBool) {
    const bool x = a != 0, y = b != 0;
    switch (op) {
      case ReduceOp::kSum: case ReduceOp::kMax: case ReduceOp::kBor: return x || y;
      case ReduceOp::kBxor: return x != y;
      default: return x && y;
    }
  }
  switch (op) {
    case ReduceOp::kSum: return static_cast<double>(a + b);
    case ReduceOp::kProduct: return static_cast<double>(a * b);
    case ReduceOp::kMin: return static_cast<double>(std::min(a, b));
    case ReduceOp::kMax: return static_cast<double>(std::max(a, b));
    case ReduceOp::kBand: return static_cast<double>(a & b);
    case ReduceOp::kBor: return static_cast<double>(a | b);
    default: return static_cast<double>(a ^ b);
  }
}

double getAsDouble(DataType t, const uint8_t* p, size_t i) {
  const uint8_t* e = p + i * elementSize(t);
  switch (t) {
    case DataType::kFloat32: { float v; std::memcpy(&v, e, 4); return v; }
    case DataType::kFloat64: { double v; std::memcpy(&v, e, 8); return v; }
    case DataType::kFloat16: { uint16_t v; std::memcpy(&v, e, 2); return reduce::halfToFloat(v); }
    case DataType::kBFloat16: { uint16_t v; std::memcpy(&v, e, 2); return reduce::bf16ToFloat(v); }
    case DataType::kInt8: return static_cast<int8_t>(*e);
    case DataType::kUInt8: case DataType::kBool: return *e;
    case DataType::kInt16: { int16_t v; std::memcpy(&v, e, 2); return v; }
    case DataType::kInt32: { int32_t v; std::memcpy(&v, e, 4); return v; }
    default: { int64_t v; std::memcpy(&v, e, 8); return static_cast<double>(v); }
  }
}

void setFromInt(DataType t, uint8_t* p, size_t i, int64_t v) {
  uint8_t* e = p + i * elementSize(t);
  switch (t) {
    case DataType::kFloat32: { const float f = static_cast<float>(v); std::memcpy(e, &f, 4); break; }
    case DataType::kFloat64: { const double d = static_cast<double>(v); std::memcpy(e, &d, 8); break; }
    case DataType::kFloat16: { const uint16_t h = reduce::floatToHalf(static_cast<float>(v)); std::memcpy(e, &h, 2); break; }
    case DataType::kBFloat16: { const uint16_t b = reduce::floatToBf16(static_cast<float>(v)); std::memcpy(e, &b, 2); break; }
    default: std::memcpy(e, &v, elementSize(t)); break;  // little-endian truncation
  }
}

TEST(CudaKernels, ReduceMatchesClosedForms) {
  for (DataType t : kAllTypes) {
    for (ReduceOp op : kOps) {
      if (!reduce::supported(t, op)) continue;
      for (size_t n : kCounts) {
        std::vector<uint8_t> a(n * elementSize(t) + 1), b(a.size());
        for (size_t i = 0; i < n; ++i) {
          setFromInt(t, a.data(), i, t == DataType::kBool ? i % 3 % 2 : i % 11);
          setFromInt(t, b.data(), i, t == DataType::kBool ? i / 2 % 2 : 3 + i % 5);
        }
        hostReduce(t, op, a.data(), b.data(), n);
        for (size_t i = 0; i < n; ++i) {
          const bool isBool = t == DataType::kBool;
          const double want = isBool ? closedForm(op, i % 3 % 2, i / 2 % 2, true)
                                     : closedForm(op, i % 11, 3 + i % 5, false);
          ASSERT_EQ(getAsDouble(t, a.data(), i), want) << label(t, op, n) << " i=" << i;
        }
      }
    }
  }
}

TEST(CudaKernels, SpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  float a[] = {nan, 1.f, -0.f, inf, 1e38f};
  float b[] = {1.f, nan, 0.f, -inf, 1e38f};
  hostReduce(DataType::kFloat32, ReduceOp::kMin, a, b, 5);
  EXPECT_TRUE(std::isnan(a[0]));  // NaN propagates from either side, as torch.minimum
  EXPECT_TRUE(std::isnan(a[1]));
  EXPECT_EQ(f2u(a[2]), f2u(0.f));  // a tie gives the second operand
  EXPECT_EQ(a[3], -inf);
  float s[] = {1e38f, 3e38f};
  float t[] = {1e38f, 3e38f};
  hostReduce(DataType::kFloat32, ReduceOp::kSum, s, t, 2);
  EXPECT_EQ(s[0], 2e38f);
  EXPECT_EQ(s[1], inf);
  int32_t i[] = {INT32_MAX, INT32_MIN, 65536};
  int32_t j[] = {1, -1, 65536};
  hostReduce(DataType::kInt32, ReduceOp::kSum, i, j, 2);
  EXPECT_EQ(i[0], INT32_MIN);  // wraps
  EXPECT_EQ(i[1], INT32_MAX);
  hostReduce(DataType::kInt32, ReduceOp::kProduct, i + 2, j + 2, 1);
  EXPECT_EQ(i[2], 0);  // 2^32 wraps to 0
  uint8_t p[] = {0, 2, 7, 0}, q[] = {0, 0, 9, 5};
  hostReduce(DataType::kBool, ReduceOp::kSum, p, q, 4);
  EXPECT_EQ(std::vector<uint8_t>(p, p + 4), (std::vector<uint8_t>{0, 1, 1, 1}));
  // fp16: 2048 + 1 is not representable; rounded once to even.
  uint16_t h1[] = {reduce::floatToHalf(2048.f)}, h2[] = {reduce::floatToHalf(1.f)};
  hostReduce(DataType::kFloat16, ReduceOp::kSum, h1, h2, 1);
  EXPECT_EQ(reduce::halfToFloat(h1[0]), 2048.f);
}

TEST(CudaKernels, ArgumentChecks) {
  int32_t a[4] = {}, b[4] = {};
  EXPECT_THROW(hostReduce(DataType::kInt32, ReduceOp::kAvg, a, b, 4), Error);
  EXPECT_THROW(hostReduce(DataType::kInt32, ReduceOp::kPremulSum, a, b, 4), Error);
  EXPECT_THROW(hostReduce(DataType::kFloat64, ReduceOp::kBand, a, b, 1), Error);
  EXPECT_THROW(hostReduce(DataType::kInt32, ReduceOp::kSum, a, a + 1, 3), Error);  // overlap
  EXPECT_THROW(hostReduce(DataType::kInt16, ReduceOp::kSum, reinterpret_cast<char*>(a) + 1, b, 1),
               Error);  // misaligned
  EXPECT_THROW(hostReduce(DataType::kInt32, ReduceOp::kSum, nullptr, b, 1), Error);
  hostReduce(DataType::kInt32, ReduceOp::kSum, nullptr, nullptr, 0);
  EXPECT_STREQ(reduceKernelName(DataType::kBFloat16, ReduceOp::kMax), "braid_reduce_bf16_max");
  EXPECT_STREQ(reduceKernelName(DataType::kBool, ReduceOp::kProduct), "braid_reduce_b8_prod");
}

// ---- Scale and divide ------------------------------------------------------------

TEST(CudaKernels, ScaleAndDivideMatchTheCpuPath) {
  const double factors[] = {0.25, 1.0 / 3, -7.5, 1e-3};
  const int64_t divisors[] = {1, 2, 3, -1, -4, 7, 1000};
  for (DataType t : kAllTypes) {
    for (size_t n : kCounts) {
      const auto src = randomBytes(t, n, n + 17 * static_cast<int>(t));
      std::vector<uint8_t> want(src.size()), got(src.size());
      if (isFloating(t)) {
        for (double f : factors) {
          reduce::scale(t, want.data(), src.data(), f, n);
          hostScale(t, got.data(), src.data(), f, n);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), n * elementSize(t)), 0)
              << toString(t) << " scale " << f << " n=" << n;
        }
      } else {
        EXPECT_THROW(hostScale(t, got.data(), src.data(), 2.0, n), Error);
      }
      for (int64_t d : divisors) {
        reduce::divide(t, want.data(), src.data(), d, n);
        hostDivide(t, got.data(), src.data(), d, n);
        ASSERT_EQ(std::memcmp(want.data(), got.data(), n * elementSize(t)), 0)
            << toString(t) << " divide " << d << " n=" << n;
      }
      EXPECT_THROW(hostDivide(t, got.data(), src.data(), 0, n), Error);
    }
  }
  int64_t v[] = {-7, 7, INT64_MIN};
  hostDivide(DataType::kInt64, v, v, 2, 2);
  EXPECT_EQ(v[0], -3);  // truncating
  EXPECT_EQ(v[1], 3);
  hostDivide(DataType::kInt64, v + 2, v + 2, -1, 1);
  EXPECT_EQ(v[2], INT64_MIN);  // wraps instead of trapping
  float f[] = {1.f, 3.f};
  hostDivide(DataType::kFloat32, f, f, 3, 2);
  EXPECT_EQ(f[0], 1.f / 3.f);
  EXPECT_EQ(f[1], 1.f);
}

// ---- Casts (the fp16/bf16 hooks) --------------------------------------------------

TEST(CudaKernels, CastsRoundOnceAndWidenExactly) {
  for (size_t n : kCounts) {
    const auto bytes = randomBytes(DataType::kFloat32, n, 99 + n);
    std::vector<float> x(n + 1);
    std::memcpy(x.data(), bytes.data(), n * 4);
    for (float div : {1.f, 4.f, 3.f}) {
      std::vector<uint16_t> h(n + 1), b(n + 1);
      k::narrowHalfRange(x.data(), h.data(), div, 0, n, 1);
      k::narrowBf16Range(x.data(), b.data(), div, 0, n, 1);
      for (size_t i = 0; i < n; ++i) {
        const float q = x[i] / div;
        ASSERT_EQ(h[i], reduce::floatToHalf(q)) << i;
        ASSERT_EQ(b[i], std::isnan(q) ? 0x7fc0 : reduce::floatToBf16(q)) << i;
      }
      std::vector<float> out(n + 1, 0.5f), acc(n + 1, 0.5f);
      k::widenHalfRange(h.data(), out.data(), false, 0, n, 1);
      k::widenBf16Range(b.data(), acc.data(), true, 0, n, 1);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(f2u(out[i]), f2u(reduce::halfToFloat(h[i]))) << i;
        ASSERT_EQ(f2u(acc[i]), f2u(0.5f + reduce::bf16ToFloat(b[i]))) << i;
      }
    }
  }
}

// ---- int8 (the int8 hook) ------------------------------------------------------------

// Values for quantization: chunks of ordinary values, all-zero chunks, tiny
// chunks (subnormal max, where 127 / max overflows to inf), and chunks with
// inf or NaN.
std::vector<float> int8Input(size_t n, size_t chunk, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> x(n + 1);
  for (size_t begin = 0; begin < n; begin += chunk) {
    const int kind = static_cast<int>(rng() % 6);
    for (size_t i = begin; i < std::min(n, begin + chunk); ++i) {
      const float v = static_cast<float>(static_cast<double>(rng() % 20001) - 10000.0) / 777.f;
      x[i] = kind == 1 ? 0.f : kind == 2 ? v * 1e-44f : v;
    }
    if (kind == 3) x[begin] = std::numeric_limits<float>::infinity();
    if (kind == 4) x[std::min(n, begin + chunk) - 1] = std::nanf("");
  }
  return x;
}

// The GPU's way: each of `threads` lanes takes the max over its strided
// elements, then the block combines them; then the lanes quantize.
void quantizeLikeAGpu(const float* x, float* residual, size_t n, size_t chunk, float* scales,
                      int8_t* q, size_t threads) {
  for (size_t begin = 0, c = 0; begin < n; begin += chunk, ++c) {
    const size_t end = std::min(n, begin + chunk);
    uint32_t m = 0;
    for (size_t t = 0; t < threads; ++t) {
      m = std::max(m, k::int8AbsMaxRange(x, residual, begin + t, end, threads));
    }
    scales[c] = k::int8Scale(m);
    for (size_t t = 0; t < threads; ++t) {
      k::int8QuantizeRange(x, residual, q, m, begin + t, end, threads);
    }
  }
}

TEST(CudaKernels, Int8MatchesTheHookBitForBit) {
  for (size_t chunk : {size_t{1}, size_t{7}, size_t{64}, size_t{1000}}) {
    for (size_t n : kCounts) {
      const size_t nchunks = (n + chunk - 1) / chunk;
      const std::vector<float> x = int8Input(n, chunk, n * 7 + chunk);
      for (bool withResidual : {false, true}) {
        std::vector<float> e1(n + 1), e2(n + 1);
        for (size_t i = 0; i < n; ++i) e1[i] = e2[i] = withResidual ? x[(i * 13) % n] * 0.01f : 0;
        std::vector<float> s1(nchunks + 1), s2(nchunks + 1);
        std::vector<int8_t> q1(n + 1), q2(n + 1);
        hooks::quantizeInt8(x.data(), withResidual ? e1.data() : nullptr, n, chunk, s1.data(),
                            q1.data());
        quantizeLikeAGpu(x.data(), withResidual ? e2.data() : nullptr, n, chunk, s2.data(),
                         q2.data(), 5);
        const std::string where = strCat("chunk=", chunk, " n=", n, " residual=", withResidual);
        for (size_t c = 0; c < nchunks; ++c) ASSERT_EQ(f2u(s1[c]), f2u(s2[c])) << where << " c=" << c;
        ASSERT_EQ(std::memcmp(q1.data(), q2.data(), n), 0) << where;
        ASSERT_EQ(std::memcmp(e1.data(), e2.data(), n * 4), 0) << where;

        // Dequantize and sum three ranks' terms in rank order.
        const int8_t* qs[] = {q1.data(), q2.data(), q1.data()};
        const float* ss[] = {s1.data(), s2.data(), s1.data()};
        std::vector<float> want(n + 1), got(n + 1);
        hooks::dequantizeSumInt8(qs, ss, 3, n, chunk, 1.f / 3, want.data());
        for (int r = 0; r < 3; ++r) {
          k::int8DequantizeRange(qs[r], ss[r], chunk, 1.f / 3, got.data(), r > 0, 0, n, 1);
        }
        ASSERT_EQ(std::memcmp(want.data(), got.data(), n * 4), 0) << where;
      }
    }
  }
}

TEST(CudaKernels, Int8ClosedForm) {
  const float x[] = {127.f, -63.5f, 0.4f, -0.5f, 2.f, 0.f};
  float scale[2];
  int8_t q[6];
  quantizeLikeAGpu(x, nullptr, 6, 4, scale, q, 1);
  EXPECT_EQ(scale[0], 1.f);  // max |x| = 127
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);  // round half away from zero
  EXPECT_EQ(q[2], 0);
  EXPECT_EQ(q[3], -1);
  EXPECT_EQ(scale[1], 2.f / 127.f);
  EXPECT_EQ(q[4], 127);
  EXPECT_EQ(q[5], 0);
  const float bad[] = {1.f, std::numeric_limits<float>::infinity()};
  float residual[] = {0.25f, 0.25f};
  quantizeLikeAGpu(bad, residual, 2, 2, scale, q, 1);
  EXPECT_TRUE(std::isnan(scale[0]));
  EXPECT_EQ(q[0], 0);
  EXPECT_EQ(residual[0], 0.f);  // reset, so one bad step does not poison the next
}

}  // namespace
}  // namespace cuda
}  // namespace braid

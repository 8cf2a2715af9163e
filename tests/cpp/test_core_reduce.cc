// Reduction kernels (csrc/reduce) against a straightforward reference written
// here: every dtype x op x SIMD level the CPU has, odd counts, unaligned
// pointers, in place, NaN/Inf, and bf16 accuracy with many sources.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "math/dispatch.h"
#include "math/half.h"
#include "math/reduce.h"

namespace braid {

// Readable test parameters in gtest's output (found by ADL).
void PrintTo(DataType t, std::ostream* os) { *os << toString(t); }

namespace reduce {

void PrintTo(Level l, std::ostream* os) { *os << levelName(l); }

namespace {

constexpr DataType kAllTypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                  DataType::kBFloat16, DataType::kInt8,    DataType::kUInt8,
                                  DataType::kInt16,    DataType::kInt32,   DataType::kInt64,
                                  DataType::kBool};
constexpr ReduceOp kReduceOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin,
                                   ReduceOp::kMax, ReduceOp::kBand,    ReduceOp::kBor,
                                   ReduceOp::kBxor};
constexpr Level kAllLevels[] = {Level::kScalar, Level::kAvx2, Level::kAvx512};

bool haveLevel(Level l) { return static_cast<int>(l) <= static_cast<int>(cpuLevel()); }

// ---- Reference float16 / bfloat16 (M = 10 or 7 mantissa bits) --------------

double smallToDouble(uint16_t b, int m) {
  const int e = 15 - m, bias = (1 << (e - 1)) - 1;
  const int exp = (b >> m) & ((1 << e) - 1);
  const int mant = b & ((1 << m) - 1);
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  if (exp == (1 << e) - 1) return mant ? std::nan("") : sign * HUGE_VAL;
  if (exp == 0) return sign * std::ldexp(mant, 1 - bias - m);
  return sign * std::ldexp(mant + (1 << m), exp - bias - m);
}

// Round to nearest, ties to even, directly from double.
uint16_t doubleToSmall(double x, int m) {
  const int e = 15 - m, bias = (1 << (e - 1)) - 1;
  const uint16_t expMask = static_cast<uint16_t>(((1 << e) - 1) << m);
  if (std::isnan(x)) return expMask | (1 << (m - 1));
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | expMask;
  if (a == 0) return sign;
  int ex;
  std::frexp(a, &ex);
  ex -= 1;  // a in [2^ex, 2^(ex+1))
  if (ex < 1 - bias) ex = 1 - bias;
  double q = std::nearbyint(a / std::ldexp(1.0, ex - m));  // default mode: ties to even
  if (q >= std::ldexp(1.0, m + 1)) {
    q /= 2;
    ++ex;
  }
  if (ex > bias) return sign | expMask;
  if (q < std::ldexp(1.0, m)) return sign | static_cast<uint16_t>(q);  // subnormal
  return sign | static_cast<uint16_t>(((ex + bias) << m) | (static_cast<int>(q) - (1 << m)));
}

int mantBits(DataType t) { return t == DataType::kFloat16 ? 10 : 7; }
bool isHalf(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }

// Sign-magnitude bits to a line where neighbours differ by one.
int ordered(uint16_t b) { return (b & 0x8000) ? -(b & 0x7FFF) : (b & 0x7FFF); }

// ---- Element access and reference values ------------------------------------

template <class T>
T rd(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Integer element as its two's complement bits, sign-extended.
int64_t rdInt(DataType t, const uint8_t* p) {
  switch (t) {
    case DataType::kInt8:
      return rd<int8_t>(p);
    case DataType::kUInt8:
      return rd<uint8_t>(p);
    case DataType::kInt16:
      return rd<int16_t>(p);
    case DataType::kInt32:
      return rd<int32_t>(p);
    default:
      return rd<int64_t>(p);
  }
}

double rdFloat(DataType t, const uint8_t* p) {
  switch (t) {
    case DataType::kFloat32:
      return rd<float>(p);
    case DataType::kFloat64:
      return rd<double>(p);
    default:
      return smallToDouble(rd<uint16_t>(p), mantBits(t));
  }
}

// NaN-propagating min/max, as torch.minimum / torch.maximum.
template <class F>
F refCombine(ReduceOp op, F a, F b) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return std::isnan(a) || std::isnan(b) ? F(NAN) : (b < a ? b : a);
    default:
      return std::isnan(a) || std::isnan(b) ? F(NAN) : (b > a ? b : a);
  }
}

uint64_t refCombineInt(DataType t, ReduceOp op, int64_t a, int64_t b) {
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case ReduceOp::kSum:
      return ua + ub;
    case ReduceOp::kProduct:
      return ua * ub;
    case ReduceOp::kMin:
      return static_cast<uint64_t>(b < a ? b : a);
    case ReduceOp::kMax:
      return static_cast<uint64_t>(b > a ? b : a);
    case ReduceOp::kBand:
      return ua & ub;
    case ReduceOp::kBor:
      return ua | ub;
    default:
      return ua ^ ub;
  }
}

// Low bits of v, sign-extended back as type t would hold them.
int64_t wrapTo(DataType t, uint64_t v) {
  switch (t) {
    case DataType::kInt8:
      return static_cast<int8_t>(v);
    case DataType::kUInt8:
      return static_cast<uint8_t>(v);
    case DataType::kInt16:
      return static_cast<int16_t>(v);
    case DataType::kInt32:
      return static_cast<int32_t>(v);
    default:
      return static_cast<int64_t>(v);
  }
}

bool refBool(ReduceOp op, const std::vector<const uint8_t*>& in) {
  bool acc = in[0][0] != 0;
  for (size_t k = 1; k < in.size(); ++k) {
    const bool x = in[k][0] != 0;
    if (op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kBor)
      acc = acc || x;
    else if (op == ReduceOp::kBxor)
      acc = acc != x;
    else
      acc = acc && x;
  }
  return acc;
}

// Empty string when `got` matches the reference for inputs `in` (one element).
std::string checkElement(DataType t, ReduceOp op, const uint8_t* got,
                         const std::vector<const uint8_t*>& in) {
  const size_t n = in.size();
  if (t == DataType::kBool) {
    const bool want = refBool(op, in);
    return got[0] == (want ? 1 : 0) ? "" : strCat("bool got ", int(got[0]), " want ", want);
  }
  if (!isFloating(t)) {
    uint64_t acc = static_cast<uint64_t>(rdInt(t, in[0]));
    for (size_t k = 1; k < n; ++k) acc = refCombineInt(t, op, wrapTo(t, acc), rdInt(t, in[k]));
    const int64_t want = wrapTo(t, acc), g = rdInt(t, got);
    return g == want ? "" : strCat("got ", g, " want ", want);
  }
  if (t == DataType::kFloat32) {
    // Same order and precision as the kernels: exact.
    float acc = rd<float>(in[0]);
    for (size_t k = 1; k < n; ++k) acc = refCombine<float>(op, acc, rd<float>(in[k]));
    const float g = rd<float>(got);
    if (std::isnan(acc) ? std::isnan(g) : g == acc) return "";
    return strCat("got ", g, " want ", acc);
  }
  double acc = rdFloat(t, in[0]);
  for (size_t k = 1; k < n; ++k) acc = refCombine<double>(op, acc, rdFloat(t, in[k]));
  const double g = rdFloat(t, got);
  if (std::isnan(acc) || std::isnan(g)) {
    return std::isnan(acc) && std::isnan(g) ? "" : strCat("got ", g, " want ", acc);
  }
  if (t == DataType::kFloat64) return g == acc ? "" : strCat("got ", g, " want ", acc);
  // fp16/bf16: the reference is rounded once from double; the kernel
  // accumulates in fp32, so allow one unit in the last place (none for Inf).
  const uint16_t want = doubleToSmall(acc, mantBits(t)), gb = rd<uint16_t>(got);
  if (std::isinf(acc) || std::isinf(g)) return gb == want ? "" : strCat("got ", g, " want ", acc);
  return std::abs(ordered(gb) - ordered(want)) <= 1 ? "" : strCat("got ", g, " want ", acc);
}

// ---- Input generation --------------------------------------------------------

void fillFloat(DataType t, ReduceOp op, uint8_t* p, size_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> wide(-100.0, 100.0), mag(0.5, 2.0);
  std::uniform_int_distribution<int> pick(0, 63), steps(-512, 512), sixteenths(16, 31);
  const size_t es = elementSize(t);
  for (size_t i = 0; i < count; ++i) {
    double v;
    const int r = pick(rng);
    if (r == 0)
      v = std::nan("");
    else if (r == 1)
      v = HUGE_VAL;
    else if (r == 2)
      v = -HUGE_VAL;
    else if (r == 3)
      v = -0.0;
    else if (op == ReduceOp::kProduct) {
      // Products of up to 8 such values stay well inside every range.
      v = (isHalf(t) ? sixteenths(rng) / 16.0 : mag(rng)) * ((r & 4) ? -1 : 1);
    } else {
      // Half inputs on a grid whose fp32 sums are exact, so the only
      // rounding is the final one (the reference does the same in double).
      v = isHalf(t) ? steps(rng) / (t == DataType::kFloat16 ? 64.0 : 8.0) : wide(rng);
    }
    uint8_t* e = p + i * es;
    if (t == DataType::kFloat32) {
      const float f = static_cast<float>(v);
      std::memcpy(e, &f, 4);
    } else if (t == DataType::kFloat64) {
      std::memcpy(e, &v, 8);
    } else {
      const uint16_t h = doubleToSmall(v, mantBits(t));
      std::memcpy(e, &h, 2);
    }
  }
}

void fill(DataType t, ReduceOp op, uint8_t* p, size_t count, std::mt19937_64& rng) {
  if (isFloating(t)) return fillFloat(t, op, p, count, rng);
  for (size_t i = 0; i < count * elementSize(t); ++i) {
    const uint8_t b = static_cast<uint8_t>(rng());
    // bool: mostly 0 and 1, sometimes a non-canonical true.
    p[i] = t == DataType::kBool ? (b < 115 ? 0 : b < 230 ? 1 : b) : b;
  }
}

// ---- One reduceN case ---------------------------------------------------------

constexpr size_t kGuard = 16;
constexpr uint8_t kGuardByte = 0xA5;

// A buffer with `off` bytes of misalignment and guard bytes on both sides.
struct Buf {
  std::vector<uint8_t> mem;
  size_t start;
  Buf(size_t bytes, size_t off) : mem(bytes + 2 * kGuard + 64 + off, kGuardByte) {
    const auto base = reinterpret_cast<uintptr_t>(mem.data()) + kGuard;
    start = ((base + 63) & ~uintptr_t{63}) + off - reinterpret_cast<uintptr_t>(mem.data());
  }
  uint8_t* data() { return mem.data() + start; }
  bool guardsIntact(size_t bytes) const {
    for (size_t i = 0; i < mem.size(); ++i) {
      if ((i < start || i >= start + bytes) && mem[i] != kGuardByte) return false;
    }
    return true;
  }
};

// Runs reduceNAt and checks it against the reference and, above the scalar
// level, bit for bit against the scalar kernel (NaN payloads aside).
void runCase(Level level, DataType t, ReduceOp op, size_t n, size_t count, size_t off, bool inPlace,
             uint64_t seed) {
  SCOPED_TRACE(strCat(toString(t), " ", toString(op), " ", levelName(level), " n=", n,
                      " count=", count, " off=", off, inPlace ? " in-place" : ""));
  std::mt19937_64 rng(seed);
  const size_t es = elementSize(t), bytes = count * es;
  std::vector<Buf> bufs;
  for (size_t k = 0; k < n; ++k) bufs.emplace_back(bytes, (off + k) % 4);
  for (auto& b : bufs) fill(t, op, b.data(), count, rng);
  std::vector<std::vector<uint8_t>> inputs;  // copies: in place overwrites source 0
  for (auto& b : bufs) inputs.emplace_back(b.data(), b.data() + bytes);
  std::vector<const void*> srcs;
  for (auto& b : bufs) srcs.push_back(b.data());

  Buf out(bytes, (off + 3) % 4);
  uint8_t* dst = inPlace ? bufs[0].data() : out.data();
  reduceNAt(level, t, op, dst, srcs.data(), n, count);
  ASSERT_TRUE(bufs[0].guardsIntact(bytes));
  ASSERT_TRUE(out.guardsIntact(bytes));

  std::vector<uint8_t> scalarOut(bytes);
  if (level != Level::kScalar) {
    std::vector<const void*> orig;
    for (auto& in : inputs) orig.push_back(in.data());
    reduceNAt(Level::kScalar, t, op, scalarOut.data(), orig.data(), n, count);
  }
  int failures = 0;
  std::vector<const uint8_t*> elem(n);
  for (size_t i = 0; i < count && failures < 5; ++i) {
    for (size_t k = 0; k < n; ++k) elem[k] = inputs[k].data() + i * es;
    const uint8_t* g = dst + i * es;
    std::string err = checkElement(t, op, g, elem);
    if (err.empty() && level != Level::kScalar && std::memcmp(g, &scalarOut[i * es], es) != 0 &&
        !(isFloating(t) && std::isnan(rdFloat(t, g)) &&
          std::isnan(rdFloat(t, &scalarOut[i * es])))) {
      err = strCat("differs from the scalar kernel: ", rdFloat(t, g), " vs ",
                   rdFloat(t, &scalarOut[i * es]));
    }
    if (!err.empty()) {
      ADD_FAILURE() << "element " << i << ": " << err;
      ++failures;
    }
  }
}

std::string paramName(DataType t, Level l) { return strCat(toString(t), "_", levelName(l)); }

class ReduceTest : public ::testing::TestWithParam<std::tuple<DataType, Level>> {};

TEST_P(ReduceTest, MatchesReference) {
  const auto [t, level] = GetParam();
  if (!haveLevel(level)) GTEST_SKIP() << "CPU lacks " << levelName(level);
  uint64_t seed = 1;
  int cases = 0;
  for (ReduceOp op : kReduceOps) {
    if (!supported(t, op)) continue;
    for (size_t n : {1, 2, 3, 8}) {
      for (size_t count : {0, 1, 7, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4099}) {
        for (size_t off = 0; off < 4; ++off) {
          for (bool inPlace : {false, true}) {
            runCase(level, t, op, n, count, off, inPlace, seed++);
            ++cases;
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 0);
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndLevels, ReduceTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllLevels)),
                         [](const auto& info) {
                           return paramName(std::get<0>(info.param), std::get<1>(info.param));
                         });

TEST(Reduce, SixtyFourSources) {
  for (Level level : kAllLevels) {
    if (!haveLevel(level)) continue;
    for (DataType t :
         {DataType::kFloat32, DataType::kBFloat16, DataType::kInt32, DataType::kBool}) {
      runCase(level, t, ReduceOp::kSum, 64, 1031, 1, false, 99);
      runCase(level, t, ReduceOp::kMax, 64, 1031, 2, true, 98);
    }
  }
}

TEST(Reduce, LargeBufferAgreesAcrossLevels) {
  const size_t count = (size_t{1} << 20) + 3;
  std::vector<float> a(count), b(count), c(count);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1, 1);
  for (size_t i = 0; i < count; ++i) a[i] = d(rng), b[i] = d(rng), c[i] = d(rng);
  const void* srcs[] = {a.data(), b.data(), c.data()};
  std::vector<float> want(count), got(count);
  reduceNAt(Level::kScalar, DataType::kFloat32, ReduceOp::kSum, want.data(), srcs, 3, count);
  for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(want[i], (a[i] + b[i]) + c[i]);
  reduceN(DataType::kFloat32, ReduceOp::kSum, got.data(), srcs, 3, count);
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), count * sizeof(float)));
}

// ---- NaN, Inf, rounding edges ---------------------------------------------------

// Reduces two one-element sources given as doubles (converted to t) at every
// level and returns the result as a double.
double reduce2(Level level, DataType t, ReduceOp op, double x, double y) {
  uint8_t a[8], b[8], out[8];
  for (auto [p, v] : {std::pair<uint8_t*, double>{a, x}, {b, y}}) {
    if (t == DataType::kFloat32) {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
    } else if (t == DataType::kFloat64) {
      std::memcpy(p, &v, 8);
    } else {
      const uint16_t h = doubleToSmall(v, mantBits(t));
      std::memcpy(p, &h, 2);
    }
  }
  const void* srcs[] = {a, b};
  reduceNAt(level, t, op, out, srcs, 2, 1);
  return rdFloat(t, out);
}

TEST(Reduce, NaNAndInf) {
  const double inf = HUGE_VAL, nan = std::nan("");
  for (Level level : kAllLevels) {
    if (!haveLevel(level)) continue;
    for (DataType t :
         {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
      SCOPED_TRACE(paramName(t, level));
      EXPECT_TRUE(std::isnan(reduce2(level, t, ReduceOp::kSum, inf, -inf)));
      EXPECT_TRUE(std::isnan(reduce2(level, t, ReduceOp::kSum, nan, 1)));
      EXPECT_TRUE(std::isnan(reduce2(level, t, ReduceOp::kProduct, 0, inf)));
      EXPECT_EQ(reduce2(level, t, ReduceOp::kSum, inf, 1), inf);
      EXPECT_EQ(reduce2(level, t, ReduceOp::kProduct, -inf, 2), -inf);
      for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
        EXPECT_TRUE(std::isnan(reduce2(level, t, op, nan, 1)));
        EXPECT_TRUE(std::isnan(reduce2(level, t, op, 1, nan)));
        EXPECT_TRUE(std::isnan(reduce2(level, t, op, nan, nan)));
      }
      EXPECT_EQ(reduce2(level, t, ReduceOp::kMin, -inf, 3), -inf);
      EXPECT_EQ(reduce2(level, t, ReduceOp::kMax, 3, inf), inf);
      EXPECT_EQ(reduce2(level, t, ReduceOp::kMax, -inf, -2), -2);
    }
    // Rounding at the top of the fp16 range: 65504 + 8 ties to even (65504),
    // 65504 + 16 = 65520 rounds to Inf.
    EXPECT_EQ(reduce2(level, DataType::kFloat16, ReduceOp::kSum, 65504, 8), 65504);
    EXPECT_EQ(reduce2(level, DataType::kFloat16, ReduceOp::kSum, 65504, 16), inf);
    EXPECT_EQ(reduce2(level, DataType::kFloat16, ReduceOp::kSum, -65504, -16), -inf);
    // Subnormal fp16 results: 2^-24 * 3 / 2 ties to even (2^-23).
    EXPECT_EQ(reduce2(level, DataType::kFloat16, ReduceOp::kProduct, std::ldexp(3, -24), 0.5),
              std::ldexp(1, -23));
    // bf16: the largest finite doubled overflows to Inf; 1 + 2^-8 ties to 1,
    // (1 + 2^-7) + 2^-8 ties to 1 + 2^-6.
    const double bfMax = smallToDouble(0x7F7F, 7);
    EXPECT_EQ(reduce2(level, DataType::kBFloat16, ReduceOp::kSum, bfMax, bfMax), inf);
    EXPECT_EQ(reduce2(level, DataType::kBFloat16, ReduceOp::kSum, 1, std::ldexp(1, -8)), 1);
    EXPECT_EQ(reduce2(level, DataType::kBFloat16, ReduceOp::kSum, 1 + std::ldexp(1, -7),
                      std::ldexp(1, -8)),
              1 + std::ldexp(1, -6));
  }
}

// Note [Reduced-precision accumulation]: with 64 sources of small bf16 values
// the result is within half a unit in the last place of the exact sum (plus
// fp32's error), where rounding after every hop drifts by many units.
TEST(Reduce, Bf16ManySmallValuesStayAccurate) {
  const size_t n = 64, count = 4099;
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> d(0.0, 0.01);
  std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(count));
  for (auto& v : in) {
    for (auto& x : v) x = doubleToSmall(d(rng), 7);
  }
  std::vector<const void*> srcs;
  for (auto& v : in) srcs.push_back(v.data());
  for (Level level : kAllLevels) {
    if (!haveLevel(level)) continue;
    SCOPED_TRACE(levelName(level));
    std::vector<uint16_t> out(count);
    reduceNAt(level, DataType::kBFloat16, ReduceOp::kSum, out.data(), srcs.data(), n, count);
    double worstUlps = 0, worstHopUlps = 0;
    for (size_t i = 0; i < count; ++i) {
      double exact = 0, hop = 0;
      for (size_t k = 0; k < n; ++k) {
        exact += smallToDouble(in[k][i], 7);
        hop = smallToDouble(doubleToSmall(hop + smallToDouble(in[k][i], 7), 7), 7);
      }
      int ex;
      std::frexp(exact, &ex);
      const double ulp = std::ldexp(1.0, ex - 8);
      worstUlps = std::max(worstUlps, std::fabs(smallToDouble(out[i], 7) - exact) / ulp);
      worstHopUlps = std::max(worstHopUlps, std::fabs(hop - exact) / ulp);
    }
    EXPECT_LE(worstUlps, 0.5 + 1e-3);
    EXPECT_GT(worstHopUlps, 2.0);  // the per-hop rounding this design avoids
  }
}

// ---- Conversions (half.h) against the reference above -------------------------

TEST(HalfConversion, WidenEveryValue) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const double f16 = smallToDouble(h, 10), bf = smallToDouble(h, 7);
    const float g16 = halfToFloat(h), gbf = bf16ToFloat(h);
    ASSERT_TRUE(std::isnan(f16) ? std::isnan(g16) : g16 == f16) << std::hex << b;
    ASSERT_TRUE(std::isnan(bf) ? std::isnan(gbf) : gbf == bf) << std::hex << b;
    if (!std::isnan(f16)) {
      ASSERT_EQ(floatToHalf(g16), h) << std::hex << b;  // round trip
    }
    if (!std::isnan(bf)) {
      ASSERT_EQ(floatToBf16(gbf), h) << std::hex << b;
    }
  }
}

TEST(HalfConversion, NarrowRoundsToNearestEven) {
  std::vector<uint32_t> patterns = {0x33000000, 0x33000001, 0x337FFFFF, 0x38800000, 0x387FFFFF,
                                    0x477FEFFF, 0x477FF000, 0x477FF001, 0x7F7FFFFF, 0x7F800001,
                                    0x7FC00000, 0x3F808000, 0x3F818000, 0x3F808001};
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 997) patterns.push_back(uint32_t(b));
  // Every tie between neighbouring fp16 or bf16 values (exact in fp32), and
  // the floats on either side of it.
  for (int m : {10, 7}) {
    for (uint32_t h = 0; h < 0x7FFF; ++h) {
      const double lo = smallToDouble(uint16_t(h), m), hi = smallToDouble(uint16_t(h + 1), m);
      if (std::isnan(lo) || std::isinf(lo) || std::isnan(hi)) continue;
      const float mid = static_cast<float>((lo + hi) / 2);  // exact: one more bit than m+1
      const uint32_t mb = floatBits(mid);
      patterns.insert(patterns.end(), {mb - 1, mb, mb + 1});
    }
  }
  for (uint32_t b : patterns) {
    for (uint32_t bits : {b, b | 0x80000000u}) {
      const float f = bitsFloat(bits);
      const uint16_t h = floatToHalf(f), bf = floatToBf16(f);
      if (std::isnan(f)) {
        ASSERT_TRUE(std::isnan(smallToDouble(h, 10))) << std::hex << bits;
        ASSERT_TRUE(std::isnan(smallToDouble(bf, 7))) << std::hex << bits;
      } else {
        ASSERT_EQ(h, doubleToSmall(f, 10)) << std::hex << bits;
        ASSERT_EQ(bf, doubleToSmall(f, 7)) << std::hex << bits;
      }
    }
  }
}

// ---- scale and divide -------------------------------------------------------------

// Reference for one element of scale (div == 0) or divide (div != 0).
std::string checkMap(DataType t, const uint8_t* got, const uint8_t* in, double factor,
                     int64_t div) {
  if (!isFloating(t)) {
    const int64_t x = t == DataType::kBool ? (in[0] != 0) : rdInt(t, in);
    const uint64_t q = div == -1 ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x / div);
    const int64_t want = t == DataType::kBool ? (q != 0) : wrapTo(t, q);
    const int64_t g = t == DataType::kBool ? got[0] : rdInt(t, got);
    return g == want ? "" : strCat("got ", g, " want ", want);
  }
  double want;
  if (t == DataType::kFloat64) {
    const double x = rd<double>(in);
    want = div ? x / static_cast<double>(div) : x * factor;
  } else {
    const float x = static_cast<float>(rdFloat(t, in));  // in fp32 for fp16/bf16
    want = div ? x / static_cast<float>(div) : x * static_cast<float>(factor);
    if (isHalf(t)) want = smallToDouble(doubleToSmall(want, mantBits(t)), mantBits(t));
  }
  const double g = rdFloat(t, got);
  if (std::isnan(want) ? std::isnan(g) : g == want) return "";
  return strCat("got ", g, " want ", want);
}

class MapTest : public ::testing::TestWithParam<std::tuple<DataType, Level>> {};

TEST_P(MapTest, ScaleAndDivideMatchReference) {
  const auto [t, level] = GetParam();
  if (!haveLevel(level)) GTEST_SKIP() << "CPU lacks " << levelName(level);
  const size_t es = elementSize(t);
  uint64_t seed = 1000;
  for (size_t count : {0, 1, 7, 15, 16, 17, 63, 1000, 4099}) {
    for (size_t off = 0; off < 4; ++off) {
      for (bool inPlace : {false, true}) {
        // Scale factors (float types only), then divisors.
        std::vector<std::pair<double, int64_t>> cases;
        if (isFloating(t)) {
          for (double f : {0.5, 1.0 / 3, -2.5, 1e-3}) cases.push_back({f, 0});
        }
        for (int64_t d : {1, 2, 3, 7, -1, -3, 8}) cases.push_back({0, d});
        for (auto [factor, div] : cases) {
          SCOPED_TRACE(strCat(paramName(t, level), " count=", count, " off=", off,
                              inPlace ? " in-place" : "", " factor=", factor, " div=", div));
          std::mt19937_64 rng(seed++);
          Buf src(count * es, off), out(count * es, (off + 1) % 4);
          fill(t, ReduceOp::kSum, src.data(), count, rng);
          const std::vector<uint8_t> in(src.data(), src.data() + count * es);
          uint8_t* dst = inPlace ? src.data() : out.data();
          if (div)
            divideAt(level, t, dst, src.data(), div, count);
          else
            scaleAt(level, t, dst, src.data(), factor, count);
          ASSERT_TRUE(src.guardsIntact(count * es));
          ASSERT_TRUE(out.guardsIntact(count * es));
          for (size_t i = 0; i < count; ++i) {
            const std::string err = checkMap(t, dst + i * es, &in[i * es], factor, div);
            ASSERT_TRUE(err.empty()) << "element " << i << ": " << err;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndLevels, MapTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllLevels)),
                         [](const auto& info) {
                           return paramName(std::get<0>(info.param), std::get<1>(info.param));
                         });

TEST(Divide, Int64MinByMinusOneWraps) {
  const int64_t in[] = {std::numeric_limits<int64_t>::min(), -7, 7};
  for (Level level : kAllLevels) {
    if (!haveLevel(level)) continue;
    int64_t out[3];
    divideAt(level, DataType::kInt64, out, in, -1, 3);
    EXPECT_EQ(out[0], std::numeric_limits<int64_t>::min());
    EXPECT_EQ(out[1], 7);
    EXPECT_EQ(out[2], -7);
    divideAt(level, DataType::kInt64, out, in, 2, 3);
    EXPECT_EQ(out[1], -3);  // truncation toward zero
  }
}

// ---- Errors and level selection ---------------------------------------------------------

TEST(Reduce, RejectsBadArguments) {
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 1, 1, 1}, out[4];
  const void* srcs[] = {a, b};
  for (DataType t :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
      EXPECT_FALSE(supported(t, op));
      EXPECT_THROW(reduceN(t, op, out, srcs, 2, 1), Error);
    }
  }
  for (DataType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kPremulSum}) {
      EXPECT_FALSE(supported(t, op));
      EXPECT_THROW(reduceN(t, op, out, srcs, 2, 1), Error);
    }
    for (ReduceOp op : kReduceOps)
      EXPECT_EQ(supported(t, op), op <= ReduceOp::kMax || !isFloating(t));
  }
  EXPECT_THROW(reduceN(DataType::kFloat32, ReduceOp::kSum, out, srcs, 0, 4), Error);
  const void* nulls[] = {a, nullptr};
  EXPECT_THROW(reduceN(DataType::kFloat32, ReduceOp::kSum, out, nulls, 2, 4), Error);
  // dst shifted by one element into source 1: partial overlap.
  EXPECT_THROW(reduceN(DataType::kFloat32, ReduceOp::kSum, b + 1, srcs, 2, 3), Error);
  EXPECT_THROW(scale(DataType::kInt32, out, a, 2.0, 4), Error);
  EXPECT_THROW(scale(DataType::kBool, out, a, 2.0, 4), Error);
  EXPECT_THROW(divide(DataType::kInt32, out, a, 0, 4), Error);
  EXPECT_THROW(divide(DataType::kFloat32, out, a, 0, 4), Error);
  if (cpuLevel() != Level::kAvx512) {
    EXPECT_THROW(reduceNAt(Level::kAvx512, DataType::kFloat32, ReduceOp::kSum, out, srcs, 2, 4),
                 Error);
  }
  // Errors name the function and the values.
  try {
    reduceN(DataType::kFloat16, ReduceOp::kBxor, out, srcs, 2, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("BXOR"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("float16"), std::string::npos) << e.what();
  }
  // Exact aliasing of a source other than 0 is fine.
  reduceN(DataType::kFloat32, ReduceOp::kSum, b, srcs, 2, 4);
  EXPECT_EQ(b[3], 5.0f);
}

TEST(SimdLevel, ChooseCapsToCpu) {
  Level l;
  ASSERT_TRUE(chooseLevel("auto", Level::kAvx512, &l));
  EXPECT_EQ(l, Level::kAvx512);
  ASSERT_TRUE(chooseLevel("auto", Level::kAvx2, &l));
  EXPECT_EQ(l, Level::kAvx2);
  ASSERT_TRUE(chooseLevel("avx512", Level::kScalar, &l));
  EXPECT_EQ(l, Level::kScalar);
  ASSERT_TRUE(chooseLevel("avx2", Level::kAvx512, &l));
  EXPECT_EQ(l, Level::kAvx2);
  ASSERT_TRUE(chooseLevel("scalar", Level::kAvx512, &l));
  EXPECT_EQ(l, Level::kScalar);
  EXPECT_FALSE(chooseLevel("sse9", Level::kAvx512, &l));
  EXPECT_FALSE(chooseLevel("", Level::kAvx512, &l));
}

TEST(SimdLevel, ReportsActiveLevel) {
  EXPECT_STREQ(simdLevel(), levelName(activeLevel()));
  EXPECT_LE(static_cast<int>(activeLevel()), static_cast<int>(cpuLevel()));
  // An unknown BRAID_SIMD value falls back to auto.
  Level want = cpuLevel();
  const char* env = std::getenv("BRAID_SIMD");
  chooseLevel(env && *env ? env : "auto", cpuLevel(), &want);
  EXPECT_EQ(activeLevel(), want);
}

}  // namespace
}  // namespace reduce
}  // namespace braid

// Argument checks and the run-time choice of kernel level (reduce.h,
// dispatch.h). Kernels have no rank, so errors name the kernel instead.
#include "math/reduce.h"

#include <cstdint>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/logging.h"
#include "common/settings.h"
#include "math/dispatch.h"

namespace braid {
namespace reduce {
namespace {

BRAID_SETTING_STRING(kSimd, "BRAID_SIMD", "auto",
                     "Highest SIMD level for reduction kernels: auto, avx512, avx2 or scalar.");

template <typename... Args>
[[noreturn]] void fail(const char* fn, const Args&... args) {
  throw Error(strCat("braid reduce::", fn, ": ", args...));
}

Level cpuLevelUncached() {
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's checks include the OS (XCR0) saving the AVX / AVX-512 state.
  __builtin_cpu_init();
  const bool avx2 = avx2::compiled() && __builtin_cpu_supports("avx2") &&
                    __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && avx512::compiled() && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  if (avx512) return Level::kAvx512;
  if (avx2) return Level::kAvx2;
#endif
  return Level::kScalar;
}

void checkLevel(const char* fn, Level level) {
  if (static_cast<int>(level) > static_cast<int>(cpuLevel())) {
    fail(fn, "SIMD level ", levelName(level), " is not supported by this CPU (best is ",
         levelName(cpuLevel()), ")");
  }
}

// dst may equal a source, but must not partly overlap one.
void checkOverlap(const char* fn, const void* dst, const void* src, size_t bytes, size_t k) {
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  if (d != s && d < s + bytes && s < d + bytes) {
    fail(fn, "dst partly overlaps source ", k, " (dst ", dst, ", source ", src, ", ", bytes,
         " bytes)");
  }
}

}  // namespace

const char* levelName(Level level) {
  switch (level) {
    case Level::kAvx512:
      return "avx512";
    case Level::kAvx2:
      return "avx2";
    case Level::kScalar:
      return "scalar";
  }
  return "unknown";
}

Level cpuLevel() {
  static const Level level = cpuLevelUncached();
  return level;
}

bool chooseLevel(const std::string& setting, Level cpu, Level* out) {
  Level cap;
  if (setting == "auto" || setting == "avx512") {
    cap = Level::kAvx512;
  } else if (setting == "avx2") {
    cap = Level::kAvx2;
  } else if (setting == "scalar") {
    cap = Level::kScalar;
  } else {
    return false;
  }
  *out = static_cast<int>(cap) < static_cast<int>(cpu) ? cap : cpu;
  return true;
}

Level activeLevel() {
  static const Level level = [] {
    const std::string v = kSimd.get();
    Level l = cpuLevel();
    if (!chooseLevel(v, cpuLevel(), &l)) {
      BRAID_LOG(kWarn, "reduce", -1)
          << "BRAID_SIMD='" << v << "' is not auto, avx512, avx2 or scalar; using auto";
    }
    BRAID_LOG(kDebug, "reduce", -1)
        << "kernels use " << levelName(l) << " (CPU has " << levelName(cpuLevel()) << ")";
    return l;
  }();
  return level;
}

bool supported(DataType type, ReduceOp op) {
  if (static_cast<int>(type) >= kNumDataTypes) return false;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return true;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return !isFloating(type);
    default:
      return false;
  }
}

void reduceNAt(Level level, DataType type, ReduceOp op, void* dst, const void* const* srcs,
               size_t nsrcs, size_t count) {
  if (!supported(type, op)) {
    fail("reduceN", "op ", toString(op), " is not supported for dtype ", toString(type));
  }
  if (nsrcs == 0) fail("reduceN", "needs at least one source, got 0");
  checkLevel("reduceN", level);
  if (count == 0) return;
  if (!dst || !srcs) fail("reduceN", "null dst or srcs with count ", count);
  const size_t bytes = count * elementSize(type);
  for (size_t k = 0; k < nsrcs; ++k) {
    if (!srcs[k]) fail("reduceN", "source ", k, " of ", nsrcs, " is null");
    checkOverlap("reduceN", dst, srcs[k], bytes, k);
  }
  if (nsrcs == 1) {
    // A copy; bool still goes through a kernel so that outputs are 0 or 1.
    if (type != DataType::kBool) {
      if (dst != srcs[0]) std::memcpy(dst, srcs[0], bytes);
      return;
    }
    const void* two[2] = {srcs[0], srcs[0]};
    return reduceNAt(level, type, ReduceOp::kBor, dst, two, 2, count);
  }
  switch (level) {
    case Level::kAvx512:
      return avx512::reduceN(type, op, dst, srcs, nsrcs, count);
    case Level::kAvx2:
      return avx2::reduceN(type, op, dst, srcs, nsrcs, count);
    case Level::kScalar:
      return scalar::reduceN(type, op, dst, srcs, nsrcs, count);
  }
}

void scaleAt(Level level, DataType type, void* dst, const void* src, double factor, size_t count) {
  if (!isFloating(type)) fail("scale", "dtype ", toString(type), " is not a float type");
  checkLevel("scale", level);
  if (count == 0) return;
  if (!dst || !src) fail("scale", "null dst or src with count ", count);
  checkOverlap("scale", dst, src, count * elementSize(type), 0);
  switch (level) {
    case Level::kAvx512:
      return avx512::scale(type, dst, src, factor, count);
    case Level::kAvx2:
      return avx2::scale(type, dst, src, factor, count);
    case Level::kScalar:
      return scalar::scale(type, dst, src, factor, count);
  }
}

void divideAt(Level level, DataType type, void* dst, const void* src, int64_t divisor,
              size_t count) {
  if (static_cast<int>(type) >= kNumDataTypes) fail("divide", "unknown dtype");
  if (divisor == 0) fail("divide", "division by zero (dtype ", toString(type), ")");
  checkLevel("divide", level);
  if (count == 0) return;
  if (!dst || !src) fail("divide", "null dst or src with count ", count);
  checkOverlap("divide", dst, src, count * elementSize(type), 0);
  switch (level) {
    case Level::kAvx512:
      return avx512::divide(type, dst, src, divisor, count);
    case Level::kAvx2:
      return avx2::divide(type, dst, src, divisor, count);
    case Level::kScalar:
      return scalar::divide(type, dst, src, divisor, count);
  }
}

void reduceN(DataType type, ReduceOp op, void* dst, const void* const* srcs, size_t nsrcs,
             size_t count) {
  reduceNAt(activeLevel(), type, op, dst, srcs, nsrcs, count);
}

void scale(DataType type, void* dst, const void* src, double factor, size_t count) {
  scaleAt(activeLevel(), type, dst, src, factor, count);
}

void divide(DataType type, void* dst, const void* src, int64_t divisor, size_t count) {
  divideAt(activeLevel(), type, dst, src, divisor, count);
}

const char* simdLevel() { return levelName(activeLevel()); }

}  // namespace reduce
}  // namespace braid

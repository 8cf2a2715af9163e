// Private to csrc/reduce and its tests: the per-ISA kernels and the run-time
// choice between them. Everything else uses reduce.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/types.h"

namespace braid {
namespace reduce {

// Note [ISA isolation]
// kernels_avx2.cc and kernels_avx512.cc are compiled with -mavx2/-mavx512*,
// so any code they emit may use those instructions. An inline function or a
// template instantiated there with ordinary types becomes a weak symbol, and
// the linker may keep that copy for callers in portable code too, which then
// crash on older CPUs. So the ISA files define everything in an unnamed
// namespace, instantiate the shared loops of simd_loops.h only with those
// local types, include no header with inline code (half.h in particular), and
// fall back to the scalar kernels by calling them, not by inlining them.

enum class Level : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

const char* levelName(Level level);

// The best level this CPU and OS support (AVX2 needs FMA and F16C as well;
// AVX-512 needs F, BW, VL and DQ).
Level cpuLevel();

// The level for a BRAID_SIMD value ("auto", "avx512", "avx2", "scalar"): the
// cap, lowered to what `cpu` supports. Returns false for an unknown value.
bool chooseLevel(const std::string& setting, Level cpu, Level* out);

// chooseLevel(BRAID_SIMD, cpuLevel()), read once at first use.
Level activeLevel();

// reduceN/scale/divide at a forced level, with the same argument checks.
// Throw braid::Error if the CPU lacks that level. For tests and benchmarks.
void reduceNAt(Level level, DataType type, ReduceOp op, void* dst, const void* const* srcs,
               size_t nsrcs, size_t count);
void scaleAt(Level level, DataType type, void* dst, const void* src, double factor, size_t count);
void divideAt(Level level, DataType type, void* dst, const void* src, int64_t divisor,
              size_t count);

// Per-ISA entry points. Callers have checked the arguments: supported(type,
// op), nsrcs >= 2, count >= 1, floating type for scale, divisor != 0, and
// dst either equal to or disjoint from each source. compiled() is false when
// the file was built without its ISA flags (another architecture, or a build
// that did not pass them); its entry points then forward to scalar and
// cpuLevel() never picks it.
#define BRAID_REDUCE_DECLARE_ISA(ns)                                                         \
  namespace ns {                                                                             \
  bool compiled();                                                                           \
  void reduceN(DataType type, ReduceOp op, void* dst, const void* const* srcs, size_t nsrcs, \
               size_t count);                                                                \
  void scale(DataType type, void* dst, const void* src, double factor, size_t count);        \
  void divide(DataType type, void* dst, const void* src, int64_t divisor, size_t count);     \
  }

BRAID_REDUCE_DECLARE_ISA(scalar)
BRAID_REDUCE_DECLARE_ISA(avx2)
BRAID_REDUCE_DECLARE_ISA(avx512)

#undef BRAID_REDUCE_DECLARE_ISA

}  // namespace reduce
}  // namespace braid
